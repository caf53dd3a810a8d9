// Scripts mode's pure part (docs/scripts-mode.md): a module command done with Redisson's
// own Lua script (clients/go/lua, byte-identical copies of clients/python/rlock/lua),
// named, with its KEYS and ARGV, and the module's reply made from the script's. Redisson's
// names (prefixName, the unlock latch) come from here too. Every primitive's commands are
// translated; the INFO commands (no Redisson script reads them) answer ErrNeedsModule.

package proto

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
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

// ScriptCall is one script run: the file's name (without .lua), its KEYS and ARGV, and
// how the module's reply is made from the script's (Then).
type ScriptCall struct {
	Name string // "": no script, only Then
	Keys []string
	Argv []any
	Then Then
}

// Then is what turns a script's reply into the module's.
type Then int

const (
	// AsIs: the script answers what the module does.
	AsIs Then = iota
	// Fenced: `{-1, token}` is the module's `[nil, token]`, `{pttl, -1}` its `[pttl, nil]`.
	Fenced
	// GetCount: the module answers a count the script does not return: GET KEYS[0]
	// after it (0 when absent), which may include other clients' changes in between.
	GetCount
	// GetToken: GET KEYS[0] (nil when absent), as an integer.
	GetToken
	// Count: the script's reply as an integer (nil: 0).
	Count
	// One: answered 1 without any call (Redisson's acquire of 0 permits).
	One
	// GetLatchCount: GET KEYS[0] after the script, at least 0 (a latch's count).
	GetLatchCount
	// GetOpen: GET KEYS[0]; 1 when the latch is open (count 0 or no key), else 0.
	GetOpen
	// FirstInt: the first element of the script's array (the read lock's renewal).
	FirstInt
	// ReadHeld: a write acquire the script refused: if the owner (Argv[1], the writer
	// field `<owner>:write`) holds the read lock, the module's READHELD error (Redisson's
	// script would let it wait for its own read leases to end); the I/O layer looks
	// (HMGET name mode owner).
	ReadHeld
	// ForceRW: no script yet: the I/O layer reads the lock's mode (HGET name mode) and
	// runs ForceRWScript for it.
	ForceRW
	// ThenAvailable: the module answers the available permits, which the script does not
	// return: the I/O layer runs PesAvailable after it.
	ThenAvailable
	// Permits: pes_try_acquire's 'OK' is the module's permit id(s) (Argv[5:], raw, as hex);
	// anything else, nil (not taken).
	Permits
)

// NonExpirable is RPermitExpirableSemaphore's score of a permit without a lease.
const NonExpirable = 922337203685477

// timeoutZset is the expirable semaphore's zset of permit expiries (`{name}:timeout`).
func timeoutZset(name string) string { return suffixName(name, "timeout") }

// pesKeys are the reclaiming scripts' KEYS: name, timeout zset, channel.
func pesKeys(name string) []string {
	return []string{name, timeoutZset(name), SemaphoreChannel(name)}
}

// PesAvailable is the script that counts an expirable semaphore's free permits (and
// reclaims expired ones), by the client's clock as Redisson does.
func PesAvailable(name, publish string) ScriptCall {
	return ScriptCall{"pes_available", pesKeys(name), []any{NowMs(), publish}, Count}
}

// PesAvailableArgs is `RPSEMAPHORE.AVAILABLEPERMITS name` (what ThenAvailable runs).
func PesAvailableArgs(name string) []any { return []any{"RPSEMAPHORE.AVAILABLEPERMITS", name} }

// NowMs is the client's clock in ms: Redisson passes System.currentTimeMillis() to the
// permit scripts (docs/scripts-mode.md: leases judged by each client's clock).
func NowMs() int64 { return time.Now().UnixMilli() }

// rawID is a permit id (32 hex digits) as the 16 bytes the zset holds.
func rawID(id string) (string, error) {
	b, err := hex.DecodeString(id)
	if err != nil || len(b) != 16 {
		return "", errors.New("BADPERMITID scripts mode takes Redisson's permit ids: 32 hex digits")
	}
	return string(b), nil
}

