// RWMutex: the read-write lock (RRWLOCK.*; Redisson's RReadWriteLock).

package rlock

import (
	"context"

	"github.com/rlock/rlock/clients/go/internal/proto"
)

// RWMutex is a distributed read-write lock: many readers or one writer, both
// re-entrant, and the writer may also read. Its two sides are Mutexes with the whole
// Mutex API (Lock, TryLock, Unlock, Extend, Done, ...), one owner for both. A queued
// writer is served before readers that came after it (no writer starvation); every read
// hold has its own lease.
type RWMutex struct {
	read, write *Mutex
}

// NewRWMutex makes a read-write lock handle on name.
func (c *Client) NewRWMutex(name string, opts ...LockOption) *RWMutex {
	o := c.lockOpts(opts)
	side := func(s string) *Mutex {
		w := proto.Hold{Key: name, Owner: o.owner, Prefix: "RRWLOCK", Side: s}
		return &Mutex{h: newHold(c, w, o.lease, o.tryWait)}
	}
	return &RWMutex{read: side("READ"), write: side("WRITE")}
}

// Reader is the read side. A reader asking for the write side of a lock it reads gets
// an error at once instead of waiting on itself forever.
func (rw *RWMutex) Reader() *Mutex { return rw.read }

// Writer is the write side.
func (rw *RWMutex) Writer() *Mutex { return rw.write }

// RLock takes a read hold, waiting until granted or ctx ends.
func (rw *RWMutex) RLock(ctx context.Context) error { return rw.read.LockContext(ctx) }

// RUnlock gives back a read hold.
func (rw *RWMutex) RUnlock(ctx context.Context) (bool, error) { return rw.read.UnlockContext(ctx) }

// Lock takes the write hold, waiting until granted or ctx ends.
func (rw *RWMutex) Lock(ctx context.Context) error { return rw.write.LockContext(ctx) }

// Unlock gives back a write hold.
func (rw *RWMutex) Unlock(ctx context.Context) (bool, error) { return rw.write.UnlockContext(ctx) }
