// The client's errors: sentinels to test with errors.Is, and the typed error that carries
// the lock's name.

package rlock

import (
	"errors"
	"fmt"

	"github.com/rlock/rlock/clients/go/internal/proto"
)

var (
	// ErrTaken: an attempt that does not wait found the lock held by another owner.
	ErrTaken = errors.New("rlock: held by another owner")
	// ErrTimeout: a wait limit passed before the lock (or permits, or the latch) was
	// granted. The caller's own context ending is reported as the context's error.
	ErrTimeout = errors.New("rlock: wait limit passed")
	// ErrNotHeld: this handle does not hold the lock (never took it, or released it).
	ErrNotHeld = errors.New("rlock: not held by this handle")
	// ErrLost: the handle held the lock and lost it before releasing it (its lease ran
	// out, it was force-released, or it was deleted): the critical section may have run
	// unprotected, and the caller must know.
	ErrLost = errors.New("rlock: lock lost")
	// ErrReplicaSync: after the acquire, fewer replicas acknowledged the lock than were
	// connected; the lock was released again (Redisson's checkLockSyncedSlaves).
	ErrReplicaSync = errors.New("rlock: lock not synced to replicas")
	// ErrUnexpectedReply: the server answered something the protocol does not allow.
	ErrUnexpectedReply = proto.ErrUnexpected
	// ErrClosed: the Client was closed.
	ErrClosed = errors.New("rlock: client closed")
)

// Error is an error about one named lock or synchronizer; errors.Is sees its sentinel.
type Error struct {
	// Op is what was being done: "lock", "unlock", "extend", "acquire", ...
	Op string
	// Key is the name of the lock or synchronizer.
	Key string
	// Err is the sentinel (ErrTaken, ...) or the underlying error.
	Err error
}

func (e *Error) Error() string { return fmt.Sprintf("rlock: %s %q: %v", e.Op, e.Key, e.Err) }

// Unwrap returns the sentinel or underlying error.
func (e *Error) Unwrap() error { return e.Err }

func opErr(op, key string, err error) error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return err
	}
	return &Error{Op: op, Key: key, Err: err}
}
