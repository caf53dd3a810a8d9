// Integration tests of a ticket that holds when its grant arrives (design.md 5, the
// server's `ticket-holds` feature): the lock's waiter returns on the granted message with
// the confirmation still in flight; a confirmation that cannot land (writes paused, the
// ticket connection killed, `rlock.ticket-confirm-ms 0`) reports the hold lost; the
// fenced lock and the expirable semaphore hold on it too, reading the token and the permit
// id from the message. A waiter whose grant is taken back before the message reached it
// (both hub connections killed with the grant) is answered TAKENBACK and queues again
// under a fresh id. And the opt-in blocked waits (WithBlockingWaits), which queue no
// ticket, and whose kill at a context's end ends no other wait.

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

// A blocked wait whose context ended is killed (CLIENT KILL ID) on another connection,
// and its grant, if the wait was granted before the kill landed, is given back. Such a
// kill can still be on its way when the wait's reply has come: the connection it is
// aimed at must serve no other blocked wait, which it would end. The kill is held back
// (WithKillHook) until a second wait blocks; it must end neither.
func TestWithBlockingWaitsAKillAimedAtAFinishedWaitEndsNoOtherWait(t *testing.T) {
	aimed := make(chan int64, 1)
	hold := make(chan struct{})
	_, rdb, c := setup(t, rlock.WithBlockingWaits(), rlock.WithKillHook(func(id int64) {
		aimed <- id
		<-hold
	}))
	ctx := context.Background()
	blocked := func() bool {
		for _, line := range strings.Split(rdb.ClientList(ctx).Val(), "\n") {
			if strings.Contains(line, "flags=b ") && strings.Contains(line, "cmd=rlock.acquire") {
				return true
			}
		}
		return false
	}
	holder := c.NewMutex("k1")
	must(t, holder.Lock())
	wctx, cancel := context.WithCancel(ctx)
	first := make(chan error, 1)
	go func() { first <- c.NewMutex("k1").LockContext(wctx) }()
	testserver.WaitUntil(t, 10*time.Second, "the first wait blocked", blocked)
	cancel()
	var id int64
	select {
	case id = <-aimed:
	case <-time.After(10 * time.Second):
		t.Fatal("no kill for the first wait")
	}
	// Granted before the kill lands: the reply comes, the grant is given back.
	_, err := holder.Unlock()
	must(t, err)
	select {
	case err := <-first:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("the first wait: %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the first wait did not end with its reply")
	}
	testserver.WaitUntil(t, 10*time.Second, "the first wait's grant given back", func() bool {
		return rdb.Exists(ctx, "k1").Val() == 0
	})
	holder2, waiter2 := c.NewMutex("k2"), c.NewMutex("k2")
	must(t, holder2.Lock())
	second := within(waiter2.LockContext)
	testserver.WaitUntil(t, 10*time.Second, "the second wait blocked", blocked)
	close(hold)
	testserver.WaitUntil(t, 10*time.Second, "the kill landed", func() bool {
		list, err := rdb.Do(ctx, "CLIENT", "LIST", "ID", id).Text()
		return err == nil && strings.TrimSpace(list) == ""
	})
	_, err = holder2.Unlock()
	must(t, err)
	if err := <-second; err != nil {
		t.Fatalf("the second wait, on a connection the first one's kill was aimed at: %v", err)
	}
	if waiter2.Held() != 1 {
		t.Fatal("the second waiter does not hold the lock")
	}
}

// holdCase is one primitive that holds on its granted message: how a holder outside the
// client takes it, how the client's waiter waits, and what the waiter holds.
type holdCase struct {
	name string
	// take: the outside holder takes it; returns the command that releases it.
	take func(t *testing.T, admin *redis.Client) []any
	// wait: the client's waiter; returns its lost signal and error when it holds.
	wait func(c *rlock.Client) (done <-chan struct{}, errNow func() error, err error)
	info string
}

