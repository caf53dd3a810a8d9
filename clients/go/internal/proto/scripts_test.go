// Scripts mode's translations (scripts.go): the lock's commands as Redisson's scripts.

package proto

import (
	"errors"
	"reflect"
	"testing"
)

// Each lock command becomes Redisson's script with Redisson's KEYS and ARGV (as
// clients/python/rlock/_scripts.py sends them); the rest needs the module.
func TestTheLockCommandsBecomeRedissonsScripts(t *testing.T) {
	lock := Hold{Key: "k", Owner: "o:1", Prefix: "RLOCK"}
	for _, tc := range []struct {
		args []any
		want ScriptCall
	}{
		{lock.Acquire(30000, -1, "r1"), ScriptCall{"lock_acquire", []string{"k"}, []any{"30000", "o:1"}}},
		{lock.Release(0, "r2"), ScriptCall{"lock_unlock",
			[]string{"k", "redisson_lock__channel:{k}", "redisson_unlock_latch:{k}:r2"},
			[]any{UnlockMessage, "30000", "o:1", "publish", UnlockLatchMs}}},
		{Hold{Key: "{a}:k", Owner: "o:1", Prefix: "RLOCK"}.Release(5000, "r3"), ScriptCall{"lock_unlock",
			[]string{"{a}:k", "redisson_lock__channel:{a}:k", "redisson_unlock_latch:{a}:k:r3"},
			[]any{UnlockMessage, "5000", "o:1", "publish", UnlockLatchMs}}},
		{lock.Renew(30000), ScriptCall{"lock_renew", []string{"k"}, []any{"30000", "o:1"}}},
		{ForceRelease("RLOCK", "k"), ScriptCall{"lock_force_unlock", []string{"k", "redisson_lock__channel:{k}"}, []any{UnlockMessage}}},
	} {
		got, err := ScriptFor(tc.args, "publish")
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%v: %+v, %v; want %+v", tc.args, got, err, tc.want)
		}
	}
	if _, err := ScriptFor(SemAcquire("s", 1, -1, "r"), "publish"); !errors.Is(err, ErrNeedsModule) {
		t.Errorf("semaphore: %v, want ErrNeedsModule", err)
	}
	if ch, ok := WaitChannel(lock.Acquire(100, 0, "r")); !ok || ch != "redisson_lock__channel:{k}" {
		t.Errorf("WaitChannel = %q, %v", ch, ok)
	}
	if LeaseLeftMs(int64(100)) != 100+LeaseEndMarginMs || LeaseLeftMs(nil) != -1 {
		t.Error("LeaseLeftMs")
	}
}
