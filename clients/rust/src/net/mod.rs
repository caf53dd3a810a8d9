//! Connections: where the locks live (one server or a cluster), the pools of waiting
//! connections, and the queued-ticket connection that all waiting calls of a client
//! share (design.md 5), one per node on a cluster; without the module, Redisson's scripts
//! (`scripts`) and the one subscriber connection all waits share, one per node on a
//! cluster with sharded pub/sub (`pubsub`).

pub(crate) mod cluster_tickets;
pub(crate) mod conn;
pub(crate) mod pubsub;
pub(crate) mod scripts;
pub(crate) mod tickets;
