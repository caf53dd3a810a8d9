// Scripts mode (docs/scripts-mode.md) on a real 3-master Redis Cluster without the
// module: every primitive's waiter is woken by another client's release, published with
// SPUBLISH as Redisson 4.7 does on a cluster with sharded pub/sub and heard on the key's
// node (SSUBSCRIBE); one subscriber connection per node, made again after it is killed; a
// waiter whose slot moves (classic MIGRATE-based migration) follows it; and an acquire
// whose connection broke after the write is not sent again (ErrOutcomeUnknown); and a
// cluster without sharded pub/sub waking waiters over classic channels.

package rlock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	rlock "github.com/rlock/rlock/clients/go"
	"github.com/rlock/rlock/clients/go/internal/proto"
	"github.com/rlock/rlock/clients/go/internal/testserver"
)

// Node i's slots, as StartBareCluster assigns them.
var clusterRanges = [3][2]int64{{0, 5460}, {5461, 10922}, {10923, 16383}}

// keyOn is a name with prefix whose slot is on node i.
func keyOn(t *testing.T, rdb *redis.ClusterClient, i int, prefix string) string {
	t.Helper()
	for n := 0; n < 1000; n++ {
		k := fmt.Sprintf("%s-%d", prefix, n)
		s := rdb.ClusterKeySlot(context.Background(), k).Val()
		if s >= clusterRanges[i][0] && s <= clusterRanges[i][1] {
			return k
		}
	}
	t.Fatalf("no name on node %d", i)
	return ""
}

// shardSubscribed tells whether node has a shard channel of name subscribed.
func shardSubscribed(node *redis.Client, name string) bool {
	chans, _ := node.Do(context.Background(), "PUBSUB", "SHARDCHANNELS").StringSlice()
	for _, c := range chans {
		if strings.Contains(c, "{"+name+"}") {
			return true
		}
	}
	return false
}

// subscriberIDs are the ids of node's connections named as scripts mode's subscriber.
func subscriberIDs(node *redis.Client) []string {
	list, _ := node.ClientList(context.Background()).Result()
	var ids []string
	for _, l := range strings.Split(list, "\n") {
		if strings.Contains(l, " name="+rlock.SubscriberName+" ") {
			for _, f := range strings.Fields(l) {
				if id, ok := strings.CutPrefix(f, "id="); ok {
					ids = append(ids, id)
				}
			}
		}
	}
	return ids
}

// scriptsCluster starts a module-less cluster and returns it with node clients and two
// scripts-mode rlock clients on their own cluster clients (waiter side, holder side).
func scriptsCluster(t *testing.T) (*testserver.Cluster, *redis.ClusterClient, []*redis.Client, *rlock.Client, *rlock.Client) {
	t.Helper()
	cl := testserver.StartBareCluster(t)
	rdb := cl.Client(t)
	var nodes []*redis.Client
	for _, n := range cl.Nodes {
		nodes = append(nodes, n.Client(t))
	}
	c, h := rlock.New(rdb), rlock.New(cl.Client(t))
	t.Cleanup(func() { c.Close(); h.Close() })
	if m := c.Mode(context.Background()); m != rlock.ModeScripts {
		t.Fatalf("Mode = %v, want ModeScripts", m)
	}
	return cl, rdb, nodes, c, h
}

// wokenAfterRelease runs wait in a goroutine, waits until its channel (of name) is
// subscribed on node and it sleeps on it, then runs release: how long after the release
// the waiter got through.
func wokenAfterRelease(t *testing.T, node *redis.Client, name string, wait func(ctx context.Context) error, release func() error) time.Duration {
	t.Helper()
	done := make(chan time.Time, 1)
	errc := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		err := wait(ctx)
		done <- time.Now()
		errc <- err
	}()
	testserver.WaitUntil(t, 10*time.Second, name+": the waiter subscribed on its node", func() bool {
		return shardSubscribed(node, name)
	})
	time.Sleep(50 * time.Millisecond) // past its first try: asleep on the channel
	released := time.Now()
	must(t, release())
	at := <-done
	if err := <-errc; err != nil {
		t.Fatalf("%s: waiter: %v", name, err)
	}
	return at.Sub(released)
}

