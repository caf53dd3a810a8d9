// Interop with Redisson: its lock scripts (RedissonLock's tryLockInnerAsync and
// unlockInnerAsync, as tests/support/redisson.py transcribes them) run against the Go
// client on the same name. They exclude each other, and a Go waiter queued in the
// server is handed the lock when the Redisson side unlocks.

package rlock_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	rlock "github.com/rlock/rlock/clients/go"
	"github.com/rlock/rlock/clients/go/internal/testserver"
)

// Redisson's tryLockInnerAsync: KEYS[1] = lock; ARGV[1] = lease ms, ARGV[2] = owner.
var redissonAcquire = redis.NewScript(`
if ((redis.call('exists', KEYS[1]) == 0) or (redis.call('hexists', KEYS[1], ARGV[2]) == 1)) then
    redis.call('hincrby', KEYS[1], ARGV[2], 1);
    redis.call('pexpire', KEYS[1], ARGV[1]);
    return nil;
end;
return redis.call('pttl', KEYS[1]);
`)

// Redisson's unlockInnerAsync with the unlock latch: KEYS = lock, channel, latch;
// ARGV = message, lease ms, owner, publish command, latch timeout ms.
var redissonUnlock = redis.NewScript(`
local val = redis.call('get', KEYS[3]);
if val ~= false then
    return tonumber(val);
end;
if (redis.call('hexists', KEYS[1], ARGV[3]) == 0) then
    return nil;
end;
local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1);
if (counter > 0) then
    redis.call('pexpire', KEYS[1], ARGV[2]);
    redis.call('set', KEYS[3], 0, 'px', ARGV[5]);
    return 0;
else
    redis.call('del', KEYS[1]);
    redis.call(ARGV[4], KEYS[2], ARGV[1]);
    redis.call('set', KEYS[3], 1, 'px', ARGV[5]);
    return 1;
end;
`)

type redisson struct {
	rdb   *redis.Client
	key   string
	owner string
	n     int
}

// tryLock is nil when acquired, else the holder's PTTL.
func (r *redisson) tryLock(ctx context.Context) (any, error) {
	v, err := redissonAcquire.Run(ctx, r.rdb, []string{r.key}, 30000, r.owner).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	return v, err
}

func (r *redisson) unlock(ctx context.Context) (any, error) {
	r.n++
	latch := "redisson_unlock_latch:{" + r.key + "}:" + r.owner + ":" + strconv.Itoa(r.n)
	v, err := redissonUnlock.Run(ctx, r.rdb, []string{r.key, "redisson_lock__channel:{" + r.key + "}", latch},
		0, 30000, r.owner, "publish", 1000).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	return v, err
}

func TestRedissonScriptsAndTheGoClientExcludeEachOther(t *testing.T) {
	_, rdb, c := setup(t)
	ctx := context.Background()
	java := &redisson{rdb: rdb, key: "shared", owner: "5b0e7c11-java:1"}
	m := c.NewMutex("shared")

	// Go holds it: Redisson's script sees it held (a PTTL, not nil).
	if err := m.Lock(); err != nil {
		t.Fatal(err)
	}
	if v, err := java.tryLock(ctx); err != nil || v == nil {
		t.Fatalf("Redisson's acquire on a Go-held lock = %v, %v; want a PTTL", v, err)
	}
	if _, err := m.Unlock(); err != nil {
		t.Fatal(err)
	}

	// Redisson holds it: the Go client is refused, then queues and is handed the lock
	// when Redisson's unlock script frees it.
	if v, err := java.tryLock(ctx); err != nil || v != nil {
		t.Fatalf("Redisson's acquire on a free lock = %v, %v", v, err)
	}
	if err := m.TryLock(); !errors.Is(err, rlock.ErrTaken) {
		t.Fatalf("Go TryLock on a Redisson-held lock = %v, want ErrTaken", err)
	}
	errc := make(chan error, 1)
	go func() {
		lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		errc <- m.LockContext(lctx)
	}()
	testserver.WaitUntil(t, 10*time.Second, "the Go waiter queued", func() bool {
		info, _ := m.Info(ctx)
		return info != nil && info.Waiters == 1
	})
	if v, err := java.unlock(ctx); err != nil || v != int64(1) {
		t.Fatalf("Redisson's unlock = %v, %v; want 1", v, err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("the Go waiter after Redisson's unlock: %v", err)
	}
	if got := rdb.HGet(ctx, "shared", m.Owner()).Val(); got != "1" {
		t.Fatalf("Redisson's layout after the handoff: field %s = %q, want 1", m.Owner(), got)
	}
	// And back: Redisson's script cannot take it while Go holds it.
	if v, _ := java.tryLock(ctx); v == nil {
		t.Fatal("Redisson acquired a lock the Go client holds")
	}
	if _, err := m.Unlock(); err != nil {
		t.Fatal(err)
	}
}
