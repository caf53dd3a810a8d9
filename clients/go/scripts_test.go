// Scripts mode (docs/scripts-mode.md) on a server without the module, under a user
// restricted as a managed service's (`+@all -@dangerous`): the lock on Redisson's own
// scripts (Redisson's hash, its unlock message), a waiter woken by that message, SCRIPT
// FLUSH mid-run (NOSCRIPT: loaded again), the mode the probe found, the fenced lock, the
// read-write lock, the semaphore, the permit-expirable semaphore and the countdown latch
// on theirs, and Info (no Redisson script) answering ErrNeedsModule. On a module-loaded
// server, a scripts-mode client and a module-mode client sharing a lock. And the embedded scripts are the Python
// client's, byte for byte.

package rlock_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	rlock "github.com/rlock/rlock/clients/go"
	"github.com/rlock/rlock/clients/go/internal/proto"
	"github.com/rlock/rlock/clients/go/internal/testserver"
)

// restricted starts a server without the module and returns an admin client and a
// client of a user without the dangerous commands (MODULE, CONFIG, DEBUG, CLIENT KILL).
func restricted(t *testing.T) (*redis.Client, *redis.Client) {
	t.Helper()
	s := testserver.StartBare(t)
	admin := s.Client(t)
	ctx := context.Background()
	if err := admin.Do(ctx, "ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all", "-@dangerous").Err(); err != nil {
		t.Fatal(err)
	}
	app := redis.NewClient(&redis.Options{Addr: s.Addr, Username: "app", Password: "pw"})
	t.Cleanup(func() { app.Close() })
	if err := app.Do(ctx, "CONFIG", "GET", "maxmemory").Err(); err == nil {
		t.Fatal("the restricted user may run CONFIG")
	}
	return admin, app
}

func TestScriptsModeLockOnAServerWithoutTheModule(t *testing.T) {
	admin, app := restricted(t)
	ctx := context.Background()
	c := rlock.New(app)
	t.Cleanup(func() { c.Close() })
	if m := c.Mode(ctx); m != rlock.ModeScripts {
		t.Fatalf("Mode = %v, want ModeScripts", m)
	}
	a, b := c.NewMutex("orders:1"), c.NewMutex("orders:1")
	if err := a.Lock(); err != nil {
		t.Fatal(err)
	}
	if err := a.Lock(); err != nil {
		t.Fatal(err)
	}
	// Redisson's layout: a hash of owner -> hold count, with the lease as its PTTL.
	if got := admin.HGet(ctx, "orders:1", a.Owner()).Val(); got != "2" {
		t.Fatalf("hold count = %q, want 2", got)
	}
	if err := b.TryLock(); !errors.Is(err, rlock.ErrTaken) {
		t.Fatalf("TryLock on a held lock = %v, want ErrTaken", err)
	}
	// A waiter subscribes Redisson's channel and is woken by the unlock message.
	errc := make(chan error, 1)
	go func() { errc <- b.Lock() }()
	testserver.WaitUntil(t, 10*time.Second, "the waiter subscribed", func() bool {
		n := admin.PubSubNumSub(ctx, proto.LockChannel("orders:1")).Val()
		return n[proto.LockChannel("orders:1")] == 1
	})
	if freed, err := a.Unlock(); err != nil || freed {
		t.Fatalf("first Unlock = %v, %v", freed, err)
	}
	// The script cache emptied (a failover, SCRIPT FLUSH): NOSCRIPT, loaded again.
	if err := admin.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if freed, err := a.Unlock(); err != nil || !freed {
		t.Fatalf("last Unlock = %v, %v", freed, err)
	}
	select {
	case err := <-errc:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter was not woken by the unlock message")
	}
	// Woken by the message, not at the 30 s lease's end.
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the waiter took %v", d)
	}
	if b.Held() != 1 || admin.HGet(ctx, "orders:1", b.Owner()).Val() != "1" {
		t.Fatal("the waiter does not hold the lock")
	}
	if ok, err := b.Extend(); err != nil || !ok {
		t.Fatalf("Extend = %v, %v", ok, err)
	}
	if ok, err := a.ForceUnlock(ctx); err != nil || !ok {
		t.Fatalf("ForceUnlock = %v, %v", ok, err)
	}
	// Not done in scripts mode yet: said plainly, not "unknown command".
	if _, err := a.Info(ctx); !errors.Is(err, rlock.ErrNeedsModule) {
		t.Fatalf("Info in scripts mode = %v, want ErrNeedsModule", err)
	}
}