func TestScriptsClusterEveryPrimitiveWokenOverShardedPubSub(t *testing.T) {
	_, rdb, nodes, c, h := scriptsCluster(t)
	ctx := context.Background()
	const bound = 2 * time.Second // a lease or a missed message would take 20 s or more
	lease := rlock.WithLease(30 * time.Second)
	type wake struct {
		what string
		took time.Duration
	}
	var took []wake
	before := map[int]int64{}
	for i, n := range nodes {
		before[i] = commandCalls(n, "spublish")
	}

	k := keyOn(t, rdb, 0, "lock")
	held := h.NewMutex(k, lease)
	must(t, held.Lock())
	took = append(took, wake{"lock", wokenAfterRelease(t, nodes[0], k, func(ctx context.Context) error {
		m := c.NewMutex(k)
		if err := m.LockContext(ctx); err != nil {
			return err
		}
		_, err := m.UnlockContext(ctx)
		return err
	}, func() error { _, err := held.Unlock(); return err })})

	k = keyOn(t, rdb, 1, "rw")
	rw := h.NewRWMutex(k, lease)
	must(t, rw.RLock(ctx))
	took = append(took, wake{"rwlock", wokenAfterRelease(t, nodes[1], k, func(ctx context.Context) error {
		w := c.NewRWMutex(k)
		if err := w.Lock(ctx); err != nil {
			return err
		}
		_, err := w.Unlock(ctx)
		return err
	}, func() error { _, err := rw.RUnlock(ctx); return err })})

	k = keyOn(t, rdb, 2, "fenced")
	f := h.NewFencedMutex(k, lease)
	t1, err := f.LockToken(ctx)
	must(t, err)
	var t2 int64
	took = append(took, wake{"fenced", wokenAfterRelease(t, nodes[2], k, func(ctx context.Context) error {
		g := c.NewFencedMutex(k)
		var err error
		if t2, err = g.LockToken(ctx); err != nil {
			return err
		}
		_, err = g.UnlockContext(ctx)
		return err
	}, func() error { _, err := f.Unlock(); return err })})
	if t2 <= t1 {
		t.Fatalf("fenced: token %d after %d", t2, t1)
	}

	k = keyOn(t, rdb, 0, "sem")
	hs := h.NewSemaphore(k)
	if ok, err := hs.TrySetPermits(ctx, 1); err != nil || !ok {
		t.Fatalf("TrySetPermits = %v, %v", ok, err)
	}
	must(t, hs.Acquire(ctx, 1))
	took = append(took, wake{"semaphore", wokenAfterRelease(t, nodes[0], k, func(ctx context.Context) error {
		return c.NewSemaphore(k).Acquire(ctx, 1)
	}, func() error { return hs.Release(ctx, 1) })})

	k = keyOn(t, rdb, 1, "pes")
	ps := h.NewPermitSemaphore(k)
	if ok, err := ps.TrySetPermits(ctx, 1); err != nil || !ok {
		t.Fatalf("TrySetPermits = %v, %v", ok, err)
	}
	p, err := ps.Acquire(ctx, 30*time.Second)
	must(t, err)
	took = append(took, wake{"expirable semaphore", wokenAfterRelease(t, nodes[1], k, func(ctx context.Context) error {
		q, err := c.NewPermitSemaphore(k).Acquire(ctx, 30*time.Second)
		if err != nil {
			return err
		}
		return q.Release(ctx)
	}, func() error { return p.Release(ctx) })})

	k = keyOn(t, rdb, 2, "latch")
	l := h.NewCountDownLatch(k)
	if ok, err := l.TrySetCount(ctx, 1); err != nil || !ok {
		t.Fatalf("TrySetCount = %v, %v", ok, err)
	}
	took = append(took, wake{"latch", wokenAfterRelease(t, nodes[2], k, func(ctx context.Context) error {
		return c.NewCountDownLatch(k).Await(ctx)
	}, func() error { _, err := l.CountDown(ctx); return err })})

	for _, w := range took {
		t.Logf("%s: woken %v after the release", w.what, w.took.Round(100*time.Microsecond))
		if w.took > bound {
			t.Errorf("%s: woken %v after the release, not by its message", w.what, w.took)
		}
	}
	var spub int64
	for i, n := range nodes {
		spub += commandCalls(n, "spublish") - before[i]
		if pub := commandCalls(n, "publish"); pub != 0 {
			t.Errorf("node %d: %d PUBLISH", i, pub)
		}
	}
	if spub < 6 {
		t.Errorf("%d SPUBLISH for six releases", spub)
	}
}

// commandCalls is how many times node ran cmd (INFO commandstats; scripts' calls count).
func commandCalls(node *redis.Client, cmd string) int64 {
	info := node.Info(context.Background(), "commandstats").Val()
	for _, l := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(l), "cmdstat_"+cmd+":calls="); ok {
			var n int64
			fmt.Sscan(strings.SplitN(rest, ",", 2)[0], &n)
			return n
		}
	}
	return 0
}

