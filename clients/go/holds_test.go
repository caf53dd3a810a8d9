// Integration tests of a ticket that holds when its grant arrives (design.md 5, the
// server's `ticket-holds` feature): the lock's waiter returns on the granted message with
// the confirmation still in flight; a confirmation that cannot land (writes paused, the
// ticket connection killed, `rlock.ticket-confirm-ms 0`) reports the hold lost. (A
// waiter whose id is answered TAKENBACK before it had the grant queues again under a
// fresh id: internal/proto's machine test; the module defers a take-back while writes are
// paused, which lets the waiter's own resend confirm the grant first, so no server-side
// sequence here forces it.) And the opt-in blocked waits (WithBlockingWaits), which queue
// no ticket.

package rlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	rlock "github.com/rlock/rlock/clients/go"
	"github.com/rlock/rlock/clients/go/internal/testserver"
)

// ticketCommandConn is the id of the hub's command connection (CLIENT LIST), or "".
func ticketCommandConn(ctx context.Context, rdb *redis.Client) string {
	for _, line := range strings.Split(rdb.ClientList(ctx).Val(), "\n") {
		if strings.Contains(line, "name="+rlock.ConnectionName) {
			return strings.TrimPrefix(strings.Fields(line)[0], "id=")
		}
	}
	return ""
}

// releaseAndPauseWrites releases owner's hold on key (granting it to the queued waiter)
// and pauses every client's writes in the same transaction, so the waiter's confirmation
// or collect cannot run; unpause is registered for cleanup.
func releaseAndPauseWrites(t *testing.T, admin *redis.Client, key, owner string) {
	t.Helper()
	ctx := context.Background()
	t.Cleanup(func() { admin.Do(context.Background(), "CLIENT", "UNPAUSE") })
	_, err := admin.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Do(ctx, "RLOCK.RELEASE", key, owner)
		p.Do(ctx, "CLIENT", "PAUSE", 60000, "WRITE")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestAHolderWhoseGrantCannotBeConfirmedIsToldItIsLost(t *testing.T) {
	s, _, c := setup(t)
	ctx := context.Background()
	admin := s.Client(t)
	if err := admin.ConfigSet(ctx, "rlock.ticket-confirm-ms", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.Do(ctx, "RLOCK.ACQUIRE", "k", "holder", 30000).Err(); err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	m := c.NewMutex("k")
	errc := make(chan error, 1)
	go func() { errc <- m.Lock() }()
	testserver.WaitUntil(t, 10*time.Second, "the waiter queued", func() bool {
		return infoWaiters(t, "RLOCK.INFO", "k") == 1
	})
	releaseAndPauseWrites(t, admin, "k", "holder")
	// Held on the granted message: a collect before returning would wait for the pause.
	select {
	case err := <-errc:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Lock did not return on the granted message")
	}
	if m.Held() != 1 || m.Err() != nil {
		t.Fatalf("Held = %d, Err = %v; want held", m.Held(), m.Err())
	}
	// The confirmation waits behind the pause; its connection killed, the server takes
	// the grant back at once (ticket-confirm-ms 0) and the holder must be told.
	id := ticketCommandConn(ctx, admin)
	if id == "" {
		t.Fatal("no ticket connection")
	}
	if err := admin.Do(ctx, "CLIENT", "KILL", "ID", id).Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-m.Done():
	case <-time.After(15 * time.Second):
		t.Fatal("the holder was never told its grant was not confirmed")
	}
	if !errors.Is(m.Err(), rlock.ErrLost) {
		t.Fatalf("Err = %v, want ErrLost", m.Err())
	}
}

func TestWithBlockingWaitsAWaitBlocksAConnectionAndQueuesNoTicket(t *testing.T) {
	_, rdb, c := setup(t, rlock.WithBlockingWaits())
	ctx := context.Background()
	holder, waiter := c.NewMutex("b"), c.NewMutex("b")
	if err := holder.Lock(); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- waiter.Lock() }()
	blocked := func() bool {
		for _, line := range strings.Split(rdb.ClientList(ctx).Val(), "\n") {
			if strings.Contains(line, "flags=b ") && strings.Contains(line, "cmd=rlock.acquire") {
				return true
			}
		}
		return false
	}
	testserver.WaitUntil(t, 10*time.Second, "the waiter blocked in the server", blocked)
	if id := ticketCommandConn(ctx, rdb); id != "" {
		t.Fatalf("a ticket connection (id %s) with blocking waits", id)
	}
	if _, err := holder.Unlock(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the blocked waiter was not served")
	}
	if waiter.Held() != 1 {
		t.Fatal("the waiter does not hold the lock")
	}
}
