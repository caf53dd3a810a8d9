// The pure parts of waiting with queued tickets (docs/commands/tickets.md): the ticket channel
// and its messages, the shape of a waiting command, the state machine of one waiter, and
// what gives back a grant nobody collected. The I/O around them (one notification
// connection per client, one command connection for queuing) is tickets.go in package
// rlock; ticket handling lives only in these two files, so a change of the handoff (a
// grant message that means "held" without a collect round trip) lands here once.

package proto

import (
	"strconv"
	"strings"
	"time"
)

// TicketChannel is the ticket channel of key: `rlock_ticket:{key}`, or `rlock_ticket:key`
// when the key already has a `{` (Redisson's prefixName rule, which keeps the channel in
// the key's cluster slot).
func TicketChannel(key string) string {
	if strings.Contains(key, "{") {
		return "rlock_ticket:" + key
	}
	return "rlock_ticket:{" + key + "}"
}

// NotifyChannel is the ticket channel of key for one client's tag (`NOTIFY tag`,
// docs/commands/tickets.md): the key's ticket channel, ":" and the tag, in the key
// channel's slot (a tag has no braces). Each message of a ticket queued with the tag goes
// there alone, so only the client that queued it hears it.
func NotifyChannel(key, tag string) string { return TicketChannel(key) + ":" + tag }

// Notify is a ticketed command (Ticketed) with `NOTIFY tag` added.
func Notify(args []any, tag string) []any {
	return append(append(make([]any, 0, len(args)+2), args...), "NOTIFY", tag)
}

// LockChannel is Redisson's unlock channel of a lock (the same prefixName rule).
func LockChannel(key string) string {
	if strings.Contains(key, "{") {
		return "redisson_lock__channel:" + key
	}
	return "redisson_lock__channel:{" + key + "}"
}

// NoteKind is how a ticket left its queue.
type NoteKind int

const (
	// Granted: the request was granted (the hold is written; collect it).
	Granted NoteKind = iota + 1
	// Timeout: its deadline passed; it was removed, nothing granted.
	Timeout
	// Failed: it can never be granted here; Detail is the server's error text
	// (`MOVED ...` when the slot left the node, the primitive's refusal, ...).
	Failed
	// Other: a kind this client does not know (a later module's). Every message ends
	// its ticket, so the waiter collects, without assuming a grant: the collect's reply
	// is the truth (ignoring it would leave the waiter hanging until its deadline).
	Other
)

// Note is one parsed ticket message.
type Note struct {
	Kind NoteKind
	// Word is the kind as sent.
	Word   string
	ID     string
	Owner  string
	Detail string
}

// ParseNote reads a ticket message `<kind>:<id-len>:<owner-len>:<id><owner><detail>`
// (lengths in bytes, 1 to 10 ASCII digits); ok is false when the payload is not one. The
// kind word alone decides what it means; a detail after any kind is kept (a later module
// may add one).
func ParseNote(payload string) (Note, bool) {
	parts := strings.SplitN(payload, ":", 4)
	if len(parts) != 4 {
		return Note{}, false
	}
	num := func(s string) (int64, bool) {
		if len(s) < 1 || len(s) > 10 {
			return 0, false
		}
		for i := 0; i < len(s); i++ {
			if s[i] < '0' || s[i] > '9' {
				return 0, false
			}
		}
		n, err := strconv.ParseInt(s, 10, 64)
		return n, err == nil
	}
	idLen, ok1 := num(parts[1])
	ownerLen, ok2 := num(parts[2])
	rest := parts[3]
	if !ok1 || !ok2 || int64(len(rest)) < idLen+ownerLen {
		return Note{}, false
	}
	n := Note{Word: parts[0], ID: rest[:idLen], Owner: rest[idLen : idLen+ownerLen], Detail: rest[idLen+ownerLen:]}
	switch parts[0] {
	case "granted":
		n.Kind = Granted
	case "timeout":
		n.Kind = Timeout
	case "error":
		n.Kind = Failed
	default:
		n.Kind = Other
	}
	return n, true
}

