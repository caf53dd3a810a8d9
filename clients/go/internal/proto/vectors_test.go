// The shared protocol vectors (spec/vectors at the repository's root, read by every
// client's suite): each case run through this package's own functions, failing on the
// first difference and naming the case. channels.json: the ticket channel and the lock's
// channel; tickets.json: how each ticket message reads and what the waiter then does;
// commands.json: every waiting command blocked, queued and collected, and the hold's
// builders; replies.json: what each lock reply means; errors.json: each error's code
// word and kind, and which are retried. RLOCK_VECTORS points at another copy of the folder.

package proto

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// vectors reads spec/vectors/<name> into v (a missing file fails the test: a vector file
// deleted by mistake must not pass quietly).
func vectors(t *testing.T, name string, v any) bool {
	t.Helper()
	dir := os.Getenv("RLOCK_VECTORS")
	if dir == "" {
		_, file, _, _ := runtime.Caller(0)
		dir = filepath.Join(filepath.Dir(file), "..", "..", "..", "..", "spec", "vectors")
	}
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return true
}

func TestVectorsChannels(t *testing.T) {
	var f struct {
		// NotifyTag is the tag every case's TicketNotify channel is for (`NOTIFY tag`).
		NotifyTag string `json:"notify_tag"`
		Cases     []struct {
			Key, Lock, Fenced, Ticket string
			TicketNotify              string `json:"ticket_notify"`
		} `json:"cases"`
	}
	vectors(t, "channels.json", &f)
	if f.NotifyTag == "" {
		t.Fatal("channels.json has no notify_tag")
	}
	for _, c := range f.Cases {
		if got := TicketChannel(c.Key); got != c.Ticket {
			t.Fatalf("key %q: ticket channel %q, want %q", c.Key, got, c.Ticket)
		}
		if got := NotifyChannel(c.Key, f.NotifyTag); got != c.TicketNotify {
			t.Fatalf("key %q: tagged ticket channel %q, want %q", c.Key, got, c.TicketNotify)
		}
		if got := LockChannel(c.Key); got != c.Lock || got != c.Fenced {
			t.Fatalf("key %q: lock channel %q, want %q", c.Key, got, c.Lock)
		}
	}
}

func TestVectorsTicketMessages(t *testing.T) {
	var f struct {
		Cases []struct {
			Message string `json:"message"`
			Parsed  *struct{ Kind, ID, Owner, Detail string }
			Then    *string `json:"then"`
		} `json:"cases"`
	}
	vectors(t, "tickets.json", &f)
	// A timed wait: a timeout message on the connection that queued the ticket is
	// answered without the collect's round trip (the reply that collect would get).
	s, _ := ShapeOf(Hold{Key: "k", Owner: "o", Prefix: "RLOCK"}.Acquire(100, 60000, "r1"))
	for _, c := range f.Cases {
		n, ok := ParseNote(c.Message)
		if (c.Parsed != nil) != ok {
			t.Fatalf("%q: read %v, want %v", c.Message, ok, c.Parsed != nil)
		}
		if !ok {
			continue
		}
		p := c.Parsed
		if n.Word != p.Kind || n.ID != p.ID || n.Owner != p.Owner || n.Detail != p.Detail {
			t.Fatalf("%q: read %+v, want %+v", c.Message, n, *p)
		}
		// What the waiter does: granted and collect both send the command again without
		// WAIT (the collect assumes nothing; a timeout knows its reply and waits for the
		// deadline to give it); fail ends the wait with the detail.
		m := NewMachine(s, time.Now())
		m.Start(time.Now())
		m.On(Event{Reply: "QUEUED"}, time.Now())
		step := m.On(Event{Note: &n}, time.Now())
		var then string
		switch {
		case step.Done && step.Err != nil:
			then = "fail"
		case step.Send != nil && n.Kind == Granted:
			then = "granted"
		case step.Send != nil:
			then = "collect"
		case step.Wait && n.Kind == Timeout && !m.Outstanding:
			then = "collect"
		}
		if c.Then == nil || then != *c.Then {
			t.Fatalf("%q: the waiter does %q, want %v", c.Message, then, c.Then)
		}
		if step.Send != nil && strings.Join(Strings(step.Send), " ") != strings.Join(Strings(s.Look()), " ") {
			t.Fatalf("%q: sends %v, want the command without WAIT", c.Message, step.Send)
		}
	}
}

