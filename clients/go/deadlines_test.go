// A timed wait ends by its own deadline on the client's clock, and a grant that races
// that deadline is given back, never left held by a caller that was told no. The server
// is frozen (DEBUG SLEEP, from a connection of its own) across the waiter's deadline, so
// that everything it sends comes late by the whole freeze: a client that ends its wait
// by its own clock is on time regardless. The lock's and the semaphore's waiters hold on
// their granted message (a grant heard after the deadline goes to the orphan, which
// collects it and gives it back): both go through the hub's one wait.

package rlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	rlock "github.com/rlock/rlock/clients/go"
	"github.com/rlock/rlock/clients/go/internal/proto"
	"github.com/rlock/rlock/clients/go/internal/testserver"
)

const (
	// deadlineWait is the waiter's wait; freezeFor how long the server sleeps across it.
	deadlineWait = 400 * time.Millisecond
	freezeFor    = time.Second
	// deadlineSlack is how late after its deadline the waiter may return: a CPU for the
	// timer's goroutine on a loaded machine (up to 87 ms late seen at load 10 on 2 cores,
	// under nice 19), far below the freeze.
	deadlineSlack = 250 * time.Millisecond
)

// serverWaiters is the server's count of queued tickets (INFO rlock, rlock_waiters).
func serverWaiters(rdb *redis.Client) int64 { return rlockStat(rdb, "rlock_waiters") }

// rlockStat is one field of INFO rlock (-1 when it cannot be read).
func rlockStat(rdb *redis.Client, field string) int64 {
	text, err := rdb.Info(context.Background(), "rlock").Result()
	if err != nil {
		return -1
	}
	n, ok := proto.InfoField(text, field)
	if !ok {
		return -1
	}
	return n
}

// freezeOnceQueued sends `DEBUG SLEEP` (freezeFor) on a connection of its own, after a
// ticket is queued and then `after`, with the commands of behind pipelined after it: the
// server runs nothing meanwhile (no timer, no reply, no message), and behind runs as it
// wakes, before its timers (a ticket's deadline among them). The returned channel closes
// when the server is awake again.
func freezeOnceQueued(t *testing.T, s *testserver.Server, after time.Duration, behind ...[]any) <-chan struct{} {
	admin := s.Client(t)
	testserver.WaitUntil(t, 10*time.Second, "a ticket queued", func() bool { return serverWaiters(admin) >= 1 })
	woke := make(chan struct{})
	go func() {
		defer close(woke)
		time.Sleep(after)
		p := admin.Pipeline()
		p.Do(context.Background(), "DEBUG", "SLEEP", freezeFor.Seconds())
		for _, args := range behind {
			p.Do(context.Background(), args...)
		}
		if _, err := p.Exec(context.Background()); err != nil {
			t.Errorf("DEBUG SLEEP and %v: %v", behind, err)
		}
	}()
	return woke
}

// deadlineCase is one primitive's timed wait on a resource taken outside the client, and
// the release of that resource.
type deadlineCase struct {
	name string
	// take makes the resource unavailable; wait waits for it deadlineWait; release gives
	// it back; free tells whether it is whole again (nobody holds it).
	take    [][]any
	wait    func() error
	release []any
	free    func() bool
}

func deadlineCases(c *rlock.Client, rdb *redis.Client) []deadlineCase {
	ctx := context.Background()
	waiter := c.NewMutex("dl:lock", rlock.WithWaitLimit(deadlineWait))
	sem := c.NewSemaphore("dl:sem")
	return []deadlineCase{
		{
			name:    "lock, held on its granted message",
			take:    [][]any{{"RLOCK.ACQUIRE", "dl:lock", "outside", 30000}},
			wait:    waiter.TryLock,
			release: []any{"RLOCK.RELEASE", "dl:lock", "outside"},
			free: func() bool {
				return rdb.Exists(ctx, "dl:lock").Val() == 0 && waiter.Held() == 0
			},
		},
		{
			name:    "semaphore, held on its granted message",
			take:    [][]any{{"RSEMAPHORE.TRYSETPERMITS", "dl:sem", 1}, {"RSEMAPHORE.ACQUIRE", "dl:sem", 1}},
			wait:    func() error { return sem.TryAcquire(ctx, 1, deadlineWait) },
			release: []any{"RSEMAPHORE.RELEASE", "dl:sem", 1},
			free:    func() bool { n, err := sem.Available(ctx); return err == nil && n == 1 },
		},
	}
}