// Shape is a waiting command taken apart: its words, where its WAIT value sits, its
// request id. Built once per waiting call; the ticketed and the collecting forms are
// derived from it.
type Shape struct {
	args   []string
	waitAt int
	waitMs int64
	id     string
	idAt   int // -1: the command had no ID (the latch); one is added for ASYNC only
	// Latch is RLATCH.AWAIT: a granted note is the whole answer.
	Latch bool
	// permits: PERMITS n was given (an expirable semaphore's grant is then an array).
	permits bool
}

// ShapeOf takes a waiting command (with `WAIT w`) apart; ok is false for a command that
// does not wait.
func ShapeOf(args []any) (Shape, bool) {
	s := Shape{args: Strings(args), waitAt: -1, idAt: -1}
	if len(s.args) < 2 {
		return Shape{}, false
	}
	for i := 2; i+1 < len(s.args); i++ {
		switch strings.ToUpper(s.args[i]) {
		case "WAIT":
			s.waitAt = i + 1
		case "ID":
			s.idAt = i + 1
		case "PERMITS":
			s.permits = true
		}
	}
	if s.waitAt < 0 {
		return Shape{}, false
	}
	w, err := strconv.ParseInt(s.args[s.waitAt], 10, 64)
	if err != nil || w < 0 {
		return Shape{}, false
	}
	s.waitMs = w
	if s.idAt >= 0 {
		s.id = s.args[s.idAt]
	} else {
		s.id = RequestID()
	}
	s.Latch = strings.EqualFold(s.args[0], "RLATCH.AWAIT")
	return s, true
}

// Key is the command's key.
func (s *Shape) Key() string { return s.args[1] }

// ID is the request id the ticket is queued and collected under.
func (s *Shape) ID() string { return s.id }

// Holds tells whether a grant of this command can be known without collecting it: the
// lock's and RW lock's acquire (their grant replies nil), the semaphore's (1), the fenced
// lock's (its token) and the expirable semaphore's (its permit ids), the last two read
// from the `granted` message's detail (HoldReply). On a server naming `ticket-holds` such
// a waiter holds on its `granted` message and the grant is confirmed off its path
// (design.md 5); the latch, whose message is its whole answer, does not. The semaphore's
// permits have no owner, so its release waits for that confirmation and leaves out
// permits taken back (SemDebt).
func (s *Shape) Holds() bool {
	switch s.Command() {
	case "RLOCK.ACQUIRE", "RRWLOCK.ACQUIRE", "RFENCED.ACQUIRE", "RPSEMAPHORE.ACQUIRE", "RSEMAPHORE.ACQUIRE":
		return true
	}
	return false
}

// HoldReply is the grant's reply as read from a `granted` message's detail
// (spec/vectors/tickets.json, `holds`); ok is false when the waiter must collect it: a
// command that does not hold, or a detail this client cannot read (none, from a module
// that wrote none).
func (s *Shape) HoldReply(detail string) (reply any, ok bool) {
	switch s.Command() {
	case "RLOCK.ACQUIRE", "RRWLOCK.ACQUIRE":
		return nil, true
	case "RSEMAPHORE.ACQUIRE":
		// Its grant is always 1 and the module writes no detail for it.
		if detail != "" {
			return nil, false
		}
		return int64(1), true
	case "RFENCED.ACQUIRE":
		// A positive decimal that fits an int64: no sign, no spaces, at most 19 digits.
		if len(detail) < 1 || len(detail) > 19 {
			return nil, false
		}
		for i := 0; i < len(detail); i++ {
			if detail[i] < '0' || detail[i] > '9' {
				return nil, false
			}
		}
		tok, err := strconv.ParseInt(detail, 10, 64)
		if err != nil {
			return nil, false
		}
		return []any{nil, tok}, true
	case "RPSEMAPHORE.ACQUIRE":
		ids := strings.Split(detail, ",")
		for _, id := range ids {
			if len(id) == 0 || len(id)%2 != 0 {
				return nil, false
			}
			for i := 0; i < len(id); i++ {
				c := id[i]
				if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
					return nil, false
				}
			}
		}
		if s.permits {
			out := make([]any, len(ids))
			for i, id := range ids {
				out[i] = id
			}
			return out, true
		}
		if len(ids) != 1 {
			return nil, false
		}
		return ids[0], true
	}
	return nil, false
}

