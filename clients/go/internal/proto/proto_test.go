// Tests of the pure protocol, without a server: command words, reply meanings, ticket
// channels and messages, the ticketed wait's state machine, undo commands, backoff.
package proto

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestItBuildsEveryCommandWithTheKeyFirst(t *testing.T) {
	lock := Hold{Key: "k", Owner: "o", Prefix: "RLOCK"}
	read := Hold{Key: "k", Owner: "o", Prefix: "RRWLOCK", Side: "READ"}
	fenced := Hold{Key: "k", Owner: "o", Prefix: "RLOCK", AcquireWord: "RFENCED.ACQUIRE"}
	// Table: the command built -> its words on the wire.
	cases := []struct {
		got  []any
		want string
	}{
		{lock.Acquire(30000, -1, "r1"), "RLOCK.ACQUIRE k o 30000 ID r1"},
		{lock.Acquire(100, 0, "r1"), "RLOCK.ACQUIRE k o 100 WAIT 0 ID r1"},
		{lock.Acquire(100, 250, "r1"), "RLOCK.ACQUIRE k o 100 WAIT 250 ID r1"},
		{lock.Release(0, "r2"), "RLOCK.RELEASE k o ID r2"},
		{lock.Release(9, "r2"), "RLOCK.RELEASE k o 9 ID r2"},
		{lock.Renew(9), "RLOCK.RENEW k o 9"},
		{ForceRelease("RLOCK", "k"), "RLOCK.FORCERELEASE k"},
		{Info("RLOCK", "k"), "RLOCK.INFO k"},
		{read.Acquire(100, 0, "r1"), "RRWLOCK.ACQUIRE k READ o 100 WAIT 0 ID r1"},
		{read.Release(9, "r2"), "RRWLOCK.RELEASE k READ o 9 ID r2"},
		{read.Renew(9), "RRWLOCK.RENEW k READ o 9"},
		{fenced.Acquire(100, -1, "r1"), "RFENCED.ACQUIRE k o 100 ID r1"},
		{fenced.Release(0, "r2"), "RLOCK.RELEASE k o ID r2"},
		{WaitReplicas(2, 100), "WAIT 2 100"},
		{SemAcquire("s", 3, 50, "r"), "RSEMAPHORE.ACQUIRE s 3 WAIT 50 ID r"},
		{SemRelease("s", 3, "r"), "RSEMAPHORE.RELEASE s 3 ID r"},
		{PSemAcquire("p", -1, 1, -1, "r"), "RPSEMAPHORE.ACQUIRE p -1 ID r"},
		{PSemAcquire("p", 500, 2, 0, "r"), "RPSEMAPHORE.ACQUIRE p 500 PERMITS 2 WAIT 0 ID r"},
		{LatchAwait("l", 0), "RLATCH.AWAIT l WAIT 0"},
		{LatchCountDown("l", "r"), "RLATCH.COUNTDOWN l ID r"},
	}
	for _, c := range cases {
		if got := join(Strings(c.got)); got != c.want {
			t.Errorf("got %q, want %q", got, c.want)
		}
	}
}

func join(a []string) string {
	out := ""
	for i, w := range a {
		if i > 0 {
			out += " "
		}
		out += w
	}
	return out
}

func TestItReadsAcquireRepliesAsRedissonDoes(t *testing.T) {
	cases := []struct {
		reply any
		want  Acquired
		err   bool
	}{
		{nil, Acquired{Held: true}, false},
		{int64(1234), Acquired{PTTL: 1234}, false},
		{int64(-1), Acquired{PTTL: -1}, false},
		{"OK", Acquired{}, true},
	}
	for _, c := range cases {
		got, err := ParseAcquire(c.reply)
		if (err != nil) != c.err || got != c.want {
			t.Errorf("ParseAcquire(%#v) = %v, %v", c.reply, got, err)
		}
	}
	if a, err := ParseFencedAcquire([]any{nil, int64(77)}); err != nil || !a.Held || a.Token != 77 {
		t.Errorf("fenced grant: %v %v", a, err)
	}
	if a, err := ParseFencedAcquire([]any{int64(900), nil}); err != nil || a.Held || a.PTTL != 900 {
		t.Errorf("fenced contended: %v %v", a, err)
	}
	if _, err := ParseFencedAcquire(nil); !errors.Is(err, ErrUnexpected) {
		t.Errorf("fenced nil: %v", err)
	}
}