func TestScriptsModePermitSemaphore(t *testing.T) {
	admin, app := restricted(t)
	ctx := context.Background()
	c := rlock.New(app)
	t.Cleanup(func() { c.Close() })
	s := c.NewPermitSemaphore("p")
	if ok, err := s.TrySetPermits(ctx, 1); err != nil || !ok {
		t.Fatalf("TrySetPermits = %v, %v", ok, err)
	}
	p1, err := s.Acquire(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(p1.ID()) != 32 {
		t.Fatalf("permit id %q, want Redisson's 32 hex digits", p1.ID())
	}
	if n := admin.ZCard(ctx, "{p}:timeout").Val(); n != 1 {
		t.Fatalf("Redisson's timeout zset holds %d permits, want 1", n)
	}
	if _, err := s.TryAcquire(ctx, time.Second, 0); !errors.Is(err, rlock.ErrTaken) {
		t.Fatalf("TryAcquire with none free = %v, want ErrTaken", err)
	}
	// A waiter woken by the release's message.
	type got struct {
		p   *rlock.Permit
		err error
	}
	gotc := make(chan got, 1)
	go func() { p, err := s.TryAcquire(ctx, time.Second, 10*time.Second); gotc <- got{p, err} }()
	ch := "redisson_sc:{p}"
	testserver.WaitUntil(t, 10*time.Second, "the permit waiter subscribed", func() bool {
		return admin.PubSubNumSub(ctx, ch).Val()[ch] == 1
	})
	if err := p1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var p2 *rlock.Permit
	select {
	case g := <-gotc:
		if g.err != nil {
			t.Fatal(g.err)
		}
		p2 = g.p
	case <-time.After(10 * time.Second):
		t.Fatal("the permit waiter was not woken by the release")
	}
	// Behind a permit that expires (no message): woken at its expiry.
	start := time.Now()
	p3, err := s.TryAcquire(ctx, 5*time.Second, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("taken %v after, want at the 1 s lease's end", d)
	}
	select {
	case <-p2.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the expired permit's holder was not told")
	}
	if n, err := s.Available(ctx); err != nil || n != 0 {
		t.Fatalf("Available = %d, %v; want 0", n, err)
	}
	if err := p3.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Available(ctx); err != nil || n != 1 {
		t.Fatalf("Available after release = %d, %v; want 1", n, err)
	}
	if n, err := s.AddPermits(ctx, 2); err != nil || n != 3 {
		t.Fatalf("AddPermits = %d, %v; want 3", n, err)
	}
}

func TestScriptsModeReadWriteLock(t *testing.T) {
	admin, app := restricted(t)
	ctx := context.Background()
	c := rlock.New(app)
	t.Cleanup(func() { c.Close() })
	a, b, w := c.NewRWMutex("rw"), c.NewRWMutex("rw"), c.NewRWMutex("rw")
	if err := a.RLock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.RLock(ctx); err != nil {
		t.Fatal(err)
	}
	if got := admin.HGet(ctx, "rw", "mode").Val(); got != "read" {
		t.Fatalf("mode = %q, want read (Redisson's layout)", got)
	}
	// A reader asking for the write side is refused at once, as by the module.
	if err := a.Lock(ctx); !errors.Is(err, rlock.ErrRefused) {
		t.Fatalf("write by a reader = %v, want ErrRefused (READHELD)", err)
	}
	if ok, err := a.Reader().Extend(); err != nil || !ok {
		t.Fatalf("read Extend = %v, %v", ok, err)
	}
	errc := make(chan error, 1)
	go func() { errc <- w.Lock(ctx) }()
	ch := proto.RWChannel("rw")
	testserver.WaitUntil(t, 10*time.Second, "the writer subscribed", func() bool {
		return admin.PubSubNumSub(ctx, ch).Val()[ch] == 1
	})
	if _, err := a.RUnlock(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.RUnlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the writer was not woken by the last read unlock")
	}
	if err := b.Reader().TryLock(); !errors.Is(err, rlock.ErrTaken) {
		t.Fatalf("read while written = %v, want ErrTaken", err)
	}
	if ok, err := w.Writer().Extend(); err != nil || !ok {
		t.Fatalf("write Extend = %v, %v", ok, err)
	}
	if ok, err := w.Writer().ForceUnlock(ctx); err != nil || !ok {
		t.Fatalf("ForceUnlock = %v, %v", ok, err)
	}
	if admin.Exists(ctx, "rw").Val() != 0 {
		t.Fatal("the lock is still there after ForceUnlock")
	}
}

func TestScriptsModeCountDownLatch(t *testing.T) {
	admin, app := restricted(t)
	ctx := context.Background()
	c := rlock.New(app)
	t.Cleanup(func() { c.Close() })
	l := c.NewCountDownLatch("l")
	if err := l.AwaitTimeout(ctx, time.Second); err != nil {
		t.Fatalf("Await on a latch never set = %v, want open", err)
	}
	if ok, err := l.TrySetCount(ctx, 2); err != nil || !ok {
		t.Fatalf("TrySetCount = %v, %v", ok, err)
	}
	if ok, err := l.TrySetCount(ctx, 5); err != nil || ok {
		t.Fatalf("TrySetCount on a set latch = %v, %v", ok, err)
	}
	if err := l.AwaitTimeout(ctx, 100*time.Millisecond); !errors.Is(err, rlock.ErrTimeout) {
		t.Fatalf("Await on a closed latch = %v, want ErrTimeout", err)
	}
	errc := make(chan error, 1)
	go func() { errc <- l.Await(ctx) }()
	ch := proto.LatchChannel("l")
	testserver.WaitUntil(t, 10*time.Second, "the latch waiter subscribed", func() bool {
		return admin.PubSubNumSub(ctx, ch).Val()[ch] == 1
	})
	if n, err := l.CountDown(ctx); err != nil || n != 1 {
		t.Fatalf("CountDown = %d, %v; want 1", n, err)
	}
	if n, err := l.Count(ctx); err != nil || n != 1 {
		t.Fatalf("Count = %d, %v; want 1", n, err)
	}
	if n, err := l.CountDown(ctx); err != nil || n != 0 {
		t.Fatalf("CountDown = %d, %v; want 0", n, err)
	}
	select {
	case err := <-errc:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the latch waiter was not woken by the zero message")
	}
	// Redisson's latch deletes its key at zero.
	if admin.Exists(ctx, "l").Val() != 0 {
		t.Fatal("the open latch's key is still there")
	}
	if ok, err := l.TrySetCount(ctx, 1); err != nil || !ok {
		t.Fatalf("TrySetCount after opening = %v, %v", ok, err)
	}
	if ok, err := l.Delete(ctx); err != nil || !ok {
		t.Fatalf("Delete = %v, %v", ok, err)
	}
}

func TestScriptsModeFencedLockAndSemaphore(t *testing.T) {
	admin, app := restricted(t)
	ctx := context.Background()
	c := rlock.New(app)
	t.Cleanup(func() { c.Close() })
	// The fenced lock: Redisson's token counter, a larger token per acquire.
	f, g := c.NewFencedMutex("f"), c.NewFencedMutex("f")
	t1, err := f.LockToken(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := admin.Get(ctx, "redisson_lock_token:{f}").Val(); got != fmt.Sprint(t1) {
		t.Fatalf("token key = %q, token %d", got, t1)
	}
	errc := make(chan error, 1)
	go func() { errc <- g.Lock() }()
	testserver.WaitUntil(t, 10*time.Second, "the fenced waiter subscribed", func() bool {
		return admin.PubSubNumSub(ctx, proto.LockChannel("f")).Val()[proto.LockChannel("f")] == 1
	})
	if _, err := f.Unlock(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if g.Token() <= t1 {
		t.Fatalf("the next holder's token %d is not above %d", g.Token(), t1)
	}
	if last, err := g.LastToken(ctx); err != nil || last != g.Token() {
		t.Fatalf("LastToken = %d, %v; want %d", last, err, g.Token())
	}
	// The semaphore: Redisson's counter and channel, a waiter woken by the release.
	sem := c.NewSemaphore("s")
	if ok, err := sem.TrySetPermits(ctx, 1); err != nil || !ok {
		t.Fatalf("TrySetPermits = %v, %v", ok, err)
	}
	if err := sem.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := sem.TryAcquire(ctx, 1, 0); !errors.Is(err, rlock.ErrTaken) {
		t.Fatalf("TryAcquire of a taken permit = %v, want ErrTaken", err)
	}
	go func() { errc <- sem.Acquire(ctx, 1) }()
	testserver.WaitUntil(t, 10*time.Second, "the semaphore waiter subscribed", func() bool {
		return admin.PubSubNumSub(ctx, "redisson_sc:{s}").Val()["redisson_sc:{s}"] == 1
	})
	if err := sem.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the semaphore waiter was not woken by the release")
	}
	if n, err := sem.AddPermits(ctx, 3); err != nil || n != 3 {
		t.Fatalf("AddPermits = %d, %v; want 3", n, err)
	}
	if n, err := sem.Available(ctx); err != nil || n != 3 {
		t.Fatalf("Available = %d, %v; want 3", n, err)
	}
	if n, err := sem.Drain(ctx); err != nil || n != 3 {
		t.Fatalf("Drain = %d, %v; want 3", n, err)
	}
	if err := sem.TryAcquire(ctx, 1, 100*time.Millisecond); !errors.Is(err, rlock.ErrTimeout) {
		t.Fatalf("TryAcquire on a drained semaphore = %v, want ErrTimeout", err)
	}
}

func TestScriptsModeWaiterWakesAtTheHoldersLeaseEnd(t *testing.T) {
	admin, app := restricted(t)
	ctx := context.Background()
	c := rlock.New(app)
	t.Cleanup(func() { c.Close() })
	// A holder that vanished: its lease ends with no unlock message.
	if err := admin.HSet(ctx, "gone", "someone:1", 1).Err(); err != nil {
		t.Fatal(err)
	}
	admin.PExpire(ctx, "gone", 300*time.Millisecond)
	m := c.NewMutex("gone", rlock.WithWaitLimit(10*time.Second))
	start := time.Now()
	if err := m.TryLock(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("taken after %v, want at the 300 ms lease's end", d)
	}
	short := c.NewMutex("gone", rlock.WithWaitLimit(100*time.Millisecond))
	if err := short.TryLock(); !errors.Is(err, rlock.ErrTimeout) {
		t.Fatalf("TryLock behind a holder = %v, want ErrTimeout", err)
	}
}

func TestModeModuleOnAServerWithoutTheModuleFails(t *testing.T) {
	_, app := restricted(t)
	c := rlock.New(app, rlock.WithMode(rlock.ModeModule))
	t.Cleanup(func() { c.Close() })
	if err := c.NewMutex("k").TryLock(); err == nil {
		t.Fatal("ModeModule without the module succeeded")
	}
}

func TestTheEmbeddedScriptsAreThePythonClients(t *testing.T) {
	ours, _ := filepath.Glob("lua/*.lua")
	theirs, _ := filepath.Glob("../python/rlock/lua/*.lua")
	if len(ours) == 0 || len(ours) != len(theirs) {
		t.Fatalf("%d scripts here, %d in the Python client", len(ours), len(theirs))
	}
	for _, p := range theirs {
		want, _ := os.ReadFile(p)
		got, err := os.ReadFile(filepath.Join("lua", filepath.Base(p)))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("lua/%s differs from the Python client's", filepath.Base(p))
		}
	}
}

// On a module-loaded server a scripts-mode client and a module-mode client share a lock:
// each hands it to the other's waiter (the module serves its queued waiter when the
// script frees the key; the module's release publishes Redisson's unlock message).
func TestScriptsModeAndModuleModeShareALock(t *testing.T) {
	s, rdb, mod := setup(t)
	ctx := context.Background()
	scr := rlock.New(s.Client(t), rlock.WithMode(rlock.ModeScripts))
	t.Cleanup(func() { scr.Close() })
	hs, wm := scr.NewMutex("mix"), mod.NewMutex("mix")
	if err := hs.Lock(); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- wm.Lock() }()
	testserver.WaitUntil(t, 10*time.Second, "the module waiter queued", func() bool {
		return infoWaiters(t, "RLOCK.INFO", "mix") == 1
	})
	if _, err := hs.Unlock(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the module waiter was not served when the script freed the lock")
	}
	ws := scr.NewMutex("mix")
	go func() { errc <- ws.Lock() }()
	ch := proto.LockChannel("mix")
	testserver.WaitUntil(t, 10*time.Second, "the scripts waiter subscribed", func() bool {
		return rdb.PubSubNumSub(ctx, ch).Val()[ch] == 1
	})
	if _, err := wm.Unlock(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the scripts waiter was not woken when the module released the lock")
	}
	if ws.Held() != 1 || rdb.HGet(ctx, "mix", ws.Owner()).Val() != "1" {
		t.Fatal("the scripts waiter does not hold the lock")
	}
}
