//! Unit tests of the queues' bookkeeping (`queues.rs`, whose child this is).

use super::*;

/// A request that is never asked anything: these tests are about the bookkeeping.
#[derive(Debug)]
#[allow(dead_code)] // read through Debug only
struct Probe(usize);

impl Ask for Probe {
    fn check(&self, _: &Context, _: &RedisString, _: i64) -> Check {
        unreachable!()
    }
    fn timed_out(&self, _: &Context, _: &RedisString) -> Reply {
        unreachable!()
    }
    fn take_back(&self, _: &Context, _: i32, _: &RedisString) {
        unreachable!()
    }
}

fn waiter(n: usize) -> Waiter {
    Waiter {
        who: Who::Blocked(Blocked(n)).into(),
        ..Waiter::new(Rc::new(Probe(n)))
    }
}

#[test]
fn it_serves_waiters_first_come_first_served() {
    let mut q = Queues::default();
    for n in 1..=5 {
        q.push(0, b"k", waiter(n), 100).unwrap();
    }
    let order: Vec<usize> =
        std::iter::from_fn(|| q.pop(0, b"k").map(|w| w.handle().unwrap().0)).collect();
    assert_eq!(order, vec![1, 2, 3, 4, 5]);
    assert_eq!(q.total(), 0);
}

#[test]
fn it_removes_a_waiter_from_the_middle_and_keeps_the_order() {
    let mut q = Queues::default();
    for n in 1..=4 {
        q.push(0, b"k", waiter(n), 100).unwrap();
    }
    let (db, name, w, was_head) = q.remove(Blocked(2)).unwrap();
    assert_eq!(
        (db, &name[..], w.handle(), was_head),
        (0, &b"k"[..], Some(Blocked(2)), false)
    );
    assert!(q.remove(Blocked(2)).is_none(), "a handle is removed once");
    assert_eq!(q.pop(0, b"k").unwrap().handle().unwrap(), Blocked(1));
    assert_eq!(q.pop(0, b"k").unwrap().handle().unwrap(), Blocked(3));
    assert_eq!(q.total(), 1);
}

#[test]
fn it_keeps_keys_and_dbs_apart() {
    let mut q = Queues::default();
    q.push(0, b"a", waiter(1), 10).unwrap();
    q.push(1, b"a", waiter(2), 10).unwrap();
    q.push(0, b"b", waiter(3), 10).unwrap();
    assert_eq!((q.len(0, b"a"), q.len(1, b"a"), q.len(0, b"b")), (1, 1, 1));
    assert_eq!(q.keys_with_waiters(), 3);
    assert_eq!(q.pop(1, b"a").unwrap().handle().unwrap(), Blocked(2));
}

#[test]
fn it_refuses_waiters_beyond_the_limit() {
    let mut q = Queues::default();
    q.push(0, b"k", waiter(1), 2).unwrap();
    q.push(0, b"k", waiter(2), 2).unwrap();
    assert!(q.push(0, b"k", waiter(3), 2).is_err());
    assert!(q.push(0, b"other", waiter(4), 0).is_err());
    assert_eq!(q.total(), 2);
}

#[test]
fn it_forgets_an_empty_queue_and_returns_its_timer() {
    let mut q = Queues::default();
    q.push(0, b"k", waiter(1), 10).unwrap();
    let (old, tag) = q.plan_timer(0, b"k", 1000).unwrap();
    assert!(old.is_none());
    let t = ArmedTimer {
        id: 7,
        tag,
        fire_at: 1000,
    };
    q.set_timer(0, b"k", t);
    assert!(q.forget_if_empty(0, b"k").is_empty(), "not empty yet");
    q.pop(0, b"k");
    assert_eq!(q.forget_if_empty(0, b"k"), vec![t]);
    assert_eq!(q.keys_with_waiters(), 0);
    assert!(q.fired(tag).is_none(), "the stopped timer's tag is stale");
}

