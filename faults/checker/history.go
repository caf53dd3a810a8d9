// Reading the fault harness's history files (faults/README.md): one JSON object a
// line, written by the workers (faults/worker, faults/pyworker.py) and, for crashes
// and the final resource values, by the harness (faults/harness.py). This file turns
// the lines into operations (an invocation paired with its completion) and into
// holds (the time a client definitely believed it held something).
package main

import (
	"bufio"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
)

// Event is one line of a history file.
type Event struct {
	P       int64   `json:"p"`
	F       string  `json:"f"`
	Type    string  `json:"type"` // invoke, ok, fail, info, event
	T       int64   `json:"t"`
	Owner   string  `json:"owner"`
	Token   *int64  `json:"token"`
	Outcome string  `json:"outcome"`
	Mode    string  `json:"mode"`
	Error   string  `json:"error"`
	Read    *int64  `json:"read"`
	Wrote   *int64  `json:"wrote"`
	Latch   *int64  `json:"latch"`
	Count   *int64  `json:"count"`
	Permits *int64  `json:"permits"`
	Plain   *int64  `json:"plain"`
	Fenced  *int64  `json:"fenced"`
	File    string  `json:"-"`
	Line    int     `json:"-"`
	Extra   float64 `json:"-"`
}

// Op is an invocation with its completion. Status is ok, fail or unknown (an `info`
// line, or no completion at all: the process crashed or the run ended).
type Op struct {
	P      int64
	F      string
	Owner  string
	Call   int64
	Return int64 // for unknown ops, the end of the history
	Status string
	Inv    Event
	Done   Event
}

// History is every event of a run, in time order, with the operations paired.
type History struct {
	Events []Event
	Ops    []Op
	// Lost signals and crashes, per process: times after which the client no longer
	// believed it held anything.
	Lost   []Event
	Owners map[int64]string
	Final  *Event
	MaxT   int64
}

// ReadHistory reads and pairs the events of the given files.
func ReadHistory(files []string) (*History, error) {
	h := &History{Owners: map[int64]string{}}
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			return nil, err
		}
		var rd io.Reader = fh
		if len(f) > 3 && f[len(f)-3:] == ".gz" {
			// Regression histories are kept compressed under testdata/.
			if rd, err = gzip.NewReader(fh); err != nil {
				return nil, fmt.Errorf("%s: %v", f, err)
			}
		}
		sc := bufio.NewScanner(rd)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		n := 0
		for sc.Scan() {
			n++
			if len(sc.Bytes()) == 0 {
				continue
			}
			var e Event
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				// A worker killed with SIGKILL may leave half a line: skip it, as
				// the operation it completed stays unknown.
				continue
			}
			e.File, e.Line = f, n
			h.Events = append(h.Events, e)
		}
		fh.Close()
	}
	sort.SliceStable(h.Events, func(i, j int) bool { return h.Events[i].T < h.Events[j].T })
	for _, e := range h.Events {
		if e.T > h.MaxT {
			h.MaxT = e.T
		}
	}
	pending := map[int64]*Event{}
	closeUnknown := func(p int64) {
		if inv := pending[p]; inv != nil {
			h.Ops = append(h.Ops, Op{P: p, F: inv.F, Owner: h.Owners[p], Call: inv.T, Return: h.MaxT + 1, Status: "unknown", Inv: *inv})
			delete(pending, p)
		}
	}
	for i := range h.Events {
		e := h.Events[i]
		switch e.Type {
		case "invoke":
			closeUnknown(e.P)
			ev := e
			pending[e.P] = &ev
		case "ok", "fail", "info":
			inv := pending[e.P]
			if inv == nil || inv.F != e.F {
				return nil, fmt.Errorf("%s:%d: %s %s without its invocation", e.File, e.Line, e.F, e.Type)
			}
			st := e.Type
			ret := e.T
			if st == "info" {
				st, ret = "unknown", h.MaxT+1
			}
			h.Ops = append(h.Ops, Op{P: e.P, F: e.F, Owner: h.Owners[e.P], Call: inv.T, Return: ret, Status: st, Inv: *inv, Done: e})
			delete(pending, e.P)
		case "event":
			switch e.F {
			case "start":
				if e.Owner != "" {
					h.Owners[e.P] = e.Owner
				}
			case "lost":
				h.Lost = append(h.Lost, e)
			case "crash":
				closeUnknown(e.P)
				h.Lost = append(h.Lost, e)
			case "final":
				ev := e
				h.Final = &ev
			}
		}
	}
	for p := range pending {
		closeUnknown(p)
	}
	sort.SliceStable(h.Ops, func(i, j int) bool { return h.Ops[i].Call < h.Ops[j].Call })
	for i := range h.Ops {
		if h.Ops[i].Owner == "" {
			h.Ops[i].Owner = h.Owners[h.Ops[i].P]
		}
	}
	return h, nil
}

// Hold is a time a client definitely believed it held a lock, a read or write hold,
// or a permit: from the acquire's ok to the first of the release's invocation, a lost
// signal, a crash, or the end of the history. Whatever order the server applied the
// calls in, it had granted the hold before the ok and the client gave it up no
// earlier than the end, so two holds that may not coexist must not overlap here.
type Hold struct {
	P          int64
	Owner      string
	Mode       string
	Start, End int64
	Token      *int64
	Fresh      bool // the first hold of a re-entrant series (not a re-entry)
	Acquire    Op
}

// Holds follows each process's re-entrant depth: the hold ends at the release that
// brings the depth to zero.
func (h *History) Holds() []Hold {
	type st struct {
		depth int
		cur   *Hold
	}
	procs := map[int64]*st{}
	var out []Hold
	get := func(p int64) *st {
		if procs[p] == nil {
			procs[p] = &st{}
		}
		return procs[p]
	}
	end := func(s *st, t int64) {
		if s.cur != nil {
			s.cur.End = t
			out = append(out, *s.cur)
		}
		s.cur, s.depth = nil, 0
	}
	// Walk events in time order: acquire oks, release invocations, lost, crash.
	okOps := map[string]Op{}
	for _, op := range h.Ops {
		if op.F == "acquire" && op.Status == "ok" {
			okOps[fmt.Sprintf("%d:%d", op.P, op.Return)] = op
		}
	}
	for _, e := range h.Events {
		s := get(e.P)
		switch {
		case e.F == "acquire" && e.Type == "ok":
			s.depth++
			if s.cur == nil {
				mode := e.Mode
				s.cur = &Hold{P: e.P, Owner: h.Owners[e.P], Mode: mode, Start: e.T, Token: e.Token, Fresh: true, Acquire: okOps[fmt.Sprintf("%d:%d", e.P, e.T)]}
			}
		case e.F == "release" && e.Type == "invoke":
			if s.depth > 0 {
				s.depth--
				if s.depth == 0 {
					end(s, e.T)
				}
			}
		case e.Type == "event" && (e.F == "lost" || e.F == "crash"):
			end(s, e.T)
		}
	}
	for _, s := range procs {
		end(s, h.MaxT+1)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Start < out[j].Start })
	return out
}
