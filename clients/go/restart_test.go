// Integration tests of a ticket wait through a restart of its server (the fault harness's
// restart cells): the lock is granted to the waiting ticket, the server dies before the
// waiter heard of it (or before the holder's confirmation of the grant got through), and
// comes back on the same port from its AOF, which kept the grant and its request id's
// reply. The wait (the confirmation) must connect again until it is back and find the
// grant under the same id; giving up would leave the lock held by an owner that does not
// know it, or report lost a lock its owner still holds. (A lost session is queued again
// up to the client's retry attempts, each a connect with go-redis's own retries, about
// 10 s in all; a confirmation is sent again for up to 5 s.)

package rlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	rlock "github.com/rlock/rlock/clients/go"
	"github.com/rlock/rlock/clients/go/internal/testserver"
)

func TestAWaitRidesOutARestartAndFindsTheGrantMadeBeforeIt(t *testing.T) {
	s, rdb, m, got := queuedBehindOutsideWithAOF(t)
	ctx := context.Background()
	// The grant, written to the AOF (fsync always) before EXEC answers; its message dies
	// with the pub/sub connection, and the waiter's collect is held by the pause until
	// the server goes away.
	t.Cleanup(func() { rdb.Do(context.Background(), "CLIENT", "UNPAUSE") })
	if _, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Do(ctx, "RLOCK.RELEASE", "k", "outside")
		p.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub")
		p.Do(ctx, "CLIENT", "PAUSE", 60000, "WRITE")
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if owners := rdb.HKeys(ctx, "k").Val(); len(owners) != 1 || owners[0] != m.Owner() {
		t.Fatalf("the lock's owners before the restart: %v, want %s", owners, m.Owner())
	}
	// Down for longer than one connect of the hub takes to fail (go-redis's own retries
	// of a refused dial, about 2 s), so the wait connects again at least once.
	s.Restart(t, 3*time.Second)
	select {
	case err := <-got:
		must(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("the wait did not end after the server came back")
	}
	if m.Held() != 1 || m.Err() != nil {
		t.Fatalf("Held = %d, Err = %v; want held once", m.Held(), m.Err())
	}
	if holds := rdb.HGetAll(ctx, "k").Val(); len(holds) != 1 || holds[m.Owner()] != "1" {
		t.Fatalf("the lock after the restart: %v, want %s holding once", holds, m.Owner())
	}
	free, err := m.Unlock()
	must(t, err)
	if !free || rdb.Exists(ctx, "k").Val() != 0 {
		t.Fatalf("Unlock = %v, key exists = %d; want the lock free", free, rdb.Exists(ctx, "k").Val())
	}
}

// A wait that heard its grant holds on it and confirms off its path (design.md 5); the
// server dies after the grant message went out and before the confirmation got through
// (held by CLIENT PAUSE WRITE, which the restart forgets), and stays down for longer than
// the server's grace (rlock.ticket-confirm-ms, 1 s). The restarted server kept the grant
// (AOF, fsync always) and has no ticket connection left to take it back from, so the
// confirmation, sent again under the same request id, finds it: the holder keeps the lock
// (no lost signal) and its unlock frees it. (Before, the client gave up confirming after
// 800 ms and reported a lock it still held lost.)
func TestAHeldGrantIsConfirmedAfterARestartLongerThanTheGrace(t *testing.T) {
	confirmed := make(chan bool, 1)
	s, rdb, m, got := queuedBehindOutsideWithAOF(t, rlock.WithConfirmHook(func(ok bool) { confirmed <- ok }))
	ctx := context.Background()
	// The grant (written to the AOF before EXEC answers) and its message go out; the
	// pause, in force from the end of the EXEC, holds the confirmation the message sets
	// off until the server goes away.
	t.Cleanup(func() { rdb.Do(context.Background(), "CLIENT", "UNPAUSE") })
	if _, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Do(ctx, "RLOCK.RELEASE", "k", "outside")
		p.Do(ctx, "CLIENT", "PAUSE", 60000, "WRITE")
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		must(t, err) // held on the grant message
	case <-time.After(10 * time.Second):
		t.Fatal("the wait did not hold on its grant message")
	}
	select {
	case ok := <-confirmed:
		t.Fatalf("the confirmation settled (%v) through the pause", ok)
	default:
	}
	s.Restart(t, 1500*time.Millisecond)
	select {
	case ok := <-confirmed:
		if !ok {
			t.Fatal("the confirmation after the restart settled the grant taken back")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the confirmation did not settle after the server came back")
	}
	if m.Held() != 1 || m.Err() != nil {
		t.Fatalf("Held = %d, Err = %v; want held once, not lost", m.Held(), m.Err())
	}
	if holds := rdb.HGetAll(ctx, "k").Val(); len(holds) != 1 || holds[m.Owner()] != "1" {
		t.Fatalf("the lock after the restart: %v, want %s holding once", holds, m.Owner())
	}
	free, err := m.Unlock()
	must(t, err)
	if !free || rdb.Exists(ctx, "k").Val() != 0 {
		t.Fatalf("Unlock = %v, key exists = %d; want the lock free", free, rdb.Exists(ctx, "k").Val())
	}
}

// queuedBehindOutsideWithAOF starts a server with an AOF (fsync always), holds "k" as
// "outside" and queues a mutex's LockContext behind it: the server, a raw client, the
// waiting mutex and its result.
func queuedBehindOutsideWithAOF(t *testing.T, opts ...rlock.Option) (*testserver.Server, *redis.Client, *rlock.Mutex, <-chan error) {
	t.Helper()
	s, rdb, c := setupServer(t, []string{"--appendonly", "yes", "--appendfsync", "always"}, opts...)
	takeOutside(t, rdb, "k")
	m := c.NewMutex("k")
	got := within(m.LockContext)
	testserver.WaitUntil(t, 10*time.Second, "the waiter queued", func() bool {
		return infoWaiters(t, "RLOCK.INFO", "k") == 1
	})
	return s, rdb, m, got
}
