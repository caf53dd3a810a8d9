//! Where a lock key lives in Redis Cluster, for waiters whose key left this node.
//!
//! A waiter queued here for a key that vanished must not be handed a lock here if the key
//! went to another node (MIGRATE deletes the source key, which looks like any delete):
//! that would make a second holder. Such waiters are answered like a client asking for a
//! missing key would be: `ASK` while the slot migrates, `MOVED` once it moved, so cluster
//! clients retry (and queue) on the right node.

use redis_module::{Context, ContextFlags, RedisValue};

/// Where requests for a slot go, seen from this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    Here,
    /// The error reply that redirects a client (`ASK`, `MOVED` or `CLUSTERDOWN`).
    Redirect(String),
}

/// Reads the route of `slot` from `CLUSTER NODES` output. Slot fields are `a-b`, `a`,
/// `[a->-<node>]` (migrating to) and `[a-<-<node>]` (importing from).
pub fn route(nodes: &str, slot: u16) -> Route {
    let mut mine = false;
    let mut migrating_to: Option<&str> = None;
    let mut owner_addr: Option<&str> = None;
    let mut addrs: Vec<(&str, &str)> = Vec::new();
    for line in nodes.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 8 {
            continue;
        }
        let (id, addr, myself) = (
            fields[0],
            address(fields[1]),
            fields[2].split(',').any(|f| f == "myself"),
        );
        addrs.push((id, addr));
        for spec in &fields[8..] {
            if let Some(inner) = spec.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
                if let Some((s, target)) = inner.split_once("->-") {
                    if myself && s.parse() == Ok(slot) {
                        migrating_to = Some(target);
                    }
                }
                continue;
            }
            let (lo, hi) = spec.split_once('-').unwrap_or((spec, spec));
            if let (Ok(lo), Ok(hi)) = (lo.parse::<u16>(), hi.parse::<u16>()) {
                if (lo..=hi).contains(&slot) {
                    if myself {
                        mine = true;
                    } else {
                        owner_addr = Some(addr);
                    }
                }
            }
        }
    }
    let addr_of = |id: &str| addrs.iter().find(|(i, _)| *i == id).map(|(_, a)| *a);
    match (mine, migrating_to.and_then(addr_of), owner_addr) {
        (true, Some(target), _) => Route::Redirect(format!("ASK {slot} {target}")),
        (true, None, _) => Route::Here,
        (false, _, Some(owner)) => Route::Redirect(format!("MOVED {slot} {owner}")),
        (false, _, None) => Route::Redirect("CLUSTERDOWN Hash slot not served".into()),
    }
}

/// `ip:port@cport[,hostname]` -> `ip:port`.
fn address(field: &str) -> &str {
    field.split('@').next().unwrap_or(field)
}

/// The route of `key` on this server: always `Here` outside cluster mode.
pub fn route_of(ctx: &Context, key: &[u8]) -> Route {
    if !ctx.get_flags().contains(ContextFlags::CLUSTER) {
        return Route::Here;
    }
    let key = redis_module::RedisString::create_from_slice(std::ptr::null_mut(), key);
    let slot = match ctx.call(
        "CLUSTER",
        &[&redis_module::RedisString::create(None, "KEYSLOT"), &key],
    ) {
        Ok(RedisValue::Integer(slot)) => slot as u16,
        _ => return Route::Here,
    };
    match ctx.call("CLUSTER", &["NODES"]) {
        Ok(RedisValue::SimpleString(nodes)) | Ok(RedisValue::BulkString(nodes)) => {
            route(&nodes, slot)
        }
        Ok(RedisValue::StringBuffer(nodes)) => route(&String::from_utf8_lossy(&nodes), slot),
        _ => Route::Here,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODES: &str = "\
aaa 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460 [100->-bbb]
bbb 127.0.0.1:7001@17001,host-b master - 0 0 2 connected 5461-10922 [100-<-aaa]
ccc 127.0.0.1:7002@17002 master - 0 0 3 connected 10923-16383
ddd 127.0.0.1:7003@17003 slave aaa 0 0 1 connected
";

    #[test]
    fn route_table() {
        // A slot of ours, not migrating: serve it here.
        assert_eq!(route(NODES, 0), Route::Here);
        assert_eq!(route(NODES, 5460), Route::Here);
        // A slot of ours migrating to bbb: ASK there, as for a missing key.
        assert_eq!(
            route(NODES, 100),
            Route::Redirect("ASK 100 127.0.0.1:7001".into())
        );
        // Another node's slot: MOVED.
        assert_eq!(
            route(NODES, 5461),
            Route::Redirect("MOVED 5461 127.0.0.1:7001".into())
        );
        assert_eq!(
            route(NODES, 16383),
            Route::Redirect("MOVED 16383 127.0.0.1:7002".into())
        );
        // Nobody's slot.
        let partial = "aaa 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-10\n";
        assert_eq!(
            route(partial, 11),
            Route::Redirect("CLUSTERDOWN Hash slot not served".into())
        );
    }
}
