// Integration tests of the Mutex against a real module-loaded server (internal/
// testserver): re-entry, exclusion, queued waiting on one notification connection, the
// typed errors, the watchdog, lost-lock detection, retries with request ids, replica
// sync.

package rlock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	rlock "github.com/rlock/rlock/clients/go"
	"github.com/rlock/rlock/clients/go/internal/testserver"
)

// setup starts a server and returns a raw go-redis client and an rlock Client on it.
func setup(t *testing.T, opts ...rlock.Option) (*testserver.Server, *redis.Client, *rlock.Client) {
	t.Helper()
	return setupServer(t, nil, opts...)
}

// setupServer is setup with extra server arguments (an AOF for the restart tests).
func setupServer(t *testing.T, serverArgs []string, opts ...rlock.Option) (*testserver.Server, *redis.Client, *rlock.Client) {
	t.Helper()
	s := testserver.Start(t, serverArgs...)
	rdb := s.Client(t)
	c := rlock.New(rdb, opts...)
	infoMu.Lock()
	infoServer[t] = rdb
	infoMu.Unlock()
	t.Cleanup(func() {
		c.Close()
		infoMu.Lock()
		delete(infoServer, t)
		infoMu.Unlock()
	})
	return s, rdb, c
}

func TestMutexReentersAndExcludes(t *testing.T) {
	_, rdb, c := setup(t)
	ctx := context.Background()
	a, b := c.NewMutex("orders:1"), c.NewMutex("orders:1")
	if err := a.Lock(); err != nil {
		t.Fatal(err)
	}
	if err := a.Lock(); err != nil {
		t.Fatal(err)
	}
	if got := rdb.HGet(ctx, "orders:1", a.Owner()).Val(); got != "2" {
		t.Fatalf("hold count in the server = %q, want 2", got)
	}
	if err := b.TryLock(); !errors.Is(err, rlock.ErrTaken) {
		t.Fatalf("TryLock on a held lock = %v, want ErrTaken", err)
	}
	if freed, err := a.Unlock(); err != nil || freed {
		t.Fatalf("first Unlock = %v, %v; want still held", freed, err)
	}
	if freed, err := a.Unlock(); err != nil || !freed {
		t.Fatalf("second Unlock = %v, %v; want freed", freed, err)
	}
	if rdb.Exists(ctx, "orders:1").Val() != 0 {
		t.Fatal("the lock key is still there after the last Unlock")
	}
	if _, err := a.Unlock(); !errors.Is(err, rlock.ErrNotHeld) {
		t.Fatalf("Unlock of a free handle = %v, want ErrNotHeld", err)
	}
	if err := b.TryLock(); err != nil {
		t.Fatalf("TryLock on a free lock: %v", err)
	}
	var e *rlock.Error
	if err := a.TryLock(); !errors.As(err, &e) || e.Key != "orders:1" || e.Op != "trylock" {
		t.Fatalf("error does not name the lock: %#v", err)
	}
}

func TestTryLockWithWaitLimitTimesOut(t *testing.T) {
	_, _, c := setup(t)
	holder := c.NewMutex("k")
	if err := holder.Lock(); err != nil {
		t.Fatal(err)
	}
	waiter := c.NewMutex("k", rlock.WithWaitLimit(150*time.Millisecond))
	start := time.Now()
	err := waiter.TryLock()
	if !errors.Is(err, rlock.ErrTimeout) {
		t.Fatalf("TryLock with a wait limit on a held lock = %v, want ErrTimeout", err)
	}
	if time.Since(start) < 150*time.Millisecond {
		t.Fatalf("gave up after %v, before its wait limit", time.Since(start))
	}
}

func TestLockContextEndsWithTheContext(t *testing.T) {
	_, rdb, c := setup(t)
	holder := c.NewMutex("k")
	if err := holder.Lock(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	waiter := c.NewMutex("k")
	errc := make(chan error, 1)
	go func() { errc <- waiter.LockContext(ctx) }()
	testserver.WaitUntil(t, 10*time.Second, "the waiter queued", func() bool {
		info, _ := holder.Info(context.Background())
		return info != nil && info.Waiters == 1
	})
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("LockContext after cancel = %v, want context.Canceled", err)
	}
	// The abandoned ticket's grant is given back: the lock ends up free, not held by a
	// waiter that left.
	if _, err := holder.Unlock(); err != nil {
		t.Fatal(err)
	}
	testserver.WaitUntil(t, 10*time.Second, "the abandoned grant given back", func() bool {
		return rdb.Exists(context.Background(), "k").Val() == 0
	})
}