func TestItReadsReleaseAndBoolReplies(t *testing.T) {
	for reply, want := range map[any]Released{int64(0): StillHeld, int64(1): Freed, nil: NotHeld} {
		if got, err := ParseRelease(reply); err != nil || got != want {
			t.Errorf("ParseRelease(%v) = %v, %v", reply, got, err)
		}
	}
	if _, err := ParseRelease(int64(2)); err == nil {
		t.Error("ParseRelease(2) accepted")
	}
	if ok, err := ParseBool("RENEW", int64(1)); !ok || err != nil {
		t.Error("RENEW 1")
	}
	if _, err := ParseBool("RENEW", nil); err == nil {
		t.Error("RENEW nil accepted")
	}
}

func TestItReadsInfoAsResp2PairsAndResp3Maps(t *testing.T) {
	resp2 := []any{"owners", []any{"c:1", int64(2)}, "pttl", int64(900), "waiters", int64(3)}
	resp3 := map[any]any{"owners": map[any]any{"c:1": int64(2)}, "pttl": int64(900),
		"waiters": int64(3), "future-field": "x"}
	for _, v := range []any{resp2, resp3} {
		info, err := ParseInfo(v)
		if err != nil || info.Owners["c:1"] != 2 || info.PTTL != 900 || info.Waiters != 3 {
			t.Errorf("ParseInfo(%#v) = %+v, %v", v, info, err)
		}
	}
	if info, err := ParseInfo(nil); info != nil || err != nil {
		t.Error("nil info is no lock")
	}
}

func TestItNamesTicketChannelsByRedissonsPrefixRule(t *testing.T) {
	cases := map[string]string{
		"orders:42":    "rlock_ticket:{orders:42}",
		"{user1}:lock": "rlock_ticket:{user1}:lock",
	}
	for key, want := range cases {
		if got := TicketChannel(key); got != want {
			t.Errorf("TicketChannel(%q) = %q, want %q", key, got, want)
		}
	}
	if got := LockChannel("k"); got != "redisson_lock__channel:{k}" {
		t.Errorf("LockChannel = %q", got)
	}
}

func TestItParsesTicketMessages(t *testing.T) {
	cases := []struct {
		payload string
		want    Note
		ok      bool
	}{
		{"granted:2:8:r1client-1", Note{Kind: Granted, Word: "granted", ID: "r1", Owner: "client-1"}, true},
		{"timeout:2:0:r1", Note{Kind: Timeout, Word: "timeout", ID: "r1"}, true},
		{"error:2:1:r1oMOVED 12 127.0.0.1:7000", Note{Kind: Failed, Word: "error", ID: "r1", Owner: "o", Detail: "MOVED 12 127.0.0.1:7000"}, true},
		// Lengths count bytes, so ids and owners may hold ':' and any UTF-8.
		{"granted:3:3:a:bc:d", Note{Kind: Granted, Word: "granted", ID: "a:b", Owner: "c:d"}, true},
		{"granted:2:7:r1m\u00fcller", Note{Kind: Granted, Word: "granted", ID: "r1", Owner: "m\u00fcller"}, true},
		// What a later module may add: a detail after any kind, kinds unknown here
		// (collected, never ignored), leading zeros.
		{"granted:2:8:r1client-1extra", Note{Kind: Granted, Word: "granted", ID: "r1", Owner: "client-1", Detail: "extra"}, true},
		{"moved:2:1:r1o127.0.0.1:7001", Note{Kind: Other, Word: "moved", ID: "r1", Owner: "o", Detail: "127.0.0.1:7001"}, true},
		{"GRANTED:2:1:r1o", Note{Kind: Other, Word: "GRANTED", ID: "r1", Owner: "o"}, true},
		{"granted:02:0:r1", Note{Kind: Granted, Word: "granted", ID: "r1"}, true},
		// Not ticket messages: ignored.
		{"granted:9:8:r1client-1", Note{}, false},
		{"granted:x:1:ab", Note{}, false},
		{"granted:-1:0:r1", Note{}, false},
		{"granted: 2:0:r1", Note{}, false},
		{"granted::0:r1", Note{}, false},
		{"granted:00000000002:0:r1", Note{}, false},
		{"granted:2:0", Note{}, false},
		{"nonsense", Note{}, false},
		{"", Note{}, false},
	}
	for _, c := range cases {
		got, ok := ParseNote(c.payload)
		if ok != c.ok || got != c.want {
			t.Errorf("ParseNote(%q) = %+v, %v", c.payload, got, ok)
		}
	}
}

