//! Scripts mode's subscriber connections: one per client, or on a cluster with sharded
//! pub/sub one per node (docs/scripts-mode.md).
//!
//! Redisson waits without the module by subscribing the primitive's channel and sleeping
//! until a message or the holder's lease end; every wait of one client shares one
//! subscriber connection. [`Subscriber`] is that connection, opened at the first wait: a
//! task reads it and wakes the waiters of a channel when a message comes. As in Redisson
//! (LockPubSub), a lock's unlock message (`0`) wakes one waiter of the client, and is kept
//! for the next if none is asleep (a waiter between two tries must not miss it: tokio's
//! `Notify::notify_one` stores that permit); every other message wakes all. A channel is
//! unsubscribed after its last waiter leaves ([`Subscription`]'s drop), by a task that
//! takes the sink's lock and only then looks whether the channel is still unused: a new
//! waiter either counted itself first (the channel stays) or finds the channel gone and
//! subscribes again behind the `UNSUBSCRIBE` on the same lock, so no waiter is left on a
//! channel the server no longer sends it. If the connection breaks, every
//! waiter is woken (a release may have been missed), subscribes again on a new connection
//! and tries again; the client is told (`on_break`: the mode is asked again, since a
//! failover may have brought a server with the module).
//!
//! On a Redis Cluster with sharded pub/sub (Redis 7+, Valkey), where the scripts publish
//! with `SPUBLISH` as Redisson 4.7 does, [`Subscribers`] keeps one such connection per
//! node (RESP3, `SSUBSCRIBE` one channel at a time: the node serving the channel's slot
//! hears it) and routes each channel to its node with a slot map read with `CLUSTER
//! SLOTS` and corrected by every `MOVED`. When a slot leaves a node, the node ends its
//! shard channels' subscriptions (a `sunsubscribe` push): their waiters are woken as by a
//! break, subscribe again, follow the `MOVED` to the slot's new owner, and try again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::{ConnectionLike, MultiplexedConnection, PubSubSink, PubSubStream};
use redis::{ConnectionAddr, ConnectionInfo, PushInfo, PushKind, RedisError, RedisResult, Value};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::Notify;

use crate::error::poisons_connection;
use crate::net::cluster_tickets::{moved, parse_slots, slots_cmd, SlotMap};
use crate::proto::logic::lock_ignoring_poison;
use crate::proto::scripts::wakes_one;

/// The name a sharded subscriber connection gives itself (CLIENT LIST shows it).
pub(crate) const SUBSCRIBER_NAME: &str = "rlock-rs-subscriber";

/// How long a sharded subscriber's connect and each `SSUBSCRIBE` may take.
const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Attempts of one cluster subscribe (each `MOVED`, `ASK` or failed connect is one).
const ROUTE_ATTEMPTS: u32 = 6;

/// What a waiter heard: something (a message, or its time is up), or a broken connection.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Heard {
    Something,
    Broken,
}

/// One channel's waiters: how many messages (and breaks) were heard, and their wake-ups.
#[derive(Default)]
struct Waiters {
    events: std::sync::atomic::AtomicU64,
    notify: Notify,
}

impl Waiters {
    fn wake_all(&self) {
        self.events
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.notify.notify_waiters();
    }
}

struct Chan {
    refs: usize,
    // The connection generation this channel was subscribed on (0: none yet).
    on_gen: u64,
    waiters: Arc<Waiters>,
}

#[derive(Default)]
struct State {
    chans: HashMap<Vec<u8>, Chan>,
    // The current connection's generation; bumped on each connect and each break, so a
    // waiter can tell that the connection it subscribed on is gone.
    gen: u64,
    connected: bool,
    reader: Option<tokio::task::AbortHandle>,
}

/// The writing side of a subscriber connection: classic (a RESP2 pub/sub connection) or
/// sharded (a RESP3 connection whose pushes go to the reader).
enum Sink {
    Classic(PubSubSink),
    Sharded(MultiplexedConnection),
}

