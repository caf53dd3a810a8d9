// What each reply means. The I/O layer hands replies over as go-redis reads them: nil
// for a nil reply, int64, string, []any, map[any]any (RESP3) or an error; these
// functions turn them into the client's vocabulary or say that a reply was unexpected.

package proto

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ErrUnexpected marks a reply the protocol does not allow (a module of another version,
// or a key used by something else).
var ErrUnexpected = errors.New("rlock: unexpected reply")

func unexpected(what string, v any) error {
	return fmt.Errorf("%w to %s: %#v", ErrUnexpected, what, v)
}

// Acquired is the reply of an acquire: nil (the hold is ours: new, re-entered or handed
// over) or an integer (held against us, with this PTTL; -1 no TTL).
type Acquired struct {
	Held bool
	// PTTL of the lock held against us (valid when !Held).
	PTTL int64
	// Token is the fencing token of an RFENCED.ACQUIRE that took the lock.
	Token int64
}

// ParseAcquire reads RLOCK.ACQUIRE's and RRWLOCK.ACQUIRE's nil/PTTL reply.
func ParseAcquire(v any) (Acquired, error) {
	switch n := v.(type) {
	case nil:
		return Acquired{Held: true}, nil
	case int64:
		return Acquired{PTTL: n}, nil
	}
	return Acquired{}, unexpected("ACQUIRE", v)
}

// ParseFencedAcquire reads RFENCED.ACQUIRE's `[nil, token]` / `[pttl, nil]`.
func ParseFencedAcquire(v any) (Acquired, error) {
	a, ok := v.([]any)
	if !ok || len(a) != 2 {
		return Acquired{}, unexpected("RFENCED.ACQUIRE", v)
	}
	switch first := a[0].(type) {
	case nil:
		tok, ok := a[1].(int64)
		if !ok {
			return Acquired{}, unexpected("RFENCED.ACQUIRE token", v)
		}
		return Acquired{Held: true, Token: tok}, nil
	case int64:
		return Acquired{PTTL: first}, nil
	}
	return Acquired{}, unexpected("RFENCED.ACQUIRE", v)
}

// Released is the reply of a release.
type Released int

const (
	// StillHeld (0): one hold less; the owner still holds it.
	StillHeld Released = iota
	// Freed (1): the owner's last hold went (the lock is free or handed on).
	Freed
	// NotHeld (nil): the owner held nothing to release; nothing changed.
	NotHeld
)

// ParseRelease reads RLOCK.RELEASE's and RRWLOCK.RELEASE's 0 / 1 / nil.
func ParseRelease(v any) (Released, error) {
	switch v {
	case nil:
		return NotHeld, nil
	case int64(0):
		return StillHeld, nil
	case int64(1):
		return Freed, nil
	}
	return 0, unexpected("RELEASE", v)
}

// ParseBool reads a 1 / 0 reply (RENEW, FORCERELEASE, TRYSETPERMITS, ...).
func ParseBool(what string, v any) (bool, error) {
	switch v {
	case int64(1):
		return true, nil
	case int64(0):
		return false, nil
	}
	return false, unexpected(what, v)
}

// ParseInt reads an integer reply.
func ParseInt(what string, v any) (int64, error) {
	if n, ok := v.(int64); ok {
		return n, nil
	}
	return 0, unexpected(what, v)
}

// ParsePermits reads RPSEMAPHORE.ACQUIRE's reply: one id (bulk), n ids (array), or nil
// (not acquired).
func ParsePermits(v any) ([]string, error) {
	switch p := v.(type) {
	case nil:
		return nil, nil
	case string:
		return []string{p}, nil
	case []any:
		out := make([]string, 0, len(p))
		for _, e := range p {
			s, ok := e.(string)
			if !ok {
				return nil, unexpected("RPSEMAPHORE.ACQUIRE", v)
			}
			out = append(out, s)
		}
		return out, nil
	}
	return nil, unexpected("RPSEMAPHORE.ACQUIRE", v)
}

// Pairs reads a RESP3 map or RESP2 flat pairs as key/value pairs in order.
func Pairs(v any) ([][2]any, bool) {
	switch m := v.(type) {
	case map[any]any:
		out := make([][2]any, 0, len(m))
		for k, val := range m {
			out = append(out, [2]any{k, val})
		}
		return out, true
	case map[string]any:
		out := make([][2]any, 0, len(m))
		for k, val := range m {
			out = append(out, [2]any{k, val})
		}
		return out, true
	case []any:
		if len(m)%2 != 0 {
			return nil, false
		}
		out := make([][2]any, 0, len(m)/2)
		for i := 0; i < len(m); i += 2 {
			out = append(out, [2]any{m[i], m[i+1]})
		}
		return out, true
	}
	return nil, false
}

// LockInfo is what RLOCK.INFO (or RRWLOCK.INFO) says about a lock.
type LockInfo struct {
	// Owners are the owner ids with their hold counts.
	Owners map[string]int64
	// PTTL is the remaining lease in milliseconds (-1: no TTL).
	PTTL int64
	// Waiters is the number of callers queued in the server.
	Waiters int64
}

// ParseInfo reads RLOCK.INFO or RRWLOCK.INFO: nil (no lock), a RESP3 map or RESP2 flat pairs. Unknown
// fields are ignored so that the module may add some.
func ParseInfo(v any) (*LockInfo, error) {
	if v == nil {
		return nil, nil
	}
	fields, ok := Pairs(v)
	if !ok {
		return nil, unexpected("RLOCK.INFO", v)
	}
	info := &LockInfo{Owners: map[string]int64{}}
	for _, f := range fields {
		name, _ := f[0].(string)
		switch name {
		case "owners":
			owners, ok := Pairs(f[1])
			if !ok {
				return nil, unexpected("RLOCK.INFO owners", f[1])
			}
			for _, o := range owners {
				id, ok1 := o[0].(string)
				n, ok2 := asInt(o[1])
				if !ok1 || !ok2 {
					return nil, unexpected("RLOCK.INFO owner", o)
				}
				info.Owners[id] = n
			}
		case "readers", "writer":
			// RRWLOCK.INFO: readers owner -> [count, pttl]; writer owner -> count, or nil.
			if f[1] == nil {
				continue
			}
			holders, ok := Pairs(f[1])
			if !ok {
				return nil, unexpected("RRWLOCK.INFO "+name, f[1])
			}
			for _, o := range holders {
				id, _ := o[0].(string)
				n, ok := asInt(o[1])
				if a, isArr := o[1].([]any); isArr && len(a) > 0 {
					n, ok = asInt(a[0])
				}
				if !ok {
					return nil, unexpected("RRWLOCK.INFO holder", o)
				}
				info.Owners[id] += n
			}
		case "pttl":
			n, ok := asInt(f[1])
			if !ok {
				return nil, unexpected("RLOCK.INFO pttl", f[1])
			}
			info.PTTL = n
		case "waiters":
			n, ok := asInt(f[1])
			if !ok {
				return nil, unexpected("RLOCK.INFO waiters", f[1])
			}
			info.Waiters = n
		}
	}
	return info, nil
}

func asInt(v any) (int64, bool) {
	switch n := v.(type) {
	case int64:
		return n, true
	case string:
		i, err := strconv.ParseInt(n, 10, 64)
		return i, err == nil
	}
	return 0, false
}

// RoleReplicas is how many replicas a `ROLE` reply lists: a primary's online replicas;
// 0 for a replica's or anything else's reply.
func RoleReplicas(role []interface{}) int {
	if len(role) < 3 {
		return 0
	}
	if kind, _ := role[0].(string); kind != "master" && kind != "primary" {
		return 0
	}
	listed, _ := role[2].([]interface{})
	return len(listed)
}

// InfoField is one integer field of `INFO <section>` text (connected_slaves, ...).
func InfoField(text, field string) (int64, bool) {
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimRight(line, "\r")
		if strings.HasPrefix(line, field+":") {
			n, err := strconv.ParseInt(strings.TrimPrefix(line, field+":"), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}