func TestItShapesAWaitingCommandIntoTicketAndCollectForms(t *testing.T) {
	lock := Hold{Key: "k", Owner: "o", Prefix: "RLOCK"}
	s, ok := ShapeOf(lock.Acquire(100, 500, "r1"))
	if !ok || s.ID() != "r1" || s.Key() != "k" {
		t.Fatalf("ShapeOf: %+v %v", s, ok)
	}
	if got := join(Strings(s.Ticketed(300))); got != "RLOCK.ACQUIRE k o 100 WAIT 300 ID r1 ASYNC" {
		t.Errorf("Ticketed = %q", got)
	}
	if got := join(Strings(s.Look())); got != "RLOCK.ACQUIRE k o 100 ID r1" {
		t.Errorf("Look = %q", got)
	}
	if left, ok := s.WaitLeft(200 * time.Millisecond); !ok || left != 300 {
		t.Errorf("WaitLeft = %v %v", left, ok)
	}
	if _, ok := s.WaitLeft(time.Second); ok {
		t.Error("WaitLeft after the limit")
	}
	// The latch has no ID of its own: one is added for ASYNC only.
	l, _ := ShapeOf(LatchAwait("l", 0))
	if got := Strings(l.Ticketed(0)); !reflect.DeepEqual(got[:5], []string{"RLATCH.AWAIT", "l", "WAIT", "0", "ASYNC"}) || got[5] != "ID" || got[6] != l.ID() {
		t.Errorf("latch Ticketed = %q", got)
	}
	if got := join(Strings(l.Look())); got != "RLATCH.AWAIT l" {
		t.Errorf("latch Look = %q", got)
	}
	if _, ok := ShapeOf(lock.Acquire(100, -1, "r")); ok {
		t.Error("a command without WAIT has no shape")
	}
}

