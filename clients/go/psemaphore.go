// PermitSemaphore: permits with ids and leases (RPSEMAPHORE.*; Redisson's
// RPermitExpirableSemaphore).

package rlock

import (
	"context"
	"sync"
	"time"

	"github.com/rlock/rlock/clients/go/internal/proto"
)

// PermitSemaphore is a distributed semaphore whose permits have ids and leases: a permit
// whose lease ends goes back to the pool at that moment (a module timer hands it to the
// next waiter), so a holder that dies leaks nothing. A permit taken without a lease is
// renewed by the client's watchdog while it is held.
type PermitSemaphore struct {
	c   *Client
	key string
	// seen: what this handle's last waiting acquire found (proto.StartWait).
	seen proto.Contention
}

// NewPermitSemaphore makes a permit-expirable semaphore handle on name.
func (c *Client) NewPermitSemaphore(name string) *PermitSemaphore {
	return &PermitSemaphore{c: c, key: name}
}

// Name is the semaphore's key.
func (s *PermitSemaphore) Name() string { return s.key }

// TrySetPermits sets the number of permits if the semaphore does not exist yet.
func (s *PermitSemaphore) TrySetPermits(ctx context.Context, permits int64) (bool, error) {
	v, err := s.c.call(ctx, "trysetpermits", s.key, proto.PSemTrySetPermits(s.key, permits, proto.RequestID()))
	if err != nil {
		return false, err
	}
	return proto.ParseBool("RPSEMAPHORE.TRYSETPERMITS", v)
}

// AddPermits adds delta permits (negative: removes) and returns the available count.
func (s *PermitSemaphore) AddPermits(ctx context.Context, delta int64) (int64, error) {
	v, err := s.c.call(ctx, "addpermits", s.key, proto.PSemAddPermits(s.key, delta, proto.RequestID()))
	if err != nil {
		return 0, err
	}
	return proto.ParseInt("RPSEMAPHORE.ADDPERMITS", v)
}

// Available is the number of free permits (expired ones counted back).
func (s *PermitSemaphore) Available(ctx context.Context) (int64, error) {
	v, err := s.c.call(ctx, "available", s.key, proto.PSemAvailable(s.key))
	if err != nil {
		return 0, err
	}
	return proto.ParseInt("RPSEMAPHORE.AVAILABLEPERMITS", v)
}

// Acquire takes one permit, waiting until granted or ctx ends. lease 0: no lease, the
// watchdog renews the permit while it is held.
func (s *PermitSemaphore) Acquire(ctx context.Context, lease time.Duration) (*Permit, error) {
	return s.acquire(ctx, lease, 0, true)
}

// TryAcquire takes one permit if one is free now (wait 0: ErrTaken otherwise) or within
// wait (ErrTimeout).
func (s *PermitSemaphore) TryAcquire(ctx context.Context, lease, wait time.Duration) (*Permit, error) {
	return s.acquire(ctx, lease, wait, false)
}

func (s *PermitSemaphore) acquire(ctx context.Context, lease, wait time.Duration, forever bool) (*Permit, error) {
	renew := lease <= 0
	if renew {
		lease = s.c.opts.watchdog
	}
	leaseMs := proto.Millis(lease)
	id := proto.RequestID()
	sent := time.Now()
	// A wait that held on its granted note (design.md 5) leaves its confirm here.
	var cf *confirm
	v, err := s.c.waitFor(withConfirmSlot(ctx, &cf, lease), "acquire", s.key, wait, forever, &s.seen,
		func(waitMs int64) []any { return proto.PSemAcquire(s.key, leaseMs, 1, waitMs, id) },
		func(v any) bool { ids, err := proto.ParsePermits(v); return err == nil && len(ids) == 1 })
	if err != nil {
		return nil, err
	}
	ids, _ := proto.ParsePermits(v)
	p := &Permit{s: s, id: ids[0], lease: lease, from: sent, done: make(chan struct{}), stop: make(chan struct{})}
	go watch(s.c, lease, renew, p.stop, p.done,
		func() time.Time { p.mu.Lock(); defer p.mu.Unlock(); return p.from },
		func(at time.Time) { p.mu.Lock(); p.from = at; p.mu.Unlock() },
		proto.PSemUpdateLease(s.key, p.id, leaseMs),
		func() { p.end(ErrLost) })
	if cf != nil {
		// A permit held on its granted note and then taken back (the server released
		// it) is a lost permit.
		cf.onLost(func() { p.end(ErrLost) })
	}
	return p, nil
}

// Permit is one acquired permit.
type Permit struct {
	s     *PermitSemaphore
	id    string
	lease time.Duration

	mu   sync.Mutex
	from time.Time
	err  error
	done chan struct{}
	stop chan struct{}
	once sync.Once
}

// ID is the permit's id (32 hex digits), as Redisson names permits.
func (p *Permit) ID() string { return p.id }

// Done is closed when the permit is released or lost (Err says which).
func (p *Permit) Done() <-chan struct{} { return p.done }

// Err is nil while the permit is held, ErrLost after it was lost, ErrNotHeld after its
// release.
func (p *Permit) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

func (p *Permit) end(why error) {
	p.once.Do(func() {
		p.mu.Lock()
		p.err = why
		p.mu.Unlock()
		close(p.stop)
		close(p.done)
	})
}

// Release gives the permit back; ErrLost when it had expired or been taken back.
func (p *Permit) Release(ctx context.Context) error {
	if err := p.Err(); err != nil {
		return opErr("release", p.s.key, err)
	}
	v, err := p.s.c.call(ctx, "release", p.s.key, proto.PSemRelease(p.s.key, p.id, proto.RequestID()))
	if err != nil {
		return err
	}
	ok, err := proto.ParseBool("RPSEMAPHORE.RELEASE", v)
	if err != nil {
		return opErr("release", p.s.key, err)
	}
	if !ok {
		p.end(ErrLost)
		return opErr("release", p.s.key, ErrLost)
	}
	p.end(ErrNotHeld)
	return nil
}

// UpdateLease sets the permit's remaining lease to d (its watchdog, if any, goes on
// renewing with the client's watchdog lease).
func (p *Permit) UpdateLease(ctx context.Context, d time.Duration) error {
	at := time.Now()
	v, err := p.s.c.call(ctx, "updatelease", p.s.key, proto.PSemUpdateLease(p.s.key, p.id, proto.Millis(d)))
	if err != nil {
		return err
	}
	ok, err := proto.ParseBool("RPSEMAPHORE.UPDATELEASETIME", v)
	if err != nil {
		return opErr("updatelease", p.s.key, err)
	}
	if !ok {
		p.end(ErrLost)
		return opErr("updatelease", p.s.key, ErrLost)
	}
	p.mu.Lock()
	p.from = at.Add(d - p.lease)
	p.mu.Unlock()
	return nil
}