impl Sink {
    async fn subscribe(&mut self, channel: &[u8]) -> RedisResult<()> {
        match self {
            Sink::Classic(s) => s.subscribe(channel).await,
            Sink::Sharded(c) => {
                let r: Value = redis::cmd("SSUBSCRIBE").arg(channel).query_async(c).await?;
                // The confirmation, unless an unasked `sunsubscribe` (a slot that left
                // the node) was taken for it: then replies and commands no longer pair
                // up, and the connection must go.
                match &r {
                    Value::Push {
                        kind: PushKind::SSubscribe,
                        data,
                    } if matches!(data.first(), Some(Value::BulkString(c)) if c == channel) => {
                        Ok(())
                    }
                    _ => Err(RedisError::from(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("rlock: SSUBSCRIBE answered {r:?}"),
                    ))),
                }
            }
        }
    }

    async fn unsubscribe(&mut self, channel: &[u8]) -> RedisResult<()> {
        match self {
            Sink::Classic(s) => s.unsubscribe(channel).await,
            Sink::Sharded(c) => redis::cmd("SUNSUBSCRIBE")
                .arg(channel)
                .query_async::<Value>(c)
                .await
                .map(drop),
        }
    }
}

/// What the reader hears.
enum Event {
    Message(Vec<u8>, Vec<u8>),
    // The server ended the channel's subscription (its slot left the node).
    Lost(Vec<u8>),
}

/// The reading side of a subscriber connection.
enum Source {
    Classic(PubSubStream),
    Sharded(UnboundedReceiver<PushInfo>),
}

impl Source {
    /// The next event; None when the connection broke.
    async fn next(&mut self) -> Option<Event> {
        match self {
            Source::Classic(s) => {
                let msg = s.next().await?;
                let channel: Vec<u8> = msg.get_channel().unwrap_or_default();
                Some(Event::Message(channel, msg.get_payload_bytes().to_vec()))
            }
            Source::Sharded(rx) => loop {
                let PushInfo { kind, data } = rx.recv().await?;
                let bytes = |i: usize| match data.get(i) {
                    Some(Value::BulkString(b)) => b.clone(),
                    _ => Vec::new(),
                };
                match kind {
                    PushKind::SMessage | PushKind::Message => {
                        return Some(Event::Message(bytes(0), bytes(1)))
                    }
                    PushKind::SUnsubscribe => return Some(Event::Lost(bytes(0))),
                    PushKind::Disconnection => return None,
                    _ => {}
                }
            },
        }
    }
}

struct Inner {
    client: Option<redis::Client>,
    // SSUBSCRIBE on a RESP3 connection (a cluster node) rather than SUBSCRIBE.
    sharded: bool,
    on_break: Box<dyn Fn() + Send + Sync>,
    state: Mutex<State>,
    // Held across every SUBSCRIBE/UNSUBSCRIBE, so that they reach the server in the order
    // the channel counts changed.
    sink: tokio::sync::Mutex<Option<(u64, Sink)>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(r) = lock_ignoring_poison(&self.state).reader.take() {
            r.abort();
        }
    }
}

/// The subscriber connection of one client to one server: a single server, a cluster
/// without sharded pub/sub (the node it was given: classic pub/sub reaches every node's
/// subscribers), or one cluster node (`sharded`).
#[derive(Clone)]
pub(crate) struct Subscriber {
    inner: Arc<Inner>,
}

impl Subscriber {
    /// `on_break` runs when the connection breaks.
    pub(crate) fn new(
        client: Option<redis::Client>,
        sharded: bool,
        on_break: impl Fn() + Send + Sync + 'static,
    ) -> Self {
        Subscriber {
            inner: Arc::new(Inner {
                client,
                sharded,
                on_break: Box::new(on_break),
                state: Mutex::new(State::default()),
                sink: tokio::sync::Mutex::new(None),
            }),
        }
    }