func TestTheTicketMachineQueuesCollectsAndRequeues(t *testing.T) {
	now := time.Now()
	s, _ := ShapeOf(Hold{Key: "k", Owner: "o", Prefix: "RLOCK"}.Acquire(100, 0, "r1"))
	m := NewMachine(s, now)
	step := m.Start(now)
	if join(Strings(step.Send)) != "RLOCK.ACQUIRE k o 100 WAIT 0 ID r1 ASYNC" || !m.Outstanding {
		t.Fatalf("start: %+v", step)
	}
	if step = m.On(Event{Reply: "QUEUED"}, now); !step.Wait {
		t.Fatalf("QUEUED: %+v", step)
	}
	// The connection broke: queue again with the same id.
	if step = m.On(Event{Lost: true}, now); join(Strings(step.Send)) != "RLOCK.ACQUIRE k o 100 WAIT 0 ID r1 ASYNC" {
		t.Fatalf("lost: %+v", step)
	}
	m.On(Event{Reply: "QUEUED"}, now)
	// Granted: collect with the same id.
	if step = m.On(Event{Note: &Note{Kind: Granted, ID: "r1"}}, now); join(Strings(step.Send)) != "RLOCK.ACQUIRE k o 100 ID r1" {
		t.Fatalf("granted: %+v", step)
	}
	if step = m.On(Event{Reply: nil}, now); !step.Done || step.Reply != nil || step.Err != nil || m.Outstanding {
		t.Fatalf("collected: %+v", step)
	}
	// Served at once: the ordinary reply is the outcome.
	m2 := NewMachine(s, now)
	m2.Start(now)
	if step = m2.On(Event{Reply: nil}, now); !step.Done {
		t.Fatalf("at once: %+v", step)
	}
	// A timeout: look once for the ordinary reply.
	m3 := NewMachine(s, now)
	m3.Start(now)
	m3.On(Event{Reply: "QUEUED"}, now)
	if step = m3.On(Event{Note: &Note{Kind: Timeout}}, now); step.Send == nil || m3.Outstanding {
		t.Fatalf("timeout: %+v", step)
	}
	// A kind this client does not know ends the ticket too: collect, do not assume.
	m6 := NewMachine(s, now)
	m6.Start(now)
	m6.On(Event{Reply: "QUEUED"}, now)
	if step = m6.On(Event{Note: &Note{Kind: Other, Word: "moved"}}, now); join(Strings(step.Send)) != "RLOCK.ACQUIRE k o 100 ID r1" || m6.Outstanding {
		t.Fatalf("unknown kind: %+v", step)
	}
	if step = m3.On(Event{Reply: int64(50)}, now); !step.Done || step.Reply != int64(50) {
		t.Fatalf("after timeout: %+v", step)
	}
	// An error note ends the wait with the server's error.
	m4 := NewMachine(s, now)
	m4.Start(now)
	m4.On(Event{Reply: "QUEUED"}, now)
	if step = m4.On(Event{Note: &Note{Kind: Failed, Detail: "MOVED 1 h:1"}}, now); !step.Done || step.Err.Error() != "MOVED 1 h:1" {
		t.Fatalf("error note: %+v", step)
	}
	// An error reply to the ticketed command ends the wait with it.
	m5 := NewMachine(s, now)
	m5.Start(now)
	if step = m5.On(Event{Err: errors.New("BADLEASE lease must be positive")}, now); !step.Done || step.Err == nil || m5.Outstanding {
		t.Fatalf("error reply: %+v", step)
	}
	// A latch's grant is its whole answer.
	l, _ := ShapeOf(LatchAwait("l", 0))
	ml := NewMachine(l, now)
	ml.Start(now)
	ml.On(Event{Reply: "QUEUED"}, now)
	if step = ml.On(Event{Note: &Note{Kind: Granted}}, now); !step.Done || step.Reply != int64(1) {
		t.Fatalf("latch: %+v", step)
	}
}

// On a server naming `ticket-holds` a lock's, RW lock's, fenced lock's, semaphore's or
// expirable semaphore's waiter holds on its `granted` message (no collect on its path; the
// token and permit ids read from the detail, spec/vectors/tickets.json `holds`); the latch
// does not. An id answered TAKENBACK (its grant taken back before the waiter had it)
// queues again under a fresh id.
func TestTheTicketMachineHoldsOnTheGrantAndRequeuesATakenBackID(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		args  []any
		holds bool
	}{
		{Hold{Key: "k", Owner: "o", Prefix: "RLOCK"}.Acquire(100, 0, "r1"), true},
		{Hold{Key: "k", Owner: "o", Prefix: "RRWLOCK", Side: "WRITE"}.Acquire(100, 0, "r1"), true},
		{Hold{Key: "k", Owner: "o", Prefix: "RLOCK", AcquireWord: "RFENCED.ACQUIRE"}.Acquire(100, 0, "r1"), true},
		{PSemAcquire("k", 100, 1, 0, "r1"), true},
		{SemAcquire("k", 1, 0, "r1"), true},
		{LatchAwait("k", 0), false},
	} {
		s, _ := ShapeOf(tc.args)
		if s.Holds() != tc.holds {
			t.Errorf("%v: Holds = %v", tc.args, s.Holds())
		}
	}
	s, _ := ShapeOf(Hold{Key: "k", Owner: "o", Prefix: "RLOCK"}.Acquire(100, 0, "r1"))
	m := NewMachine(s, now)
	m.Start(now)
	m.On(Event{Reply: "QUEUED"}, now)
	if step := m.On(Event{Note: &Note{Kind: Granted, ID: "r1"}, Held: true}, now); !step.Done || !step.Held || step.Reply != nil || step.Send != nil || m.Outstanding {
		t.Fatalf("held on the grant: %+v", step)
	}
	// A resend after a broken connection answered TAKENBACK: queue again, fresh id.
	m2 := NewMachine(s, now)
	m2.Start(now)
	m2.On(Event{Reply: "QUEUED"}, now)
	m2.On(Event{Lost: true}, now)
	step := m2.On(Event{Err: errors.New("TAKENBACK the grant of this request id was taken back")}, now)
	got := join(Strings(step.Send))
	if step.Done || !strings.HasPrefix(got, "RLOCK.ACQUIRE k o 100 WAIT 0 ID ") || strings.Contains(got, " r1 ") ||
		m2.Shape.ID() == "r1" || !strings.Contains(got, m2.Shape.ID()) || !m2.Outstanding {
		t.Fatalf("taken back: %+v (%q)", step, got)
	}
}