func heldCases() []holdCase {
	ctx := context.Background()
	return []holdCase{
		{
			name: "fenced",
			info: "RLOCK.INFO",
			take: func(t *testing.T, admin *redis.Client) []any {
				if err := admin.Do(ctx, "RFENCED.ACQUIRE", "k", "holder", 30000).Err(); err != nil {
					t.Fatal(err)
				}
				return []any{"RLOCK.RELEASE", "k", "holder"}
			},
			wait: func(c *rlock.Client) (<-chan struct{}, func() error, error) {
				m := c.NewFencedMutex("k")
				tok, err := m.LockToken(context.Background())
				if err == nil && tok <= 1 {
					// The outside holder had token 1: the waiter's is larger.
					err = errors.New("token " + strconv.FormatInt(tok, 10) + " after the holder's 1")
				}
				return m.Done(), m.Err, err
			},
		},
		{
			name: "permit",
			info: "RPSEMAPHORE.INFO",
			take: func(t *testing.T, admin *redis.Client) []any {
				if err := admin.Do(ctx, "RPSEMAPHORE.TRYSETPERMITS", "k", 1, "ID", "setup").Err(); err != nil {
					t.Fatal(err)
				}
				id, err := admin.Do(ctx, "RPSEMAPHORE.ACQUIRE", "k", 30000, "ID", "outside").Text()
				if err != nil {
					t.Fatal(err)
				}
				return []any{"RPSEMAPHORE.RELEASE", "k", id}
			},
			wait: func(c *rlock.Client) (<-chan struct{}, func() error, error) {
				p, err := c.NewPermitSemaphore("k").Acquire(context.Background(), 0)
				if err != nil {
					return nil, nil, err
				}
				if len(p.ID()) != 32 {
					return nil, nil, errors.New("permit id " + p.ID())
				}
				return p.Done(), p.Err, nil
			},
		},
	}
}

