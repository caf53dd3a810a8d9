// Scripts mode's scripts that must not run twice (issue 39, docs/scripts-mode.md): a
// semaphore release and a latch count-down whose reply is lost after the server applied
// them are not sent again (go-redis's own retries included) and answer ErrOutcomeUnknown,
// the count moved exactly once; a lock release (Redisson's unlock latch answers its
// retry) is retried; a failure before the write (a refused dial) is retried. A dialer
// that drops the reply of a marked request stands for a connection cut mid-call.

package rlock_test

import (
	"bytes"
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	rlock "github.com/rlock/rlock/clients/go"
	"github.com/rlock/rlock/clients/go/internal/testserver"
)

// lossy makes connections that, once a request containing the armed marker was written,
// read the server's reply and then fail instead of returning it: the command did take
// effect, the client sees a broken connection.
type lossy struct {
	mu     sync.Mutex
	marker []byte
	lost   atomic.Int32
}

func (l *lossy) arm(m string) { l.mu.Lock(); l.marker = []byte(m); l.mu.Unlock() }

func (l *lossy) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &lossyConn{Conn: c, l: l}, nil
}

type lossyConn struct {
	net.Conn
	l    *lossy
	drop bool
}

func (c *lossyConn) Write(b []byte) (int, error) {
	c.l.mu.Lock()
	if c.l.marker != nil && bytes.Contains(b, c.l.marker) {
		c.l.marker, c.drop = nil, true
	}
	c.l.mu.Unlock()
	return c.Conn.Write(b)
}

func (c *lossyConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if c.drop && n > 0 {
		c.l.lost.Add(1)
		c.Conn.Close()
		return 0, net.ErrClosed
	}
	return n, err
}

// shaOf is the SHA1 EVALSHA names for lua/<script>.lua, the marker of its request; the
// script is loaded first, so that the marked EVALSHA runs (not a NOSCRIPT answer, after
// which the EVAL would not carry the marker).
func shaOf(t *testing.T, admin *redis.Client, script string) string {
	t.Helper()
	text, err := os.ReadFile("lua/" + script + ".lua")
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.ScriptLoad(context.Background(), string(text)).Err(); err != nil {
		t.Fatal(err)
	}
	h := sha1.Sum(text)
	return hex.EncodeToString(h[:])
}

// lossyScripts is a server without the module, a client of it through a lossy dialer
// (go-redis's default retries kept) and a scripts-mode rlock.Client on that.
func lossyScripts(t *testing.T) (*redis.Client, *lossy, *rlock.Client) {
	t.Helper()
	s := testserver.StartBare(t)
	l := &lossy{}
	app := redis.NewClient(&redis.Options{Addr: s.Addr, Dialer: l.dial})
	t.Cleanup(func() { app.Close() })
	c := rlock.New(app, rlock.WithMode(rlock.ModeScripts))
	t.Cleanup(func() { c.Close() })
	return s.Client(t), l, c
}

func TestAReleaseWhoseReplyWasLostIsNotSentAgain(t *testing.T) {
	admin, l, c := lossyScripts(t)
	ctx := context.Background()
	sem := c.NewSemaphore("s")
	if ok, err := sem.TrySetPermits(ctx, 1); err != nil || !ok {
		t.Fatalf("TrySetPermits = %v, %v", ok, err)
	}
	if err := sem.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	l.arm(shaOf(t, admin, "semaphore_release"))
	err := sem.Release(ctx, 1)
	var ou *rlock.OutcomeUnknownError
	if !errors.Is(err, rlock.ErrOutcomeUnknown) || !errors.As(err, &ou) || ou.Script != "semaphore_release" {
		t.Fatalf("Release with its reply lost = %v, want ErrOutcomeUnknown", err)
	}
	if l.lost.Load() != 1 {
		t.Fatalf("replies lost: %d", l.lost.Load())
	}
	if n, _ := admin.Get(ctx, "s").Int(); n != 1 {
		t.Fatalf("permits after one release = %d, want 1 (applied exactly once)", n)
	}
	if n, err := sem.Available(ctx); err != nil || n != 1 {
		t.Fatalf("Available = %d, %v", n, err)
	}
}

func TestACountDownWhoseReplyWasLostIsNotSentAgain(t *testing.T) {
	admin, l, c := lossyScripts(t)
	ctx := context.Background()
	latch := c.NewCountDownLatch("l")
	if ok, err := latch.TrySetCount(ctx, 3); err != nil || !ok {
		t.Fatalf("TrySetCount = %v, %v", ok, err)
	}
	l.arm(shaOf(t, admin, "latch_count_down"))
	if _, err := latch.CountDown(ctx); !errors.Is(err, rlock.ErrOutcomeUnknown) {
		t.Fatalf("CountDown with its reply lost = %v, want ErrOutcomeUnknown", err)
	}
	if n, _ := admin.Get(ctx, "l").Int(); n != 2 {
		t.Fatalf("count = %d, want 2 (counted down exactly once)", n)
	}
}

func TestALockReleaseWhoseReplyWasLostIsRetried(t *testing.T) {
	admin, l, c := lossyScripts(t)
	ctx := context.Background()
	m := c.NewMutex("k")
	if err := m.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	l.arm(shaOf(t, admin, "lock_unlock"))
	if _, err := m.UnlockContext(ctx); err != nil {
		t.Fatalf("Unlock with its reply lost = %v, want retried", err)
	}
	if l.lost.Load() != 1 || admin.Exists(ctx, "k").Val() != 0 {
		t.Fatalf("lost %d, key there %d", l.lost.Load(), admin.Exists(ctx, "k").Val())
	}
}

func TestAReleaseRefusedBeforeTheWriteIsRetried(t *testing.T) {
	s := testserver.StartBare(t)
	ctx := context.Background()
	admin := s.Client(t)
	if err := admin.Set(ctx, "s", 0, 0).Err(); err != nil {
		t.Fatal(err)
	}
	// Refused until the third dial: nothing was written, so the release is retried.
	var dials atomic.Int32
	app := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if dials.Add(1) < 3 {
				return nil, &net.OpError{Op: "dial", Net: network, Err: errors.New("connection refused")}
			}
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		}})
	t.Cleanup(func() { app.Close() })
	c := rlock.New(app, rlock.WithMode(rlock.ModeScripts),
		rlock.WithRetry(5, 10*time.Millisecond, 10*time.Millisecond))
	t.Cleanup(func() { c.Close() })
	if err := c.NewSemaphore("s").Release(ctx, 1); err != nil {
		t.Fatalf("Release after refused dials = %v", err)
	}
	if n, _ := admin.Get(ctx, "s").Int(); n != 1 {
		t.Fatalf("permits = %d, want 1", n)
	}
}
