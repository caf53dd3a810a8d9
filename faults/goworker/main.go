// The fault harness's Go client process (faults/README.md): drives the lock through the
// Go client's public API (clients/go, rlock.Mutex) and records every operation in a
// history file in the same JSON-lines shape as the Rust worker (faults/worker) and the
// Python one (faults/pyworker.py): `invoke`, then `ok`, `fail` (definitely not done) or
// `info` (unknown), with CLOCK_MONOTONIC nanoseconds, which every process shares. Under
// the lock it does the plain read-modify-write of the shared resource.
//
// usage: goworker --url URL --name KEY --hist FILE --proc N [--resource URL]
//
//	[--ops N] [--seconds S] [--watchdog-ms MS] [--hold-ms MS] [--wait-ms MS] [--replica-sync N]
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/redis/go-redis/v9"

	rlock "github.com/rlock/rlock/clients/go"
)

// monotonicNs is CLOCK_MONOTONIC in nanoseconds: Go's own monotonic clock has another
// origin, and the histories of the Rust and Python workers are merged with these.
func monotonicNs() int64 {
	var ts syscall.Timespec
	_, _, _ = syscall.Syscall(syscall.SYS_CLOCK_GETTIME, 1, uintptr(unsafe.Pointer(&ts)), 0)
	return ts.Nano()
}

// history writes one line per event, each written at once so that a kill -9 loses at
// most the line being written.
type history struct {
	mu   sync.Mutex
	out  *os.File
	proc int
}

func (h *history) line(f, kind string, extra map[string]any) {
	rec := map[string]any{"p": h.proc, "f": f, "type": kind, "t": monotonicNs()}
	for k, v := range extra {
		rec[k] = v
	}
	b, _ := json.Marshal(rec)
	h.mu.Lock()
	defer h.mu.Unlock()
	_, _ = h.out.Write(append(b, '\n'))
}

func main() {
	url := flag.String("url", "", "the lock's server")
	name := flag.String("name", "", "the lock's key")
	hist := flag.String("hist", "", "history file (appended)")
	proc := flag.Int("proc", 0, "process number")
	resource := flag.String("resource", "", "the resource's server")
	ops := flag.Int("ops", 10000, "operations at most")
	seconds := flag.Float64("seconds", 60, "seconds at most")
	watchdogMs := flag.Int("watchdog-ms", 1000, "watchdog lease")
	holdMs := flag.Int("hold-ms", 2, "time between the resource's read and write")
	waitMs := flag.Int("wait-ms", 1000, "wait limit of an acquire")
	replicaSync := flag.Int("replica-sync", 0, "replicas to WAIT for after each acquire (0: none)")
	mode := flag.String("mode", "auto", "auto | module | scripts (docs/scripts-mode.md)")
	flag.Parse()

	f, err := os.OpenFile(*hist, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	h := &history{out: f, proc: *proc}
	opt, err := redis.ParseURL(*url)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	opt.ReadTimeout, opt.DialTimeout = 3*time.Second, 2*time.Second
	rdb := redis.NewClient(opt)
	var res *redis.Client
	if *resource != "" {
		ropt, err := redis.ParseURL(*resource)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		ropt.ReadTimeout, ropt.DialTimeout = 2*time.Second, 2*time.Second
		res = redis.NewClient(ropt)
	}
	// The harness's failover cell is the plain one: no replica sync unless asked for
	// (failover-wait), though the client syncs with connected replicas by default.
	replicas := rlock.WithoutReplicaSync()
	if *replicaSync > 0 {
		replicas = rlock.WithReplicaSync(*replicaSync, 500*time.Millisecond)
	}
	// The scripts-mode cells run auto (the default) against servers without the module,
	// as a managed service's user would.
	modes := map[string]rlock.Mode{"auto": rlock.ModeAuto, "module": rlock.ModeModule, "scripts": rlock.ModeScripts}
	m0, ok := modes[*mode]
	if !ok {
		fmt.Fprintln(os.Stderr, "--mode: auto, module or scripts")
		os.Exit(2)
	}
	client := rlock.New(rdb, rlock.WithWatchdogTimeout(time.Duration(*watchdogMs)*time.Millisecond), replicas,
		rlock.WithMode(m0))
	// One handle per process: one owner, as one Rust lock handle is; locking it again
	// re-enters.
	m := client.NewMutex(*name, rlock.WithWaitLimit(time.Duration(*waitMs)*time.Millisecond))
	h.line("start", "event", map[string]any{"owner": m.Owner()})

	ctx := context.Background()
	deadline := time.Now().Add(time.Duration(*seconds * float64(time.Second)))
	plain := "res:plain:" + *name
	n := 0
	for n < *ops && time.Now().Before(deadline) {
		holds := 0
		times := 1
		if rand.Float64() < 0.25 {
			times = 2
		}
		for i := 0; i < times; i++ {
			h.line("acquire", "invoke", nil)
			n++
			err := m.TryLockContext(ctx)
			switch {
			case err == nil:
				h.line("acquire", "ok", nil)
				if holds == 0 {
					watchLoss(h, m)
				}
				holds++
			case errors.Is(err, rlock.ErrTimeout) || errors.Is(err, rlock.ErrTaken):
				h.line("acquire", "fail", map[string]any{"error": "timeout"})
			default:
				h.line("acquire", "info", map[string]any{"error": err.Error()})
			}
		}
		if holds == 0 {
			continue
		}
		if res != nil {
			h.line("write", "invoke", nil)
			n++
			s, err := res.Get(ctx, plain).Result()
			if err != nil && !errors.Is(err, redis.Nil) {
				h.line("write", "fail", map[string]any{"error": err.Error()})
			} else {
				v, _ := strconv.Atoi(s)
				time.Sleep(time.Duration(*holdMs) * time.Millisecond)
				if err := res.Set(ctx, plain, v+1, 0).Err(); err != nil {
					h.line("write", "info", map[string]any{"read": v, "error": err.Error()})
				} else {
					h.line("write", "ok", map[string]any{"read": v, "wrote": v + 1})
				}
			}
		}
		for i := 0; i < holds; i++ {
			h.line("release", "invoke", nil)
			n++
			freed, err := m.UnlockContext(ctx)
			switch {
			case err == nil && freed:
				h.line("release", "ok", map[string]any{"outcome": "freed"})
			case err == nil:
				h.line("release", "ok", map[string]any{"outcome": "still"})
			case errors.Is(err, rlock.ErrLost) || errors.Is(err, rlock.ErrNotHeld):
				h.line("release", "fail", map[string]any{"error": "notheld"})
				i = holds // every hold of the epoch went with it
			default:
				h.line("release", "info", map[string]any{"error": err.Error()})
			}
		}
	}
}

// watchLoss records the lost signal of the hold just taken.
func watchLoss(h *history, m *rlock.Mutex) {
	done := m.Done()
	go func() {
		<-done
		if errors.Is(m.Err(), rlock.ErrLost) {
			h.line("lost", "event", map[string]any{"why": "NotHeld"})
		}
	}()
}
