// Integration tests of a ticket hub whose notification (pub/sub) connection alone dies:
// the session ends, and its ticket command connection must close for real (the server
// drops the tickets queued there and takes back their unconfirmed grants), not go back to
// the application's pool with tickets still queued on it. The waiter queues again on a
// new session and is granted once the holder lets go; afterwards the lock's owner and the
// semaphore's permits are what they should be.

package rlock_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rlock/rlock/clients/go/internal/testserver"
)

// clientFields is CLIENT LIST's line for each connection, as its fields by name.
func clientFields(ctx context.Context, admin *redis.Client) []map[string]string {
	var out []map[string]string
	for _, line := range strings.Split(admin.ClientList(ctx).Val(), "\n") {
		f := map[string]string{}
		for _, kv := range strings.Fields(line) {
			if k, v, ok := strings.Cut(kv, "="); ok {
				f[k] = v
			}
		}
		if f["id"] != "" {
			out = append(out, f)
		}
	}
	return out
}

// connected tells whether a connection with this id is in CLIENT LIST.
func connected(ctx context.Context, admin *redis.Client, id string) bool {
	for _, f := range clientFields(ctx, admin) {
		if f["id"] == id {
			return true
		}
	}
	return false
}

// killTicketNotifications kills the hub's notification connection only (the one
// connection subscribed to a channel: `sub=` or `ssub=` above 0) and returns the id of
// the ticket command connection it was paired with.
func killTicketNotifications(t *testing.T, admin *redis.Client) string {
	t.Helper()
	ctx := context.Background()
	cmd := ticketCommandConn(ctx, admin)
	if cmd == "" {
		t.Fatal("no ticket connection")
	}
	var subs []string
	for _, f := range clientFields(ctx, admin) {
		n, _ := strconv.Atoi(f["sub"])
		m, _ := strconv.Atoi(f["ssub"])
		if n+m > 0 {
			subs = append(subs, f["id"])
		}
	}
	if len(subs) != 1 {
		t.Fatalf("subscribed connections: %v, want the hub's one", subs)
	}
	must(t, admin.Do(ctx, "CLIENT", "KILL", "ID", subs[0]).Err())
	return cmd
}

// requeuedOnANewConnection waits until the old ticket connection is gone from CLIENT
// LIST and the waiter is queued again (waiters() == 1) on a new one.
func requeuedOnANewConnection(t *testing.T, admin *redis.Client, old string, waiters func() int64) {
	t.Helper()
	ctx := context.Background()
	testserver.WaitUntil(t, 10*time.Second, "the old ticket connection closed", func() bool {
		return !connected(ctx, admin, old)
	})
	testserver.WaitUntil(t, 10*time.Second, "the waiter queued again on a new ticket connection", func() bool {
		id := ticketCommandConn(ctx, admin)
		return id != "" && id != old && waiters() == 1
	})
}

func TestALockWaiterWhoseNotificationConnectionDiedClosesItsTicketConnection(t *testing.T) {
	s, _, c := setup(t)
	ctx := context.Background()
	admin := s.Client(t) // its own pool: never hands out the client's connections
	takeOutside(t, admin, "k")
	m := c.NewMutex("k")
	got := within(m.LockContext)
	testserver.WaitUntil(t, 10*time.Second, "the waiter queued", func() bool {
		return infoWaiters(t, "RLOCK.INFO", "k") == 1
	})
	old := killTicketNotifications(t, admin)
	requeuedOnANewConnection(t, admin, old, func() int64 { return infoWaiters(t, "RLOCK.INFO", "k") })
	releaseOutside(t, admin, "k")
	must(t, <-got)
	if owners := admin.HKeys(ctx, "k").Val(); m.Held() != 1 || len(owners) != 1 || owners[0] != m.Owner() {
		t.Fatalf("Held = %d, the lock's owners %v; want held by %s alone", m.Held(), owners, m.Owner())
	}
	if freed, err := m.Unlock(); err != nil || !freed {
		t.Fatalf("Unlock = %v, %v; want freed", freed, err)
	}
	if admin.Exists(ctx, "k").Val() != 0 || infoWaiters(t, "RLOCK.INFO", "k") != 0 {
		t.Fatal("the lock or a waiter is left after the last Unlock")
	}
}

func TestASemaphoreWaiterWhoseNotificationConnectionDiedClosesItsTicketConnection(t *testing.T) {
	s, _, c := setup(t)
	ctx := context.Background()
	admin := s.Client(t)
	must(t, admin.Do(ctx, "RSEMAPHORE.TRYSETPERMITS", "s", 2, "ID", "setup").Err())
	if v, err := admin.Do(ctx, "RSEMAPHORE.ACQUIRE", "s", 2, "ID", "outside").Int64(); err != nil || v != 1 {
		t.Fatalf("the outside acquire: %v %v", v, err)
	}
	sem := c.NewSemaphore("s")
	got := within(func(ctx context.Context) error { return sem.Acquire(ctx, 1) })
	testserver.WaitUntil(t, 10*time.Second, "the waiter queued", func() bool { return semWaiters(t, sem) == 1 })
	old := killTicketNotifications(t, admin)
	requeuedOnANewConnection(t, admin, old, func() int64 { return semWaiters(t, sem) })
	must(t, admin.Do(ctx, "RSEMAPHORE.RELEASE", "s", 2, "ID", "outside-release").Err())
	must(t, <-got)
	must(t, sem.Release(ctx, 1))
	// Every permit free once all released: none kept by a ticket left on a connection
	// the server never saw close.
	testserver.WaitUntil(t, 10*time.Second, "both permits free", func() bool {
		n, err := sem.Available(ctx)
		return err == nil && n == 2 && semWaiters(t, sem) == 0
	})
}
