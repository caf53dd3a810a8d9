//! Connections: where the locks live (one server or a cluster), the pools of waiting
//! connections, and the queued-ticket connection that all waiting calls of a client
//! share (design.md 5), one per node on a cluster.

pub(crate) mod cluster_tickets;
pub(crate) mod conn;
pub(crate) mod tickets;
