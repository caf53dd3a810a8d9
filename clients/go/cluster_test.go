// The client on a 3-master Redis Cluster: commands routed by key, tickets queued and
// heard (SSUBSCRIBE) on the node that owns the key's slot, one hub per node with waiters;
// a ticket follows its node's connections being killed and (Valkey 9.0+) an atomic slot
// migration, which also makes the hub forget a channel left subscribed with no waiter,
// and which must not leave it counting a channel the node redirected as subscribed.

package rlock_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	rlock "github.com/rlock/rlock/clients/go"
	"github.com/rlock/rlock/clients/go/internal/testserver"
)

// clusterSetup starts a 3-master cluster and returns it, a go-redis client on it and an
// rlock Client on that one, closed at cleanup.
func clusterSetup(t *testing.T) (*testserver.Cluster, *redis.ClusterClient, *rlock.Client) {
	t.Helper()
	cl := testserver.StartCluster(t)
	rdb := cl.Client(t)
	c := rlock.New(rdb)
	t.Cleanup(func() { c.Close() })
	return cl, rdb, c
}

// slotMigration skips the test unless the cluster's servers migrate slots atomically
// (CLUSTER MIGRATESLOTS, Valkey 9.0+), and returns key's slot, the master that owns it
// and another master to move it to.
func slotMigration(t *testing.T, cl *testserver.Cluster, rdb *redis.ClusterClient, key string) (int64, *redis.Client, *redis.Client) {
	t.Helper()
	ctx := context.Background()
	info := cl.Nodes[0].Client(t).Info(ctx, "server").Val()
	if !strings.Contains(info, "server_name:valkey") || strings.Contains(info, "valkey_version:8.") || strings.Contains(info, "valkey_version:7.") {
		t.Skip("atomic slot migration (CLUSTER MIGRATESLOTS) is Valkey 9.0+")
	}
	slot := rdb.ClusterKeySlot(ctx, key).Val()
	src, err := rdb.MasterForKey(ctx, key)
	must(t, err)
	for _, n := range cl.Nodes {
		if n.Addr != src.Options().Addr {
			return slot, src, n.Client(t)
		}
	}
	t.Fatal("no other master")
	return 0, nil, nil
}

// nodeID is a cluster node's id (CLUSTER MYID).
func nodeID(t *testing.T, node *redis.Client) string {
	t.Helper()
	id, err := node.Do(context.Background(), "CLUSTER", "MYID").Text()
	must(t, err)
	return id
}

// waitersOn is the waiters' count of the lock key on node (RLOCK.INFO), -1 when the node
// does not answer it (MOVED: it does not serve the key's slot).
func waitersOn(node *redis.Client, key string) int64 {
	v, err := node.Do(context.Background(), "RLOCK.INFO", key).Result()
	if err != nil {
		return -1
	}
	switch m := v.(type) {
	case map[any]any:
		n, _ := m["waiters"].(int64)
		return n
	case []any:
		for i := 0; i+1 < len(m); i += 2 {
			if m[i] == "waiters" {
				n, _ := m[i+1].(int64)
				return n
			}
		}
	}
	return -1
}

