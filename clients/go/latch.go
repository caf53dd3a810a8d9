// CountDownLatch: RLATCH.* (Redisson's RCountDownLatch).

package rlock

import (
	"context"
	"time"

	"github.com/rlock/rlock/clients/go/internal/proto"
)

// CountDownLatch is a distributed countdown latch: awaiters are released together, in
// the server, in the turn the count reaches zero. A latch whose key is missing is open.
type CountDownLatch struct {
	c   *Client
	key string
}

// NewCountDownLatch makes a latch handle on name.
func (c *Client) NewCountDownLatch(name string) *CountDownLatch {
	return &CountDownLatch{c: c, key: name}
}

// Name is the latch's key.
func (l *CountDownLatch) Name() string { return l.key }

// TrySetCount sets the count if the latch is not set (count > 0 already).
func (l *CountDownLatch) TrySetCount(ctx context.Context, count int64) (bool, error) {
	v, err := l.c.call(ctx, "trysetcount", l.key, proto.LatchTrySetCount(l.key, count, proto.RequestID()))
	if err != nil {
		return false, err
	}
	return proto.ParseBool("RLATCH.TRYSETCOUNT", v)
}

// CountDown decrements the count and returns it (0 once open).
func (l *CountDownLatch) CountDown(ctx context.Context) (int64, error) {
	v, err := l.c.call(ctx, "countdown", l.key, proto.LatchCountDown(l.key, proto.RequestID()))
	if err != nil {
		return 0, err
	}
	return proto.ParseInt("RLATCH.COUNTDOWN", v)
}

// Count is the current count (0 when open).
func (l *CountDownLatch) Count(ctx context.Context) (int64, error) {
	v, err := l.c.call(ctx, "count", l.key, proto.LatchGetCount(l.key))
	if err != nil {
		return 0, err
	}
	return proto.ParseInt("RLATCH.GETCOUNT", v)
}

// Await waits until the count reaches zero or ctx ends.
func (l *CountDownLatch) Await(ctx context.Context) error { return l.await(ctx, 0, true) }

// AwaitTimeout waits up to d for the count to reach zero (ErrTimeout).
func (l *CountDownLatch) AwaitTimeout(ctx context.Context, d time.Duration) error {
	return l.await(ctx, d, false)
}

func (l *CountDownLatch) await(ctx context.Context, d time.Duration, forever bool) error {
	// A latch keeps no findings: an await always looks at the count first.
	_, err := l.c.waitFor(ctx, "await", l.key, d, forever, nil,
		func(waitMs int64) []any { return proto.LatchAwait(l.key, waitMs) },
		func(v any) bool { return v == int64(1) })
	return err
}

// Delete removes the latch (which opens it); true if there was one.
func (l *CountDownLatch) Delete(ctx context.Context) (bool, error) {
	v, err := l.c.call(ctx, "delete", l.key, proto.LatchDelete(l.key, proto.RequestID()))
	if err != nil {
		return false, err
	}
	return proto.ParseBool("RLATCH.DELETE", v)
}