#[test]
fn it_keeps_an_earlier_timer_and_replaces_a_later_one() {
    let mut q = Queues::default();
    q.push(0, b"k", waiter(1), 10).unwrap();
    let (_, tag) = q.plan_timer(0, b"k", 1000).unwrap();
    q.set_timer(
        0,
        b"k",
        ArmedTimer {
            id: 1,
            tag,
            fire_at: 1000,
        },
    );
    // A renewal pushes the expiry later: the armed timer fires first and re-arms.
    assert!(q.plan_timer(0, b"k", 5000).is_none());
    // A shorter lease needs an earlier timer: the old one is returned to be stopped.
    let (old, tag2) = q.plan_timer(0, b"k", 500).unwrap();
    assert_eq!(old.unwrap().id, 1);
    q.set_timer(
        0,
        b"k",
        ArmedTimer {
            id: 2,
            tag: tag2,
            fire_at: 500,
        },
    );
    assert!(q.fired(tag).is_none(), "the replaced timer is stale");
    assert_eq!(
        q.fired(tag2).map(|(db, k, f)| (db, k.to_vec(), f)),
        Some((0, b"k".to_vec(), Fired::Expiry))
    );
}

#[test]
fn it_remembers_a_granted_waiter_until_its_reply_goes_out() {
    let mut q = Queues::default();
    q.push(0, b"k", waiter(1), 10).unwrap();
    q.push(0, b"k", waiter(2), 10).unwrap();
    q.pop(0, b"k").unwrap();
    q.pop(0, b"k").unwrap();
    q.replied(Blocked(1));
    assert!(
        q.ungrant(Blocked(1)).is_none(),
        "told: nothing to take back"
    );
    let g = q.ungrant(Blocked(2)).unwrap();
    assert_eq!((g.db, &g.key[..]), (0, &b"k"[..]));
    assert_eq!(format!("{:?}", g.request), "Probe(2)");
    assert!(q.ungrant(Blocked(2)).is_none());
}

#[test]
fn it_drains_every_queue() {
    let mut q = Queues::default();
    q.push(0, b"a", waiter(1), 10).unwrap();
    q.push(3, b"b", waiter(2), 10).unwrap();
    let mut handles = q.drain().handles;
    handles.sort_by_key(|h| h.0);
    assert_eq!(handles, vec![Blocked(1), Blocked(2)]);
    assert_eq!((q.total(), q.keys_with_waiters()), (0, 0));
    assert!(q.remove(Blocked(1)).is_none());
}

#[test]
fn it_gives_back_its_indexes_memory_once_nobody_waits() {
    let mut q = Queues::default();
    for n in 1..=1000 {
        q.push(0, format!("k{n}").as_bytes(), waiter(n), 10)
            .unwrap();
    }
    assert!(q.by_handle.capacity() >= 1000);
    q.shrink_when_idle();
    assert!(q.by_handle.capacity() >= 1000, "not while anyone waits");
    for n in 1..=1000 {
        q.remove(Blocked(n));
        q.forget_if_empty(0, format!("k{n}").as_bytes());
    }
    q.shrink_when_idle();
    assert_eq!((q.by_handle.capacity(), q.dbs.capacity()), (0, 0));
}

fn ticket(n: usize, client: u64, deadline_at: i64) -> Waiter {
    Waiter {
        who: Who::Ticket(client).into(),
        deadline_at,
        ..Waiter::new(Rc::new(Probe(n)))
    }
}

fn probe_of(w: &Waiter) -> String {
    format!("{:?}", w.request)
}

#[test]
fn tickets_and_blocked_waiters_share_one_fifo() {
    let mut q = Queues::default();
    q.push(0, b"k", waiter(1), 100).unwrap();
    q.push(0, b"k", ticket(2, 7, 0), 100).unwrap();
    q.push(0, b"k", waiter(3), 100).unwrap();
    q.push(0, b"k", ticket(4, 8, 0), 100).unwrap();
    assert_eq!((q.total(), q.tickets(), q.len(0, b"k")), (4, 2, 4));
    let order: Vec<String> = std::iter::from_fn(|| q.pop(0, b"k").map(|w| probe_of(&w))).collect();
    assert_eq!(order, ["Probe(1)", "Probe(2)", "Probe(3)", "Probe(4)"]);
    assert_eq!((q.total(), q.tickets()), (0, 0));
    assert!(
        q.tickets_of.is_empty(),
        "per-connection counts go with their tickets"
    );
}