    /// A confirmed subscription to `channel`: once this returns, no message published on
    /// it is missed.
    pub(crate) async fn subscribe(&self, channel: &[u8]) -> RedisResult<Subscription> {
        let waiters = {
            let mut st = lock_ignoring_poison(&self.inner.state);
            let chan = st.chans.entry(channel.to_vec()).or_insert_with(|| Chan {
                refs: 0,
                on_gen: 0,
                waiters: Arc::default(),
            });
            chan.refs += 1;
            chan.waiters.clone()
        };
        // From here the count is the subscription's: its drop gives it back.
        let mut sub = Subscription {
            inner: self.inner.clone(),
            channel: channel.to_vec(),
            waiters,
            gen: 0,
        };
        let mut sink = self.inner.sink.lock().await;
        if sink.is_none() {
            *sink = Some(self.connect().await?);
        }
        let (gen, s) = sink.as_mut().expect("connected above");
        let gen = *gen;
        let done = {
            let st = lock_ignoring_poison(&self.inner.state);
            st.chans.get(channel).is_some_and(|c| c.on_gen == gen)
        };
        if !done {
            if let Err(e) = s.subscribe(channel).await {
                // A refusal (a `MOVED`) leaves the connection sound.
                if poisons_connection(&e) || e.code().is_none() {
                    *sink = None;
                }
                return Err(e);
            }
            if let Some(c) = lock_ignoring_poison(&self.inner.state)
                .chans
                .get_mut(channel)
            {
                c.on_gen = gen;
            }
        }
        sub.gen = gen;
        Ok(sub)
    }

    /// Under the sink's lock: a new connection and its reader task.
    async fn connect(&self) -> RedisResult<(u64, Sink)> {
        let client = self.inner.client.as_ref().ok_or_else(no_nodes)?;
        let (sink, mut source) = if self.inner.sharded {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            let cfg = redis::AsyncConnectionConfig::new()
                .set_push_sender(tx)
                .set_connection_timeout(Some(SUBSCRIBE_TIMEOUT))
                .set_response_timeout(Some(SUBSCRIBE_TIMEOUT));
            let mut conn = client
                .get_multiplexed_async_connection_with_config(&cfg)
                .await?;
            // A name for CLIENT LIST; a server refusing it changes nothing.
            let _ = redis::cmd("CLIENT")
                .arg("SETNAME")
                .arg(SUBSCRIBER_NAME)
                .query_async::<Value>(&mut conn)
                .await;
            (Sink::Sharded(conn), Source::Sharded(rx))
        } else {
            let (sink, stream) = client.get_async_pubsub().await?.split();
            (Sink::Classic(sink), Source::Classic(stream))
        };
        let gen = {
            let mut st = lock_ignoring_poison(&self.inner.state);
            st.gen += 1;
            st.connected = true;
            st.gen
        };
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        let reader = tokio::spawn(async move {
            while let Some(event) = source.next().await {
                let Some(inner) = weak.upgrade() else { return };
                match event {
                    Event::Message(channel, payload) => {
                        let waiters = {
                            let st = lock_ignoring_poison(&inner.state);
                            st.chans.get(&channel).map(|c| c.waiters.clone())
                        };
                        if let Some(w) = waiters {
                            if wakes_one(&channel, &payload) {
                                w.notify.notify_one();
                            } else {
                                w.wake_all();
                            }
                        }
                    }
                    Event::Lost(channel) => {
                        // Subscribed no more: its waiters subscribe again (where the slot
                        // went) and try. (Our own SUNSUBSCRIBE's confirmation finds the
                        // channel gone, or not yet subscribed again.)
                        let waiters = {
                            let mut st = lock_ignoring_poison(&inner.state);
                            st.chans
                                .get_mut(&channel)
                                .filter(|c| c.on_gen == gen)
                                .map(|c| {
                                    c.on_gen = 0;
                                    c.waiters.clone()
                                })
                        };
                        if let Some(w) = waiters {
                            w.wake_all();
                        }
                    }
                }
            }
            // The connection broke: wake everyone (each subscribes again and tries).
            let Some(inner) = weak.upgrade() else { return };
            let woken: Vec<Arc<Waiters>> = {
                let mut st = lock_ignoring_poison(&inner.state);
                if st.gen == gen {
                    st.gen += 1;
                    st.connected = false;
                }
                st.chans.values().map(|c| c.waiters.clone()).collect()
            };
            {
                let mut sink = inner.sink.lock().await;
                if sink.as_ref().is_some_and(|(g, _)| *g == gen) {
                    *sink = None;
                }
            }
            for w in woken {
                w.wake_all();
            }
            (inner.on_break)();
        });
        if let Some(old) = lock_ignoring_poison(&self.inner.state)
            .reader
            .replace(reader.abort_handle())
        {
            old.abort();
        }
        Ok((gen, sink))
    }
}