// Hint is how many ms until a waiter should look again without a message, from the
// script's raw reply v (before Reply): the lock's PTTL, the expirable semaphore's first
// permit expiry; -1 for none (a message only), 0 to look at once.
func (c ScriptCall) Hint(v any) int64 {
	switch c.Then {
	case Permits:
		if s, ok := v.(string); ok && strings.HasPrefix(s, ":") {
			ts, err := strconv.ParseFloat(s[1:], 64)
			if err != nil {
				return -1
			}
			now, _ := c.Argv[2].(int64)
			if left := int64(ts) - now; left > 1 {
				return left + LeaseEndMarginMs
			}
			return 1 + LeaseEndMarginMs
		}
		return -1
	case Fenced:
		if a, ok := v.([]any); ok && len(a) == 2 {
			v = a[0]
		}
	}
	if n, ok := v.(int64); ok {
		if n == -2 {
			return 0 // the holder's key went between two looks: look again
		}
		if n >= 0 {
			return n + LeaseEndMarginMs
		}
	}
	return -1
}

// ReadHeldText is the module's refusal of a write acquire by a read holder.
const ReadHeldText = "READHELD this owner holds the read lock: release the read lock first (a writer waiting on its own read would wait forever)"

// RWChannel is Redisson's read-write lock channel (`redisson_rwlock:{name}`).
func RWChannel(name string) string { return PrefixName("redisson_rwlock", name) }

// suffixName is Redisson's suffixName: `{name}:suffix`, or `name:suffix` when the name
// has a `{` of its own.
func suffixName(name, suffix string) string {
	if strings.Contains(name, "{") {
		return name + ":" + suffix
	}
	return "{" + name + "}:" + suffix
}

// rwTimeoutPrefix: `{name}:<owner>:rwlock_timeout`, read hold n's timeout key + `:n`.
func rwTimeoutPrefix(name, owner string) string { return suffixName(name, owner) + ":rwlock_timeout" }

// rwKeyPrefix is RedissonReadLock.getKeyPrefix: `{name}` (`name` when it has a `{`).
func rwKeyPrefix(name string) string {
	if strings.Contains(name, "{") {
		return name
	}
	return "{" + name + "}"
}

// ForceRWScript is the force-release script of a read-write lock in mode ("read" or
// "write"; the lock's HGET name mode), with its KEYS and ARGV.
func ForceRWScript(name, mode, publish string) ScriptCall {
	if mode == "read" {
		return ScriptCall{"read_force_unlock", []string{name, RWChannel(name)}, []any{UnlockMessage, publish}, AsIs}
	}
	return ScriptCall{"write_force_unlock", []string{name, RWChannel(name)}, []any{ReadUnlockMessage, publish}, AsIs}
}

// ReadUnlockMessage is Redisson's LockPubSub read-unlock message (wake all).
const ReadUnlockMessage = 1

// Gets tells whether the module's reply needs a GET of KEYS[0] after the script.
func (t Then) Gets() bool {
	return t == GetCount || t == GetToken || t == GetLatchCount || t == GetOpen
}

// Reply is the module's reply made from a script's reply v (or, for GetCount and
// GetToken, the GET's).
func (t Then) Reply(v any) (any, error) {
	switch t {
	case Fenced:
		a, ok := v.([]any)
		if !ok || len(a) != 2 {
			return nil, unexpected("fenced script", v)
		}
		if a[0] == int64(-1) {
			return []any{nil, a[1]}, nil
		}
		return []any{a[0], nil}, nil
	case GetCount, Count:
		return toInt(v, 0)
	case GetToken:
		if v == nil {
			return nil, nil
		}
		return toInt(v, 0)
	case One:
		return int64(1), nil
	case Permits:
		if v != "OK" {
			return nil, nil
		}
		return nil, nil // filled by PermitReply
	case FirstInt:
		if a, ok := v.([]any); ok && len(a) > 0 {
			return toInt(a[0], 0)
		}
		return toInt(v, 0)
	case GetLatchCount, GetOpen:
		n, err := toInt(v, 0)
		if err != nil {
			return nil, err
		}
		count := n.(int64)
		if count < 0 {
			count = 0
		}
		if t == GetOpen {
			if count == 0 {
				return int64(1), nil
			}
			return int64(0), nil
		}
		return count, nil
	}
	return v, nil
}

// PermitReply is the module's reply to an expirable semaphore's acquire whose script
// answered v: the permit id (one) or ids (more), in hex, or nil.
func (c ScriptCall) PermitReply(v any) any {
	if v != "OK" {
		return nil
	}
	var ids []any
	for _, a := range c.Argv[5:] {
		ids = append(ids, hex.EncodeToString([]byte(a.(string))))
	}
	if len(ids) == 1 {
		return ids[0]
	}
	return ids
}

// LatchChannel is Redisson's latch channel: always braces around the whole name
// (RedissonCountDownLatch.getChannelName has no prefixName rule).
func LatchChannel(name string) string { return "redisson_countdownlatch__channel__{" + name + "}" }

