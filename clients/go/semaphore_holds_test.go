// Integration tests of the plain semaphore's waiter holding on its `granted` message
// (design.md 5, the server's `ticket-holds` feature): it returns while every write is
// paused (a collect would wait for the pause), and a grant the server took back (its
// confirmation's connection killed and no new connection accepted until the take-back)
// is not released again: the permits the server returned are not added a second time.

package rlock_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	rlock "github.com/rlock/rlock/clients/go"
	"github.com/rlock/rlock/clients/go/internal/testserver"
)

// semHeldByAdmin makes semaphore key with 1 permit, taken by admin (outside the client).
func semHeldByAdmin(t *testing.T, ctx context.Context, admin *redis.Conn, key string) {
	t.Helper()
	must(t, admin.ConfigSet(ctx, "rlock.ticket-confirm-ms", "0").Err())
	must(t, admin.Do(ctx, "RSEMAPHORE.TRYSETPERMITS", key, 1, "ID", "setup").Err())
	if v, err := admin.Do(ctx, "RSEMAPHORE.ACQUIRE", key, 1, "ID", "outside").Int64(); err != nil || v != 1 {
		t.Fatalf("the outside acquire: %v %v", v, err)
	}
}

// waitForSemaphore starts sem.Acquire(1) and waits until it is queued in the server.
func waitForSemaphore(t *testing.T, ctx context.Context, admin *redis.Conn, sem *rlock.Semaphore) <-chan error {
	t.Helper()
	got := within(func(ctx context.Context) error { return sem.Acquire(ctx, 1) })
	testserver.WaitUntil(t, 10*time.Second, "the waiter queued", func() bool {
		n, _ := semInfo(ctx, admin, sem.Name(), "waiters")
		return n == 1
	})
	return got
}

// grantAndPauseWrites releases the outside permit (granting it to the queued waiter) and
// pauses every client's writes in the same transaction, so the waiter's confirmation or
// collect cannot run; unpause is registered for cleanup.
func grantAndPauseWrites(t *testing.T, ctx context.Context, admin *redis.Conn, key string) {
	t.Helper()
	t.Cleanup(func() { admin.Do(context.Background(), "CLIENT", "UNPAUSE") })
	_, err := admin.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Do(ctx, "RSEMAPHORE.RELEASE", key, 1, "ID", "outside-release")
		p.Do(ctx, "CLIENT", "PAUSE", 60000, "WRITE")
		return nil
	})
	must(t, err)
}

// confirmOutcomes records each held grant's confirmation outcome (WithConfirmHook).
type confirmOutcomes struct {
	mu  sync.Mutex
	got []bool
}

func (o *confirmOutcomes) record(ok bool) { o.mu.Lock(); o.got = append(o.got, ok); o.mu.Unlock() }

func (o *confirmOutcomes) list() []bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]bool(nil), o.got...)
}

// grantedWhilePaused makes semaphore "s" with its 1 permit taken by an admin connection
// (closed at cleanup), queues a client's waiter on it, then grants it the permit with
// every write paused, and returns once Acquire returned on its granted message: the admin
// connection, the waiter's semaphore and its confirmation outcomes.
func grantedWhilePaused(t *testing.T) (*redis.Conn, *rlock.Semaphore, *confirmOutcomes) {
	t.Helper()
	outcomes := &confirmOutcomes{}
	s, _, c := setup(t, rlock.WithConfirmHook(outcomes.record))
	ctx := context.Background()
	admin := s.Client(t).Conn()
	t.Cleanup(func() { admin.Close() })
	semHeldByAdmin(t, ctx, admin, "s")
	sem := c.NewSemaphore("s")
	got := waitForSemaphore(t, ctx, admin, sem)
	grantAndPauseWrites(t, ctx, admin, "s")
	select {
	case err := <-got:
		must(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Acquire did not return on the granted message (writes are paused)")
	}
	return admin, sem, outcomes
}

// semInfo reads one field of RSEMAPHORE.INFO (a map under RESP3, pairs under RESP2).
func semInfo(ctx context.Context, admin *redis.Conn, key, field string) (int64, error) {
	v, err := admin.Do(ctx, "RSEMAPHORE.INFO", key).Result()
	if err != nil {
		return 0, err
	}
	switch m := v.(type) {
	case map[any]any:
		n, _ := m[field].(int64)
		return n, nil
	case []any:
		for i := 0; i+1 < len(m); i += 2 {
			if m[i] == field {
				n, _ := m[i+1].(int64)
				return n, nil
			}
		}
	}
	return 0, errors.New("no " + field)
}

// rejectedConnections is INFO's count of connections refused at maxclients.
func rejectedConnections(t *testing.T, ctx context.Context, admin *redis.Conn) int64 {
	t.Helper()
	info, err := admin.Info(ctx, "stats").Result()
	must(t, err)
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "rejected_connections:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			must(t, err)
			return n
		}
	}
	t.Fatal("no rejected_connections in INFO stats")
	return 0
}

