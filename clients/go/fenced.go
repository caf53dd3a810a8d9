// FencedMutex: the lock plus a fencing token (RFENCED.ACQUIRE; Redisson's RFencedLock).

package rlock

import (
	"context"

	"github.com/rlock/rlock/clients/go/internal/proto"
)

// FencedMutex is a Mutex whose every acquire (re-entries and handoffs included) returns
// a fencing token larger than every token issued for the name before, across restarts
// and failovers (docs/commands/fenced.md). Hand the token to the resource you protect,
// and let it refuse a token lower than one it has seen: a holder paused past its lease
// is then refused instead of overwriting its successor's work.
type FencedMutex struct {
	Mutex
}

// NewFencedMutex makes a fenced lock handle on name. Release, renewal and force release
// are the plain lock's (RLOCK.*) on the same key.
func (c *Client) NewFencedMutex(name string, opts ...LockOption) *FencedMutex {
	o := c.lockOpts(opts)
	w := proto.Hold{Key: name, Owner: o.owner, Prefix: "RLOCK", AcquireWord: "RFENCED.ACQUIRE"}
	h := newHold(c, w, o.lease, o.tryWait)
	h.parse = proto.ParseFencedAcquire
	return &FencedMutex{Mutex{h: h}}
}

// Token is the token of this handle's latest acquire (0 before the first).
func (m *FencedMutex) Token() int64 {
	m.h.mu.Lock()
	defer m.h.mu.Unlock()
	return m.h.token
}

// LockToken takes the lock as LockContext does and returns its token.
func (m *FencedMutex) LockToken(ctx context.Context) (int64, error) {
	if err := m.LockContext(ctx); err != nil {
		return 0, err
	}
	return m.Token(), nil
}

// LastToken is the last token the server issued for the name (Redisson's getToken; 0
// before the first), whoever holds it.
func (m *FencedMutex) LastToken(ctx context.Context) (int64, error) {
	v, err := m.h.c.call(ctx, "token", m.Name(), proto.FencedToken(m.Name()))
	if err != nil || v == nil {
		return 0, err
	}
	return proto.ParseInt("RFENCED.GETTOKEN", v)
}
