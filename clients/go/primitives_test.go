// Integration tests of the fenced lock, the read-write lock, both semaphores and the
// latch against a real module-loaded server: each one's rules, and waiting through
// queued tickets (a waiter served when another call frees what it waits for).

package rlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	rlock "github.com/rlock/rlock/clients/go"
	"github.com/rlock/rlock/clients/go/internal/testserver"
)

// within runs f in a goroutine and returns a channel with its error.
func within(f func(ctx context.Context) error) <-chan error {
	out := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out <- f(ctx)
	}()
	return out
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestFencedTokensGrowThroughReentryAndHandoff(t *testing.T) {
	_, _, c := setup(t)
	ctx := context.Background()
	a, b := c.NewFencedMutex("ledger"), c.NewFencedMutex("ledger")
	t1, err := a.LockToken(ctx)
	must(t, err)
	t2, err := a.LockToken(ctx) // re-entry: a new, larger token
	must(t, err)
	if t1 <= 0 || t2 <= t1 {
		t.Fatalf("tokens %d then %d, want growing", t1, t2)
	}
	if err := b.TryLock(); !errors.Is(err, rlock.ErrTaken) {
		t.Fatalf("TryLock = %v, want ErrTaken", err)
	}
	got := within(b.LockContext)
	testserver.WaitUntil(t, 10*time.Second, "b queued", func() bool {
		info, _ := a.Info(ctx)
		return info != nil && info.Waiters == 1
	})
	_, _ = a.Unlock()
	_, _ = a.Unlock()
	must(t, <-got)
	if b.Token() <= t2 {
		t.Fatalf("token at the handoff %d, want > %d", b.Token(), t2)
	}
	if last, err := a.LastToken(ctx); err != nil || last != b.Token() {
		t.Fatalf("LastToken = %d, %v; want %d", last, err, b.Token())
	}
}

func TestRWMutexSharesReadsAndServesAQueuedWriter(t *testing.T) {
	_, _, c := setup(t)
	ctx := context.Background()
	r1, r2, w := c.NewRWMutex("catalog"), c.NewRWMutex("catalog"), c.NewRWMutex("catalog")
	must(t, r1.RLock(ctx))
	must(t, r2.RLock(ctx))
	if err := w.Writer().TryLock(); !errors.Is(err, rlock.ErrTaken) {
		t.Fatalf("write TryLock with readers = %v, want ErrTaken", err)
	}
	// A reader may not ask for the write side of a lock it reads: an error at once.
	if err := r1.Writer().TryLock(); err == nil || errors.Is(err, rlock.ErrTaken) {
		t.Fatalf("upgrade = %v, want the server's refusal", err)
	}
	got := within(w.Lock)
	testserver.WaitUntil(t, 10*time.Second, "the writer queued", func() bool {
		info, _ := w.Writer().Info(ctx)
		return info != nil && info.Waiters == 1
	})
	// A new reader queues behind the writer (no writer starvation).
	r3 := c.NewRWMutex("catalog")
	if err := r3.Reader().TryLock(); !errors.Is(err, rlock.ErrTaken) {
		t.Fatalf("a reader after a queued writer = %v, want ErrTaken", err)
	}
	_, _ = r1.RUnlock(ctx)
	_, _ = r2.RUnlock(ctx)
	must(t, <-got)
	// The writer may also read.
	must(t, w.RLock(ctx))
	if info, _ := w.Writer().Info(ctx); info == nil || info.Owners[w.Writer().Owner()] < 2 {
		t.Fatalf("info after write+read = %+v", info)
	}
	_, _ = w.RUnlock(ctx)
	if freed, err := w.Unlock(ctx); err != nil || !freed {
		t.Fatalf("write Unlock = %v, %v", freed, err)
	}
}

