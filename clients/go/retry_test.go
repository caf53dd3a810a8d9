// Retries with request ids: a reply lost after the server applied the call (injected with
// a go-redis hook) is retried with the same id, and the server answers the retry with its
// first reply instead of applying it twice.

package rlock_test

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/redis/go-redis/v9"

	rlock "github.com/rlock/rlock/clients/go"
	"github.com/rlock/rlock/clients/go/internal/testserver"
)

// loseReplies makes the next `count` replies to commands named word look lost: the
// command ran in the server, and the client sees a reset connection instead of its reply.
type loseReplies struct {
	word  string
	count atomic.Int32
}

func (h *loseReplies) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *loseReplies) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *loseReplies) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if strings.EqualFold(cmd.Name(), h.word) && h.count.Add(-1) >= 0 {
			return &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
		}
		return err
	}
}

func TestRetriesWithRequestIDsApplyNothingTwice(t *testing.T) {
	s := testserver.Start(t)
	rdb := s.Client(t)
	raw := s.Client(t)
	hook := &loseReplies{word: "rlock.acquire"}
	rdb.AddHook(hook)
	c := rlock.New(rdb)
	defer c.Close()
	ctx := context.Background()
	m := c.NewMutex("retried")
	must(t, m.Lock())
	// A re-entry whose reply is lost: the retry must not count it twice.
	hook.count.Store(1)
	must(t, m.Lock())
	if got := raw.HGet(ctx, "retried", m.Owner()).Val(); got != "2" {
		t.Fatalf("hold count after a retried re-entry = %s, want 2", got)
	}
	// A release whose reply is lost: the retry gets "freed" back, not "not held".
	hook.word = "rlock.release"
	_, err := m.Unlock()
	must(t, err)
	hook.count.Store(1)
	freed, err := m.Unlock()
	if err != nil || !freed {
		t.Fatalf("retried last Unlock = %v, %v; want freed", freed, err)
	}
	if raw.Exists(ctx, "retried").Val() != 0 {
		t.Fatal("the lock is still there")
	}
}
