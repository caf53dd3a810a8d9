// MultiLock and RedLock: several Mutexes taken as one (Redisson's RedissonMultiLock and
// RedissonRedLock), on one Client or on several.

package rlock

import (
	"context"
	"errors"
	"sort"
	"sync"
	"time"
)

// MultiLock holds every one of its Mutexes or none. Lock takes them in one order (by
// name, then by position), so two MultiLocks over overlapping sets wait for each other
// in the server's queues instead of deadlocking.
type MultiLock struct {
	locks []*Mutex
	group
}

// NewMultiLock makes a MultiLock over locks (on one Client or several).
func NewMultiLock(locks ...*Mutex) *MultiLock {
	sorted := append([]*Mutex(nil), locks...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Name() < sorted[j].Name() })
	return &MultiLock{locks: sorted}
}

// Lock takes every lock, waiting in each one's queue in turn, until all are held or ctx
// ends (then none is held).
func (m *MultiLock) Lock(ctx context.Context) error {
	return m.take(ctx, func(l *Mutex) error { return l.LockContext(ctx) })
}

// TryLock takes every lock if each is free now, or, with wait > 0, within wait in all
// (ErrTaken or ErrTimeout otherwise; then none is held).
func (m *MultiLock) TryLock(ctx context.Context, wait time.Duration) error {
	if wait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, wait)
		defer cancel()
		return m.take(ctx, func(l *Mutex) error {
			err := l.LockContext(ctx)
			if errors.Is(err, context.DeadlineExceeded) {
				return &Error{Op: "trylock", Key: l.Name(), Err: ErrTimeout}
			}
			return err
		})
	}
	return m.take(ctx, func(l *Mutex) error { return l.TryLockContext(ctx) })
}

func (m *MultiLock) take(ctx context.Context, lock func(*Mutex) error) error {
	for i, l := range m.locks {
		if err := lock(l); err != nil {
			unlockAll(context.Background(), m.locks[:i])
			return err
		}
	}
	m.watch(m.locks, 1)
	return nil
}

// Unlock releases every lock; the first error (ErrLost for a lock lost meanwhile) is
// returned after all were tried.
func (m *MultiLock) Unlock(ctx context.Context) error {
	m.stop()
	return unlockAll(ctx, m.locks)
}

// RedLock holds a majority of its Mutexes, each on an independent server (a Client
// each): Redis's Redlock algorithm as Redisson's RedissonRedLock runs it. An acquire
// asks every server at once and succeeds when more than half granted the lock within
// the wait; otherwise it gives back what it got.
type RedLock struct {
	locks []*Mutex
	group
	mu   sync.Mutex
	held []*Mutex
}

// NewRedLock makes a RedLock over locks, each on its own server.
func NewRedLock(locks ...*Mutex) *RedLock { return &RedLock{locks: locks} }

// Quorum is how many locks a RedLock must hold: more than half.
func (r *RedLock) Quorum() int { return len(r.locks)/2 + 1 }

// TryLock asks every server at once, each waiting up to wait in its queue (0: not at
// all), and succeeds when a quorum granted the lock; otherwise it releases what it got
// and returns ErrTaken (or ErrTimeout after a wait).
func (r *RedLock) TryLock(ctx context.Context, wait time.Duration) error {
	type result struct {
		l   *Mutex
		err error
	}
	results := make(chan result, len(r.locks))
	for _, l := range r.locks {
		go func(l *Mutex) {
			var err error
			if wait > 0 {
				wctx, cancel := context.WithTimeout(ctx, wait)
				err = l.LockContext(wctx)
				cancel()
			} else {
				err = l.TryLockContext(ctx)
			}
			results <- result{l, err}
		}(l)
	}
	var got []*Mutex
	var firstErr error
	for range r.locks {
		res := <-results
		if res.err == nil {
			got = append(got, res.l)
		} else if firstErr == nil {
			firstErr = res.err
		}
	}
	if len(got) >= r.Quorum() {
		r.mu.Lock()
		r.held = got
		r.mu.Unlock()
		r.watch(got, len(got)-r.Quorum()+1)
		return nil
	}
	unlockAll(context.Background(), got)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if wait > 0 {
		return &Error{Op: "trylock", Key: r.locks[0].Name(), Err: ErrTimeout}
	}
	if firstErr == nil || errors.Is(firstErr, ErrTaken) {
		return &Error{Op: "trylock", Key: r.locks[0].Name(), Err: ErrTaken}
	}
	return firstErr
}

// Lock retries TryLock, each round waiting up to a second in every queue, until a
// quorum is held or ctx ends.
func (r *RedLock) Lock(ctx context.Context) error {
	for n := 0; ; n++ {
		err := r.TryLock(ctx, time.Second)
		if err == nil || ctx.Err() != nil || !(errors.Is(err, ErrTimeout) || errors.Is(err, ErrTaken)) {
			return err
		}
		if err := sleep(ctx, r.locks[0].h.c.opts.backoff.Delay(n)); err != nil {
			return err
		}
	}
}

// Unlock releases every lock it holds.
func (r *RedLock) Unlock(ctx context.Context) error {
	r.stop()
	r.mu.Lock()
	held := r.held
	r.held = nil
	r.mu.Unlock()
	return unlockAll(ctx, held)
}

// unlockAll releases every lock of ls (all of their holds) and returns the first error.
func unlockAll(ctx context.Context, ls []*Mutex) error {
	var first error
	for i := len(ls) - 1; i >= 0; i-- {
		if _, err := ls[i].UnlockContext(ctx); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// group is the lost signal of several holds: Done is closed once `losses` of them were
// lost (MultiLock: one; RedLock: enough to fall below the quorum).
type group struct {
	mu   sync.Mutex
	done chan struct{}
	err  error
	quit chan struct{}
}

func (g *group) watch(ls []*Mutex, losses int) {
	g.mu.Lock()
	g.done, g.err, g.quit = make(chan struct{}), nil, make(chan struct{})
	done, quit := g.done, g.quit
	g.mu.Unlock()
	lost := make(chan struct{}, len(ls))
	for _, l := range ls {
		go func(d <-chan struct{}, l *Mutex) {
			select {
			case <-d:
				if errors.Is(l.Err(), ErrLost) {
					lost <- struct{}{}
				}
			case <-quit:
			}
		}(l.Done(), l)
	}
	go func() {
		for n := 0; n < losses; n++ {
			select {
			case <-lost:
			case <-quit:
				return
			}
		}
		g.mu.Lock()
		if g.done == done && g.err == nil {
			g.err = ErrLost
			close(done)
		}
		g.mu.Unlock()
	}()
}

func (g *group) stop() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.quit != nil {
		close(g.quit)
		g.quit = nil
	}
	if g.done != nil && g.err == nil {
		g.err = ErrNotHeld
		close(g.done)
	}
}

// Done is closed when the group's hold is lost (Err: ErrLost) or released.
func (g *group) Done() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.done == nil {
		c := make(chan struct{})
		close(c)
		return c
	}
	return g.done
}

// Err is nil while held, ErrLost after a loss, ErrNotHeld otherwise.
func (g *group) Err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.done == nil {
		return ErrNotHeld
	}
	return g.err
}
