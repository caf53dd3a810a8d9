// Semaphore: counted permits (RSEMAPHORE.*; Redisson's RSemaphore).

package rlock

import (
	"context"
	"time"

	"github.com/rlock/rlock/clients/go/internal/proto"
)

// Semaphore is a distributed counting semaphore in Redisson's layout. Waiters are
// served first come, first served (a request for 5 at the head is served before a later
// request for 1). Nobody records who holds permits: a holder that dies leaks them, as
// with Redisson; PermitSemaphore's permits have leases instead.
type Semaphore struct {
	c   *Client
	key string
}

// NewSemaphore makes a semaphore handle on name.
func (c *Client) NewSemaphore(name string) *Semaphore { return &Semaphore{c: c, key: name} }

// Name is the semaphore's key.
func (s *Semaphore) Name() string { return s.key }

// TrySetPermits sets the number of permits if the semaphore does not exist yet.
func (s *Semaphore) TrySetPermits(ctx context.Context, permits int64) (bool, error) {
	v, err := s.c.call(ctx, "trysetpermits", s.key, proto.SemTrySetPermits(s.key, permits, proto.RequestID()))
	if err != nil {
		return false, err
	}
	return proto.ParseBool("RSEMAPHORE.TRYSETPERMITS", v)
}

// AddPermits adds delta permits (negative: removes) and returns the new count.
func (s *Semaphore) AddPermits(ctx context.Context, delta int64) (int64, error) {
	v, err := s.c.call(ctx, "addpermits", s.key, proto.SemAddPermits(s.key, delta, proto.RequestID()))
	if err != nil {
		return 0, err
	}
	return proto.ParseInt("RSEMAPHORE.ADDPERMITS", v)
}

// Acquire takes n permits, waiting in the server's queue until they are granted or ctx
// ends.
func (s *Semaphore) Acquire(ctx context.Context, n int64) error {
	return s.acquire(ctx, n, 0, true)
}

// TryAcquire takes n permits if they are free now (wait 0: ErrTaken otherwise) or
// within wait (ErrTimeout).
func (s *Semaphore) TryAcquire(ctx context.Context, n int64, wait time.Duration) error {
	return s.acquire(ctx, n, wait, false)
}

func (s *Semaphore) acquire(ctx context.Context, n int64, wait time.Duration, forever bool) error {
	id := proto.RequestID()
	_, err := s.c.waitFor(ctx, "acquire", s.key, wait, forever,
		func(waitMs int64) []any { return proto.SemAcquire(s.key, n, waitMs, id) },
		func(v any) bool { return v == int64(1) })
	return err
}

// Release gives back n permits.
func (s *Semaphore) Release(ctx context.Context, n int64) error {
	_, err := s.c.call(ctx, "release", s.key, proto.SemRelease(s.key, n, proto.RequestID()))
	return err
}

// Available is the number of free permits.
func (s *Semaphore) Available(ctx context.Context) (int64, error) {
	v, err := s.c.call(ctx, "available", s.key, proto.SemAvailable(s.key))
	if err != nil {
		return 0, err
	}
	return proto.ParseInt("RSEMAPHORE.AVAILABLEPERMITS", v)
}

// Drain takes every free permit and returns how many.
func (s *Semaphore) Drain(ctx context.Context) (int64, error) {
	v, err := s.c.call(ctx, "drain", s.key, proto.SemDrain(s.key, proto.RequestID()))
	if err != nil {
		return 0, err
	}
	return proto.ParseInt("RSEMAPHORE.DRAINPERMITS", v)
}
