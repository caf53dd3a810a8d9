//! The waiting engine: clients waiting in the server, and the handoff that serves them.
//!
//! Layer: below the commands and the pipeline, above `server` (`store`, `tracking`,
//! `cluster`, `stats`, `ffi`); `events.rs` here translates keyspace and server events
//! into engine calls. It imports no primitive: what it must know of one comes through
//! the [`Ask`] of a queued request, or the [`Owed`] of a tracked key (`pending.rs`).
//!
//! Each key with waiters has one FIFO queue, whatever primitive its waiters ask for (a
//! [`Request`]). When the key may have changed, [`serve`] asks the head's primitive
//! "can the head be granted in this state, and with what plan?" and keeps granting heads
//! until the answer is no (the lock grants at most one). A granted waiter is answered in
//! the same event-loop turn, so nobody else ever sees the lock free (strict first come,
//! first served, no thundering herd of pub/sub wake-ups).
//!
//! Written once here for every primitive: blocking, deadline timers, expiry timers,
//! disconnects, grants taken back from clients that vanished untold, cluster redirection,
//! and the pending list that serves keys freed by DEL, expiry, overwrite, FLUSH or SWAPDB
//! once the cause has propagated (a post-notification job, or a zero-delay timer on 7.0;
//! see events.rs for why the handoff is not written from inside the notification).
//!
//! [`Queues`] is the bookkeeping, pure and unit-tested; the functions below it are the
//! glue that blocks clients, arms timers and performs handoffs.

pub mod events;
pub mod ticket;

mod pending;
mod queues;
mod request;
mod serve;
mod turns;

pub use pending::*;
pub use queues::*;
pub use request::*;
pub use serve::*;
pub use turns::{open_script_turn, turn_left, Turns};

use std::cell::{Cell, RefCell};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::rc::Rc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;

use redis_module::{Context, ContextFlags, RedisString};

use crate::server::cluster;
use crate::server::ffi::{self, Blocked, TimerId, Wake};
use crate::server::stats;
use crate::server::store;
use crate::server::tracking;
use crate::vocab::args;
use crate::vocab::errors::{ERR_INTERNAL, ERR_TOO_MANY_WAITERS};
use crate::vocab::reply::Reply;