func TestScriptsClusterOneSubscriberPerNodeMadeAgainWhenKilled(t *testing.T) {
	_, rdb, nodes, c, h := scriptsCluster(t)
	ctx := context.Background()
	var names []string
	var held []*rlock.Mutex
	for i := 0; i < 9; i++ {
		n := keyOn(t, rdb, i%3, fmt.Sprintf("n%d", i))
		m := h.NewMutex(n) // the watchdog renews: a waiter that missed its message times out
		must(t, m.TryLock())
		names, held = append(names, n), append(held, m)
	}
	var got []<-chan error
	for _, n := range names {
		w := c.NewMutex(n)
		got = append(got, within(func(ctx context.Context) error {
			if err := w.LockContext(ctx); err != nil {
				return err
			}
			_, err := w.UnlockContext(ctx)
			return err
		}))
	}
	allSubscribed := func() bool {
		for i, n := range names {
			if !shardSubscribed(nodes[i%3], n) {
				return false
			}
		}
		return true
	}
	testserver.WaitUntil(t, 10*time.Second, "every waiter subscribed on its node", allSubscribed)
	for i, n := range nodes {
		if ids := subscriberIDs(n); len(ids) != 1 {
			t.Fatalf("node %d: %d subscriber connections for three waits", i, len(ids))
		}
	}
	old := subscriberIDs(nodes[0])[0]
	must(t, nodes[0].Do(ctx, "CLIENT", "KILL", "ID", old).Err())
	testserver.WaitUntil(t, 10*time.Second, "a new subscriber on node 0, every channel subscribed again", func() bool {
		ids := subscriberIDs(nodes[0])
		return len(ids) == 1 && ids[0] != old && allSubscribed()
	})
	start := time.Now()
	for _, m := range held {
		_, err := m.Unlock()
		must(t, err)
	}
	for i, e := range got {
		if err := <-e; err != nil {
			t.Fatalf("%s: %v", names[i], err)
		}
	}
	t.Logf("nine waiters woken within %v of the first release", time.Since(start).Round(100*time.Microsecond))
}

