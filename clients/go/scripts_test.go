// Scripts mode (docs/scripts-mode.md) on a server without the module, under a user
// restricted as a managed service's (`+@all -@dangerous`): the lock on Redisson's own
// scripts (Redisson's hash, its unlock message), a waiter woken by that message, SCRIPT
// FLUSH mid-run (NOSCRIPT: loaded again), the mode the probe found, and calls not done in
// scripts mode yet answering ErrNeedsModule. And the embedded scripts are the Python
// client's, byte for byte.

package rlock_test

import (
	"bytes"
	"context"
	"errors"
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
	if _, err := c.NewSemaphore("s").TrySetPermits(ctx, 1); !errors.Is(err, rlock.ErrNeedsModule) {
		t.Fatalf("semaphore in scripts mode = %v, want ErrNeedsModule", err)
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