func TestWaitersAreServedInArrivalOrderOnOneConnection(t *testing.T) {
	_, rdb, c := setup(t)
	ctx := context.Background()
	holder := c.NewMutex("fifo")
	if err := holder.Lock(); err != nil {
		t.Fatal(err)
	}
	const n = 20
	var mu sync.Mutex
	order := []int{}
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		m := c.NewMutex("fifo")
		// Queue them one by one, so their arrival order is known.
		want := int64(i + 1)
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			if err := m.Lock(); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			if _, err := m.Unlock(); err != nil {
				t.Error(err)
			}
		}(i)
		testserver.WaitUntil(t, 10*time.Second, "waiter queued", func() bool {
			info, _ := holder.Info(ctx)
			return info != nil && info.Waiters == want
		})
	}
	// n goroutines wait: the client holds its pool connection(s) plus the two of its
	// ticket hub, not one per waiter.
	list := rdb.ClientList(ctx).Val()
	if got := strings.Count(list, "name="+rlock.ConnectionName); got != 1 {
		t.Fatalf("%d ticket connections, want 1:\n%s", got, list)
	}
	if conns := strings.Count(list, "\n"); conns > 8 {
		t.Fatalf("%d connections for %d waiters:\n%s", conns, n, list)
	}
	if _, err := holder.Unlock(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i, got := range order {
		if got != i {
			t.Fatalf("served in order %v, want arrival order", order)
		}
	}
}