// A queued ticket's step says so (the hub adds `NOTIFY tag` to it where the server names
// `ticket-notify`); a collect's does not.
func TestOnlyATicketsStepQueuesAndTakesNotify(t *testing.T) {
	now := time.Now()
	s, _ := ShapeOf(Hold{Key: "k", Owner: "o", Prefix: "RLOCK"}.Acquire(100, 0, "r1"))
	m := NewMachine(s, now)
	step := m.Start(now)
	if !step.Queue || join(Strings(Notify(step.Send, "c7f3a9e1"))) != "RLOCK.ACQUIRE k o 100 WAIT 0 ID r1 ASYNC NOTIFY c7f3a9e1" {
		t.Fatalf("queue step %+v", step)
	}
	m.On(Event{Reply: "QUEUED"}, now)
	if step := m.On(Event{Note: &Note{Kind: Timeout, ID: "r1"}}, now); step.Queue || step.Send == nil {
		t.Fatalf("look step %+v", step)
	}
	if got := NotifyChannel("{app}:lock", "c7f3a9e1"); got != "rlock_ticket:{app}:lock:c7f3a9e1" {
		t.Fatalf("tagged channel %q", got)
	}
}

// A timed wait's server part ends TimeoutLead before the client's deadline (at most a
// quarter of the wait), so that its timeout message is normally in first.
func TestItAsksTheServerToEndItsWaitALittleBeforeTheClientsDeadline(t *testing.T) {
	// Table: the wait left (ms) -> the server's wait.
	for _, c := range [][2]int64{{0, 0}, {1, 1}, {3, 3}, {20, 15}, {40, 30}, {1000, 990}} {
		if got := ServerWait(c[0]); got != c[1] {
			t.Errorf("ServerWait(%d) = %d, want %d", c[0], got, c[1])
		}
	}
	now := time.Now()
	s, _ := ShapeOf(Hold{Key: "k", Owner: "o", Prefix: "RLOCK"}.Acquire(100, 300, "r1"))
	m := NewMachine(s, now)
	if got := join(Strings(m.Start(now).Send)); got != "RLOCK.ACQUIRE k o 100 WAIT 290 ID r1 ASYNC" {
		t.Errorf("timed start %q", got)
	}
	if dl, ok := m.Deadline(); !ok || !dl.Equal(now.Add(300*time.Millisecond)) {
		t.Errorf("deadline %v %v", dl, ok)
	}
	// The wait left after a lost connection, 10 ms sooner too.
	m.On(Event{Reply: "QUEUED"}, now)
	if got := join(Strings(m.On(Event{Lost: true}, now.Add(100*time.Millisecond)).Send)); got != "RLOCK.ACQUIRE k o 100 WAIT 190 ID r1 ASYNC" {
		t.Errorf("resent %q", got)
	}
	forever, _ := ShapeOf(Hold{Key: "k", Owner: "o", Prefix: "RLOCK"}.Acquire(100, 0, "r1"))
	if _, ok := NewMachine(forever, now).Deadline(); ok {
		t.Error("a wait without limit has a deadline")
	}
	if MillisUp(1500*time.Microsecond) != 2 || MillisUp(2*time.Millisecond) != 2 {
		t.Error("MillisUp does not round up")
	}
}