// tickets.json `holds`: the reply a waiter holds on, read from its granted message's
// detail, or "collect" (a detail this client cannot read); and the machine on that note.
func TestVectorsHoldOnTheGrant(t *testing.T) {
	var f struct {
		Holds []struct {
			Command string          `json:"command"`
			Permits bool            `json:"permits"`
			Detail  string          `json:"detail"`
			Then    string          `json:"then"`
			Reply   json.RawMessage `json:"reply"`
		} `json:"holds"`
	}
	if vectors(t, "tickets.json", &f); len(f.Holds) == 0 {
		t.Fatal("tickets.json has no holds")
	}
	// JSON numbers read as json.Number (a token may be the largest int64, which a
	// float64 would round); the server's integers are int64.
	var norm func(v any) any
	norm = func(v any) any {
		switch x := v.(type) {
		case json.RawMessage:
			if len(x) == 0 {
				return nil
			}
			d := json.NewDecoder(strings.NewReader(string(x)))
			d.UseNumber()
			var y any
			if err := d.Decode(&y); err != nil {
				t.Fatal(err)
			}
			return norm(y)
		case json.Number:
			n, _ := x.Int64()
			return n
		case []any:
			out := make([]any, len(x))
			for i, e := range x {
				out[i] = norm(e)
			}
			return out
		}
		return v
	}
	for _, c := range f.Holds {
		var args []any
		switch c.Command {
		case "RLOCK.ACQUIRE", "RFENCED.ACQUIRE":
			args = []any{c.Command, "k", "o", int64(30000)}
		case "RRWLOCK.ACQUIRE":
			args = []any{c.Command, "k", "WRITE", "o", int64(30000)}
		case "RPSEMAPHORE.ACQUIRE":
			args = []any{c.Command, "k", int64(30000)}
		case "RSEMAPHORE.ACQUIRE":
			args = []any{c.Command, "k", int64(1)}
		default:
			args = []any{c.Command, "k"}
		}
		if c.Permits {
			args = append(args, "PERMITS", int64(2))
		}
		args = append(args, "WAIT", int64(0), "ID", "r1")
		s, ok := ShapeOf(args)
		if !ok {
			t.Fatalf("%+v: not a waiting command", c)
		}
		got, held := s.HoldReply(c.Detail)
		switch c.Then {
		case "hold":
			if !held || !reflect.DeepEqual(got, norm(c.Reply)) {
				t.Fatalf("%+v: holds %v on %#v, want %#v", c, held, got, norm(c.Reply))
			}
		case "collect":
			if held {
				t.Fatalf("%+v: holds on %#v, want a collect", c, got)
			}
		default:
			t.Fatalf("%+v: unknown then", c)
		}
		// The machine on that note, as the hub marks it (Held where the reader holds).
		m := NewMachine(s, time.Now())
		m.Start(time.Now())
		m.On(Event{Reply: "QUEUED"}, time.Now())
		step := m.On(Event{Note: &Note{Kind: Granted, ID: "r1", Owner: "o", Detail: c.Detail}, Held: held && s.Holds()}, time.Now())
		switch {
		case c.Command == "RLATCH.AWAIT":
			if !step.Done || step.Reply != int64(1) {
				t.Fatalf("%+v: latch step %+v", c, step)
			}
		case held:
			if !step.Done || !step.Held || !reflect.DeepEqual(step.Reply, got) {
				t.Fatalf("%+v: step %+v, want held with %#v", c, step, got)
			}
		default:
			if step.Send == nil || join(Strings(step.Send)) != join(Strings(s.Look())) {
				t.Fatalf("%+v: step %+v, want the collect", c, step)
			}
		}
	}
}

func TestVectorsWaitingCommands(t *testing.T) {
	var f struct {
		Waiting []struct {
			Base     []string `json:"base"`
			WaitMs   int64    `json:"wait_ms"`
			ID       *string  `json:"id"`
			Latch    bool     `json:"latch"`
			Command  []string `json:"command"`
			Ticketed []string `json:"ticketed"`
			Look     []string `json:"look"`
		} `json:"waiting"`
	}
	if vectors(t, "commands.json", &f); len(f.Waiting) == 0 {
		t.Fatal("commands.json has no waiting commands")
	}
	for _, c := range f.Waiting {
		args := make([]any, 0, len(c.Base)+4)
		for _, w := range c.Base {
			args = append(args, w)
		}
		args = append(args, "WAIT", strconv.FormatInt(c.WaitMs, 10))
		if c.ID != nil {
			args = append(args, "ID", *c.ID)
		}
		s, ok := ShapeOf(args)
		if !ok || s.Latch != c.Latch {
			t.Fatalf("%v: not read as a waiting command (latch %v)", c.Base, c.Latch)
		}
		sub := func(words []string) string {
			return strings.ReplaceAll(strings.Join(words, " "), "$id", s.ID())
		}
		if got := strings.Join(Strings(args), " "); got != sub(c.Command) {
			t.Fatalf("%v: blocked %q, want %q", c.Base, got, sub(c.Command))
		}
		if got := strings.Join(Strings(s.Ticketed(c.WaitMs)), " "); got != sub(c.Ticketed) {
			t.Fatalf("%v: ticketed %q, want %q", c.Base, got, sub(c.Ticketed))
		}
		if got := strings.Join(Strings(s.Look()), " "); got != sub(c.Look) {
			t.Fatalf("%v: collected %q, want %q", c.Base, got, sub(c.Look))
		}
	}
}

