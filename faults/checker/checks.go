// The checkers of the fault harness, one per model (faults/README.md, "Checkers"):
//
//   - mutex: an owner-aware re-entrant mutex, checked for linearizability with
//     Porcupine (github.com/anishathalye/porcupine), because the question there is
//     whether some order of the calls explains every reply (re-entry counts, releases
//     answered "not held", calls whose outcome is unknown), which needs a search;
//   - fencing, read-write, semaphore and latch: safety invariants over what the clients
//     definitely saw (holds between an acquire's ok and its release's invocation),
//     which hold or fail whatever order the server applied the calls in, so no search
//     is needed: an unknown call adds no hold, which can hide an anomaly but never
//     invent one;
//   - lost updates: the resource's final values against the acknowledged writes.
package main

import (
	"fmt"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

// Result is what one check found: anomalies by kind (zero where the guarantee held).
type Result struct {
	Ops          int              `json:"ops"`
	ByStatus     map[string]int   `json:"by_status"`
	Anomalies    map[string]int   `json:"anomalies"`
	Fencing      map[string]int   `json:"fencing"`
	Linearizable string           `json:"linearizable,omitempty"`
	Examples     []string         `json:"examples,omitempty"`
	Info         map[string]int64 `json:"info,omitempty"`
}

func newResult(h *History) *Result {
	r := &Result{ByStatus: map[string]int{}, Anomalies: map[string]int{}, Fencing: map[string]int{}, Info: map[string]int64{}}
	for _, op := range h.Ops {
		r.Ops++
		r.ByStatus[op.Status]++
	}
	r.Info["lost_signals"] = 0
	for _, op := range h.Ops {
		// A release answered "not held": the hold was lost before it (lease, data loss).
		if op.F == "release" && op.Status == "fail" && op.Done.Error == "notheld" {
			r.Info["released_not_held"]++
		}
	}
	for _, e := range h.Lost {
		if e.F == "lost" {
			r.Info["lost_signals"]++
		} else {
			r.Info["crashes"]++
		}
	}
	return r
}

func (r *Result) example(format string, a ...interface{}) {
	if len(r.Examples) < 5 {
		r.Examples = append(r.Examples, fmt.Sprintf(format, a...))
	}
}

// ---- the owner-aware re-entrant mutex, for Porcupine ----

type mutexInput struct {
	Kind  string // acquire, release, lost
	Owner string
}

type mutexOutput struct {
	Status  string // ok, fail, unknown
	Outcome string // release: freed or still
}

type mutexState struct {
	Owner string
	Count int
}

// mutexModel: acquire succeeds only when the lock is free or already this owner's
// (re-entry); release ok "freed" only at count 1, "still" above it; a release
// answered "not held", a lost signal and a crash give up whatever the owner held (the
// client stops believing it holds the lock, which is all mutual exclusion needs);
// an unknown outcome may or may not have taken effect (Jepsen's :info).
var mutexModel = porcupine.NondeterministicModel{
	Init: func() []interface{} { return []interface{}{mutexState{}} },
	Step: func(state, input, output interface{}) []interface{} {
		s := state.(mutexState)
		in := input.(mutexInput)
		out := output.(mutexOutput)
		mine := s.Owner == in.Owner && s.Count > 0
		free := s.Count == 0
		gaveUp := s
		if mine {
			gaveUp = mutexState{}
		}
		switch in.Kind {
		case "acquire":
			taken := mutexState{in.Owner, s.Count + 1}
			switch out.Status {
			case "ok":
				if free || mine {
					return []interface{}{taken}
				}
				return nil
			case "unknown":
				if free || mine {
					return []interface{}{s, taken}
				}
				return []interface{}{s}
			}
			return []interface{}{s}
		case "release":
			var released mutexState
			if mine {
				released = mutexState{in.Owner, s.Count - 1}
				if released.Count == 0 {
					released = mutexState{}
				}
			}
			switch out.Status {
			case "ok":
				if !mine || (out.Outcome == "freed") != (s.Count == 1) {
					return nil
				}
				return []interface{}{released}
			case "unknown":
				if mine {
					return []interface{}{s, released, gaveUp}
				}
				return []interface{}{s}
			}
			return []interface{}{gaveUp}
		case "lost":
			return []interface{}{gaveUp}
		}
		return nil
	},
	Equal: func(a, b interface{}) bool { return a.(mutexState) == b.(mutexState) },
	DescribeOperation: func(input, output interface{}) string {
		in, out := input.(mutexInput), output.(mutexOutput)
		return fmt.Sprintf("%s(%s) -> %s %s", in.Kind, in.Owner, out.Status, out.Outcome)
	},
}

// CheckMutex runs Porcupine on the lock history and counts overlapping holds of two
// owners (the anomaly Porcupine's "Illegal" stands for, counted).
func CheckMutex(h *History, timeout time.Duration) *Result {
	r := newResult(h)
	var ops []porcupine.Operation
	for _, op := range h.Ops {
		if op.F != "acquire" && op.F != "release" {
			continue
		}
		if op.F == "acquire" && op.Status == "fail" {
			continue // refused or timed out: changed nothing
		}
		ops = append(ops, porcupine.Operation{
			ClientId: int(op.P),
			Input:    mutexInput{op.F, op.Owner},
			Call:     op.Call,
			Output:   mutexOutput{op.Status, op.Done.Outcome},
			Return:   op.Return,
		})
	}
	for _, e := range h.Lost {
		ops = append(ops, porcupine.Operation{ClientId: int(e.P), Input: mutexInput{"lost", h.Owners[e.P]}, Call: e.T, Output: mutexOutput{Status: "ok"}, Return: e.T + 1})
	}
	res := porcupine.CheckOperationsTimeout(mutexModel.ToModel(), ops, timeout)
	r.Linearizable = string(res)
	if res == porcupine.Illegal {
		r.Anomalies["not-linearizable"] = 1
	}
	holds := h.Holds()
	for i := range holds {
		for j := i + 1; j < len(holds) && holds[j].Start < holds[i].End; j++ {
			if holds[j].Owner != holds[i].Owner {
				r.Anomalies["two-holders"]++
				r.example("two holders: p%d [%d,%d] and p%d [%d,%d]", holds[i].P, holds[i].Start, holds[i].End, holds[j].P, holds[j].Start, holds[j].End)
			}
		}
	}
	if _, ok := r.Anomalies["two-holders"]; !ok {
		r.Anomalies["two-holders"] = 0
	}
	return r
}

// CheckFencing: tokens strictly increase in the real-time order of acquisition: an
// acquire that completed before another was invoked has the smaller token.
func CheckFencing(h *History, r *Result) {
	var acq []Op
	for _, hd := range h.Holds() {
		if hd.Fresh && hd.Token != nil && hd.Acquire.Status == "ok" {
			acq = append(acq, hd.Acquire)
		}
	}
	byReturn := append([]Op(nil), acq...)
	sort.Slice(byReturn, func(i, j int) bool { return byReturn[i].Return < byReturn[j].Return })
	sort.Slice(acq, func(i, j int) bool { return acq[i].Call < acq[j].Call })
	r.Anomalies["token-not-increasing"] = 0
	k := 0
	var maxTok int64 = -1 << 62
	var maxOp Op
	for _, b := range acq {
		for k < len(byReturn) && byReturn[k].Return < b.Call {
			if t := *byReturn[k].Done.Token; t > maxTok {
				maxTok, maxOp = t, byReturn[k]
			}
			k++
		}
		if *b.Done.Token <= maxTok {
			r.Anomalies["token-not-increasing"]++
			r.example("token %d (p%d, invoked %d) after token %d (p%d, ok %d)", *b.Done.Token, b.P, b.Call, maxTok, maxOp.P, maxOp.Return)
		}
	}
}

// CheckResource counts lost and doubled updates of the plain and the fenced resource
// from the acknowledged writes and the final values the harness read.
func CheckResource(h *History, r *Result) {
	count := func(f string) (ok, unknown, refused int) {
		for _, op := range h.Ops {
			if op.F != f {
				continue
			}
			switch {
			case op.Status == "ok":
				ok++
			case op.Status == "unknown":
				unknown++
			case op.Done.Error == "refused":
				refused++
			}
		}
		return
	}
	if h.Final == nil {
		return
	}
	if h.Final.Plain != nil {
		ok, unk, _ := count("write")
		f := int(*h.Final.Plain)
		r.Anomalies["lost-update"] = atLeast0(ok - f)
		r.Anomalies["doubled-update"] = atLeast0(f - ok - unk)
		r.Info["plain_writes"] = int64(ok)
	}
	if h.Final.Fenced != nil {
		ok, unk, refused := count("fwrite")
		f := int(*h.Final.Fenced)
		r.Fencing["refused"] = refused
		r.Fencing["lost-update"] = atLeast0(ok - f)
		r.Fencing["doubled-update"] = atLeast0(f - ok - unk)
		r.Info["fenced_writes"] = int64(ok)
	}
}

// CheckRW: a writer's hold never overlaps another owner's hold (read or write).
func CheckRW(h *History) *Result {
	r := newResult(h)
	r.Anomalies["writer-beside-another"] = 0
	holds := h.Holds()
	for i := range holds {
		for j := i + 1; j < len(holds) && holds[j].Start < holds[i].End; j++ {
			a, b := holds[i], holds[j]
			if a.Owner != b.Owner && (a.Mode == "write" || b.Mode == "write") {
				r.Anomalies["writer-beside-another"]++
				r.example("%s p%d [%d,%d] beside %s p%d [%d,%d]", a.Mode, a.P, a.Start, a.End, b.Mode, b.P, b.Start, b.End)
			}
		}
	}
	return r
}

// CheckSemaphore: never more permits held at once than the semaphore has.
func CheckSemaphore(h *History, permits int) *Result {
	r := newResult(h)
	r.Anomalies["permits-exceeded"] = 0
	type pt struct {
		t int64
		d int
	}
	var pts []pt
	for _, hd := range h.Holds() {
		pts = append(pts, pt{hd.Start, 1}, pt{hd.End, -1})
	}
	// Ends before starts at one instant: a hold given back as another begins is fine.
	sort.Slice(pts, func(i, j int) bool {
		if pts[i].t != pts[j].t {
			return pts[i].t < pts[j].t
		}
		return pts[i].d < pts[j].d
	})
	out, most := 0, 0
	for _, p := range pts {
		out += p.d
		if out > most {
			most = out
		}
		if p.d > 0 && out > permits {
			r.Anomalies["permits-exceeded"]++
			r.example("%d permits out of %d at %d", out, permits, p.t)
		}
	}
	r.Info["most_out"] = int64(most)
	return r
}

// CheckLatch: an awaiter released (await ok) only after at least `count` count-downs
// of its latch had been invoked (the count cannot reach zero with fewer). Only latches
// some set of which answered (ok: set now, or already set) are judged: where every set's
// outcome is unknown (scripts mode answers "outcome unknown" rather than re-send it) the
// latch may never have been set, and a latch never set is open (info latches_unset).
func CheckLatch(h *History, count int) *Result {
	r := newResult(h)
	r.Anomalies["released-early"] = 0
	downs := map[int64][]int64{}
	set := map[int64]bool{}
	seen := map[int64]bool{}
	for _, op := range h.Ops {
		if op.F == "countdown" && op.Inv.Latch != nil {
			downs[*op.Inv.Latch] = append(downs[*op.Inv.Latch], op.Call)
		}
		if op.F == "set" && op.Inv.Latch != nil {
			seen[*op.Inv.Latch] = true
			if op.Status == "ok" {
				set[*op.Inv.Latch] = true
			}
		}
	}
	unset := int64(0)
	for l := range seen {
		if !set[l] {
			unset++
		}
	}
	r.Info["latches_unset"] = unset
	for _, op := range h.Ops {
		if op.F != "await" || op.Status != "ok" || op.Inv.Latch == nil {
			continue
		}
		if seen[*op.Inv.Latch] && !set[*op.Inv.Latch] {
			continue
		}
		n := 0
		for _, t := range downs[*op.Inv.Latch] {
			if t < op.Return {
				n++
			}
		}
		if n < count {
			r.Anomalies["released-early"]++
			r.example("p%d released from latch %d after %d of %d count-downs", op.P, *op.Inv.Latch, n, count)
		}
	}
	return r
}

// atLeast0 is max(0, n), written out so the checker builds with Go 1.19 (Debian 12's
// golang-go), which has no built-in max.
func atLeast0(n int) int {
	if n < 0 {
		return 0
	}
	return n
}
