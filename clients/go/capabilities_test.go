// Integration tests of the capability probe (RLOCK.HELLO) against a real module-loaded
// server: Client.Capabilities, one probe per ticket session (counted in INFO
// commandstats) and again after its connections are killed, and an ACL user refused the
// probe whose waits still work, blocked.

package rlock_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	rlock "github.com/rlock/rlock/clients/go"
	"github.com/rlock/rlock/clients/go/internal/testserver"
)

// helloCalls is how many RLOCK.HELLO the server has run (INFO commandstats).
func helloCalls(t *testing.T, rdb *redis.Client) int64 {
	t.Helper()
	text, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, "cmdstat_rlock.hello:") {
			continue
		}
		for _, f := range strings.Split(strings.TrimSpace(strings.TrimPrefix(line, "cmdstat_rlock.hello:")), ",") {
			if v, ok := strings.CutPrefix(f, "calls="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					t.Fatalf("commandstats: %q", line)
				}
				return n
			}
		}
	}
	return 0
}

func TestCapabilitiesNameTheModuleAndItsTickets(t *testing.T) {
	_, _, c := setup(t)
	caps, err := c.Capabilities(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !caps.Module || caps.Refused || !caps.Tickets() || !caps.Has("lock") || caps.Protocol < 1 || caps.Version == "" {
		t.Fatalf("capabilities: %+v", caps)
	}
}

func TestTheHubProbesOncePerSessionAndAgainAfterAReconnect(t *testing.T) {
	_, rdb, c := setup(t)
	ctx := context.Background()
	holder, waiter := c.NewMutex("probe"), c.NewMutex("probe")
	if err := holder.Lock(); err != nil {
		t.Fatal(err)
	}
	// The client's mode probe (ModeAuto, once per client) came with the first call.
	base := helloCalls(t, rdb)
	queued := func(n int64) func() bool {
		return func() bool { info, _ := holder.Info(ctx); return info != nil && info.Waiters == n }
	}
	errc := make(chan error, 1)
	go func() { errc <- waiter.Lock() }()
	testserver.WaitUntil(t, 10*time.Second, "the waiter queued", queued(1))
	if n := helloCalls(t, rdb) - base; n != 1 {
		t.Fatalf("probes after the first wait = %d, want 1", n)
	}
	// A second waiter on the same session asks nothing.
	other := c.NewMutex("probe")
	errc2 := make(chan error, 1)
	go func() { errc2 <- other.Lock() }()
	testserver.WaitUntil(t, 10*time.Second, "the second waiter queued", queued(2))
	if n := helloCalls(t, rdb) - base; n != 1 {
		t.Fatalf("probes after a second wait on the session = %d, want 1", n)
	}
	// Kill the ticket connections: the new session probes again.
	if err := rdb.Do(ctx, "CLIENT", "KILL", "SKIPME", "yes", "TYPE", "normal").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	testserver.WaitUntil(t, 20*time.Second, "probed again on a new session", func() bool { return helloCalls(t, rdb)-base == 2 })
	testserver.WaitUntil(t, 20*time.Second, "both waiters queued again", queued(2))
	if _, err := holder.Unlock(); err != nil {
		t.Fatal(err)
	}
	// Whichever waiter is served first hands the lock on to the other.
	for i := 0; i < 2; i++ {
		select {
		case err := <-errc:
			if err != nil {
				t.Fatal(err)
			}
			if _, err := waiter.Unlock(); err != nil {
				t.Fatal(err)
			}
		case err := <-errc2:
			if err != nil {
				t.Fatal(err)
			}
			if _, err := other.Unlock(); err != nil {
				t.Fatal(err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("a waiter was not served after the reconnect")
		}
	}
	if n := helloCalls(t, rdb) - base; n != 2 {
		t.Fatalf("probes = %d, want 2", n)
	}
}

func TestAnACLUserRefusedTheProbeWaitsBlocked(t *testing.T) {
	s, rdb, _ := setup(t)
	ctx := context.Background()
	if err := rdb.Do(ctx, "ACL", "SETUSER", "nohello", "on", ">pw", "~*", "&*", "+@all", "-rlock.hello").Err(); err != nil {
		t.Fatal(err)
	}
	udb := redis.NewClient(&redis.Options{Addr: s.Addr, Username: "nohello", Password: "pw"})
	t.Cleanup(func() { udb.Close() })
	c := rlock.New(udb)
	t.Cleanup(func() { c.Close() })
	caps, err := c.Capabilities(ctx)
	if err != nil || !caps.Refused || caps.Tickets() {
		t.Fatalf("capabilities of a user refused the probe: %+v, %v", caps, err)
	}
	holder, waiter := c.NewMutex("acl"), c.NewMutex("acl")
	if err := holder.Lock(); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- waiter.Lock() }()
	testserver.WaitUntil(t, 10*time.Second, "the waiter blocked in the server", func() bool {
		return strings.Contains(rdb.ClientList(ctx).Val(), "cmd=rlock.acquire") && strings.Contains(rdb.Info(ctx, "clients").Val(), "blocked_clients:1")
	})
	if strings.Contains(rdb.ClientList(ctx).Val(), "name="+rlock.ConnectionName) {
		t.Fatal("a ticket connection stayed open on a server that refused the probe")
	}
	if _, err := holder.Unlock(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the blocked waiter was not served")
	}
	// A blocked wait the caller's context ends leaves no waiter behind.
	ctx2, cancel := context.WithCancel(ctx)
	go func() { errc <- holder.LockContext(ctx2) }()
	testserver.WaitUntil(t, 10*time.Second, "the second waiter blocked", func() bool {
		return strings.Contains(rdb.Info(ctx, "clients").Val(), "blocked_clients:1")
	})
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("a cancelled blocked wait = %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a cancelled blocked wait did not return")
	}
	testserver.WaitUntil(t, 10*time.Second, "the cancelled wait left the server", func() bool {
		return strings.Contains(rdb.Info(ctx, "clients").Val(), "blocked_clients:0")
	})
}