// RenewID gives the command a fresh request id: its old one was answered TAKENBACK (a
// grant made while its ticket's connection was down, taken back before anything of it
// reached this waiter), so the wait queues anew under an id the server has not seen.
func (s *Shape) RenewID() {
	s.id = RequestID()
	if s.idAt >= 0 {
		s.args[s.idAt] = s.id
	}
}

// Command is the command word.
func (s *Shape) Command() string { return strings.ToUpper(s.args[0]) }

// Arg is the i-th word of the command.
func (s *Shape) Arg(i int) string {
	if i < len(s.args) {
		return s.args[i]
	}
	return ""
}

// WaitLeft is the wait left after elapsed, in ms: 0 for no limit; ok is false when it
// is over.
func (s *Shape) WaitLeft(elapsed time.Duration) (int64, bool) {
	if s.waitMs == 0 {
		return 0, true
	}
	left := s.waitMs - elapsed.Milliseconds()
	return left, left > 0
}

func words(a []string) []any {
	out := make([]any, len(a))
	for i, w := range a {
		out[i] = w
	}
	return out
}

// Ticketed is the command with `ASYNC` (and an ID), waiting waitMs (0: no limit).
func (s *Shape) Ticketed(waitMs int64) []any {
	a := append([]string(nil), s.args...)
	a[s.waitAt] = strconv.FormatInt(waitMs, 10)
	a = append(a, "ASYNC")
	if s.idAt < 0 {
		a = append(a, "ID", s.id)
	}
	return words(a)
}

// Look is the command without WAIT: it answers at once with the ordinary reply (the
// replay of a remembered grant under the same id, or the reply of a timed-out wait).
// Sending it after a grant is the collection that confirms the grant.
func (s *Shape) Look() []any {
	a := append([]string(nil), s.args[:s.waitAt-1]...)
	a = append(a, s.args[s.waitAt+1:]...)
	return words(a)
}

// RanOut is the command's "not now" reply (docs/commands/tickets.md), for a timed wait
// the client ended at its own deadline or whose `timeout` message came: what the server
// answers a wait that ran out, with -1 where that reply carries the holder's PTTL (not
// known without asking, and no caller reads it).
func (s *Shape) RanOut() any {
	switch s.Command() {
	case "RFENCED.ACQUIRE":
		return []any{int64(-1), nil}
	case "RLOCK.ACQUIRE", "RRWLOCK.ACQUIRE":
		return int64(-1)
	case "RPSEMAPHORE.ACQUIRE":
		return nil
	}
	return int64(0) // RSEMAPHORE.ACQUIRE, RLATCH.AWAIT
}

// TimeoutLead is how much sooner than the client's own deadline a timed ticket's wait
// ends in the server (at most a quarter of the wait, ServerWait): the server counts from
// the command's arrival and its `timeout` message takes hops back (server, reader,
// waiter), each waiting for a CPU on a loaded machine, so that message is then normally
// in before the deadline and the waiter knows its ticket gone: it leaves no orphan.
const TimeoutLead = 10 * time.Millisecond

// ServerWait is the server's part of a wait of left ms (0: no limit), TimeoutLead sooner.
func ServerWait(left int64) int64 {
	return left - min(TimeoutLead.Milliseconds(), left/4)
}

// Blocking is the command as a blocked wait (no ASYNC) for the wait left after elapsed,
// or Look when it is over: how a waiter waits on a module without tickets.
func (s *Shape) Blocking(elapsed time.Duration) []any {
	left, ok := s.WaitLeft(elapsed)
	if !ok {
		return s.Look()
	}
	a := append([]string(nil), s.args...)
	a[s.waitAt] = strconv.FormatInt(left, 10)
	return words(a)
}

// Event is what happened to a waiter: the reply to its last command (Value or Err), its
// ticket's note, or the loss of the connection its ticket was queued on.
type Event struct {
	Reply any
	Err   error
	Note  *Note
	Lost  bool
	// Held: a `granted` note that means held (a Holds command on a server naming
	// `ticket-holds`, its detail readable by HoldReply), whose confirmation the hub has
	// already sent off the path.
	Held bool
}