// Redisson's CountDownLatchPubSub messages: the count reached zero / a count was set or
// the latch deleted.
const (
	ZeroCountMessage = 0
	NewCountMessage  = 1
)

func toInt(v any, none int64) (any, error) {
	switch x := v.(type) {
	case nil:
		return none, nil
	case int64:
		return x, nil
	case string:
		n, err := strconv.ParseInt(x, 10, 64)
		if err != nil {
			return nil, unexpected("count", v)
		}
		return n, nil
	}
	return nil, unexpected("count", v)
}

// SemaphoreChannel is Redisson's semaphore channel (`redisson_sc:{name}`).
func SemaphoreChannel(name string) string { return PrefixName("redisson_sc", name) }

// TokenKey is Redisson's fenced lock's token counter (`redisson_lock_token:{name}`).
func TokenKey(name string) string { return PrefixName("redisson_lock_token", name) }

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

// scriptArity: the positional arguments each module command done by a script needs.
var scriptArity = map[string]int{
	"RLOCK.ACQUIRE":                3,
	"RLOCK.RELEASE":                2,
	"RLOCK.RENEW":                  3,
	"RFENCED.ACQUIRE":              3,
	"RFENCED.GETTOKEN":             1,
	"RSEMAPHORE.TRYSETPERMITS":     2,
	"RSEMAPHORE.ADDPERMITS":        2,
	"RSEMAPHORE.ACQUIRE":           2,
	"RSEMAPHORE.RELEASE":           2,
	"RSEMAPHORE.AVAILABLEPERMITS":  1,
	"RSEMAPHORE.DRAINPERMITS":      1,
	"RRWLOCK.ACQUIRE":              4,
	"RRWLOCK.RELEASE":              3,
	"RRWLOCK.RENEW":                4,
	"RRWLOCK.FORCERELEASE":         1,
	"RPSEMAPHORE.TRYSETPERMITS":    2,
	"RPSEMAPHORE.SETPERMITS":       2,
	"RPSEMAPHORE.ADDPERMITS":       2,
	"RPSEMAPHORE.AVAILABLEPERMITS": 1,
	"RPSEMAPHORE.ACQUIREDPERMITS":  1,
	"RPSEMAPHORE.ACQUIRE":          2,
	"RPSEMAPHORE.RELEASE":          2,
	"RPSEMAPHORE.UPDATELEASETIME":  3,
	"RPSEMAPHORE.LEASETIME":        2,
	"RLATCH.TRYSETCOUNT":           2,
	"RLATCH.COUNTDOWN":             1,
	"RLATCH.GETCOUNT":              1,
	"RLATCH.AWAIT":                 1,
	"RLATCH.DELETE":                1,
	"RLOCK.FORCERELEASE":           1,
}