func TestScriptsClusterWaiterFollowsAMigratedSlot(t *testing.T) {
	_, rdb, nodes, c, h := scriptsCluster(t)
	ctx := context.Background()
	key := keyOn(t, rdb, 0, "mk")
	src, dst := nodes[0], nodes[1]
	slot := rdb.ClusterKeySlot(ctx, key).Val()
	held := h.NewMutex(key)
	must(t, held.TryLock())
	done := make(chan time.Time, 1)
	got := within(func(ctx context.Context) error {
		w := c.NewMutex(key)
		err := w.LockContext(ctx)
		done <- time.Now()
		if err == nil {
			_, err = w.UnlockContext(ctx)
		}
		return err
	})
	testserver.WaitUntil(t, 10*time.Second, "the waiter subscribed on the source", func() bool { return shardSubscribed(src, key) })

	srcID, err := src.Do(ctx, "CLUSTER", "MYID").Text()
	must(t, err)
	dstID, err := dst.Do(ctx, "CLUSTER", "MYID").Text()
	must(t, err)
	must(t, dst.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", srcID).Err())
	must(t, src.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", dstID).Err())
	keys, err := src.Do(ctx, "CLUSTER", "GETKEYSINSLOT", slot, 1000).StringSlice()
	must(t, err)
	args := []any{"MIGRATE", "127.0.0.1", strings.Split(dst.Options().Addr, ":")[1], "", 0, 5000, "KEYS"}
	for _, k := range keys {
		args = append(args, k)
	}
	must(t, src.Do(ctx, args...).Err())
	for _, n := range []*redis.Client{dst, src, nodes[2]} {
		must(t, n.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", dstID).Err())
	}
	testserver.WaitUntil(t, 20*time.Second, "the waiter's channel subscribed on the slot's new node only", func() bool {
		return shardSubscribed(dst, key) && !shardSubscribed(src, key)
	})
	select {
	case err := <-got:
		t.Fatalf("the waiter returned while the lock is held: %v", err)
	default:
	}
	time.Sleep(50 * time.Millisecond) // past its try: asleep on the channel
	released := time.Now()
	_, err = held.Unlock()
	must(t, err)
	must(t, <-got)
	took := (<-done).Sub(released)
	t.Logf("woken %v after the release on the new node", took.Round(100*time.Microsecond))
	if took > 2*time.Second {
		t.Fatalf("woken %v after the release, not by its message", took)
	}
}

func TestScriptsClusterAcquireNotSentAgainAfterABrokenConnection(t *testing.T) {
	_, rdb, nodes, c, _ := scriptsCluster(t)
	ctx := context.Background()
	node := nodes[1]
	key := keyOn(t, rdb, 1, "once")
	// Warm: the probes asked, the script cached on the node, the connections open.
	warm := c.NewMutex(keyOn(t, rdb, 1, "warm"))
	must(t, warm.TryLock())
	_, err := warm.Unlock()
	must(t, err)
	// The node holds writes back: the acquire's EVALSHA is written and waits there.
	must(t, node.Do(ctx, "CLIENT", "PAUSE", 2000, "WRITE").Err())
	errc := make(chan error, 1)
	go func() { errc <- c.NewMutex(key).TryLock() }()
	testserver.WaitUntil(t, 10*time.Second, "the acquire's EVALSHA blocked by the pause", func() bool {
		list, _ := node.ClientList(ctx).Result()
		for _, l := range strings.Split(list, "\n") {
			if strings.Contains(l, " cmd=evalsha ") && strings.Contains(l, " flags=b ") {
				return true
			}
		}
		return false
	})
	// Its connection breaks after the write: go-redis's cluster retries would connect
	// again and write it again (run at the unpause).
	must(t, node.Do(ctx, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes").Err())
	err = <-errc
	must(t, node.Do(ctx, "CLIENT", "UNPAUSE").Err())
	if !errors.Is(err, rlock.ErrOutcomeUnknown) {
		t.Fatalf("TryLock = %v, want ErrOutcomeUnknown", err)
	}
	time.Sleep(200 * time.Millisecond) // a re-sent acquire would run at the unpause
	if node.Exists(ctx, key).Val() != 0 {
		t.Fatal("the acquire was sent again")
	}
}

// A cluster without sharded pub/sub, as one before Redis 7 (here: the user may not
// SPUBLISH, so the probe answers NOPERM): the scripts PUBLISH and the waiters SUBSCRIBE
// (classic channels, which every node hears), and each is still woken by its message.
func TestScriptsClusterWithoutShardedPubSubUsesClassicChannels(t *testing.T) {
	cl := testserver.StartBareCluster(t)
	ctx := context.Background()
	var nodes []*redis.Client
	var addrs []string
	for _, n := range cl.Nodes {
		node := n.Client(t)
		must(t, node.Do(ctx, "ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all", "-spublish", "-ssubscribe").Err())
		nodes, addrs = append(nodes, node), append(addrs, n.Addr)
	}
	app := func() *redis.ClusterClient {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, Username: "app", Password: "pw"})
		t.Cleanup(func() { c.Close() })
		return c
	}
	rdb := app()
	c, h := rlock.New(rdb), rlock.New(app())
	t.Cleanup(func() { c.Close(); h.Close() })
	for i := 0; i < 3; i++ {
		k := keyOn(t, rdb, i, "classic")
		held := h.NewMutex(k, rlock.WithLease(30*time.Second))
		must(t, held.Lock())
		done := make(chan time.Time, 1)
		got := within(func(ctx context.Context) error {
			err := c.NewMutex(k).LockContext(ctx)
			done <- time.Now()
			return err
		})
		ch := proto.LockChannel(k)
		testserver.WaitUntil(t, 10*time.Second, k+": the waiter subscribed (classic) on its node", func() bool {
			return nodes[i].PubSubNumSub(ctx, ch).Val()[ch] == 1
		})
		time.Sleep(50 * time.Millisecond) // past its first try: asleep on the channel
		released := time.Now()
		_, err := held.Unlock()
		must(t, err)
		must(t, <-got)
		took := (<-done).Sub(released)
		t.Logf("%s: woken %v after the release", k, took.Round(100*time.Microsecond))
		if took > 2*time.Second {
			t.Fatalf("%s: woken %v after the release, not by its message", k, took)
		}
	}
	var pub int64
	for i, n := range nodes {
		pub += commandCalls(n, "publish")
		if s := commandCalls(n, "spublish"); s != 0 {
			t.Errorf("node %d: %d SPUBLISH", i, s)
		}
	}
	if pub < 3 {
		t.Errorf("%d PUBLISH for three releases", pub)
	}
}

// A forced unlock wakes a waiter too: Redisson's forceUnlock script takes its publish
// command as an argument like the others, so on a cluster with sharded pub/sub it
// SPUBLISHes where the waiter listens (with PUBLISH it reached nobody there, and the
// waiter slept until the old holder's lease ran out).
func TestScriptsClusterForcedUnlockWakesAWaiter(t *testing.T) {
	_, rdb, nodes, c, h := scriptsCluster(t)
	k := keyOn(t, rdb, 0, "forced")
	held := h.NewMutex(k, rlock.WithLease(30*time.Second))
	must(t, held.Lock())
	took := wokenAfterRelease(t, nodes[0], k, func(ctx context.Context) error {
		m := c.NewMutex(k)
		if err := m.LockContext(ctx); err != nil {
			return err
		}
		_, err := m.UnlockContext(ctx)
		return err
	}, func() error {
		freed, err := h.NewMutex(k).ForceUnlock(context.Background())
		if err == nil && !freed {
			err = errors.New("ForceUnlock freed nothing")
		}
		return err
	})
	if took > 2*time.Second {
		t.Fatalf("woken %v after the forced unlock: the message was not heard", took)
	}
	t.Logf("woken %v after the forced unlock", took)
}
