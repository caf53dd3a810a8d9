// The client's errors: sentinels to test with errors.Is, the typed error that carries
// the lock's name, and the typed error of a server's refusal (its code word and kind).

package rlock

import (
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

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
	// ErrOutcomeUnknown (scripts mode only): the connection broke, or the reply timed
	// out, after a script that must not run twice (a semaphore release, a latch
	// count-down, an acquire...) was sent, so it may or may not have been applied, and it
	// was not sent again: without the module there is no request id to make a second run
	// harmless (docs/scripts-mode.md). Also when such a script was applied and the read
	// that gives the call's answer failed. Not retried by the client; the error is an
	// *OutcomeUnknownError.
	ErrOutcomeUnknown = errors.New("rlock: outcome unknown")
)

// OutcomeUnknownError is ErrOutcomeUnknown with the script and the failure.
type OutcomeUnknownError struct {
	Script string // its file name in lua/, without .lua
	Err    error  // the failure that left the outcome unknown
}

func (e *OutcomeUnknownError) Error() string {
	return fmt.Sprintf("rlock: outcome unknown: the script %s may or may not have been applied "+
		"(not sent again: it must not run twice): %v", e.Script, e.Err)
}

// Is makes errors.Is(err, ErrOutcomeUnknown) true; the cause is not unwrapped, so that
// nothing takes the error for the transient failure it came from.
func (e *OutcomeUnknownError) Is(target error) bool { return target == ErrOutcomeUnknown }

// The kinds of a server's error reply (a *ServerError): errors.Is(err, ErrArgument) and
// so on. The code words and their kinds are spec/vectors/errors.json's.
var (
	// ErrArgument: the request was malformed (BADLEASE, BADPERMITS, ERR syntax error,
	// ...); nothing changed.
	ErrArgument = errors.New("rlock: bad argument")
	// ErrWrongType: the key holds another type (WRONGTYPE) or another primitive
	// (NOTALOCK, NOTASEMAPHORE, ...).
	ErrWrongType = errors.New("rlock: key holds another type")
	// ErrRefused: the state forbids it now (OVERFLOW, TOOMANYWAITERS, TOOMANYHOLDS,
	// READHELD, TAKENBACK).
	ErrRefused = errors.New("rlock: refused by the server")
	// ErrRetry: the server could not serve it then (LOADING, TRYAGAIN, CLUSTERDOWN,
	// MASTERDOWN, READONLY, BUSY); it is what remained after the client's own retries.
	ErrRetry = errors.New("rlock: server not ready")
	// ErrInternal: an internal command, or a bug the module caught (INTERNALCMD,
	// RLOCKBUG; details in the server's log).
	ErrInternal = errors.New("rlock: internal error in the module")
)

// ErrorKind is the kind of a server's error reply: "argument", "wrong-type", "refused",
// "retry", "internal", or "" for code words outside those (NOPERM, ...).
type ErrorKind = proto.Kind

// The error kinds, as errors.json spells them.
const (
	KindArgument  = proto.KindArgument
	KindWrongType = proto.KindWrongType
	KindRefused   = proto.KindRefused
	KindRetry     = proto.KindRetry
	KindInternal  = proto.KindInternal
	KindOther     = proto.KindOther
)

var kindSentinel = map[ErrorKind]error{
	KindArgument: ErrArgument, KindWrongType: ErrWrongType, KindRefused: ErrRefused,
	KindRetry: ErrRetry, KindInternal: ErrInternal,
}

// ServerError is an error reply of the server: its code word (the text's first word),
// the code's kind, and the whole text. errors.Is matches the kind's sentinel.
type ServerError struct {
	Code    string
	Kind    ErrorKind
	Message string
}

func (e *ServerError) Error() string { return e.Message }

// Is reports whether target is the sentinel of e's kind.
func (e *ServerError) Is(target error) bool {
	s, ok := kindSentinel[e.Kind]
	return ok && s == target
}

// RedisError marks it as a server's reply, as go-redis's own error replies are.
func (e *ServerError) RedisError() {}

// serverError turns a server's error reply (go-redis's, or a ticket's error note) into a
// *ServerError; other errors pass unchanged.
func serverError(err error) error {
	var se *ServerError
	if err == nil || errors.Is(err, redis.Nil) || errors.As(err, &se) {
		return err
	}
	var text string
	var re redis.Error
	var note proto.ServerError
	switch {
	case errors.As(err, &note):
		text = string(note)
	case errors.As(err, &re):
		text = re.Error()
	default:
		return err
	}
	code := proto.ErrorCode(text)
	return &ServerError{Code: code, Kind: proto.ErrorKind(code), Message: text}
}

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
	return &Error{Op: op, Key: key, Err: serverError(err)}
}