// ScriptFor is the script that does module command args (publish: "publish", or
// "spublish" on a cluster with sharded pub/sub), or ErrNeedsModule.
func ScriptFor(args []any, publish string) (ScriptCall, error) {
	a := Strings(args)
	if len(a) < 2 {
		return ScriptCall{}, ErrNeedsModule
	}
	cmd := strings.ToUpper(a[0])
	// How many positional arguments each command needs: checked once, here, before its
	// case reads them.
	n, known := scriptArity[cmd]
	if !known {
		return ScriptCall{}, fmt.Errorf("%w (%s)", ErrNeedsModule, cmd)
	}
	pos, opts := split(a, n)
	if len(pos) < n {
		return ScriptCall{}, fmt.Errorf("ERR wrong number of arguments for '%s' command", strings.ToLower(cmd))
	}
	switch cmd {
	case "RLOCK.ACQUIRE":
		return ScriptCall{"lock_acquire", []string{pos[0]}, []any{pos[2], pos[1]}, AsIs}, nil
	case "RLOCK.RELEASE":
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
			[]any{UnlockMessage, lease, pos[1], publish, UnlockLatchMs}, AsIs}, nil
	case "RLOCK.RENEW":
		return ScriptCall{"lock_renew", []string{pos[0]}, []any{pos[2], pos[1]}, AsIs}, nil
	case "RFENCED.ACQUIRE":
		return ScriptCall{"fenced_acquire_token", []string{pos[0], TokenKey(pos[0])}, []any{pos[2], pos[1]}, Fenced}, nil
	case "RFENCED.GETTOKEN":
		return ScriptCall{"", []string{TokenKey(pos[0])}, nil, GetToken}, nil
	case "RSEMAPHORE.TRYSETPERMITS":
		keys := []string{pos[0], SemaphoreChannel(pos[0])}
		if px, ok := opts["PX"]; ok {
			return ScriptCall{"semaphore_try_set_ttl", keys, []any{pos[1], publish, px}, AsIs}, nil
		}
		return ScriptCall{"semaphore_try_set", keys, []any{pos[1], publish}, AsIs}, nil
	case "RSEMAPHORE.ADDPERMITS":
		return ScriptCall{"semaphore_add", []string{pos[0], SemaphoreChannel(pos[0])}, []any{pos[1], publish}, GetCount}, nil
	case "RSEMAPHORE.ACQUIRE":
		if pos[1] == "0" {
			return ScriptCall{"", []string{pos[0]}, nil, One}, nil
		}
		return ScriptCall{"semaphore_try_acquire", []string{pos[0]}, []any{pos[1]}, AsIs}, nil
	case "RSEMAPHORE.RELEASE":
		if pos[1] == "0" {
			return ScriptCall{"", []string{pos[0]}, nil, GetCount}, nil
		}
		return ScriptCall{"semaphore_release", []string{pos[0], SemaphoreChannel(pos[0])}, []any{pos[1], publish}, GetCount}, nil
	case "RSEMAPHORE.AVAILABLEPERMITS":
		return ScriptCall{"", []string{pos[0]}, nil, GetCount}, nil
	case "RSEMAPHORE.DRAINPERMITS":
		return ScriptCall{"semaphore_drain", []string{pos[0]}, nil, Count}, nil
	case "RRWLOCK.ACQUIRE":
		name, owner, lease := pos[0], pos[2], pos[3]
		writer := owner + ":write"
		if strings.EqualFold(pos[1], "READ") {
			return ScriptCall{"read_acquire", []string{name, rwTimeoutPrefix(name, owner)}, []any{lease, owner, writer}, AsIs}, nil
		}
		return ScriptCall{"write_acquire", []string{name}, []any{lease, writer}, ReadHeld}, nil
	case "RRWLOCK.RELEASE":
		name, owner := pos[0], pos[2]
		lease := "30000"
		if len(pos) > 3 {
			lease = pos[3]
		}
		id := opts["ID"]
		if id == "" {
			id = RequestID()
		}
		latch := UnlockLatch(name, id)
		if strings.EqualFold(pos[1], "READ") {
			return ScriptCall{"read_unlock", []string{name, RWChannel(name), rwTimeoutPrefix(name, owner), rwKeyPrefix(name), latch},
				[]any{UnlockMessage, owner, publish, UnlockLatchMs}, AsIs}, nil
		}
		return ScriptCall{"write_unlock", []string{name, RWChannel(name), latch},
			[]any{ReadUnlockMessage, lease, owner + ":write", publish, UnlockLatchMs}, AsIs}, nil
	case "RRWLOCK.RENEW":
		name, owner, lease := pos[0], pos[2], pos[3]
		if strings.EqualFold(pos[1], "READ") {
			return ScriptCall{"read_renew", []string{name, rwKeyPrefix(name)}, []any{lease, 1, owner}, FirstInt}, nil
		}
		return ScriptCall{"lock_renew", []string{name}, []any{lease, owner + ":write"}, AsIs}, nil
	case "RRWLOCK.FORCERELEASE":
		return ScriptCall{"", []string{pos[0]}, nil, ForceRW}, nil
	case "RPSEMAPHORE.TRYSETPERMITS":
		return ScriptCall{"semaphore_try_set", []string{pos[0], SemaphoreChannel(pos[0])}, []any{pos[1], publish}, AsIs}, nil
	case "RPSEMAPHORE.SETPERMITS":
		return ScriptCall{"pes_set_permits", []string{pos[0], SemaphoreChannel(pos[0]), timeoutZset(pos[0])}, []any{pos[1], publish}, ThenAvailable}, nil
	case "RPSEMAPHORE.ADDPERMITS":
		return ScriptCall{"pes_add", []string{pos[0], SemaphoreChannel(pos[0])}, []any{pos[1], publish}, ThenAvailable}, nil
	case "RPSEMAPHORE.AVAILABLEPERMITS":
		return PesAvailable(pos[0], publish), nil
	case "RPSEMAPHORE.ACQUIREDPERMITS":
		return ScriptCall{"pes_acquired", pesKeys(pos[0]), []any{NowMs(), publish}, Count}, nil
	case "RPSEMAPHORE.ACQUIRE":
		permits := int64(1)
		if p, ok := opts["PERMITS"]; ok {
			var err error
			if permits, err = strconv.ParseInt(p, 10, 64); err != nil || permits < 1 {
				return ScriptCall{}, errors.New("BADPERMITS permits must be a positive integer")
			}
		}
		lease, err := strconv.ParseInt(pos[1], 10, 64)
		if err != nil {
			return ScriptCall{}, errors.New("BADLEASE lease must be an integer")
		}
		now := NowMs()
		expiry := int64(NonExpirable)
		if lease >= 0 {
			expiry = now + lease
		}
		argv := []any{permits, expiry, now, int64(NonExpirable), publish}
		for i := int64(0); i < permits; i++ {
			b := make([]byte, 16)
			_, _ = rand.Read(b)
			argv = append(argv, string(b))
		}
		return ScriptCall{"pes_try_acquire", pesKeys(pos[0]), argv, Permits}, nil
	case "RPSEMAPHORE.RELEASE":
		raw, err := rawID(pos[1])
		if err != nil {
			return ScriptCall{}, err
		}
		return ScriptCall{"pes_release", []string{pos[0], SemaphoreChannel(pos[0]), timeoutZset(pos[0])}, []any{raw, 1, NowMs(), publish}, AsIs}, nil
	case "RPSEMAPHORE.UPDATELEASETIME":
		raw, err := rawID(pos[1])
		if err != nil {
			return ScriptCall{}, err
		}
		lease, err := strconv.ParseInt(pos[2], 10, 64)
		if err != nil {
			return ScriptCall{}, errors.New("BADLEASE lease must be an integer")
		}
		now := NowMs()
		expiry := int64(NonExpirable)
		if lease >= 0 {
			expiry = now + lease
		}
		return ScriptCall{"pes_update_lease", pesKeys(pos[0]), []any{raw, expiry, now, publish}, AsIs}, nil
	case "RPSEMAPHORE.LEASETIME":
		raw, err := rawID(pos[1])
		if err != nil {
			return ScriptCall{}, err
		}
		return ScriptCall{"pes_lease_time", pesKeys(pos[0]), []any{raw, int64(NonExpirable), NowMs(), publish}, AsIs}, nil
	case "RLATCH.TRYSETCOUNT":
		return ScriptCall{"latch_try_set", []string{pos[0], LatchChannel(pos[0])}, []any{NewCountMessage, pos[1], publish}, AsIs}, nil
	case "RLATCH.COUNTDOWN":
		return ScriptCall{"latch_count_down", []string{pos[0], LatchChannel(pos[0])}, []any{ZeroCountMessage, publish}, GetLatchCount}, nil
	case "RLATCH.GETCOUNT":
		return ScriptCall{"", []string{pos[0]}, nil, GetLatchCount}, nil
	case "RLATCH.AWAIT":
		return ScriptCall{"", []string{pos[0]}, nil, GetOpen}, nil
	case "RLATCH.DELETE":
		return ScriptCall{"latch_delete", []string{pos[0], LatchChannel(pos[0])}, []any{NewCountMessage, publish}, AsIs}, nil
	case "RLOCK.FORCERELEASE":
		return ScriptCall{"lock_force_unlock", []string{pos[0], LockChannel(pos[0])}, []any{UnlockMessage, publish}, AsIs}, nil
	}
	return ScriptCall{}, fmt.Errorf("%w (%s)", ErrNeedsModule, cmd)
}