#[test]
fn a_closed_connection_takes_its_tickets_from_every_queue() {
    let mut q = Queues::default();
    q.push(0, b"a", ticket(1, 7, 0), 100).unwrap();
    q.push(0, b"a", ticket(2, 8, 0), 100).unwrap();
    q.push(0, b"a", ticket(3, 7, 0), 100).unwrap();
    q.push(2, b"b", waiter(4), 100).unwrap();
    q.push(2, b"b", ticket(5, 7, 0), 100).unwrap();
    let (dropped, heads) = q.drop_tickets_of(7);
    let mut names: Vec<String> = dropped.iter().map(|(_, _, w)| probe_of(w)).collect();
    names.sort();
    assert_eq!(names, ["Probe(1)", "Probe(3)", "Probe(5)"]);
    assert_eq!(
        heads
            .iter()
            .map(|(db, k)| (*db, k.to_vec()))
            .collect::<Vec<_>>(),
        vec![(0, b"a".to_vec())]
    );
    assert_eq!(
        (q.total(), q.tickets(), q.len(0, b"a"), q.len(2, b"b")),
        (2, 1, 1, 1)
    );
    assert_eq!(probe_of(q.head(0, b"a").unwrap()), "Probe(2)");
    assert!(
        q.drop_tickets_of(7).0.is_empty(),
        "a connection without tickets costs a lookup"
    );
    assert!(
        q.forget_if_empty(0, b"a").is_empty(),
        "ticket 2 still queues"
    );
}

#[test]
fn due_tickets_leave_in_deadline_order_and_the_timer_follows_the_earliest() {
    let mut q = Queues::default();
    q.push(0, b"k", ticket(1, 7, 300), 100).unwrap();
    q.push(0, b"k", ticket(2, 7, 100), 100).unwrap();
    q.push(0, b"k", ticket(3, 7, 0), 100).unwrap(); // no deadline
    q.push(0, b"k", ticket(4, 7, 200), 100).unwrap();
    let (old, tag, at) = q.plan_ticket_timer(0, b"k").unwrap();
    assert_eq!((old, at), (None, 100));
    q.set_ticket_timer(
        0,
        b"k",
        ArmedTimer {
            id: 1,
            tag,
            fire_at: at,
        },
    );
    assert!(
        q.plan_ticket_timer(0, b"k").is_none(),
        "the armed timer is the earliest"
    );
    assert_eq!(q.fired(tag).map(|(_, _, f)| f), Some(Fired::Tickets));
    let (due, head_left) = q.due_tickets(0, b"k", 200);
    assert_eq!(
        due.iter().map(probe_of).collect::<Vec<_>>(),
        ["Probe(2)", "Probe(4)"]
    );
    assert!(!head_left);
    // Ticket 1 leaves early (granted): its deadline entry is stale and skipped.
    assert_eq!(probe_of(&q.pop(0, b"k").unwrap()), "Probe(1)");
    assert!(
        q.plan_ticket_timer(0, b"k").is_none(),
        "ticket 3 has no deadline"
    );
    assert_eq!(q.due_tickets(0, b"k", 10_000).0.len(), 0);
    assert_eq!((q.len(0, b"k"), q.tickets()), (1, 1));
    let (due, head_left) = {
        q.push(0, b"k", ticket(5, 7, 50), 100).unwrap();
        q.pop(0, b"k"); // ticket 3 granted: ticket 5 is the head
        q.due_tickets(0, b"k", 60)
    };
    assert_eq!((due.len(), head_left), (1, true));
    assert_eq!(q.total(), 0);
}

#[test]
fn deadlines_of_tickets_granted_early_do_not_pile_up() {
    let mut q = Queues::default();
    q.push(0, b"k", ticket(0, 7, 1_000_000), 10_000).unwrap(); // stays queued
    for n in 1..=1000 {
        q.push(0, b"k", ticket(n, 7, 900_000 + n as i64), 10_000)
            .unwrap();
        // Granted right away (behind the first one: taken from the middle).
        let seq = q.queue(0, b"k").unwrap().waiters.back().unwrap().0;
        let queue = q.queue_mut(0, b"k").unwrap();
        let i = queue.position(seq).unwrap();
        queue.take_at(i).unwrap();
    }
    let queue = q.queue(0, b"k").unwrap();
    assert!(
        queue.ticket_deadlines.len() <= 2 * queue.live + 64,
        "{}",
        queue.ticket_deadlines.len()
    );
    assert_eq!(
        q.queue_mut(0, b"k").unwrap().next_ticket_deadline(),
        Some(1_000_000)
    );
}

