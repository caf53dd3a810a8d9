// Mutex: the re-entrant lock (RLOCK.*), named as in go-redsync/redsync.

package rlock

import (
	"context"
	"time"

	"github.com/rlock/rlock/clients/go/internal/proto"
)

// LockOption configures one lock handle.
type LockOption func(*lockOptions)

type lockOptions struct {
	lease   time.Duration
	tryWait time.Duration
	owner   string
}

// WithLease gives the lock a fixed lease: it is not renewed, Extend re-arms it, and it
// counts as lost when the lease ends while held. Without it the watchdog renews the
// lock for as long as it is held.
func WithLease(d time.Duration) LockOption { return func(o *lockOptions) { o.lease = d } }

// WithWaitLimit makes TryLock wait up to d for the lock, queued in the server, before
// failing with ErrTimeout (default: no wait, ErrTaken).
func WithWaitLimit(d time.Duration) LockOption { return func(o *lockOptions) { o.tryWait = d } }

// WithOwner sets the handle's owner id (default `<client id>:<n>`, a fresh one per
// handle). Two handles with one owner id are one owner to the server.
func WithOwner(owner string) LockOption { return func(o *lockOptions) { o.owner = owner } }

func (c *Client) lockOpts(opts []LockOption) lockOptions {
	var o lockOptions
	for _, f := range opts {
		f(&o)
	}
	if o.owner == "" {
		o.owner = c.newOwner()
	}
	return o
}

// Mutex is a distributed re-entrant lock on one name. A Mutex is one owner: locking it
// again while held re-enters (each Lock needs its Unlock); two Mutexes on one name
// exclude each other, in one process or many. It is safe for concurrent use, and its
// goroutines share its holds.
type Mutex struct {
	h *hold
}

// NewMutex makes a lock handle on name.
func (c *Client) NewMutex(name string, opts ...LockOption) *Mutex {
	o := c.lockOpts(opts)
	w := proto.Hold{Key: name, Owner: o.owner, Prefix: "RLOCK"}
	return &Mutex{h: newHold(c, w, o.lease, o.tryWait)}
}

// Name is the lock's key.
func (m *Mutex) Name() string { return m.h.words.Key }

// Owner is the handle's owner id.
func (m *Mutex) Owner() string { return m.h.words.Owner }

// Lock takes the lock, waiting in the server's queue without limit.
func (m *Mutex) Lock() error { return m.LockContext(context.Background()) }

// LockContext takes the lock, waiting in the server's queue until it is granted or ctx
// ends (then ctx's error; the queued ticket is withdrawn, and a grant that comes anyway
// is given back).
func (m *Mutex) LockContext(ctx context.Context) error {
	return m.h.acquire(ctx, "lock", 0, true)
}

// TryLock takes the lock if it is free (ErrTaken otherwise), or with WithWaitLimit
// waits up to that limit (ErrTimeout).
func (m *Mutex) TryLock() error { return m.TryLockContext(context.Background()) }

// TryLockContext is TryLock bounded by ctx.
func (m *Mutex) TryLockContext(ctx context.Context) error {
	if m.h.tryWait > 0 {
		return m.h.acquire(ctx, "trylock", m.h.tryWait, false)
	}
	return m.h.acquire(ctx, "trylock", -1, false)
}

// Unlock gives back one hold; it reports true when that was the last one and the lock
// is free (or handed to the next waiter). ErrNotHeld when the handle holds nothing,
// ErrLost when the lock was lost while held.
func (m *Mutex) Unlock() (bool, error) { return m.UnlockContext(context.Background()) }

// UnlockContext is Unlock bounded by ctx.
func (m *Mutex) UnlockContext(ctx context.Context) (bool, error) { return m.h.release(ctx, "unlock") }

// Extend re-arms the lease to its full length (the fixed lease, or the watchdog's).
func (m *Mutex) Extend() (bool, error) { return m.ExtendContext(context.Background()) }

// ExtendContext is Extend bounded by ctx.
func (m *Mutex) ExtendContext(ctx context.Context) (bool, error) { return m.h.extend(ctx) }

// Held is the number of holds this handle has (0: not held).
func (m *Mutex) Held() int { return m.h.held() }

// Done is closed when the current hold ends: released, or lost (Err says which). Before
// the first Lock it is already closed.
func (m *Mutex) Done() <-chan struct{} { return m.h.doneChan() }

// Err is nil while the lock is held, ErrLost after it was lost, ErrNotHeld otherwise.
func (m *Mutex) Err() error { return m.h.errNow() }

// ForceUnlock frees the lock whoever holds it (Redisson's forceUnlock); true if a lock
// was freed. On a side of an RWMutex it frees the lock only in that side's mode.
func (m *Mutex) ForceUnlock(ctx context.Context) (bool, error) {
	args := proto.ForceRelease(m.h.words.Prefix, m.Name())
	if m.h.words.Side != "" {
		args = append(args, m.h.words.Side)
	}
	v, err := m.h.c.doRetry(ctx, args)
	if err != nil {
		return false, opErr("forceunlock", m.Name(), err)
	}
	return proto.ParseBool("FORCERELEASE", v)
}

// LockInfo is what the server says about a lock.
type LockInfo = proto.LockInfo

// Info reads the lock's owners, remaining lease and queued waiters (nil: not held).
func (m *Mutex) Info(ctx context.Context) (*LockInfo, error) {
	v, err := m.h.c.do(ctx, proto.Info(m.h.words.Prefix, m.Name()))
	if err != nil {
		return nil, opErr("info", m.Name(), err)
	}
	return proto.ParseInfo(v)
}