func TestSemaphoreServesAWaiterWhenPermitsComeBack(t *testing.T) {
	_, _, c := setup(t)
	ctx := context.Background()
	s := c.NewSemaphore("jobs")
	if ok, err := s.TrySetPermits(ctx, 2); err != nil || !ok {
		t.Fatalf("TrySetPermits = %v, %v", ok, err)
	}
	if ok, _ := s.TrySetPermits(ctx, 5); ok {
		t.Fatal("TrySetPermits on a set semaphore")
	}
	must(t, s.Acquire(ctx, 2))
	if err := s.TryAcquire(ctx, 1, 0); !errors.Is(err, rlock.ErrTaken) {
		t.Fatalf("TryAcquire without permits = %v, want ErrTaken", err)
	}
	if err := s.TryAcquire(ctx, 1, 100*time.Millisecond); !errors.Is(err, rlock.ErrTimeout) {
		t.Fatalf("TryAcquire with a wait = %v, want ErrTimeout", err)
	}
	got := within(func(ctx context.Context) error { return s.Acquire(ctx, 2) })
	testserver.WaitUntil(t, 10*time.Second, "the waiter queued", func() bool {
		info := semWaiters(t, s)
		return info > 0
	})
	must(t, s.Release(ctx, 2))
	must(t, <-got)
	if n, err := s.Available(ctx); err != nil || n != 0 {
		t.Fatalf("Available = %d, %v; want 0", n, err)
	}
	must(t, s.Release(ctx, 2))
	if n, err := s.Drain(ctx); err != nil || n != 2 {
		t.Fatalf("Drain = %d, %v", n, err)
	}
	if n, err := s.AddPermits(ctx, 3); err != nil || n != 3 {
		t.Fatalf("AddPermits = %d, %v", n, err)
	}
}

// semWaiters is the number of waiters on a semaphore (RSEMAPHORE.INFO's waiters).
func semWaiters(t *testing.T, s *rlock.Semaphore) int64 {
	t.Helper()
	return infoWaiters(t, "RSEMAPHORE.INFO", s.Name())
}

func TestPermitSemaphoreLeasesAndWatchdog(t *testing.T) {
	_, _, c := setup(t, rlock.WithWatchdogTimeout(600*time.Millisecond))
	ctx := context.Background()
	s := c.NewPermitSemaphore("pool")
	if ok, err := s.TrySetPermits(ctx, 1); err != nil || !ok {
		t.Fatalf("TrySetPermits = %v, %v", ok, err)
	}
	// No lease: the watchdog keeps the permit past several watchdog leases.
	p, err := s.Acquire(ctx, 0)
	must(t, err)
	if len(p.ID()) != 32 {
		t.Fatalf("permit id %q", p.ID())
	}
	deadline := time.Now().Add(1500 * time.Millisecond)
	for time.Now().Before(deadline) {
		if n, _ := s.Available(ctx); n != 0 {
			t.Fatal("the watchdog let the permit expire")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := s.TryAcquire(ctx, time.Second, 0); !errors.Is(err, rlock.ErrTaken) {
		t.Fatalf("TryAcquire with none free = %v, want ErrTaken", err)
	}
	must(t, p.Release(ctx))
	if err := p.Release(ctx); !errors.Is(err, rlock.ErrNotHeld) {
		t.Fatalf("second Release = %v, want ErrNotHeld", err)
	}
	// A leased permit goes back at its lease end, to a queued waiter, and its holder
	// hears of the loss.
	short, err := s.Acquire(ctx, 300*time.Millisecond)
	must(t, err)
	got := make(chan error, 1)
	go func() {
		p2, err := s.Acquire(ctx, time.Minute)
		if err == nil {
			err = p2.Release(ctx)
		}
		got <- err
	}()
	must(t, <-got)
	select {
	case <-short.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the expired permit's loss was not signalled")
	}
	if !errors.Is(short.Err(), rlock.ErrLost) {
		t.Fatalf("Err = %v, want ErrLost", short.Err())
	}
}

func TestLatchReleasesEveryAwaiterAtZero(t *testing.T) {
	_, _, c := setup(t)
	ctx := context.Background()
	l := c.NewCountDownLatch("batch")
	if ok, err := l.TrySetCount(ctx, 2); err != nil || !ok {
		t.Fatalf("TrySetCount = %v, %v", ok, err)
	}
	if err := l.AwaitTimeout(ctx, 100*time.Millisecond); !errors.Is(err, rlock.ErrTimeout) {
		t.Fatalf("AwaitTimeout on a closed latch = %v, want ErrTimeout", err)
	}
	var got []<-chan error
	for i := 0; i < 5; i++ {
		got = append(got, within(l.Await))
	}
	testserver.WaitUntil(t, 10*time.Second, "five awaiters queued", func() bool {
		return infoWaiters(t, "RLATCH.INFO", "batch") == 5
	})
	if n, err := l.CountDown(ctx); err != nil || n != 1 {
		t.Fatalf("CountDown = %d, %v", n, err)
	}
	if n, _ := l.Count(ctx); n != 1 {
		t.Fatalf("Count = %d", n)
	}
	_, _ = l.CountDown(ctx)
	for _, g := range got {
		must(t, <-g)
	}
	must(t, l.Await(ctx)) // open: at once
	if ok, err := l.Delete(ctx); err != nil || ok {
		t.Fatalf("Delete of an open latch = %v, %v", ok, err) // the last count-down removed it
	}
}
