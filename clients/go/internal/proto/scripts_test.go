// Scripts mode's translations (scripts.go): the module's commands as Redisson's scripts.

package proto

import (
	"errors"
	"os"
	"reflect"
	"strconv"
	"strings"
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
		{lock.Acquire(30000, -1, "r1"), ScriptCall{"lock_acquire", []string{"k"}, []any{"30000", "o:1"}, AsIs}},
		{Hold{Key: "k", Owner: "o:1", Prefix: "RLOCK", AcquireWord: "RFENCED.ACQUIRE"}.Acquire(30000, -1, "r1"),
			ScriptCall{"fenced_acquire_token", []string{"k", "redisson_lock_token:{k}"}, []any{"30000", "o:1"}, Fenced}},
		{SemAcquire("s", 2, -1, "r"), ScriptCall{"semaphore_try_acquire", []string{"s"}, []any{"2"}, AsIs}},
		{SemRelease("s", 2, "r"), ScriptCall{"semaphore_release", []string{"s", "redisson_sc:{s}"}, []any{"2", "publish"}, GetCount}},
		{lock.Release(0, "r2"), ScriptCall{"lock_unlock",
			[]string{"k", "redisson_lock__channel:{k}", "redisson_unlock_latch:{k}:r2"},
			[]any{UnlockMessage, "30000", "o:1", "publish", UnlockLatchMs}, AsIs}},
		{Hold{Key: "{a}:k", Owner: "o:1", Prefix: "RLOCK"}.Release(5000, "r3"), ScriptCall{"lock_unlock",
			[]string{"{a}:k", "redisson_lock__channel:{a}:k", "redisson_unlock_latch:{a}:k:r3"},
			[]any{UnlockMessage, "5000", "o:1", "publish", UnlockLatchMs}, AsIs}},
		{Hold{Key: "rw", Owner: "o:1", Prefix: "RRWLOCK", Side: "WRITE"}.Acquire(100, -1, "r"),
			ScriptCall{"write_acquire", []string{"rw"}, []any{"100", "o:1:write"}, ReadHeld}},
		{Hold{Key: "rw", Owner: "o:1", Prefix: "RRWLOCK", Side: "READ"}.Release(0, "r9"), ScriptCall{"read_unlock",
			[]string{"rw", "redisson_rwlock:{rw}", "{rw}:o:1:rwlock_timeout", "{rw}", "redisson_unlock_latch:{rw}:r9"},
			[]any{UnlockMessage, "o:1", "publish", UnlockLatchMs}, AsIs}},
		{lock.Renew(30000), ScriptCall{"lock_renew", []string{"k"}, []any{"30000", "o:1"}, AsIs}},
		{ForceRelease("RLOCK", "k"), ScriptCall{"lock_force_unlock", []string{"k", "redisson_lock__channel:{k}"}, []any{UnlockMessage, "publish"}, AsIs}},
	} {
		got, err := ScriptFor(tc.args, "publish")
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%v: %+v, %v; want %+v", tc.args, got, err, tc.want)
		}
	}
	if _, err := ScriptFor(Info("RLOCK", "k"), "publish"); !errors.Is(err, ErrNeedsModule) {
		t.Errorf("info: %v, want ErrNeedsModule", err)
	}
	acq, err := ScriptFor(PSemAcquire("p", 1000, 2, -1, "r"), "publish")
	if err != nil || acq.Name != "pes_try_acquire" || len(acq.Argv) != 7 || acq.Argv[0] != int64(2) {
		t.Fatalf("expirable acquire: %+v, %v", acq, err)
	}
	if ids, ok := acq.PermitReply("OK").([]any); !ok || len(ids) != 2 || len(ids[0].(string)) != 32 {
		t.Errorf("permit ids: %v", acq.PermitReply("OK"))
	}
	now := acq.Argv[2].(int64)
	if h := acq.Hint(":" + strconv.FormatInt(now+500, 10)); h != 500+LeaseEndMarginMs {
		t.Errorf("hint at the first permit's expiry: %d", h)
	}
	if got, err := ScriptFor(LatchCountDown("l", "r"), "publish"); err != nil || got.Name != "latch_count_down" ||
		!reflect.DeepEqual(got.Keys, []string{"l", "redisson_countdownlatch__channel__{l}"}) || got.Then != GetLatchCount {
		t.Errorf("latch countdown: %+v, %v", got, err)
	}
	if v, _ := GetOpen.Reply(nil); v != int64(1) {
		t.Errorf("an absent latch is open: %v", v)
	}
	if v, _ := GetLatchCount.Reply("-1"); v != int64(0) {
		t.Errorf("a latch count below 0 reads 0: %v", v)
	}
	if ch, leased, ok := WaitChannel(lock.Acquire(100, 0, "r")); !ok || !leased || ch != "redisson_lock__channel:{k}" {
		t.Errorf("WaitChannel = %q, %v", ch, ok)
	}
	if ch, leased, ok := WaitChannel(SemAcquire("s", 1, 0, "r")); !ok || leased || ch != "redisson_sc:{s}" {
		t.Errorf("WaitChannel(semaphore) = %q, %v, %v", ch, leased, ok)
	}
	if v, _ := Fenced.Reply([]any{int64(-1), int64(7)}); !reflect.DeepEqual(v, []any{nil, int64(7)}) {
		t.Errorf("fenced held: %v", v)
	}
	if v, _ := Fenced.Reply([]any{int64(300), int64(-1)}); !reflect.DeepEqual(v, []any{int64(300), nil}) {
		t.Errorf("fenced taken: %v", v)
	}
	if v, _ := GetCount.Reply("5"); v != int64(5) {
		t.Errorf("count: %v", v)
	}
	if LeaseLeftMs(int64(100)) != 100+LeaseEndMarginMs || LeaseLeftMs(nil) != -1 {
		t.Error("LeaseLeftMs")
	}
}

// Every embedded script has a row in the "may retry" table (resend.go).
func TestEveryScriptHasAResendDecision(t *testing.T) {
	entries, err := os.ReadDir("../../lua")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		name := strings.TrimSuffix(e.Name(), ".lua")
		if _, ok := mayResend[name]; !ok {
			t.Errorf("lua/%s has no row in mayResend", e.Name())
		}
	}
}
