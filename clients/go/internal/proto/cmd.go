// The command builders of every primitive. Each returns the arguments of one command as
// go-redis takes them ([]any, the command word first); every command names its key at
// position 1 and nowhere else, so a cluster client routes it like any single-key command.

package proto

import (
	"strconv"
	"time"

	"github.com/google/uuid"
)

// RequestID is a fresh request id (a v4 uuid) for one logical call. Every retry of that
// call sends the same id, so the server answers a retry of a call that did take effect
// with its first reply and applies nothing twice (README, "Request ids").
func RequestID() string { return uuid.NewString() }

// Millis is d in whole milliseconds, at least 1 for a positive d (the server takes
// integers; a sub-millisecond wait must not become "no limit").
func Millis(d time.Duration) int64 {
	ms := d.Milliseconds()
	if ms == 0 && d > 0 {
		return 1
	}
	return ms
}

// MillisUp is d in whole milliseconds, rounded up: a wait sent as this ends no sooner
// than d.
func MillisUp(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// Hold names one exclusive or shared hold by an owner: the plain lock (Prefix "RLOCK"),
// the fenced lock (acquires with "RFENCED.ACQUIRE", releases and renews as RLOCK), or
// one side of a read-write lock (Prefix "RRWLOCK", Side "READ" or "WRITE").
type Hold struct {
	Key   string
	Owner string
	// Prefix is "RLOCK" or "RRWLOCK".
	Prefix string
	// Side is "READ" or "WRITE" for RRWLOCK, empty otherwise.
	Side string
	// AcquireWord overrides the acquire command ("RFENCED.ACQUIRE"); empty: Prefix+".ACQUIRE".
	AcquireWord string
}

func (h Hold) head(verb string) []any {
	args := []any{h.Prefix + "." + verb, h.Key}
	if h.Side != "" {
		args = append(args, h.Side)
	}
	return args
}

// Acquire is `<acquire> key [side] owner lease-ms [WAIT wait-ms] ID id`; wait < 0 sends no
// WAIT (answer at once), wait == 0 waits without limit.
func (h Hold) Acquire(leaseMs, waitMs int64, id string) []any {
	var args []any
	if h.AcquireWord != "" {
		args = []any{h.AcquireWord, h.Key}
	} else {
		args = h.head("ACQUIRE")
	}
	args = append(args, h.Owner, leaseMs)
	if waitMs >= 0 {
		args = append(args, "WAIT", waitMs)
	}
	return append(args, "ID", id)
}

// Release is `<prefix>.RELEASE key [side] owner [lease-ms] ID id`: a lease (> 0) re-arms
// the expiry of a hold that stays held after a re-entrant release, so a watchdog hold
// keeps its full lease.
func (h Hold) Release(leaseMs int64, id string) []any {
	args := append(h.head("RELEASE"), h.Owner)
	if leaseMs > 0 {
		args = append(args, leaseMs)
	}
	return append(args, "ID", id)
}

// Renew is `<prefix>.RENEW key [side] owner lease-ms`: idempotent, so it carries no id.
func (h Hold) Renew(leaseMs int64) []any {
	return append(h.head("RENEW"), h.Owner, leaseMs)
}

// ForceRelease is `RLOCK.FORCERELEASE key` (Redisson's forceUnlock), or for a read-write
// lock `RRWLOCK.FORCERELEASE key` (both sides).
func ForceRelease(prefix, key string) []any { return []any{prefix + ".FORCERELEASE", key} }

// Info is `<prefix>.INFO key`, read-only.
func Info(prefix, key string) []any { return []any{prefix + ".INFO", key} }

// FencedToken is `RFENCED.GETTOKEN key`.
func FencedToken(key string) []any { return []any{"RFENCED.GETTOKEN", key} }

// WaitReplicas is `WAIT replicas timeout-ms`, sent after a RENEW on the same connection
// so that it counts the acknowledgement of a write that covers the lock.
func WaitReplicas(replicas int, timeoutMs int64) []any {
	return []any{"WAIT", replicas, timeoutMs}
}

// withWaitID appends `[WAIT w] [ID id]` (w < 0: no WAIT; id empty: no ID).
func withWaitID(args []any, waitMs int64, id string) []any {
	if waitMs >= 0 {
		args = append(args, "WAIT", waitMs)
	}
	if id != "" {
		args = append(args, "ID", id)
	}
	return args
}

// ---- semaphore (RSEMAPHORE.*) ----------------------------------------------------------

// SemTrySetPermits is `RSEMAPHORE.TRYSETPERMITS key permits ID id`.
func SemTrySetPermits(key string, permits int64, id string) []any {
	return withWaitID([]any{"RSEMAPHORE.TRYSETPERMITS", key, permits}, -1, id)
}

// SemAddPermits is `RSEMAPHORE.ADDPERMITS key delta ID id`.
func SemAddPermits(key string, delta int64, id string) []any {
	return withWaitID([]any{"RSEMAPHORE.ADDPERMITS", key, delta}, -1, id)
}

// SemAcquire is `RSEMAPHORE.ACQUIRE key permits [WAIT w] ID id`.
func SemAcquire(key string, permits, waitMs int64, id string) []any {
	return withWaitID([]any{"RSEMAPHORE.ACQUIRE", key, permits}, waitMs, id)
}

// SemRelease is `RSEMAPHORE.RELEASE key permits ID id`.
func SemRelease(key string, permits int64, id string) []any {
	return withWaitID([]any{"RSEMAPHORE.RELEASE", key, permits}, -1, id)
}

// SemDrain is `RSEMAPHORE.DRAINPERMITS key ID id`.
func SemDrain(key, id string) []any {
	return withWaitID([]any{"RSEMAPHORE.DRAINPERMITS", key}, -1, id)
}

// SemAvailable is `RSEMAPHORE.AVAILABLEPERMITS key`.
func SemAvailable(key string) []any { return []any{"RSEMAPHORE.AVAILABLEPERMITS", key} }

// ---- permit-expirable semaphore (RPSEMAPHORE.*) ----------------------------------------

// NoLease is the lease of a permit without expiry (Redisson's leaseTime -1): the client
// renews such permits with its watchdog.
const NoLease = -1

// PSemTrySetPermits is `RPSEMAPHORE.TRYSETPERMITS key permits ID id`.
func PSemTrySetPermits(key string, permits int64, id string) []any {
	return withWaitID([]any{"RPSEMAPHORE.TRYSETPERMITS", key, permits}, -1, id)
}

// PSemAddPermits is `RPSEMAPHORE.ADDPERMITS key delta ID id`.
func PSemAddPermits(key string, delta int64, id string) []any {
	return withWaitID([]any{"RPSEMAPHORE.ADDPERMITS", key, delta}, -1, id)
}

// PSemAcquire is `RPSEMAPHORE.ACQUIRE key lease-ms [PERMITS n] [WAIT w] ID id`.
func PSemAcquire(key string, leaseMs, permits, waitMs int64, id string) []any {
	args := []any{"RPSEMAPHORE.ACQUIRE", key, leaseMs}
	if permits != 1 {
		args = append(args, "PERMITS", permits)
	}
	return withWaitID(args, waitMs, id)
}

// PSemRelease is `RPSEMAPHORE.RELEASE key permit-id ID id`.
func PSemRelease(key, permit, id string) []any {
	return withWaitID([]any{"RPSEMAPHORE.RELEASE", key, permit}, -1, id)
}

// PSemUpdateLease is `RPSEMAPHORE.UPDATELEASETIME key permit-id lease-ms` (idempotent).
func PSemUpdateLease(key, permit string, leaseMs int64) []any {
	return []any{"RPSEMAPHORE.UPDATELEASETIME", key, permit, leaseMs}
}

// PSemAvailable is `RPSEMAPHORE.AVAILABLEPERMITS key`.
func PSemAvailable(key string) []any { return []any{"RPSEMAPHORE.AVAILABLEPERMITS", key} }

// ---- countdown latch (RLATCH.*) ----------------------------------------------------------

// LatchTrySetCount is `RLATCH.TRYSETCOUNT key count ID id`.
func LatchTrySetCount(key string, count int64, id string) []any {
	return withWaitID([]any{"RLATCH.TRYSETCOUNT", key, count}, -1, id)
}

// LatchCountDown is `RLATCH.COUNTDOWN key ID id`.
func LatchCountDown(key, id string) []any {
	return withWaitID([]any{"RLATCH.COUNTDOWN", key}, -1, id)
}

// LatchGetCount is `RLATCH.GETCOUNT key`.
func LatchGetCount(key string) []any { return []any{"RLATCH.GETCOUNT", key} }

// LatchAwait is `RLATCH.AWAIT key [WAIT w]`: it changes nothing, so it has no id of its
// own (a ticket adds one, see Shape).
func LatchAwait(key string, waitMs int64) []any {
	return withWaitID([]any{"RLATCH.AWAIT", key}, waitMs, "")
}

// LatchDelete is `RLATCH.DELETE key ID id`.
func LatchDelete(key, id string) []any {
	return withWaitID([]any{"RLATCH.DELETE", key}, -1, id)
}

// Strings is args as the strings sent on the wire (for tests and for the ticket shape).
func Strings(args []any) []string {
	out := make([]string, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case string:
			out[i] = v
		case int64:
			out[i] = strconv.FormatInt(v, 10)
		case int:
			out[i] = strconv.Itoa(v)
		case []byte:
			out[i] = string(v)
		default:
			panic("proto: unexpected argument type")
		}
	}
	return out
}
