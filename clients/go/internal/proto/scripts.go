// Scripts mode's pure part (docs/scripts-mode.md): a module command done with Redisson's
// own Lua script (clients/go/lua, byte-identical copies of clients/python/rlock/lua),
// named, with its KEYS and ARGV, and the module's reply made from the script's. Redisson's
// names (prefixName, the unlock latch) come from here too. Only the lock (RLOCK.*) is
// translated so far; any other command answers ErrNeedsModule.

package proto

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ErrNeedsModule: a command scripts mode does not do (no Redisson script does it, or
// this client does not translate it yet).
var ErrNeedsModule = errors.New("rlock scripts mode: this call needs the rlock module")

// UnlockLatchMs is how long an unlock's reply is remembered for its retries (Redisson's
// unlock latch).
const UnlockLatchMs = 10000

// LeaseEndMarginMs: a scripts-mode waiter behind a lease looks again this long after the
// PTTL its try answered, so that the key has expired by then.
const LeaseEndMarginMs = 2

// UnlockMessage is Redisson's LockPubSub unlock message.
const UnlockMessage = 0

// PrefixName is Redisson's prefixName: `prefix:{name}`, or `prefix:name` when the name
// has a `{` of its own.
func PrefixName(prefix, name string) string {
	if strings.Contains(name, "{") {
		return prefix + ":" + name
	}
	return prefix + ":{" + name + "}"
}

// UnlockLatch is the key under which an unlock's reply is remembered for request id.
func UnlockLatch(name, id string) string {
	return PrefixName("redisson_unlock_latch", name) + ":" + id
}

// ScriptCall is one script run: the file's name (without .lua), its KEYS and ARGV.
type ScriptCall struct {
	Name string
	Keys []string
	Argv []any
}

// split is a command's positional words (at least fixed after the command word) and
// its options (ID, WAIT, ASYNC, ...).
func split(args []string, fixed int) ([]string, map[string]string) {
	words := args[1:]
	var pos []string
	i := 0
	isOpt := func(w string) bool {
		switch strings.ToUpper(w) {
		case "ID", "WAIT", "ASYNC", "PERMITS", "PX":
			return true
		}
		return false
	}
	for i < len(words) && (i < fixed || !isOpt(words[i])) {
		pos = append(pos, words[i])
		i++
	}
	opts := map[string]string{}
	for i < len(words) {
		w := strings.ToUpper(words[i])
		if w == "ASYNC" {
			opts[w] = "1"
			i++
			continue
		}
		if i+1 < len(words) {
			opts[w] = words[i+1]
		}
		i += 2
	}
	return pos, opts
}

// ScriptFor is the script that does module command args (publish: "publish", or
// "spublish" on a cluster with sharded pub/sub), or ErrNeedsModule.
func ScriptFor(args []any, publish string) (ScriptCall, error) {
	a := Strings(args)
	if len(a) < 2 {
		return ScriptCall{}, ErrNeedsModule
	}
	cmd := strings.ToUpper(a[0])
	need := func(n int) ([]string, map[string]string, error) {
		pos, opts := split(a, n)
		if len(pos) < n {
			return nil, nil, fmt.Errorf("ERR wrong number of arguments for '%s' command", strings.ToLower(cmd))
		}
		return pos, opts, nil
	}
	switch cmd {
	case "RLOCK.ACQUIRE":
		pos, _, err := need(3)
		if err != nil {
			return ScriptCall{}, err
		}
		return ScriptCall{"lock_acquire", []string{pos[0]}, []any{pos[2], pos[1]}}, nil
	case "RLOCK.RELEASE":
		pos, opts, err := need(2)
		if err != nil {
			return ScriptCall{}, err
		}
		lease := "30000"
		if len(pos) > 2 {
			lease = pos[2]
		}
		id := opts["ID"]
		if id == "" {
			id = RequestID()
		}
		name := pos[0]
		return ScriptCall{"lock_unlock", []string{name, LockChannel(name), UnlockLatch(name, id)},
			[]any{UnlockMessage, lease, pos[1], publish, UnlockLatchMs}}, nil
	case "RLOCK.RENEW":
		pos, _, err := need(3)
		if err != nil {
			return ScriptCall{}, err
		}
		return ScriptCall{"lock_renew", []string{pos[0]}, []any{pos[2], pos[1]}}, nil
	case "RLOCK.FORCERELEASE":
		pos, _, err := need(1)
		if err != nil {
			return ScriptCall{}, err
		}
		return ScriptCall{"lock_force_unlock", []string{pos[0], LockChannel(pos[0])}, []any{UnlockMessage}}, nil
	}
	return ScriptCall{}, fmt.Errorf("%w (%s)", ErrNeedsModule, cmd)
}

// WaitChannel is the channel a scripts-mode waiter of command args listens on.
func WaitChannel(args []any) (string, bool) {
	a := Strings(args)
	if len(a) >= 2 && strings.EqualFold(a[0], "RLOCK.ACQUIRE") {
		return LockChannel(a[1]), true
	}
	return "", false
}

// LeaseLeftMs is the ms until a try's holder's lease ends, from an acquire's PTTL reply
// (-1: none known, wait for a message only).
func LeaseLeftMs(reply any) int64 {
	if n, ok := reply.(int64); ok && n >= 0 {
		return n + LeaseEndMarginMs
	}
	if s, ok := reply.(string); ok {
		if n, err := strconv.ParseInt(s, 10, 64); err == nil && n >= 0 {
			return n + LeaseEndMarginMs
		}
	}
	return -1
}