func TestClusterLocksWaitOnTheKeysNode(t *testing.T) {
	_, rdb, c := clusterSetup(t)
	ctx := context.Background()
	// Names whose slots fall on different nodes.
	names := []string{"a", "b", "c", "d", "e", "f"}
	nodes := map[string]bool{}
	for _, n := range names {
		node, err := rdb.MasterForKey(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		nodes[node.Options().Addr] = true
	}
	if len(nodes) < 2 {
		t.Fatalf("names on %d node(s) only", len(nodes))
	}
	var wg sync.WaitGroup
	for _, name := range names {
		holder := c.NewMutex(name)
		if err := holder.Lock(); err != nil {
			t.Fatal(err)
		}
		if err := c.NewMutex(name).TryLock(); !errors.Is(err, rlock.ErrTaken) {
			t.Fatalf("%s: TryLock of a held lock = %v", name, err)
		}
		waiter := c.NewMutex(name)
		wg.Add(1)
		go func(name string) {
			defer wg.Done()
			lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			if err := waiter.LockContext(lctx); err != nil {
				t.Errorf("%s: waiter: %v", name, err)
				return
			}
			if _, err := waiter.Unlock(); err != nil {
				t.Errorf("%s: waiter unlock: %v", name, err)
			}
		}(name)
		testserver.WaitUntil(t, 10*time.Second, fmt.Sprintf("a waiter queued on %s", name), func() bool {
			info, _ := holder.Info(ctx)
			return info != nil && info.Waiters == 1
		})
		if _, err := holder.Unlock(); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	for _, name := range names {
		if rdb.Exists(ctx, name).Val() != 0 {
			t.Fatalf("%s still held", name)
		}
	}
}

func TestClusterWaiterQueuesAgainWhenItsNodeConnectionsAreKilled(t *testing.T) {
	_, rdb, c := clusterSetup(t)
	ctx := context.Background()
	holder := c.NewMutex("k1")
	must(t, holder.Lock())
	waiter := c.NewMutex("k1")
	got := within(waiter.LockContext)
	testserver.WaitUntil(t, 10*time.Second, "the waiter queued", func() bool {
		info, _ := holder.Info(ctx)
		return info != nil && info.Waiters == 1
	})
	node, err := rdb.MasterForKey(ctx, "k1")
	must(t, err)
	// Every connection to the key's node but the killer's: the ticket goes with them.
	must(t, node.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err())
	must(t, node.Do(ctx, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes").Err())
	testserver.WaitUntil(t, 20*time.Second, "the waiter queued again", func() bool {
		info, _ := holder.Info(ctx)
		return info != nil && info.Waiters == 1
	})
	_, err = holder.Unlock()
	must(t, err)
	must(t, <-got)
	if waiter.Held() != 1 {
		t.Fatal("the waiter does not hold the lock")
	}
}

// Valkey 9's atomic slot migration (CLUSTER MIGRATESLOTS): the old node drops the slot's
// shard subscriptions before it answers the slot's tickets MOVED on them; the waiter
// queues again on the new owner with the same request id and is served there.
func TestClusterTicketFollowsAnAtomicSlotMigration(t *testing.T) {
	cl, rdb, c := clusterSetup(t)
	ctx := context.Background()
	const key = "asm-go"
	slot, src, dst := slotMigration(t, cl, rdb, key)
	dstID := nodeID(t, dst)
	waitersOn := func(node *redis.Client) int64 { return waitersOn(node, key) }
	holder := c.NewMutex(key)
	must(t, holder.Lock())
	waiter := c.NewMutex(key)
	got := within(waiter.LockContext)
	testserver.WaitUntil(t, 10*time.Second, "the ticket queued on the source", func() bool { return waitersOn(src) == 1 })
	must(t, src.Do(ctx, "CLUSTER", "MIGRATESLOTS", "SLOTSRANGE", slot, slot, "NODE", dstID).Err())
	testserver.WaitUntil(t, 30*time.Second, "the waiter queued again on the new owner", func() bool { return waitersOn(dst) == 1 })
	select {
	case err := <-got:
		t.Fatalf("the waiter returned while the lock is held: %v", err)
	default:
	}
	_, err := holder.Unlock()
	must(t, err)
	must(t, <-got)
	if waiter.Held() != 1 || dst.HGet(ctx, key, waiter.Owner()).Val() != "1" {
		t.Fatal("the waiter does not hold the lock on the new owner")
	}
}

// A tagged channel left subscribed on a node after its last waiter (it lingers there) is
// forgotten when an atomic slot migration drops it (Valkey 9): once the slot is back, a
// wait on the key subscribes again there and is granted (still counted as subscribed, it
// would queue unheard).
func TestClusterAChannelDroppedByASlotMigrationIsSubscribedAgain(t *testing.T) {
	cl, rdb, c := clusterSetup(t)
	ctx := context.Background()
	const key = "asm-idle-go"
	slot, src, dst := slotMigration(t, cl, rdb, key)
	srcID := nodeID(t, src)
	dstID := nodeID(t, dst)
	tagged := "rlock_ticket:{" + key + "}:" + rlock.TicketTag(c)
	holder, waiter := c.NewMutex(key), c.NewMutex(key)
	queuedWait := func() {
		must(t, holder.Lock())
		got := within(waiter.LockContext)
		testserver.WaitUntil(t, 20*time.Second, "the ticket queued", func() bool {
			i, _ := holder.Info(ctx)
			return i != nil && i.Waiters == 1
		})
		_, err := holder.Unlock()
		must(t, err)
		must(t, <-got)
		_, err = waiter.Unlock()
		must(t, err)
	}
	moved := func(node *redis.Client) bool {
		err := node.Get(ctx, key).Err()
		return err != nil && strings.HasPrefix(err.Error(), "MOVED")
	}
	queuedWait()
	if n := src.PubSubShardNumSub(ctx, tagged).Val()[tagged]; n != 1 {
		t.Fatalf("subscribers of the idle channel: %d, want 1", n)
	}
	must(t, src.Do(ctx, "CLUSTER", "MIGRATESLOTS", "SLOTSRANGE", slot, slot, "NODE", dstID).Err())
	testserver.WaitUntil(t, 30*time.Second, "the slot moved away, its subscription dropped", func() bool {
		return moved(src) && src.PubSubShardNumSub(ctx, tagged).Val()[tagged] == 0
	})
	must(t, dst.Do(ctx, "CLUSTER", "MIGRATESLOTS", "SLOTSRANGE", slot, slot, "NODE", srcID).Err())
	testserver.WaitUntil(t, 30*time.Second, "the slot back", func() bool { return moved(dst) && !moved(src) })
	rdb.ReloadState(ctx)
	queuedWait()
	if n := src.PubSubShardNumSub(ctx, tagged).Val()[tagged]; n != 1 {
		t.Fatalf("subscribers of the channel after the migration back: %d, want 1", n)
	}
}

// movedAnswers is how many commands node has answered MOVED (INFO errorstats); 0 when it
// does not answer.
func movedAnswers(node *redis.Client) int64 {
	info, _ := node.Info(context.Background(), "errorstats").Result()
	for _, line := range strings.Split(info, "\r\n") {
		if rest, ok := strings.CutPrefix(line, "errorstat_MOVED:count="); ok {
			n, _ := strconv.ParseInt(rest, 10, 64)
			return n
		}
	}
	return 0
}

// A wait sent to a node its key's slot had left (the client's slot map not yet corrected)
// has the SSUBSCRIBE of its key's channel answered MOVED there, like its ticket: the hub
// must not count that channel as subscribed on the node. Counted so and left lingering
// after its last waiter, once the slot came back the next wait there would send no
// SSUBSCRIBE and never hear its grant (the Rust client's bug, found by the fault
// harness's lock:migrate cell). Valkey 9 (atomic slot migration); every step within the
// channel's linger. The waiting client's slot map is held stale (ClusterSlots) from the
// slot's move away until the node it left has answered that wait MOVED.
func TestClusterAChannelRedirectedWithItsTicketIsSubscribedAgainWhenTheSlotReturns(t *testing.T) {
	cl, rdb, holders := clusterSetup(t)
	ctx := context.Background()
	const key = "asm-back-go"
	slot, a, b := slotMigration(t, cl, rdb, key)
	aID, bID := nodeID(t, a), nodeID(t, b)
	seed := cl.Nodes[0].Client(t)
	var (
		mu      sync.Mutex
		stale   bool                // the map read last is served, not a new one
		last    []redis.ClusterSlot // the map read last
		movedAt int64               // A's MOVED answers when the stale wait started; -1 before
	)
	addrs := []string{}
	for _, n := range cl.Nodes {
		addrs = append(addrs, n.Addr)
	}
	wrdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs,
		ClusterSlots: func(ctx context.Context) ([]redis.ClusterSlot, error) {
			mu.Lock()
			defer mu.Unlock()
			// Stale until A has answered the wait MOVED as well as its first try (which
			// go-redis follows to B by itself).
			if stale && (movedAt < 0 || movedAnswers(a) < movedAt+2) && last != nil {
				return last, nil
			}
			stale = false
			s, err := seed.ClusterSlots(ctx).Result()
			if err == nil {
				last = s
			}
			return s, err
		}})
	t.Cleanup(func() { wrdb.Close() })
	// More tries than the default: go-redis reads the map again at most once per 200 ms
	// (ReloadState is lazy), and the reload that the first try's MOVED started still
	// serves the stale map, so the hub's tries must outlast that pause.
	c := rlock.New(wrdb, rlock.WithRetry(10, 50*time.Millisecond, time.Second))
	t.Cleanup(func() { c.Close() })
	tagged := "rlock_ticket:{" + key + "}:" + rlock.TicketTag(c)
	subscribers := func(node *redis.Client) int64 { return node.PubSubShardNumSub(ctx, tagged).Val()[tagged] }
	moved := func(node *redis.Client) bool {
		err := node.Get(ctx, key).Err()
		return err != nil && strings.HasPrefix(err.Error(), "MOVED")
	}
	migrate := func(from, to *redis.Client, toID string) {
		must(t, from.Do(ctx, "CLUSTER", "MIGRATESLOTS", "SLOTSRANGE", slot, slot, "NODE", toID).Err())
		testserver.WaitUntil(t, 30*time.Second, "the slot moved", func() bool { return moved(from) && !moved(to) })
	}
	holder, waiter := holders.NewMutex(key), c.NewMutex(key)
	// A wait on the key that queues a ticket on node (the holder's lock held meanwhile).
	queuedWait := func(what string, node *redis.Client, before func()) {
		t.Helper()
		must(t, holder.Lock())
		if before != nil {
			before()
		}
		got := make(chan error, 1)
		go func() {
			wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			got <- waiter.LockContext(wctx)
		}()
		testserver.WaitUntil(t, 20*time.Second, what+": the ticket queued", func() bool { return waitersOn(node, key) == 1 })
		_, err := holder.Unlock()
		must(t, err)
		if err := <-got; err != nil {
			t.Fatalf("%s: the wait was not granted: %v", what, err)
		}
		_, err = waiter.Unlock()
		must(t, err)
	}
	// The map read, the channel subscribed on A, lingering there after the wait.
	queuedWait("first wait, on A", a, nil)
	if n := subscribers(a); n != 1 {
		t.Fatalf("subscribers of the channel on A after the first wait: %d, want 1", n)
	}
	mu.Lock()
	stale, movedAt = true, -1
	mu.Unlock()
	// A drops the channel with the slot; the waiting client's map still says A.
	migrate(a, b, bID)
	testserver.WaitUntil(t, 10*time.Second, "A dropped the channel", func() bool { return subscribers(a) == 0 })
	// Sent to A (its first try is followed to B by go-redis, the hub's is redirected),
	// queued and granted on B.
	queuedWait("wait sent to A, redirected to B", b, func() {
		mu.Lock()
		movedAt = movedAnswers(a)
		mu.Unlock()
	})
	mu.Lock()
	wentToA := !stale
	mu.Unlock()
	if !wentToA {
		t.Fatal("the wait was not sent to A: the map was never read again")
	}
	// Back to A, within the channel's linger on A had it been counted there.
	migrate(b, a, aID)
	queuedWait("wait after the slot came back to A", a, nil)
	if n := subscribers(a); n != 1 {
		t.Fatalf("subscribers of the channel on A after the slot came back: %d, want 1", n)
	}
}
