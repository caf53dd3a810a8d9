// MultiLock (all or none, deadlock-free order) and RedLock (a quorum of independent
// servers) against real module-loaded servers.

package rlock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	rlock "github.com/rlock/rlock/clients/go"
	"github.com/rlock/rlock/clients/go/internal/testserver"
)

func TestMultiLockHoldsAllOrNone(t *testing.T) {
	_, rdb, c := setup(t, rlock.WithWatchdogTimeout(600*time.Millisecond))
	ctx := context.Background()
	other := c.NewMutex("b")
	must(t, other.Lock())
	m := rlock.NewMultiLock(c.NewMutex("a"), c.NewMutex("b"), c.NewMutex("c"))
	if err := m.TryLock(ctx, 0); !errors.Is(err, rlock.ErrTaken) {
		t.Fatalf("TryLock with b held = %v, want ErrTaken", err)
	}
	if n := rdb.Exists(ctx, "a", "c").Val(); n != 0 {
		t.Fatalf("%d locks left held after a failed TryLock", n)
	}
	if err := m.TryLock(ctx, 100*time.Millisecond); !errors.Is(err, rlock.ErrTimeout) {
		t.Fatalf("TryLock with a wait = %v, want ErrTimeout", err)
	}
	_, _ = other.Unlock()
	must(t, m.Lock(ctx))
	if n := rdb.Exists(ctx, "a", "b", "c").Val(); n != 3 {
		t.Fatalf("%d of 3 held", n)
	}
	rdb.Del(ctx, "c")
	select {
	case <-m.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the loss of one member was not signalled")
	}
	if !errors.Is(m.Err(), rlock.ErrLost) {
		t.Fatalf("Err = %v, want ErrLost", m.Err())
	}
	if err := m.Unlock(ctx); !errors.Is(err, rlock.ErrLost) {
		t.Fatalf("Unlock = %v, want ErrLost (c was lost)", err)
	}
	if n := rdb.Exists(ctx, "a", "b", "c").Val(); n != 0 {
		t.Fatalf("%d left held after Unlock", n)
	}
}

func TestOverlappingMultiLocksDoNotDeadlock(t *testing.T) {
	_, _, c := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			// Opposite orders of the same names: taken in one order, no deadlock.
			m := rlock.NewMultiLock(c.NewMutex("x"), c.NewMutex("y"))
			if i%2 == 1 {
				m = rlock.NewMultiLock(c.NewMutex("y"), c.NewMutex("x"))
			}
			for r := 0; r < 10; r++ {
				if err := m.Lock(ctx); err != nil {
					t.Error(err)
					return
				}
				if err := m.Unlock(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		}(i)
	}
	wg.Wait()
}

func TestRedLockNeedsAQuorumOfServers(t *testing.T) {
	ctx := context.Background()
	var clients []*rlock.Client
	for i := 0; i < 3; i++ {
		s := testserver.Start(t)
		c := rlock.New(s.Client(t))
		t.Cleanup(func() { c.Close() })
		clients = append(clients, c)
	}
	redlock := func() *rlock.RedLock {
		var ls []*rlock.Mutex
		for _, c := range clients {
			ls = append(ls, c.NewMutex("red"))
		}
		return rlock.NewRedLock(ls...)
	}
	// One server's lock held by someone else: 2 of 3 is still a quorum.
	blocker := clients[0].NewMutex("red")
	must(t, blocker.Lock())
	r := redlock()
	if r.Quorum() != 2 {
		t.Fatalf("quorum %d", r.Quorum())
	}
	must(t, r.TryLock(ctx, 0))
	// Now no other RedLock can reach a quorum.
	if err := redlock().TryLock(ctx, 0); !errors.Is(err, rlock.ErrTaken) {
		t.Fatalf("second RedLock = %v, want ErrTaken", err)
	}
	must(t, r.Unlock(ctx))
	// Two servers' locks held by others: no quorum, and nothing is left held.
	blocker2 := clients[1].NewMutex("red")
	must(t, blocker2.Lock())
	r2 := redlock()
	if err := r2.TryLock(ctx, 0); !errors.Is(err, rlock.ErrTaken) {
		t.Fatalf("RedLock with 1 of 3 = %v, want ErrTaken", err)
	}
	if err := r2.TryLock(ctx, 100*time.Millisecond); !errors.Is(err, rlock.ErrTimeout) {
		t.Fatalf("RedLock with a wait = %v, want ErrTimeout", err)
	}
	_, _ = blocker.Unlock()
	must(t, r2.Lock(ctx))
	must(t, r2.Unlock(ctx))
}