// The fenced lock's and the expirable semaphore's waiters hold on the granted message
// too (the token, the permit id read from its detail): they return while every write is
// paused, which a collect would wait for; and a grant taken back (its confirmation's
// connection killed, `rlock.ticket-confirm-ms 0`) fires the lost signal.
func TestFencedAndPermitWaitersHoldOnTheGrantAndAreToldWhenItIsTakenBack(t *testing.T) {
	for _, tc := range heldCases() {
		t.Run(tc.name, func(t *testing.T) {
			s, _, c := setup(t)
			ctx := context.Background()
			admin := s.Client(t)
			if err := admin.ConfigSet(ctx, "rlock.ticket-confirm-ms", "0").Err(); err != nil {
				t.Fatal(err)
			}
			release := tc.take(t, admin)
			type held struct {
				done   <-chan struct{}
				errNow func() error
				err    error
			}
			got := make(chan held, 1)
			go func() {
				d, e, err := tc.wait(c)
				got <- held{d, e, err}
			}()
			testserver.WaitUntil(t, 10*time.Second, "the waiter queued", func() bool {
				return infoWaiters(t, tc.info, "k") == 1
			})
			t.Cleanup(func() { admin.Do(context.Background(), "CLIENT", "UNPAUSE") })
			if _, err := admin.TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.Do(ctx, release...)
				p.Do(ctx, "CLIENT", "PAUSE", 60000, "WRITE")
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			var h held
			select {
			case h = <-got:
				if h.err != nil {
					t.Fatal(h.err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the waiter did not return on the granted message")
			}
			if err := h.errNow(); err != nil {
				t.Fatalf("Err = %v; want held", err)
			}
			id := ticketCommandConn(ctx, admin)
			if id == "" {
				t.Fatal("no ticket connection")
			}
			if err := admin.Do(ctx, "CLIENT", "KILL", "ID", id).Err(); err != nil {
				t.Fatal(err)
			}
			select {
			case <-h.done:
			case <-time.After(15 * time.Second):
				t.Fatal("the holder was never told its grant was taken back")
			}
			if !errors.Is(h.errNow(), rlock.ErrLost) {
				t.Fatalf("Err = %v, want ErrLost", h.errNow())
			}
		})
	}
}

// Issue 42: a grant taken back before its waiter had it, end to end. The outside holder's
// release grants the lock to the client's queued waiter, and in the same transaction
// both of the hub's connections are killed, so the `granted` message dies in the
// notification connection's buffer and nothing confirms the grant; with
// `rlock.ticket-confirm-ms 0` the server takes it back at once and hands the lock to the
// next in line (a blocked waiter). The client's waiter, queuing again under its request
// id on new connections, is answered TAKENBACK, queues under a fresh id behind that
// holder, and gets the lock when it is released: it never held while the other did, and
// it is not told of a loss (it never held).
func TestAWaiterWhoseGrantWasTakenBackBeforeItHadItQueuesAgain(t *testing.T) {
	s, rdb, c := setup(t)
	ctx := context.Background()
	must(t, rdb.ConfigSet(ctx, "rlock.ticket-confirm-ms", "0").Err())
	takeOutside(t, rdb, "k")
	m := c.NewMutex("k")
	got := within(m.LockContext)
	testserver.WaitUntil(t, 10*time.Second, "the client's waiter queued", func() bool {
		return infoWaiters(t, "RLOCK.INFO", "k") == 1
	})
	// The next in line: a blocked wait on a connection of its own (not a pub/sub one).
	blocked := s.Client(t)
	next := make(chan error, 1)
	go func() {
		err := blocked.Do(context.Background(), "RLOCK.ACQUIRE", "k", "next", 30000, "WAIT", 0).Err()
		if errors.Is(err, redis.Nil) {
			err = nil
		}
		next <- err
	}()
	testserver.WaitUntil(t, 10*time.Second, "the blocked waiter queued", func() bool {
		return infoWaiters(t, "RLOCK.INFO", "k") == 2
	})
	id := ticketCommandConn(ctx, rdb)
	if id == "" {
		t.Fatal("no ticket connection")
	}
	if _, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Do(ctx, "RLOCK.RELEASE", "k", "outside")
		p.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub")
		p.Do(ctx, "CLIENT", "KILL", "ID", id)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-next:
		must(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the taken-back grant was not passed on to the next waiter")
	}
	select {
	case err := <-got:
		t.Fatalf("the client's waiter returned (%v) while the next waiter holds", err)
	default:
	}
	testserver.WaitUntil(t, 20*time.Second, "the client's waiter queued again", func() bool {
		return infoWaiters(t, "RLOCK.INFO", "k") == 1
	})
	if m.Held() != 0 {
		t.Fatal("the client's waiter holds while the next waiter does")
	}
	must(t, rdb.Do(ctx, "RLOCK.RELEASE", "k", "next").Err())
	select {
	case err := <-got:
		must(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the client's waiter was not granted the lock after the next one released it")
	}
	if m.Held() != 1 || m.Err() != nil {
		t.Fatalf("Held = %d, Err = %v; want held", m.Held(), m.Err())
	}
	if owner := rdb.HKeys(ctx, "k").Val(); len(owner) != 1 || owner[0] != m.Owner() {
		t.Fatalf("the lock's owners: %v, want %s", owner, m.Owner())
	}
}

// takeOutside takes lock key for an owner outside the clients under test ("outside").
func takeOutside(t *testing.T, rdb *redis.Client, key string) {
	t.Helper()
	if err := rdb.Do(context.Background(), "RLOCK.ACQUIRE", key, "outside", 30000).Err(); err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
}

func releaseOutside(t *testing.T, rdb *redis.Client, key string) {
	t.Helper()
	must(t, rdb.Do(context.Background(), "RLOCK.RELEASE", key, "outside").Err())
}
