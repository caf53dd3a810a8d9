// Package rlock is the Go client of rlock, a Redis module that implements Redisson's
// locks and synchronizers natively inside the server: a re-entrant lock (Mutex), a
// fenced lock, a read-write lock, a semaphore, a permit-expirable semaphore, a countdown
// latch, and MultiLock / RedLock over several of them.
//
// It runs on github.com/redis/go-redis/v9 (a *redis.Client or a *redis.ClusterClient).
// Waiting happens in the server, first come first served: a waiting call queues a
// ticket (`WAIT t ASYNC ID id`) and hears its grant on one notification connection per
// client (per node in a cluster), so a process holds a constant number of connections
// however many goroutines wait.
//
// The names follow go-redsync/redsync where they mean the same thing (NewMutex, Lock,
// LockContext, TryLock, Unlock, Extend); what redsync cannot say is said with sentinel
// errors (ErrTaken, ErrTimeout, ErrNotHeld, ErrLost) and a lost-lock signal (Done, Err).
//
// Layout: package rlock holds the I/O (client.go, tickets.go for waiting, hold.go for the
// acquire/release/renew engine every owned hold shares) and one file per primitive;
// internal/proto holds the wire protocol with no I/O; internal/testserver starts real
// module-loaded servers for the tests. Scripts mode (scripts.go: Redisson's Lua scripts on
// a server without the module, chosen by Mode) does the lock so far.
package rlock
