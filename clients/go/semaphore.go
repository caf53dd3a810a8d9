// Semaphore: counted permits (RSEMAPHORE.*; Redisson's RSemaphore).

package rlock

import (
	"context"
	"log/slog"
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
	// seen: what this handle's last waiting acquire found (proto.StartWait).
	seen proto.Contention
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
	// A wait that held on its granted note (design.md 5) leaves its confirm here; no
	// lease bounds it (confirmBound does).
	var cf *confirm
	_, err := s.c.waitFor(withConfirmSlot(ctx, &cf, 0), "acquire", s.key, wait, forever, &s.seen,
		func(waitMs int64) []any { return proto.SemAcquire(s.key, n, waitMs, id) },
		func(v any) bool { return v == int64(1) })
	if err == nil && cf != nil {
		s.c.trackSemGrant(s.key, n, cf)
	}
	return err
}

// Release gives back n permits. It first waits for the confirmations still in flight of
// this client's grants on this semaphore that were held on their granted message
// (normally long done; each bounded by about 5 s, or ends with ctx), then leaves out the
// permits of such grants that the server took back (it returned them itself, and
// releasing them again would add permits that never existed), sending the rest only.
// When all n were taken back it returns nil without a round trip.
func (s *Semaphore) Release(ctx context.Context, n int64) error {
	send, undo, err := s.c.semAbsorb(ctx, s.key, n)
	if err != nil {
		return opErr("release", s.key, err)
	}
	if send == 0 && n > 0 {
		return nil
	}
	if _, err := s.c.call(ctx, "release", s.key, proto.SemRelease(s.key, send, proto.RequestID())); err != nil {
		undo() // not released: a retried Release leaves out the taken-back permits again
		return err
	}
	return nil
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

// semLedger is what one Client knows of a semaphore name's grants held on their granted
// message (design.md 5): the confirmations still in flight, and the debt, permits whose
// grant was answered TAKENBACK (the server returned them) and not yet released by the
// application. Its releases, through any handle on the name, wait for the first and
// absorb the second (Semaphore.Release).
type semLedger struct {
	inflight map[*confirm]struct{}
	debt     int64
}

// trackSemGrant records a grant of n permits on key held on its granted message, until
// its confirmation settles: TAKENBACK makes n permits of debt (and a warning); a
// confirmation left in doubt (no answer within its bound, another error) makes none, so
// the release is sent. The residual risk of that: a server that took the grant back
// answers TAKENBACK to every retry, so a doubt after the retries means the server was
// unreachable for all of them; had it taken the grant back meanwhile, the release adds n
// permits that never existed.
func (c *Client) trackSemGrant(key string, n int64, cf *confirm) {
	c.semMu.Lock()
	l := c.semLedgers[key]
	if l == nil {
		l = &semLedger{inflight: map[*confirm]struct{}{}}
		c.semLedgers[key] = l
	}
	l.inflight[cf] = struct{}{}
	c.semMu.Unlock()
	cf.onSettle(func(o proto.Confirmed) {
		c.semMu.Lock()
		delete(l.inflight, cf)
		if o == proto.ConfirmTakenBack {
			l.debt += n
		}
		c.dropIdleLedger(key, l)
		c.semMu.Unlock()
		if o == proto.ConfirmTakenBack {
			slog.Warn("rlock: a semaphore grant held on its granted message was taken back "+
				"before its confirmation landed; the server returned the permits, and the next "+
				"release of as many on this semaphore is not sent",
				"semaphore", key, "permits", n)
		}
	})
}

// semAbsorb waits for the in-flight confirmations of key's held grants (or ctx), then
// takes up to n permits off key's debt: send is what is left to release in the server,
// undo puts the absorbed permits back (the release failed).
func (c *Client) semAbsorb(ctx context.Context, key string, n int64) (send int64, undo func(), err error) {
	c.semMu.Lock()
	l := c.semLedgers[key]
	var waits []<-chan struct{}
	if l != nil {
		for cf := range l.inflight {
			waits = append(waits, cf.done)
		}
	}
	c.semMu.Unlock()
	nothing := func() {}
	if l == nil {
		return n, nothing, nil
	}
	for _, done := range waits {
		select {
		case <-done:
		case <-ctx.Done():
			return 0, nothing, ctx.Err()
		}
	}
	c.semMu.Lock()
	defer c.semMu.Unlock()
	if c.semLedgers[key] != l {
		// Dropped once idle (no debt, nothing in flight): nothing to absorb.
		return n, nothing, nil
	}
	send, left := proto.AbsorbRelease(l.debt, n)
	absorbed := l.debt - left
	l.debt = left
	c.dropIdleLedger(key, l)
	if absorbed == 0 {
		return send, nothing, nil
	}
	return send, func() {
		c.semMu.Lock()
		defer c.semMu.Unlock()
		back := c.semLedgers[key]
		if back == nil {
			back = &semLedger{inflight: map[*confirm]struct{}{}}
			c.semLedgers[key] = back
		}
		back.debt += absorbed
	}, nil
}

// dropIdleLedger forgets key's ledger when it holds nothing (c.semMu held), so that a
// client does not keep one per name it ever waited on.
func (c *Client) dropIdleLedger(key string, l *semLedger) {
	if l.debt == 0 && len(l.inflight) == 0 && c.semLedgers[key] == l {
		delete(c.semLedgers, key)
	}
}
