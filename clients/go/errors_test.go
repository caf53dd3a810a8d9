// Integration tests of the typed server errors against a real module-loaded server: each
// refusal comes back as a *ServerError with the reply's code word and kind, matched by
// errors.Is against the kind's sentinel and still naming the lock (*Error). The table of
// every code word is checked in internal/proto's vectors test.

package rlock_test

import (
	"context"
	"errors"
	"testing"

	rlock "github.com/rlock/rlock/clients/go"
)

// serverErr checks that err is a *ServerError with code and kind, seen by errors.Is as
// sentinel and by no other kind's sentinel, inside an *Error naming op and key.
func serverErr(t *testing.T, err error, op, key, code string, kind rlock.ErrorKind, sentinel error) {
	t.Helper()
	var se *rlock.ServerError
	if !errors.As(err, &se) {
		t.Fatalf("%s: %#v is not a *ServerError", op, err)
	}
	if se.Code != code || se.Kind != kind {
		t.Fatalf("%s: code %q kind %q, want %q %q (%s)", op, se.Code, se.Kind, code, kind, se.Message)
	}
	for _, s := range []error{rlock.ErrArgument, rlock.ErrWrongType, rlock.ErrRefused, rlock.ErrRetry, rlock.ErrInternal} {
		if errors.Is(err, s) != (s == sentinel) {
			t.Fatalf("%s: errors.Is(%v, %v) = %v", op, err, s, errors.Is(err, s))
		}
	}
	var e *rlock.Error
	if !errors.As(err, &e) || e.Op != op || e.Key != key {
		t.Fatalf("%s: the error does not name the call: %#v", op, err)
	}
}

func TestServerRefusalsAreTypedByCodeWord(t *testing.T) {
	_, rdb, c := setup(t)
	ctx := context.Background()

	// A hash that is not a lock (a hold count that is not a number): the module's
	// NOTA<primitive>.
	if err := rdb.HSet(ctx, "typed:hash", "someone", "many").Err(); err != nil {
		t.Fatal(err)
	}
	serverErr(t, c.NewMutex("typed:hash").TryLock(), "trylock", "typed:hash", "NOTALOCK", rlock.KindWrongType, rlock.ErrWrongType)

	// A key of another Redis type: Redis's WRONGTYPE.
	if err := rdb.Set(ctx, "typed:str", "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	serverErr(t, c.NewMutex("typed:str").TryLock(), "trylock", "typed:str", "WRONGTYPE", rlock.KindWrongType, rlock.ErrWrongType)

	// An argument out of range: the module's BAD<what>; nothing was created.
	_, err := c.NewCountDownLatch("typed:latch").TrySetCount(ctx, -1)
	serverErr(t, err, "trysetcount", "typed:latch", "BADCOUNT", rlock.KindArgument, rlock.ErrArgument)
	if n := rdb.Exists(ctx, "typed:latch").Val(); n != 0 {
		t.Fatalf("a refused TrySetCount left the key (%d)", n)
	}
}