// Step is what a waiter does next.
type Step struct {
	// Send: these arguments on the ticket connection.
	Send []any
	// Queue: Send queues a ticket (Ticketed; it takes `NOTIFY tag` where the server
	// names `ticket-notify`).
	Queue bool
	// Wait for the next event.
	Wait bool
	// Done: the call's outcome (Reply or Err).
	Done  bool
	Reply any
	Err   error
	// Held: Done on a `granted` message, before any collect (Event.Held): the grant's
	// confirmation settles later, and a grant taken back is a lost hold.
	Held bool
}

// Leaves is what a waiter whose deadline came first leaves behind (Machine.Expire).
type Leaves int

const (
	// LeavesNothing: its ticket is known gone (or went with its connection).
	LeavesNothing Leaves = iota
	// LeavesOrphan: a ticket that may still be queued, or a collect in flight: an orphan,
	// whose late grant is collected and given back.
	LeavesOrphan
	// LeavesUndo: a `granted` (or unknown) message heard and not collected: collect it
	// and give it back now.
	LeavesUndo
)

// Machine is one ticketed wait, as a state machine over Events; no I/O. The caller
// feeds it the replies and notes of its request id and does what each Step says.
type Machine struct {
	Shape   Shape
	started time.Time
	// Outstanding: a ticket of ours may be queued, or granted and not yet collected.
	Outstanding bool
	// resent: sent again after a broken connection; a `timeout` message may then hide a
	// grant made under the same id on the old connection, which a collect replays.
	resent bool
	// gone: its `timeout` message came before its deadline: nothing is queued any more,
	// and the wait ends, not granted, at the deadline (a timed wait never ends sooner).
	gone bool
	// Queued: a command of this wait was answered QUEUED; a grant without it was the
	// waiting command's own answer (what the handle's Contention hears).
	Queued bool
}

// NewMachine starts a ticketed wait at started, on a server whose probe (Hello) named
// the tickets feature.
func NewMachine(s Shape, started time.Time) *Machine {
	return &Machine{Shape: s, started: started}
}

// Deadline is when the wait ends on the client's clock: started plus its WAIT (ok is
// false for no limit). The caller rounds the WAIT up, so this is never before its own.
func (m *Machine) Deadline() (time.Time, bool) {
	if m.Shape.waitMs == 0 {
		return time.Time{}, false
	}
	return m.started.Add(time.Duration(m.Shape.waitMs) * time.Millisecond), true
}

// Expire is the outcome of a wait whose deadline came first, given the events heard
// but not yet read (taken under the hub's lock, so that no more can come), and what the
// waiter leaves behind. An answer among them is the outcome (a grant held on its
// message); otherwise the "not now" reply (RanOut), and a grant whose collect is not
// done is given back, never left held by a caller that was told no.
func (m *Machine) Expire(heard []Event, now time.Time) (Step, Leaves) {
	undo := false
	for _, ev := range heard {
		step := m.On(ev, now)
		switch {
		case step.Done:
			return step, LeavesNothing
		case step.Send != nil && ev.Note != nil:
			undo = true
		}
	}
	leaves := LeavesNothing
	switch {
	case undo:
		m.Outstanding = false
		leaves = LeavesUndo
	case m.Outstanding:
		leaves = LeavesOrphan
	}
	return Step{Done: true, Reply: m.Shape.RanOut()}, leaves
}

// Start is the first step.
func (m *Machine) Start(now time.Time) Step { return m.resend(now) }

func (m *Machine) resend(now time.Time) Step {
	if left, ok := m.Shape.WaitLeft(now.Sub(m.started)); ok {
		m.Outstanding = true
		return Step{Send: m.Shape.Ticketed(ServerWait(left)), Queue: true}
	}
	return Step{Send: m.Shape.Look()}
}