#[test]
fn a_queue_slot_stays_small_and_who_round_trips() {
    // A queued ticket's slot: a request pointer, who (packed), its tag (a thin pointer to
    // the interned copy), a timer, a deadline.
    assert!(std::mem::size_of::<(u64, Option<Waiter>)>() <= 56);
    for who in [
        Who::Blocked(Blocked(0x7fff_1234_5678)),
        Who::Ticket(1),
        Who::Ticket(u32::MAX as u64 * 9),
    ] {
        assert_eq!(PackedWho::from(who).get(), who);
    }
}

#[test]
fn notify_tags_are_kept_once_and_dropped_once_no_ticket_holds_them() {
    let mut q = Queues::default();
    let a = q.intern_tag(b"c7f3a9e1");
    let b = q.intern_tag(b"c7f3a9e1");
    assert!(Rc::ptr_eq(&a, &b), "one copy per tag");
    assert_eq!(&a[..], b"c7f3a9e1");
    drop((a, b));
    // Thousands of short-lived tags: the map is swept as it doubles, never grows unbounded.
    let held = q.intern_tag(b"held");
    for n in 0..10_000 {
        let _ = q.intern_tag(format!("t{n}").as_bytes());
    }
    assert!(q.tags_kept() <= 2 * 64 + 2, "{}", q.tags_kept());
    assert!(
        Rc::ptr_eq(&held, &q.intern_tag(b"held")),
        "a held tag is kept"
    );
    q.shrink_when_idle();
    assert_eq!(q.tags_kept(), 0, "all dropped once nobody waits");
}

#[test]
fn holes_left_by_removals_are_dropped_and_order_is_kept() {
    let mut q = Queues::default();
    for n in 1..=200 {
        q.push(0, b"k", waiter(n), 1000).unwrap();
    }
    for n in (2..=200).step_by(2) {
        assert!(q.remove(Blocked(n)).is_some());
    }
    for n in (3..=199).step_by(4) {
        assert!(q.remove(Blocked(n)).is_some());
    }
    let queue = q.queue(0, b"k").unwrap();
    assert_eq!(queue.live, 50);
    assert!(
        queue.waiters.len() <= 2 * queue.live + 32,
        "holes compacted"
    );
    let order: Vec<usize> =
        std::iter::from_fn(|| q.pop(0, b"k").map(|w| w.handle().unwrap().0)).collect();
    assert_eq!(order, (1..=200).step_by(4).collect::<Vec<_>>());
    assert!(q.remove(Blocked(1)).is_none());
}

#[test]
fn grants_are_uncollected_until_collected_or_their_connections_grace_ends() {
    let mut q = Queues::default();
    let untold = |n| Untold {
        db: 0,
        key: Rc::from(&b"k"[..]),
        request: Rc::new(Probe(n)) as Request,
    };
    q.granted_ticket(7, b"r1", untold(1), 1000, 60_000);
    q.granted_ticket(7, b"r2", untold(2), 1000, 60_000);
    q.granted_ticket(7, b"r4", untold(4), 1000, 60_000);
    q.granted_ticket(8, b"r3", untold(3), 1000, 60_000);
    q.collected(b"r1");
    assert!(q.orphan_grants_of(7, 2000));
    assert!(
        !q.orphan_grants_of(7, 3000),
        "the first close's time stands"
    );
    assert!(!q.orphan_grants_of(9, 2000), "a connection without grants");
    // Not due before the grace ends; a confirmation within it keeps the grant.
    assert_eq!(q.due_take_backs(1999).0.len(), 0);
    assert_eq!(q.due_take_backs(1999).1, Some(2000));
    q.collected(b"r4");
    let (due, next) = q.due_take_backs(2000);
    let back: Vec<String> = due
        .iter()
        .map(|(k, u)| format!("{}={:?}", String::from_utf8_lossy(k), u.request))
        .collect();
    assert_eq!(back, ["r2=Probe(2)"]);
    assert_eq!(next, None, "connection 8's grant is not orphaned");
    assert_eq!(q.uncollected.len(), 1);
}