func available(t *testing.T, ctx context.Context, admin *redis.Conn, key string) int64 {
	t.Helper()
	n, err := admin.Do(ctx, "RSEMAPHORE.AVAILABLEPERMITS", key).Int64()
	must(t, err)
	return n
}

// The semaphore's waiter returns on its granted message while writes are paused (a
// collect is a write and would wait out the pause); its release, once writes resume,
// gives back exactly the permit it holds.
func TestASemaphoreWaiterHoldsOnItsGrantedMessage(t *testing.T) {
	ctx := context.Background()
	admin, sem, outcomes := grantedWhilePaused(t)
	must(t, admin.Do(ctx, "CLIENT", "UNPAUSE").Err())
	must(t, sem.Release(ctx, 1))
	if n := available(t, ctx, admin, "s"); n != 1 {
		t.Fatalf("available permits %d after the release, want 1", n)
	}
	if o := outcomes.list(); len(o) != 1 || !o[0] {
		t.Fatalf("confirmation outcomes %v, want one confirmed", o)
	}
}

// A grant held on its message and then taken back is not released again. The
// confirmation is held back: writes paused, maxclients at 1 (only the test's connection)
// and every other connection killed, so the client's retries are refused with "ERR max
// number of clients reached" (which must not settle them). With `rlock.ticket-confirm-ms
// 0` the module takes the grant back once writes resume (the permit is available again),
// and the client's reconnects are seen refused (INFO rejected_connections);
// Release(1), called before that, waits for the confirmation's outcome; maxclients
// restored, the retried confirmation answers TAKENBACK, and the release sends nothing:
// the semaphore keeps exactly 1 permit, not 2.
func TestASemaphoreGrantTakenBackIsNotReleasedAgain(t *testing.T) {
	ctx := context.Background()
	admin, sem, outcomes := grantedWhilePaused(t)
	maxclients, err := admin.ConfigGet(ctx, "maxclients").Result()
	must(t, err)
	t.Cleanup(func() { admin.ConfigSet(context.Background(), "maxclients", maxclients["maxclients"]) })
	// Kill the ticket connection, the hub's pub/sub one and the client's idle pooled
	// ones: a confirmation retried on one of those would wait behind the pause and could
	// land before the take-back.
	rejected := rejectedConnections(t, ctx, admin)
	must(t, admin.ConfigSet(ctx, "maxclients", "1").Err())
	must(t, admin.Do(ctx, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes").Err())
	_ = admin.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err()
	released := within(func(ctx context.Context) error { return sem.Release(ctx, 1) })
	must(t, admin.Do(ctx, "CLIENT", "UNPAUSE").Err())
	testserver.WaitUntil(t, 10*time.Second, "the grant taken back", func() bool {
		return available(t, ctx, admin, "s") == 1
	})
	// The confirmation's retries reach the server and are refused (go-redis reads the
	// refusal as a broken connection): still no answer, so the release still waits.
	testserver.WaitUntil(t, 4*time.Second, "the confirmation's reconnects refused", func() bool {
		return rejectedConnections(t, ctx, admin) >= rejected+2
	})
	select {
	case err := <-released:
		t.Fatalf("Release returned (%v) before its grant's confirmation was answered", err)
	default:
	}
	must(t, admin.ConfigSet(ctx, "maxclients", maxclients["maxclients"]).Err())
	select {
	case err := <-released:
		must(t, err)
	case <-time.After(15 * time.Second):
		t.Fatal("Release did not return after the confirmation was answered")
	}
	if o := outcomes.list(); len(o) != 1 || o[0] {
		t.Fatalf("confirmation outcomes %v, want one not confirmed", o)
	}
	if n := available(t, ctx, admin, "s"); n != 1 {
		t.Fatalf("available permits %d after the release of a taken-back grant, want 1", n)
	}
	// Nothing else of the grant is left to release: the count stays.
	time.Sleep(300 * time.Millisecond)
	if n := available(t, ctx, admin, "s"); n != 1 {
		t.Fatalf("available permits %d later, want 1", n)
	}
	// The debt is spent: the next grant's release is sent as usual.
	must(t, sem.Acquire(ctx, 1))
	if n := available(t, ctx, admin, "s"); n != 0 {
		t.Fatalf("available permits %d while held, want 0", n)
	}
	must(t, sem.Release(ctx, 1))
	if n := available(t, ctx, admin, "s"); n != 1 {
		t.Fatalf("available permits %d after a plain release, want 1", n)
	}
}