// On is the step after ev at now.
func (m *Machine) On(ev Event, now time.Time) Step {
	switch {
	case ev.Lost:
		// The connection that carried our ticket broke: the server dropped the ticket and
		// took back an uncollected grant. Queue again under the same id: a grant we
		// collected meanwhile is replayed, anything else queues anew. A ticket whose
		// timeout message came is gone already: nothing to send again.
		if !m.Outstanding || m.gone {
			return Step{Wait: true}
		}
		m.resent = true
		return m.resend(now)
	case ev.Note != nil:
		switch ev.Note.Kind {
		case Granted:
			if m.Shape.Latch {
				m.Outstanding = false
				return Step{Done: true, Reply: int64(1)}
			}
			if reply, ok := m.Shape.HoldReply(ev.Note.Detail); ok && ev.Held {
				// Held now, the reply read from the message; confirmed off the path.
				m.Outstanding = false
				return Step{Done: true, Reply: reply, Held: true}
			}
			// Collect: the same command and id again; the server replays the grant.
			return Step{Send: m.Shape.Look()}
		case Failed:
			m.Outstanding = false
			return Step{Done: true, Err: NoteError(ev.Note.Detail)}
		case Timeout:
			dl, timed := m.Deadline()
			if !timed || m.resent {
				// After a broken connection the same id may have been granted on the
				// old one: the collect replays that.
				m.Outstanding = false
				return Step{Send: m.Shape.Look()}
			}
			// Removed, nothing granted: the reply of a wait that ran out, without a
			// collect's round trip, given at the deadline (see Expire).
			m.Outstanding = false
			if now.Before(dl) {
				m.gone = true
				return Step{Wait: true}
			}
			return Step{Done: true, Reply: m.Shape.RanOut()}
		default:
			// A kind this client does not know: the ticket left its queue; look once,
			// and the ordinary reply says what happened.
			m.Outstanding = false
			return Step{Send: m.Shape.Look()}
		}
	case ev.Err != nil:
		if ErrorCode(ev.Err.Error()) == "TAKENBACK" && m.Outstanding {
			// Our id's grant was taken back (its connection closed and no confirmation
			// came within the server's grace) before this waiter was given it: nothing was
			// held, so queue again under a fresh id (the old one answers TAKENBACK for good).
			m.Shape.RenewID()
			return m.resend(now)
		}
		m.Outstanding = false
		return Step{Done: true, Err: ev.Err}
	default:
		if s, ok := ev.Reply.(string); ok && s == "QUEUED" {
			m.Queued = true
			return Step{Wait: true}
		}
		m.Outstanding = false
		return Step{Done: true, Reply: ev.Reply}
	}
}

// ServerError is an error text as the server would have answered it (an `error` note's
// detail).
type ServerError string

func (e ServerError) Error() string { return string(e) }

// NoteError is the error an `error` note stands for.
func NoteError(detail string) error { return ServerError(detail) }

// Undo is the commands that give back what reply (to the waiting command s) granted,
// for a grant nobody will use: its waiter left (a cancelled context) while its ticket
// was queued.
func Undo(s *Shape, reply any) [][]any {
	id := RequestID()
	switch s.Command() {
	case "RLOCK.ACQUIRE":
		if reply == nil {
			return [][]any{{"RLOCK.RELEASE", s.Arg(1), s.Arg(2), "ID", id}}
		}
	case "RFENCED.ACQUIRE":
		if a, ok := reply.([]any); ok && len(a) == 2 && a[0] == nil {
			return [][]any{{"RLOCK.RELEASE", s.Arg(1), s.Arg(2), "ID", id}}
		}
	case "RRWLOCK.ACQUIRE":
		if reply == nil {
			return [][]any{{"RRWLOCK.RELEASE", s.Arg(1), s.Arg(2), s.Arg(3), "ID", id}}
		}
	case "RSEMAPHORE.ACQUIRE":
		if reply == int64(1) {
			return [][]any{{"RSEMAPHORE.RELEASE", s.Arg(1), s.Arg(2), "ID", id}}
		}
	case "RPSEMAPHORE.ACQUIRE":
		ids, _ := ParsePermits(reply)
		var out [][]any
		for n, p := range ids {
			out = append(out, []any{"RPSEMAPHORE.RELEASE", s.Arg(1), p, "ID", id + "-" + strconv.Itoa(n)})
		}
		return out
	}
	return nil
}