func TestMutualExclusionUnderContention(t *testing.T) {
	_, _, c := setup(t)
	const workers, rounds = 8, 25
	var inside, maxInside, total atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := c.NewMutex("counter")
			for r := 0; r < rounds; r++ {
				if err := m.Lock(); err != nil {
					t.Error(err)
					return
				}
				if v := inside.Add(1); v > maxInside.Load() {
					maxInside.Store(v)
				}
				total.Add(1)
				inside.Add(-1)
				if _, err := m.Unlock(); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if maxInside.Load() != 1 || total.Load() != workers*rounds {
		t.Fatalf("max inside %d (want 1), total %d (want %d)", maxInside.Load(), total.Load(), workers*rounds)
	}
}

func TestWatchdogRenewsALockWithoutLease(t *testing.T) {
	_, rdb, c := setup(t, rlock.WithWatchdogTimeout(600*time.Millisecond))
	ctx := context.Background()
	m := c.NewMutex("wd")
	if err := m.Lock(); err != nil {
		t.Fatal(err)
	}
	// Held across several leases: the watchdog renews it every 200 ms.
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		if rdb.HGet(ctx, "wd", m.Owner()).Val() != "1" {
			t.Fatal("the watchdog let the lock expire")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if m.Err() != nil {
		t.Fatalf("Err while held = %v", m.Err())
	}
	if freed, err := m.Unlock(); err != nil || !freed {
		t.Fatalf("Unlock = %v, %v", freed, err)
	}
	if !errors.Is(m.Err(), rlock.ErrNotHeld) {
		t.Fatalf("Err after Unlock = %v, want ErrNotHeld", m.Err())
	}
}

func TestLostLockIsSignalledAndReported(t *testing.T) {
	_, rdb, c := setup(t, rlock.WithWatchdogTimeout(600*time.Millisecond))
	ctx := context.Background()
	m := c.NewMutex("lost")
	if err := m.Lock(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Del(ctx, "lost").Err(); err != nil { // someone deletes it under us
		t.Fatal(err)
	}
	select {
	case <-m.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the loss was not signalled")
	}
	if !errors.Is(m.Err(), rlock.ErrLost) {
		t.Fatalf("Err = %v, want ErrLost", m.Err())
	}
	if _, err := m.Unlock(); !errors.Is(err, rlock.ErrLost) {
		t.Fatalf("Unlock after the loss = %v, want ErrLost", err)
	}
}

func TestFixedLeaseExtendAndLoss(t *testing.T) {
	_, rdb, c := setup(t)
	ctx := context.Background()
	m := c.NewMutex("lease", rlock.WithLease(10*time.Second))
	if err := m.Lock(); err != nil {
		t.Fatal(err)
	}
	if pttl := rdb.PTTL(ctx, "lease").Val(); pttl <= 0 || pttl > 10*time.Second {
		t.Fatalf("PTTL = %v, want the fixed lease", pttl)
	}
	rdb.PExpire(ctx, "lease", time.Second)
	if ok, err := m.Extend(); err != nil || !ok {
		t.Fatalf("Extend = %v, %v", ok, err)
	}
	if pttl := rdb.PTTL(ctx, "lease").Val(); pttl < 5*time.Second {
		t.Fatalf("PTTL after Extend = %v, want the full lease again", pttl)
	}
	if err := rdb.Del(ctx, "lease").Err(); err != nil {
		t.Fatal(err)
	}
	if ok, err := m.Extend(); ok || !errors.Is(err, rlock.ErrLost) {
		t.Fatalf("Extend of a deleted lock = %v, %v; want ErrLost", ok, err)
	}
	select {
	case <-m.Done():
	default:
		t.Fatal("Done not closed after the loss")
	}
}

func TestReentryOfALostLockStartsOver(t *testing.T) {
	_, rdb, c := setup(t)
	ctx := context.Background()
	m := c.NewMutex("re")
	if err := m.Lock(); err != nil {
		t.Fatal(err)
	}
	rdb.Del(ctx, "re")
	other := c.NewMutex("re")
	if err := other.Lock(); err != nil {
		t.Fatal(err)
	}
	// m still thinks it holds the lock: its re-entry finds another owner, reports the
	// loss, and, as a TryLock, gives up.
	if err := m.TryLock(); !errors.Is(err, rlock.ErrTaken) {
		t.Fatalf("TryLock = %v, want ErrTaken", err)
	}
	if !errors.Is(m.Err(), rlock.ErrLost) {
		t.Fatalf("Err = %v, want ErrLost", m.Err())
	}
}

func TestTicketConnectionKilledWhileWaiting(t *testing.T) {
	_, rdb, c := setup(t)
	ctx := context.Background()
	holder := c.NewMutex("kill")
	if err := holder.Lock(); err != nil {
		t.Fatal(err)
	}
	waiter := c.NewMutex("kill")
	errc := make(chan error, 1)
	go func() { errc <- waiter.Lock() }()
	testserver.WaitUntil(t, 10*time.Second, "the waiter queued", func() bool {
		info, _ := holder.Info(ctx)
		return info != nil && info.Waiters == 1
	})
	ticketConn := func() string {
		for _, line := range strings.Split(rdb.ClientList(ctx).Val(), "\n") {
			if strings.Contains(line, "name="+rlock.ConnectionName) {
				return strings.Fields(line)[0] // id=<n>
			}
		}
		return ""
	}
	before := ticketConn()
	// Kill the ticket connections: the server drops the ticket; the client notices, and
	// queues again on new connections.
	if err := rdb.Do(ctx, "CLIENT", "KILL", "SKIPME", "yes", "TYPE", "normal").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	testserver.WaitUntil(t, 15*time.Second, "the waiter queued again on a new connection", func() bool {
		info, _ := holder.Info(ctx)
		now := ticketConn()
		return info != nil && info.Waiters == 1 && now != "" && now != before
	})
	if _, err := holder.Unlock(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the waiter was not served after its connection was killed")
	}
	if waiter.Held() != 1 {
		t.Fatal("the waiter does not hold the lock")
	}
}

func TestReplicaSyncWaitsForConnectedReplicas(t *testing.T) {
	master, _, c := setup(t)
	ctx := context.Background()
	replica := testserver.Start(t, "--replicaof", "127.0.0.1", fmt.Sprint(master.Port))
	rc := replica.Client(t)
	// Up on the replica's side and listed by the primary's ROLE, which the client counts.
	mc := master.Client(t)
	testserver.WaitUntil(t, 20*time.Second, "replica link up and listed by ROLE", func() bool {
		info := rc.Info(ctx, "replication").Val()
		role, _ := mc.Do(ctx, "ROLE").Slice()
		return strings.Contains(info, "master_link_status:up") && len(role) > 2 &&
			len(role[2].([]interface{})) == 1
	})
	m := c.NewMutex("synced")
	if err := m.Lock(); err != nil {
		t.Fatal(err)
	}
	// The acquire returned only after the replica acknowledged: the lock is there now.
	if rc.HGet(ctx, "synced", m.Owner()).Val() != "1" {
		t.Fatal("the replica does not have the lock after Lock returned")
	}
	// Asking for more replicas than exist: the acquire is undone and reported.
	c2 := rlock.New(master.Client(t), rlock.WithReplicaSync(2, 100*time.Millisecond))
	defer c2.Close()
	m2 := c2.NewMutex("synced2")
	if err := m2.Lock(); !errors.Is(err, rlock.ErrReplicaSync) {
		t.Fatalf("Lock with too few replicas = %v, want ErrReplicaSync", err)
	}
	if master.Client(t).Exists(ctx, "synced2").Val() != 0 {
		t.Fatal("the unsynced lock was not released")
	}
}

// infoServer is each test's raw client, for infoWaiters.
var (
	infoMu     sync.Mutex
	infoServer = map[*testing.T]*redis.Client{}
)

// infoWaiters reads the waiters field of a <PREFIX>.INFO reply on the test's server.
func infoWaiters(t *testing.T, cmd, key string) int64 {
	t.Helper()
	infoMu.Lock()
	rdb := infoServer[t]
	infoMu.Unlock()
	v, err := rdb.Do(context.Background(), cmd, key).Result()
	if err != nil {
		return 0
	}
	switch m := v.(type) {
	case map[interface{}]interface{}:
		n, _ := m["waiters"].(int64)
		return n
	case []interface{}:
		for i := 0; i+1 < len(m); i += 2 {
			if m[i] == "waiters" {
				n, _ := m[i+1].(int64)
				return n
			}
		}
	}
	return 0
}

func TestLockContextEndsWithTheContextsDeadline(t *testing.T) {
	_, _, c := setup(t)
	holder := c.NewMutex("dl")
	must(t, holder.Lock())
	// The server drops the ticket at the context's deadline, maybe a moment before the
	// context itself ends: the caller still sees the context's error, not ErrTimeout.
	for i := 0; i < 5; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		err := c.NewMutex("dl").LockContext(ctx)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("LockContext past its deadline = %v, want context.DeadlineExceeded", err)
		}
	}
}

func TestManyWaitersHoldAConstantNumberOfConnections(t *testing.T) {
	_, rdb, c := setup(t)
	ctx := context.Background()
	holder := c.NewMutex("crowd")
	must(t, holder.Lock())
	const n = 200
	var wg sync.WaitGroup
	var served atomic.Int64
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := c.NewMutex("crowd")
			lctx, cancel := context.WithTimeout(ctx, 60*time.Second)
			defer cancel()
			if err := m.LockContext(lctx); err != nil {
				t.Error(err)
				return
			}
			served.Add(1)
			if _, err := m.Unlock(); err != nil {
				t.Error(err)
			}
		}()
	}
	testserver.WaitUntil(t, 30*time.Second, "200 goroutines queued", func() bool {
		info, _ := holder.Info(ctx)
		return info != nil && info.Waiters == n
	})
	// 200 goroutines wait in the server: the client holds its go-redis pool (at most
	// PoolSize) and the two connections of its ticket hub, not a connection per waiter.
	list := rdb.ClientList(ctx).Val()
	conns := strings.Count(list, "\n")
	t.Logf("%d connections while %d goroutines wait", conns, n)
	if limit := rdb.Options().PoolSize + 2; conns > limit {
		t.Fatalf("%d connections for %d waiters (limit %d)", conns, n, limit)
	}
	_, _ = holder.Unlock()
	wg.Wait()
	if served.Load() != n {
		t.Fatalf("%d of %d served", served.Load(), n)
	}
}

func TestALockIsReportedLostAtItsLeaseEndWhileARenewalHangs(t *testing.T) {
	s := testserver.Start(t)
	// A read timeout longer than the server's silence, as on a cut-off network.
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr, ReadTimeout: 30 * time.Second})
	t.Cleanup(func() { rdb.Close() })
	c := rlock.New(rdb, rlock.WithWatchdogTimeout(900*time.Millisecond))
	defer c.Close()
	m := c.NewMutex("hang")
	must(t, m.Lock())
	// The server stops answering for 10 s: renewals hang; the loss must be signalled
	// when the lease, counted from the last renewal, ends (within 900 ms), not when the
	// server answers again.
	raw := s.Client(t)
	start := time.Now()
	go raw.Do(context.Background(), "DEBUG", "SLEEP", "10")
	select {
	case <-m.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("no loss signalled")
	}
	if took := time.Since(start); took > 7*time.Second {
		t.Fatalf("loss signalled after %v, after the server woke, not at the lease end", took)
	}
	if !errors.Is(m.Err(), rlock.ErrLost) {
		t.Fatalf("Err = %v, want ErrLost", m.Err())
	}
}