func TestItAnswersEachCommandsNotNowWhenItsDeadlineComesFirst(t *testing.T) {
	// Table: the waiting command -> its "not now" reply (docs/commands/tickets.md).
	for _, c := range []struct {
		args []any
		want any
	}{
		{Hold{Key: "k", Owner: "o", Prefix: "RLOCK"}.Acquire(100, 50, "r"), int64(-1)},
		{Hold{Key: "k", Owner: "o", Prefix: "RRWLOCK", Side: "WRITE"}.Acquire(100, 50, "r"), int64(-1)},
		{Hold{Key: "k", Owner: "o", Prefix: "RLOCK", AcquireWord: "RFENCED.ACQUIRE"}.Acquire(100, 50, "r"), []any{int64(-1), nil}},
		{SemAcquire("k", 1, 50, "r"), int64(0)},
		{PSemAcquire("k", 100, 1, 50, "r"), nil},
		{LatchAwait("k", 50), int64(0)},
	} {
		s, _ := ShapeOf(c.args)
		if got := s.RanOut(); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%v: %#v, want %#v", c.args[0], got, c.want)
		}
	}
	// Each reads as not served.
	if a, err := ParseAcquire(int64(-1)); err != nil || a.Held {
		t.Errorf("lock: %+v %v", a, err)
	}
	if a, err := ParseFencedAcquire([]any{int64(-1), nil}); err != nil || a.Held {
		t.Errorf("fenced: %+v %v", a, err)
	}
	if ids, _ := ParsePermits(nil); len(ids) != 0 {
		t.Errorf("permits: %v", ids)
	}
}

// A timeout message on the connection that queued the ticket is the reply of a wait that
// ran out: no collect, given at the deadline (a timed wait never ends sooner); after a
// re-send it is collected, as the old connection may have granted the same id.
func TestItTakesATimeoutMessageAsTheReplyOfAWaitThatRanOut(t *testing.T) {
	now := time.Now()
	s, _ := ShapeOf(Hold{Key: "k", Owner: "o", Prefix: "RLOCK"}.Acquire(100, 500, "r1"))
	m := NewMachine(s, now)
	m.Start(now)
	m.On(Event{Reply: "QUEUED"}, now)
	if step := m.On(Event{Note: &Note{Kind: Timeout, ID: "r1"}}, now); !step.Wait || m.Outstanding {
		t.Fatalf("timeout before the deadline: %+v", step)
	}
	if step := m.On(Event{Lost: true}, now); !step.Wait {
		t.Fatalf("a gone ticket is not sent again: %+v", step)
	}
	if step, leaves := m.Expire(nil, now.Add(500*time.Millisecond)); !step.Done || step.Reply != int64(-1) || leaves != LeavesNothing {
		t.Fatalf("at the deadline: %+v %v", step, leaves)
	}
	late := NewMachine(s, now)
	late.Start(now)
	late.On(Event{Reply: "QUEUED"}, now)
	if step := late.On(Event{Note: &Note{Kind: Timeout, ID: "r1"}}, now.Add(500*time.Millisecond)); !step.Done || step.Reply != int64(-1) {
		t.Fatalf("timeout at the deadline: %+v", step)
	}
	resent := NewMachine(s, now)
	resent.Start(now)
	resent.On(Event{Lost: true}, now)
	resent.On(Event{Reply: "QUEUED"}, now)
	if step := resent.On(Event{Note: &Note{Kind: Timeout, ID: "r1"}}, now); join(Strings(step.Send)) != "RLOCK.ACQUIRE k o 100 ID r1" {
		t.Fatalf("timeout after a re-send: %+v", step)
	}
}