// WaitChannel is the channel a scripts-mode waiter of command args listens on, and
// whether a try's reply is the holder's PTTL (a lock: the waiter also wakes at the
// lease's end; a semaphore only on a message).
func WaitChannel(args []any) (channel string, leased, ok bool) {
	a := Strings(args)
	if len(a) < 2 {
		return "", false, false
	}
	switch strings.ToUpper(a[0]) {
	case "RLOCK.ACQUIRE", "RFENCED.ACQUIRE":
		return LockChannel(a[1]), true, true
	case "RSEMAPHORE.ACQUIRE":
		return SemaphoreChannel(a[1]), false, true
	case "RPSEMAPHORE.ACQUIRE":
		return SemaphoreChannel(a[1]), true, true
	case "RLATCH.AWAIT":
		return LatchChannel(a[1]), false, true
	case "RRWLOCK.ACQUIRE":
		return RWChannel(a[1]), true, true
	}
	return "", false, false
}

// LeaseLeftMs is the ms until a try's holder's lease ends, from an acquire's PTTL reply
// (-1: none known, wait for a message only).
func LeaseLeftMs(reply any) int64 {
	if a, ok := reply.([]any); ok && len(a) == 2 {
		reply = a[0] // the fenced lock's [pttl, nil]
	}
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
