// Integration tests of how a waiting acquire starts (spec/vectors/waits.json), against a
// real module-loaded server, counted in the server (INFO commandstats, cmdCalls: the
// acquire commands it ran; INFO rlock: the tickets it queued): an uncontended wait asks
// once on the quick path and queues nothing; a handle that had to queue lately queues at once,
// without a try that fails first; a try that finds the lock held is followed by its
// queued wait, served in its turn.

package rlock_test

import (
	"context"
	"testing"
	"time"

	rlock "github.com/rlock/rlock/clients/go"
	"github.com/rlock/rlock/clients/go/internal/testserver"
)

// lockAsync runs m.Lock in a goroutine and returns its outcome's channel.
func lockAsync(m *rlock.Mutex) <-chan error {
	got := make(chan error, 1)
	go func() { got <- m.Lock() }()
	return got
}

func waitErr(t *testing.T, got <-chan error, what string) {
	t.Helper()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: not done within 10 s", what)
	}
}

func TestAnUncontendedWaitAsksOnceAndQueuesNothing(t *testing.T) {
	_, rdb, c := setup(t)
	ctx := context.Background()
	m := c.NewMutex("quiet")
	sem := c.NewSemaphore("quiet-sem")
	if ok, err := sem.TrySetPermits(ctx, 1); err != nil || !ok {
		t.Fatalf("TrySetPermits: %v %v", ok, err)
	}
	queued := rlockStat(rdb, "rlock_tickets_queued")
	locks, sems := cmdCalls(t, rdb, "rlock.acquire"), cmdCalls(t, rdb, "rsemaphore.acquire")
	for i := 0; i < 3; i++ {
		if err := m.Lock(); err != nil {
			t.Fatal(err)
		}
		if _, err := m.Unlock(); err != nil {
			t.Fatal(err)
		}
		if err := sem.Acquire(ctx, 1); err != nil {
			t.Fatal(err)
		}
		if err := sem.Release(ctx, 1); err != nil {
			t.Fatal(err)
		}
	}
	if n := cmdCalls(t, rdb, "rlock.acquire") - locks; n != 3 {
		t.Fatalf("3 uncontended Locks ran %d RLOCK.ACQUIRE, want 3", n)
	}
	if n := cmdCalls(t, rdb, "rsemaphore.acquire") - sems; n != 3 {
		t.Fatalf("3 uncontended Acquires ran %d RSEMAPHORE.ACQUIRE, want 3", n)
	}
	if n := rlockStat(rdb, "rlock_tickets_queued"); n != queued || n < 0 {
		t.Fatalf("tickets queued %d -> %d, want none", queued, n)
	}
}

func TestAHandleThatQueuedLatelyQueuesAtOnce(t *testing.T) {
	_, rdb, c := setup(t)
	a, b := c.NewMutex("busy"), c.NewMutex("busy")
	if err := a.Lock(); err != nil {
		t.Fatal(err)
	}
	// b tries, finds it held, queues, and is handed the lock: b found it held.
	got := lockAsync(b)
	testserver.WaitUntil(t, 10*time.Second, "b queued", func() bool { return infoWaiters(t, "RLOCK.INFO", "busy") == 1 })
	if _, err := a.Unlock(); err != nil {
		t.Fatal(err)
	}
	waitErr(t, got, "b's first Lock")
	if _, err := b.Unlock(); err != nil {
		t.Fatal(err)
	}
	if err := a.Lock(); err != nil {
		t.Fatal(err)
	}
	// Within the second: b's next Lock sends its ticket alone, no failed try first.
	before := cmdCalls(t, rdb, "rlock.acquire")
	got = lockAsync(b)
	testserver.WaitUntil(t, 10*time.Second, "b queued again", func() bool { return infoWaiters(t, "RLOCK.INFO", "busy") == 1 })
	if n := cmdCalls(t, rdb, "rlock.acquire") - before; n != 1 {
		t.Fatalf("b's second Lock ran %d RLOCK.ACQUIRE before it was queued, want 1 (the ticket)", n)
	}
	if _, err := a.Unlock(); err != nil {
		t.Fatal(err)
	}
	waitErr(t, got, "b's second Lock")
	if _, err := b.Unlock(); err != nil {
		t.Fatal(err)
	}
}

func TestAPermitSemaphoreHandleThatQueuedLatelyQueuesAtOnce(t *testing.T) {
	_, rdb, c := setup(t)
	ctx := context.Background()
	holder, waiter := c.NewPermitSemaphore("ps"), c.NewPermitSemaphore("ps")
	if ok, err := holder.TrySetPermits(ctx, 1); err != nil || !ok {
		t.Fatalf("TrySetPermits: %v %v", ok, err)
	}
	for round := 0; round < 2; round++ {
		p, err := holder.Acquire(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		before := cmdCalls(t, rdb, "rpsemaphore.acquire")
		type acquired struct {
			p   *rlock.Permit
			err error
		}
		got := make(chan acquired, 1)
		go func() {
			q, err := waiter.Acquire(ctx, 0)
			got <- acquired{q, err}
		}()
		testserver.WaitUntil(t, 10*time.Second, "the waiter queued", func() bool { return infoWaiters(t, "RPSEMAPHORE.INFO", "ps") == 1 })
		// The first round tries first (the handle found nothing yet); the second,
		// within the second after a wait that queued, does not.
		want := 2 - round
		if n := cmdCalls(t, rdb, "rpsemaphore.acquire") - before; n != want {
			t.Fatalf("round %d: %d RPSEMAPHORE.ACQUIRE before the waiter queued, want %d", round, n, want)
		}
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case a := <-got:
			if a.err != nil {
				t.Fatal(a.err)
			}
			if err := a.p.Release(ctx); err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the waiter got no permit within 10 s")
		}
	}
}

func TestATryThatFindsItHeldQueuesInItsTurn(t *testing.T) {
	_, rdb, c := setup(t)
	a, b, d := c.NewMutex("turns"), c.NewMutex("turns"), c.NewMutex("turns")
	if err := a.Lock(); err != nil {
		t.Fatal(err)
	}
	before := cmdCalls(t, rdb, "rlock.acquire")
	gotB := lockAsync(b)
	testserver.WaitUntil(t, 10*time.Second, "b queued", func() bool { return infoWaiters(t, "RLOCK.INFO", "turns") == 1 })
	if n := cmdCalls(t, rdb, "rlock.acquire") - before; n != 2 {
		t.Fatalf("a fresh handle's Lock on a held lock ran %d RLOCK.ACQUIRE, want 2 (a try, then its ticket)", n)
	}
	gotD := lockAsync(d)
	testserver.WaitUntil(t, 10*time.Second, "d queued", func() bool { return infoWaiters(t, "RLOCK.INFO", "turns") == 2 })
	if _, err := a.Unlock(); err != nil {
		t.Fatal(err)
	}
	// First come, first served: b, which queued first, has it; d still waits.
	waitErr(t, gotB, "b's Lock")
	if d.Held() != 0 || infoWaiters(t, "RLOCK.INFO", "turns") != 1 {
		t.Fatalf("d held %d, waiters %d: b was not served first", d.Held(), infoWaiters(t, "RLOCK.INFO", "turns"))
	}
	if _, err := b.Unlock(); err != nil {
		t.Fatal(err)
	}
	waitErr(t, gotD, "d's Lock")
	if _, err := d.Unlock(); err != nil {
		t.Fatal(err)
	}
}