// doRaw runs one command on rdb (a nil reply is no error).
func doRaw(t *testing.T, rdb *redis.Client, args []any) {
	t.Helper()
	if err := rdb.Do(context.Background(), args...).Err(); err != nil && !errors.Is(err, redis.Nil) {
		t.Fatalf("%v: %v", args, err)
	}
}

func TestATimedWaitEndsByItsDeadlineWhileTheServerIsFrozen(t *testing.T) {
	s, rdb, c := setup(t)
	for _, tc := range deadlineCases(c, rdb) {
		t.Run(tc.name, func(t *testing.T) {
			for _, args := range tc.take {
				doRaw(t, rdb, args)
			}
			got := make(chan error, 1)
			start := time.Now()
			go func() { got <- tc.wait() }()
			woke := freezeOnceQueued(t, s, 50*time.Millisecond)
			err := <-got
			elapsed := time.Since(start)
			<-woke
			t.Logf("returned after %v (wait %v, server frozen for %v)", elapsed, deadlineWait, freezeFor)
			if !errors.Is(err, rlock.ErrTimeout) {
				t.Fatalf("wait = %v, want ErrTimeout", err)
			}
			if elapsed < deadlineWait || elapsed > deadlineWait+deadlineSlack {
				t.Fatalf("returned after %v, want within %v of its %v wait", elapsed, deadlineSlack, deadlineWait)
			}
			// The server's own timeout comes after its freeze, to the orphan left behind.
			testserver.WaitUntil(t, 10*time.Second, "the ticket timed out in the server", func() bool {
				return serverWaiters(rdb) == 0
			})
			doRaw(t, rdb, tc.release)
			testserver.WaitUntil(t, 10*time.Second, "free", tc.free)
		})
	}
}

// A release that reaches the frozen server runs when it wakes, after the waiter's
// deadline: sent after that deadline it runs after the ticket's own timer (the ticket
// timed out); pipelined behind the freeze it runs before that timer, and the grant goes
// to the ticket of a waiter that has been told ErrTimeout, which the client collects and
// gives back. Either way the waiter was told in time and nobody holds the lock or permit.
func TestAGrantMadeAfterTheWaitersDeadlineIsGivenBack(t *testing.T) {
	s, rdb, c := setup(t)
	for _, tc := range deadlineCases(c, rdb) {
		for _, behind := range []bool{false, true} {
			name := tc.name + ", released after the deadline"
			if behind {
				name = tc.name + ", released as the server wakes"
			}
			t.Run(name, func(t *testing.T) {
				for _, args := range tc.take {
					doRaw(t, rdb, args)
				}
				granted := rlockStat(rdb, "rlock_tickets_granted")
				got := make(chan error, 1)
				start := time.Now()
				go func() { got <- tc.wait() }()
				released := make(chan struct{})
				var woke <-chan struct{}
				if behind {
					woke = freezeOnceQueued(t, s, 20*time.Millisecond, tc.release)
					close(released)
				} else {
					woke = freezeOnceQueued(t, s, 20*time.Millisecond)
					go func() {
						defer close(released)
						time.Sleep(time.Until(start.Add(deadlineWait + 50*time.Millisecond)))
						if err := rdb.Do(context.Background(), tc.release...).Err(); err != nil {
							t.Errorf("%v: %v", tc.release, err)
						}
					}()
				}
				err := <-got
				elapsed := time.Since(start)
				<-woke
				<-released
				t.Logf("returned %v after %v", err, elapsed)
				if !errors.Is(err, rlock.ErrTimeout) || elapsed > deadlineWait+deadlineSlack {
					t.Fatalf("wait = %v after %v, want ErrTimeout by %v", err, elapsed, deadlineWait+deadlineSlack)
				}
				testserver.WaitUntil(t, 10*time.Second, "free", tc.free)
				testserver.WaitUntil(t, 10*time.Second, "no ticket left", func() bool { return serverWaiters(rdb) == 0 })
				if n := rlockStat(rdb, "rlock_tickets_granted") - granted; behind && n != 1 {
					t.Fatalf("%d tickets granted as the server woke, want the waiter's 1 (given back)", n)
				}
			})
		}
	}
}
