// rlock-check: the fault harness's checker program (faults/README.md). It reads the
// history files of one run (JSON lines from the workers and the harness), checks them
// against the model of the primitive, and prints one JSON object: operations, their
// outcomes, anomalies by kind, what fencing caught. With -expect-none it exits 1 when
// any anomaly was found (the short slice in `make test` uses this where the guarantee
// holds); it exits 2 on bad input.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"
)

func run(model string, files []string, permits, count int, timeout time.Duration) (*Result, error) {
	h, err := ReadHistory(files)
	if err != nil {
		return nil, err
	}
	var r *Result
	switch model {
	case "lock", "lock-py", "lock-go":
		r = CheckMutex(h, timeout)
		CheckResource(h, r)
	case "fenced":
		r = CheckMutex(h, timeout)
		CheckFencing(h, r)
		CheckResource(h, r)
	case "rwlock":
		r = CheckRW(h)
	case "semaphore", "expirable":
		r = CheckSemaphore(h, permits)
	case "latch":
		r = CheckLatch(h, count)
	default:
		return nil, fmt.Errorf("unknown model %q (lock, lock-py, lock-go, fenced, rwlock, semaphore, expirable, latch)", model)
	}
	return r, nil
}

// anomalies counts every anomaly, fencing's included, but not the stale writes
// fencing refused (those are fencing working).
func anomalies(r *Result) int {
	n := 0
	for _, v := range r.Anomalies {
		n += v
	}
	for k, v := range r.Fencing {
		if k != "refused" {
			n += v
		}
	}
	return n
}

func main() {
	model := flag.String("model", "", "lock | lock-py | lock-go | fenced | rwlock | semaphore | expirable | latch")
	permits := flag.Int("permits", 2, "the semaphore's permits")
	count := flag.Int("count", 3, "the latch's count")
	timeout := flag.Duration("timeout", 60*time.Second, "Porcupine's time limit (the result is Unknown past it)")
	expectNone := flag.Bool("expect-none", false, "exit 1 when any anomaly is found")
	flag.Parse()
	if *model == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: rlock-check -model MODEL [-permits N] [-count N] [-expect-none] history.jsonl...")
		os.Exit(2)
	}
	r, err := run(*model, flag.Args(), *permits, *count, *timeout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "rlock-check:", err)
		os.Exit(2)
	}
	out, _ := json.Marshal(r)
	fmt.Println(string(out))
	if *expectNone && anomalies(r) > 0 {
		os.Exit(1)
	}
}
