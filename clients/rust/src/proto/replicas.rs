//! How many replicas the node serving a key has, for replica sync's default
//! ([`ReplicaSync::connected`](crate::ReplicaSync::connected)): wait for every replica
//! the node had when last asked, as Redisson's `checkLockSyncedSlaves` waits for the
//! replicas its topology scan knows.
//!
//! Pure: parsers of `ROLE` (one server) and `CLUSTER SLOTS` (a cluster), and a cache that
//! says when to ask again. `aio` sends the commands and keeps the cache. Asking is at most
//! once per [`REFRESH`] per client, so a server without replicas pays nothing per acquire
//! but that one command now and then; a user not allowed `ROLE` (a managed service's
//! `-@dangerous`) counts as no replicas, which the crate README says.

use std::time::{Duration, Instant};

use redis::Value;

/// How long a count is trusted. Redisson rescans a cluster's topology every second.
pub(crate) const REFRESH: Duration = Duration::from_secs(1);

/// The replicas connected to the master that answered `ROLE`, or `None` when the reply
/// is not a master's (a replica or sentinel answered: there is nothing to wait for there).
pub(crate) fn role_replicas(v: &Value) -> Option<u32> {
    let Value::Array(parts) = v else { return None };
    let is_master = match parts.first()? {
        Value::BulkString(b) => b.as_slice() == b"master",
        Value::SimpleString(s) => s == "master",
        _ => false,
    };
    if !is_master {
        return None;
    }
    match parts.get(2)? {
        Value::Array(replicas) => u32::try_from(replicas.len()).ok(),
        _ => None,
    }
}

/// Each slot range of a `CLUSTER SLOTS` reply with the number of replicas listed for it
/// (the entries after the master's).
pub(crate) fn slot_replicas(v: &Value) -> Vec<(u16, u16, u32)> {
    let int = |v: &Value| match v {
        Value::Int(n) => u16::try_from(*n).ok(),
        _ => None,
    };
    let Value::Array(ranges) = v else {
        return Vec::new();
    };
    ranges
        .iter()
        .filter_map(|r| {
            let Value::Array(r) = r else { return None };
            let replicas = r.len().checked_sub(3)?;
            Some((
                int(r.first()?)?,
                int(r.get(1)?)?,
                u32::try_from(replicas).ok()?,
            ))
        })
        .collect()
}

/// The last counts read, and when.
#[derive(Debug, Default)]
pub(crate) struct ReplicaCounts {
    read_at: Option<Instant>,
    // One server: a single count; a cluster: the count of each slot range.
    single: u32,
    ranges: Vec<(u16, u16, u32)>,
}

impl ReplicaCounts {
    /// Whether the counts must be read again before they are used at `now`.
    pub(crate) fn stale(&self, now: Instant) -> bool {
        self.read_at
            .is_none_or(|at| now.saturating_duration_since(at) >= REFRESH)
    }

    /// Keeps a one-server count read at `now` (`None`: not a master, or not allowed).
    pub(crate) fn set_single(&mut self, count: Option<u32>, now: Instant) {
        self.single = count.unwrap_or(0);
        self.read_at = Some(now);
    }

    /// Keeps a cluster's counts read at `now`.
    pub(crate) fn set_ranges(&mut self, ranges: Vec<(u16, u16, u32)>, now: Instant) {
        self.ranges = ranges;
        self.read_at = Some(now);
    }

    /// The one server's count.
    pub(crate) fn single(&self) -> u32 {
        self.single
    }

    /// The count of the range holding `slot` (0 when no range does).
    pub(crate) fn of_slot(&self, slot: u16) -> u32 {
        self.ranges
            .iter()
            .find(|(lo, hi, _)| (*lo..=*hi).contains(&slot))
            .map_or(0, |r| r.2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn replica(port: i64) -> Value {
        Value::Array(vec![bulk("127.0.0.1"), Value::Int(port), bulk("0")])
    }

    #[test]
    fn it_counts_a_masters_replicas_and_none_for_a_replica() {
        let master = |n| {
            Value::Array(vec![
                bulk("master"),
                Value::Int(10),
                Value::Array((0..n).map(|i| replica(7000 + i)).collect()),
            ])
        };
        assert_eq!(role_replicas(&master(0)), Some(0));
        assert_eq!(role_replicas(&master(2)), Some(2));
        let replica_role = Value::Array(vec![
            bulk("slave"),
            bulk("127.0.0.1"),
            Value::Int(6379),
            bulk("connected"),
            Value::Int(10),
        ]);
        assert_eq!(role_replicas(&replica_role), None);
        assert_eq!(role_replicas(&Value::Nil), None);
    }

    #[test]
    fn it_counts_the_replicas_listed_for_each_slot_range() {
        let node = |port| Value::Array(vec![bulk("127.0.0.1"), Value::Int(port), bulk("id")]);
        let slots = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                node(7000),
                node(7003),
            ]),
            Value::Array(vec![Value::Int(5461), Value::Int(10922), node(7001)]),
        ]);
        let ranges = slot_replicas(&slots);
        assert_eq!(ranges, vec![(0, 5460, 1), (5461, 10922, 0)]);
        let mut c = ReplicaCounts::default();
        let now = Instant::now();
        assert!(c.stale(now));
        c.set_ranges(ranges, now);
        assert!(!c.stale(now));
        assert!(c.stale(now + REFRESH));
        assert_eq!(
            (c.of_slot(17), c.of_slot(6000), c.of_slot(16000)),
            (1, 0, 0)
        );
    }

    #[test]
    fn it_takes_a_refused_role_for_no_replicas() {
        let mut c = ReplicaCounts::default();
        c.set_single(None, Instant::now());
        assert_eq!(c.single(), 0);
        c.set_single(Some(2), Instant::now());
        assert_eq!(c.single(), 2);
    }
}
