//! Scripts mode's one subscriber connection per client (docs/scripts-mode.md).
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

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::PubSubSink;
use redis::RedisResult;
use tokio::sync::Notify;

use crate::proto::logic::lock_ignoring_poison;
use crate::proto::scripts::wakes_one;

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

struct Inner {
    client: Option<redis::Client>,
    on_break: Box<dyn Fn() + Send + Sync>,
    state: Mutex<State>,
    // Held across every SUBSCRIBE/UNSUBSCRIBE, so that they reach the server in the order
    // the channel counts changed.
    sink: tokio::sync::Mutex<Option<(u64, PubSubSink)>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(r) = lock_ignoring_poison(&self.state).reader.take() {
            r.abort();
        }
    }
}

/// The subscriber connection of one client (one server; on a cluster, the node it was
/// given: classic pub/sub reaches every node's subscribers).
#[derive(Clone)]
pub(crate) struct Subscriber {
    inner: Arc<Inner>,
}

impl Subscriber {
    /// `on_break` runs when the connection breaks.
    pub(crate) fn new(
        client: Option<redis::Client>,
        on_break: impl Fn() + Send + Sync + 'static,
    ) -> Self {
        Subscriber {
            inner: Arc::new(Inner {
                client,
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
                *sink = None;
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
    async fn connect(&self) -> RedisResult<(u64, PubSubSink)> {
        let client = self.inner.client.as_ref().ok_or_else(|| {
            redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "scripts mode waits on a subscriber connection: open the cluster client with \
                 Client::open_cluster (a redis-rs ClusterClient does not tell its nodes)",
            ))
        })?;
        let pubsub = client.get_async_pubsub().await?;
        let (sink, mut stream) = pubsub.split();
        let gen = {
            let mut st = lock_ignoring_poison(&self.inner.state);
            st.gen += 1;
            st.connected = true;
            st.gen
        };
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        let reader = tokio::spawn(async move {
            while let Some(msg) = stream.next().await {
                let Some(inner) = weak.upgrade() else { return };
                let channel: Vec<u8> = msg.get_channel().unwrap_or_default();
                let waiters = {
                    let st = lock_ignoring_poison(&inner.state);
                    st.chans.get(&channel).map(|c| c.waiters.clone())
                };
                if let Some(w) = waiters {
                    if wakes_one(&channel, msg.get_payload_bytes()) {
                        w.notify.notify_one();
                    } else {
                        w.wake_all();
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
        st.gen != self.gen || !st.connected
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
        if *gen == on_gen && s.unsubscribe(&channel).await.is_err() {
            *sink = None;
        }
    }
}