func TestItLeavesAnOrphanWhenItsDeadlineComesWithTheTicketQueued(t *testing.T) {
	s, _ := ShapeOf(Hold{Key: "k", Owner: "o", Prefix: "RLOCK"}.Acquire(100, 300, "r1"))
	granted := Note{Kind: Granted, ID: "r1"}
	// Table: the events heard but not read at the deadline -> the outcome, what it leaves.
	for _, c := range []struct {
		name   string
		heard  []Event
		held   bool
		reply  any
		leaves Leaves
	}{
		{"still queued", nil, false, int64(-1), LeavesOrphan},
		{"the grant heard, not collected: given back", []Event{{Note: &granted}}, false, int64(-1), LeavesUndo},
		{"a kind it does not know: collected and given back", []Event{{Note: &Note{Kind: Other, ID: "r1"}}}, false, int64(-1), LeavesUndo},
		{"its timeout message: nothing left", []Event{{Note: &Note{Kind: Timeout, ID: "r1"}}}, false, int64(-1), LeavesNothing},
		{"a grant held on its message is the caller's", []Event{{Note: &granted, Held: true}}, true, nil, LeavesNothing},
	} {
		now := time.Now()
		m := NewMachine(s, now)
		m.Start(now)
		m.On(Event{Reply: "QUEUED"}, now)
		step, leaves := m.Expire(c.heard, now.Add(300*time.Millisecond))
		if !step.Done || step.Held != c.held || !reflect.DeepEqual(step.Reply, c.reply) || leaves != c.leaves {
			t.Errorf("%s: %+v %v", c.name, step, leaves)
		}
	}
	// A collect in flight when the deadline comes: its reply goes to the orphan.
	now := time.Now()
	m := NewMachine(s, now)
	m.Start(now)
	m.On(Event{Reply: "QUEUED"}, now)
	m.On(Event{Note: &granted}, now)
	if _, leaves := m.Expire(nil, now.Add(300*time.Millisecond)); leaves != LeavesOrphan {
		t.Errorf("collect in flight: %v", leaves)
	}
}

func TestItUndoesAGrantNobodyCollected(t *testing.T) {
	lock, _ := ShapeOf(Hold{Key: "k", Owner: "o", Prefix: "RLOCK"}.Acquire(100, 0, "r1"))
	if u := Undo(&lock, nil); len(u) != 1 || join(Strings(u[0][:3])) != "RLOCK.RELEASE k o" {
		t.Errorf("lock undo: %v", u)
	}
	if u := Undo(&lock, int64(5)); u != nil {
		t.Errorf("nothing granted, nothing undone: %v", u)
	}
	rw, _ := ShapeOf(Hold{Key: "k", Owner: "o", Prefix: "RRWLOCK", Side: "WRITE"}.Acquire(100, 0, "r1"))
	if u := Undo(&rw, nil); len(u) != 1 || join(Strings(u[0][:4])) != "RRWLOCK.RELEASE k WRITE o" {
		t.Errorf("rw undo: %v", u)
	}
	sem, _ := ShapeOf(SemAcquire("s", 3, 0, "r"))
	if u := Undo(&sem, int64(1)); len(u) != 1 || join(Strings(u[0][:3])) != "RSEMAPHORE.RELEASE s 3" {
		t.Errorf("sem undo: %v", u)
	}
	ps, _ := ShapeOf(PSemAcquire("p", 100, 2, 0, "r"))
	if u := Undo(&ps, []any{"aa", "bb"}); len(u) != 2 || join(Strings(u[1][:3])) != "RPSEMAPHORE.RELEASE p bb" {
		t.Errorf("psem undo: %v", u)
	}
}

func TestBackoffStaysWithinItsCap(t *testing.T) {
	b := Backoff{Attempts: 5, Base: 10 * time.Millisecond, Cap: 40 * time.Millisecond}
	for n := 0; n < 64; n++ {
		limit := b.Cap
		if n < 3 {
			limit = b.Base << n
		}
		if d := b.Delay(n); d < 0 || d > limit {
			t.Fatalf("Delay(%d) = %v, over %v", n, d, limit)
		}
	}
	if !TransientReply("LOADING Redis is loading") || TransientReply("ERR syntax error") {
		t.Error("TransientReply")
	}
}