/// One waiter's hold on a channel; dropping the last one unsubscribes the channel (see
/// the module's comment).
pub(crate) struct Subscription {
    inner: Arc<Inner>,
    channel: Vec<u8>,
    waiters: Arc<Waiters>,
    gen: u64,
}

impl Subscription {
    /// What has been heard so far: give it to [`listen`](Self::listen) after a try, so
    /// that a message heard during the try is not waited for again.
    pub(crate) fn mark(&self) -> u64 {
        self.waiters
            .events
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    fn broken(&self) -> bool {
        let st = lock_ignoring_poison(&self.inner.state);
        st.gen != self.gen
            || !st.connected
            || st
                .chans
                .get(&self.channel)
                .is_none_or(|c| c.on_gen != self.gen)
    }

    /// Sleeps until a message on the channel since `seen`, a wake-one message for this
    /// waiter, `sleep` passes (None: no limit), or the connection breaks.
    pub(crate) async fn listen(&self, seen: u64, sleep: Option<Duration>) -> Heard {
        let notified = self.waiters.notify.notified();
        tokio::pin!(notified);
        // Registered before the look, so that a message between the look and the sleep
        // still wakes it (a stored wake-one permit is taken here).
        notified.as_mut().enable();
        if self.broken() {
            return Heard::Broken;
        }
        if self.mark() == seen {
            match sleep {
                Some(d) => {
                    let _ = tokio::time::timeout(d, notified).await;
                }
                None => notified.await,
            }
        }
        if self.broken() {
            Heard::Broken
        } else {
            Heard::Something
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let last = {
            let mut st = lock_ignoring_poison(&self.inner.state);
            st.chans.get_mut(&self.channel).is_some_and(|c| {
                c.refs = c.refs.saturating_sub(1);
                c.refs == 0
            })
        };
        // Outside a runtime (a future dropped elsewhere) the channel stays subscribed
        // until a later waiter of it leaves: harmless, as before.
        if let (true, Ok(rt)) = (last, tokio::runtime::Handle::try_current()) {
            let (inner, channel) = (self.inner.clone(), std::mem::take(&mut self.channel));
            rt.spawn(unsubscribe_idle(inner, channel));
        }
    }
}

/// Unsubscribes `channel` if it still has no waiter, deciding under the sink's lock (see
/// the module's comment): a subscribe counted after the decision finds the channel gone
/// and sends its `SUBSCRIBE` after this `UNSUBSCRIBE`, on the same lock.
async fn unsubscribe_idle(inner: Arc<Inner>, channel: Vec<u8>) {
    let mut sink = inner.sink.lock().await;
    let on_gen = {
        let mut st = lock_ignoring_poison(&inner.state);
        match st.chans.get(&channel) {
            Some(c) if c.refs == 0 => {}
            _ => return,
        }
        st.chans.remove(&channel).map_or(0, |c| c.on_gen)
    };
    if let Some((gen, s)) = sink.as_mut() {
        if *gen == on_gen {
            if let Err(e) = s.unsubscribe(&channel).await {
                // A refusal (the slot's node changed) leaves the connection sound.
                if poisons_connection(&e) || e.code().is_none() {
                    *sink = None;
                }
            }
        }
    }
}

fn no_nodes() -> RedisError {
    RedisError::from((
        redis::ErrorKind::InvalidClientConfig,
        "scripts mode waits on a subscriber connection: open the cluster client with \
         Client::open_cluster (a redis-rs ClusterClient does not tell its nodes)",
    ))
}

/// Scripts mode's subscriber connections of one client: the one connection of a single
/// server or of a cluster without sharded pub/sub, or on a cluster with it, one per node
/// that has waiters (see the module's comment).
pub(crate) struct Subscribers {
    one: Subscriber,
    // A cluster's: the settings of its nodes (their address replaced per node), None for
    // a single server.
    nodes: Option<Nodes>,
}

struct Nodes {
    template: Option<ConnectionInfo>,
    on_break: Arc<dyn Fn() + Send + Sync>,
    map: Mutex<SlotMap>,
    subs: Mutex<std::collections::HashMap<(String, u16), Subscriber>>,
}

impl Subscribers {
    /// A single server's (`cluster` false) or a cluster's subscribers; `template`: the
    /// settings of a node (None: a cluster client given as a redis-rs ClusterClient,
    /// whose scripts-mode waits then fail, saying so).
    pub(crate) fn new(
        single: Option<redis::Client>,
        cluster: bool,
        template: Option<ConnectionInfo>,
        on_break: impl Fn() + Send + Sync + 'static,
    ) -> Self {
        let on_break: Arc<dyn Fn() + Send + Sync> = Arc::new(on_break);
        let ob = on_break.clone();
        let one_client = match (&single, &template) {
            (Some(c), _) => Some(c.clone()),
            (None, Some(t)) => redis::Client::open(t.clone()).ok(),
            (None, None) => None,
        };
        Subscribers {
            one: Subscriber::new(one_client, false, move || ob()),
            nodes: cluster.then(|| Nodes {
                template,
                on_break,
                map: Mutex::new(SlotMap::default()),
                subs: Mutex::new(Default::default()),
            }),
        }
    }

    /// A confirmed subscription to `channel` (see [`Subscriber::subscribe`]): with
    /// `sharded` on a cluster, an `SSUBSCRIBE` on the connection of the node serving the
    /// channel's slot, found with `CLUSTER SLOTS` on `conn` when not known, and moved
    /// to where a `MOVED` points.
    pub(crate) async fn subscribe<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        channel: &[u8],
        sharded: bool,
    ) -> RedisResult<Subscription> {
        let nodes = match &self.nodes {
            Some(n) if sharded => n,
            _ => return self.one.subscribe(channel).await,
        };
        let slot = crate::proto::watchdog::slot(channel);
        let mut last = None;
        for attempt in 0..ROUTE_ATTEMPTS {
            let known = lock_ignoring_poison(&nodes.map).node(slot);
            let addr = match known {
                Some(a) => a,
                None => {
                    let v: Value = slots_cmd().query_async(conn).await?;
                    let mut map = lock_ignoring_poison(&nodes.map);
                    for (lo, hi, addr) in parse_slots(&v) {
                        map.set(lo, hi, addr);
                    }
                    map.node(slot).ok_or_else(|| {
                        RedisError::from((
                            redis::ErrorKind::Client,
                            "rlock: CLUSTER SLOTS names no node for the channel's slot",
                        ))
                    })?
                }
            };
            let sub = nodes.subscriber(&addr)?;
            let e = match sub.subscribe(channel).await {
                Ok(s) => return Ok(s),
                Err(e) => e,
            };
            match e.code() {
                Some("MOVED") => {
                    if let Some((s, to)) = moved(&e) {
                        lock_ignoring_poison(&nodes.map).set(s, s, to);
                    }
                }
                // Half-way through a migration: the old owner serves the channel until
                // the slot is handed over.
                Some("ASK") | Some("TRYAGAIN") | Some("CLUSTERDOWN") => {
                    tokio::time::sleep(Duration::from_millis(20 << attempt)).await
                }
                Some(_) => return Err(e),
                None => {
                    // The node cannot be reached (a failover): read the map again.
                    *lock_ignoring_poison(&nodes.map) = SlotMap::default();
                    tokio::time::sleep(Duration::from_millis(20 << attempt)).await;
                }
            }
            last = Some(e);
        }
        Err(last.unwrap_or_else(no_nodes))
    }
}

impl Nodes {
    /// The sharded subscriber of node `addr`, made if new.
    fn subscriber(&self, addr: &(String, u16)) -> RedisResult<Subscriber> {
        let mut subs = lock_ignoring_poison(&self.subs);
        if let Some(s) = subs.get(addr) {
            return Ok(s.clone());
        }
        let info = self
            .template
            .clone()
            .ok_or_else(no_nodes)?
            .set_addr(ConnectionAddr::Tcp(addr.0.clone(), addr.1));
        let resp3 = info
            .redis_settings()
            .clone()
            .set_protocol(redis::ProtocolVersion::RESP3);
        let client = redis::Client::open(info.set_redis_settings(resp3))?;
        let ob = self.on_break.clone();
        let s = Subscriber::new(Some(client), true, move || ob());
        subs.insert(addr.clone(), s.clone());
        Ok(s)
    }
}