func TestVectorsBuilders(t *testing.T) {
	var f struct {
		Builders []struct {
			Op      string   `json:"op"`
			Side    *string  `json:"side"`
			Key     string   `json:"key"`
			Owner   string   `json:"owner"`
			LeaseMs *int64   `json:"lease_ms"`
			WaitMs  *int64   `json:"wait_ms"`
			ID      string   `json:"id"`
			Wire    []string `json:"wire"`
		} `json:"builders"`
	}
	if vectors(t, "commands.json", &f); len(f.Builders) == 0 {
		t.Fatal("commands.json has no builders")
	}
	for _, c := range f.Builders {
		h := Hold{Key: c.Key, Owner: c.Owner, Prefix: "RLOCK"}
		if c.Side != nil {
			h.Prefix, h.Side = "RRWLOCK", *c.Side
		}
		lease, wait := int64(0), int64(-1)
		if c.LeaseMs != nil {
			lease = *c.LeaseMs
		}
		if c.WaitMs != nil {
			wait = *c.WaitMs
		}
		var got []any
		switch c.Op {
		case "acquire":
			got = h.Acquire(lease, wait, c.ID)
		case "release":
			got = h.Release(lease, c.ID)
		case "renew":
			got = h.Renew(lease)
		case "force_release":
			got = ForceRelease(h.Prefix, c.Key)
		case "info":
			got = Info(h.Prefix, c.Key)
		default:
			continue // an op this client builds otherwise
		}
		if g, w := strings.Join(Strings(got), " "), strings.Join(c.Wire, " "); g != w {
			t.Fatalf("%s: %q, want %q", c.Op, g, w)
		}
	}
}

// vectorValue is a reply as replies.json writes it, as go-redis hands it over: null,
// an integer, {"between": [lo, hi]} (lo stands for it), a string, an array.
func vectorValue(t *testing.T, raw json.RawMessage) any {
	t.Helper()
	var v any
	d := json.NewDecoder(strings.NewReader(string(raw)))
	d.UseNumber()
	if err := d.Decode(&v); err != nil {
		t.Fatal(err)
	}
	var conv func(any) any
	conv = func(v any) any {
		switch x := v.(type) {
		case json.Number:
			n, err := x.Int64()
			if err != nil {
				t.Fatalf("reply %s", raw)
			}
			return n
		case map[string]any:
			return conv(x["between"].([]any)[0])
		case []any:
			out := make([]any, len(x))
			for i, e := range x {
				out[i] = conv(e)
			}
			return out
		}
		return v
	}
	return conv(v)
}

func TestVectorsReplies(t *testing.T) {
	var f struct {
		Cases []struct {
			Send    []string        `json:"send"`
			Reply   json.RawMessage `json:"reply"`
			Outcome string          `json:"outcome"`
		} `json:"cases"`
	}
	vectors(t, "replies.json", &f)
	for _, c := range f.Cases {
		reply := vectorValue(t, c.Reply)
		verb := c.Send[0][strings.Index(c.Send[0], ".")+1:]
		var got string
		switch {
		case reply == "QUEUED":
			// What the ticket machine makes of it: wait for the ticket's message.
			s, _ := ShapeOf(append(words(c.Send[:len(c.Send)-3]), "ID", "x"))
			m := NewMachine(s, time.Now())
			m.Start(time.Now())
			if m.On(Event{Reply: reply}, time.Now()).Wait {
				got = "queued"
			}
		case c.Send[0] == "RFENCED.ACQUIRE" || verb == "ACQUIRE":
			parse := ParseAcquire
			if c.Send[0] == "RFENCED.ACQUIRE" {
				parse = ParseFencedAcquire
			}
			a, err := parse(reply)
			switch {
			case err != nil:
			case a.Held && (c.Send[0] != "RFENCED.ACQUIRE" || a.Token > 0):
				got = "acquired"
			case !a.Held:
				got = "held"
			}
		case verb == "RELEASE":
			r, err := ParseRelease(reply)
			if err == nil {
				got = map[Released]string{Freed: "freed", StillHeld: "still-held", NotHeld: "not-held"}[r]
			}
		case verb == "RENEW":
			if ok, err := ParseBool(verb, reply); err == nil {
				got = map[bool]string{true: "renewed", false: "not-held"}[ok]
			}
		case verb == "FORCERELEASE":
			if ok, err := ParseBool(verb, reply); err == nil {
				got = map[bool]string{true: "force-freed", false: "nothing-to-free"}[ok]
			}
		}
		if got != c.Outcome {
			t.Fatalf("%v -> %s: read as %q, want %q", c.Send, c.Reply, got, c.Outcome)
		}
	}
}

func TestVectorsErrorsRetriedAreTheRetryKind(t *testing.T) {
	var f struct {
		Errors []struct{ Name, Code, Kind, Text string } `json:"errors"`
	}
	vectors(t, "errors.json", &f)
	if len(f.Errors) == 0 {
		t.Fatal("errors.json lists no errors")
	}
	for _, e := range f.Errors {
		if TransientReply(e.Text) != (e.Kind == "retry") {
			t.Fatalf("%s (%s): retried %v", e.Name, e.Kind, TransientReply(e.Text))
		}
		if got := ErrorCode(e.Text); got != e.Code {
			t.Fatalf("%s: code word read as %q, want %q", e.Name, got, e.Code)
		}
		if got := ErrorKind(e.Code); got != Kind(e.Kind) {
			t.Fatalf("%s: code %s read as kind %q, want %q", e.Name, e.Code, got, e.Kind)
		}
	}
}