func TestInfoFieldReadsInfoText(t *testing.T) {
	text := "# Replication\r\nrole:master\r\nconnected_slaves:2\r\n"
	if n, ok := InfoField(text, "connected_slaves"); !ok || n != 2 {
		t.Errorf("InfoField = %v %v", n, ok)
	}
}

func TestHelloReadsBothShapesAndTheRefusals(t *testing.T) {
	features := []any{"tickets", "lock"}
	for _, reply := range []any{
		map[any]any{"module": "rlock", "version": "0.1.0", "protocol": int64(1), "features": features, "replication": "commands", "later": "x"},
		[]any{"features", features, "module", "rlock", "protocol", int64(1), "replication", "commands", "version", "0.1.0"},
	} {
		c, err := ParseHello(reply, nil)
		if err != nil || !c.Module || !c.Tickets() || !c.Has("lock") || c.Has("latch") || c.Version != "0.1.0" || c.Replication != "commands" {
			t.Fatalf("%v: %+v, %v", reply, c, err)
		}
	}
	if c, err := ParseHello(map[any]any{"protocol": int64(0), "features": features}, nil); err == nil {
		t.Fatalf("no protocol read as %+v", c)
	}
	if c, _ := ParseHello(map[any]any{"protocol": int64(ProtocolVersion + 1), "features": []any{"lock"}}, nil); c.Tickets() {
		t.Fatal("a server without the tickets feature read as taking tickets")
	}
	if c, err := ParseHello(nil, errors.New("ERR unknown command 'RLOCK.HELLO', with args beginning with: ")); err != nil || c.Module || c.Refused || c.Tickets() {
		t.Fatalf("unknown command: %+v, %v", c, err)
	}
	if c, err := ParseHello(nil, errors.New("NOPERM User u has no permissions to run the 'rlock.hello' command")); err != nil || !c.Refused || c.Tickets() {
		t.Fatalf("NOPERM: %+v, %v", c, err)
	}
	if _, err := ParseHello(nil, errors.New("LOADING Redis is loading the dataset in memory")); err == nil {
		t.Fatal("LOADING read as an answer")
	}
}

// A semaphore's release leaves out the permits of its grants that were taken back (the
// server returned them): release 3 with a debt of 1 sends 2; a debt of 5 absorbs a
// release of 2 whole (nothing is sent) and 3 remain.
func TestASemaphoreReleaseAbsorbsTheTakenBackPermits(t *testing.T) {
	for _, c := range []struct{ debt, n, send, left int64 }{
		{1, 3, 2, 0},
		{5, 2, 0, 3},
		{2, 2, 0, 0},
		{0, 4, 4, 0},
		{3, 0, 0, 3},
	} {
		if send, left := AbsorbRelease(c.debt, c.n); send != c.send || left != c.left {
			t.Errorf("debt %d, release %d: sends %d, debt %d; want %d, %d", c.debt, c.n, send, left, c.send, c.left)
		}
	}
}

// A confirmation's answer: the grant's reply replayed confirms it; TAKENBACK (only that)
// is taken back; a refused connection (maxclients), a redirection, TRYAGAIN or LOADING
// is asked again; anything else leaves it in doubt.
func TestAConfirmationsAnswer(t *testing.T) {
	for _, c := range []struct {
		reply any
		err   string
		want  Confirmed
	}{
		{int64(1), "", ConfirmHeld},
		{int64(0), "", ConfirmOther},
		{nil, "TAKENBACK the grant of this request id was taken back", ConfirmTakenBack},
		{nil, "ERR max number of clients reached", ConfirmRetry},
		{nil, "MOVED 3999 127.0.0.1:6381", ConfirmRetry},
		{nil, "TRYAGAIN Multiple keys request during rehashing of slot", ConfirmRetry},
		{nil, "LOADING Redis is loading the dataset in memory", ConfirmRetry},
		{nil, "WRONGTYPE Operation against a key holding the wrong kind of value", ConfirmOther},
		{nil, "ERR unknown command", ConfirmOther},
	} {
		if got := ConfirmAnswer(c.reply, c.err, c.err != "", int64(1)); got != c.want {
			t.Errorf("%v %q: %v, want %v", c.reply, c.err, got, c.want)
		}
	}
}
