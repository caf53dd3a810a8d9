// Command bench is `make bench-go`: contenders in separate processes on one lock,
// rlock's Go client against go-redsync/redsync and bsm/redislock on the same server, one
// run each (rlock twice: its default tickets, and WithBlockingWaits): owner changes per
// second, the p99 wait of an acquire, Jain's fairness index over the processes'
// acquisitions, the server's connections during the run, and the CPU time the contenders
// and the server spent per owner change (what tells the tickets' fan-out apart: each
// grant message reaches every waiting process). It writes one table, with ratios, into
// BENCHMARK.md (between its markers).
//
// A separate module (clients/go/bench/go.mod), so that redsync and redislock stay out
// of the client's own go.mod. It starts its server with internal/testserver
// (RLOCK_MODULE, REDIS_SERVER), and re-runs itself as each contender (-child).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	rlock "github.com/rlock/rlock/clients/go"
	"github.com/rlock/rlock/clients/go/internal/proto"
	"github.com/rlock/rlock/clients/go/internal/testserver"
)

const key = "bench:lock"

// result is what one contender reports.
type result struct {
	Proc     int     `json:"proc"`
	Acquired int     `json:"acquired"`
	Changes  int     `json:"changes"`
	WaitsUs  []int64 `json:"waits_us"`
	// ChangeWaitsUs are the waits of the acquisitions that took the lock from another
	// process: what waiting for the lock costs, without the free re-acquisitions of an
	// unfair lock's current owner.
	ChangeWaitsUs []int64 `json:"change_waits_us"`
}

func main() {
	child := flag.Bool("child", false, "run as one contender")
	addr := flag.String("addr", "", "child: the server")
	impl := flag.String("impl", "rlock", "child: rlock | redsync | redislock")
	proc := flag.Int("proc", 0, "child: its number")
	startNs := flag.Int64("start", 0, "child: when to start (unix ns)")
	seconds := flag.Float64("seconds", 10, "seconds per run")
	contenders := flag.String("contenders", "8,64", "contender counts, one run each")
	impls := flag.String("impls", "rlock,rlock-blocking,redsync,redislock", "the clients to run, in order")
	report := flag.String("report", "", "write the table into this file (BENCHMARK.md)")
	flag.Parse()
	if *child {
		if err := runChild(*addr, *impl, *proc, time.Unix(0, *startNs), *seconds); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	if err := runDriver(*seconds, *contenders, *impls, *report); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// ---- one contender ----------------------------------------------------------------------

func runChild(addr, impl string, proc int, start time.Time, seconds float64) error {
	// BENCH_CPUPROFILE=dir: each contender writes its CPU profile there (proc-<n>.pprof),
	// to see where a contender's time goes.
	if dir := os.Getenv("BENCH_CPUPROFILE"); dir != "" {
		f, err := os.Create(fmt.Sprintf("%s/%s-%d.pprof", dir, impl, proc))
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	end := start.Add(time.Duration(seconds * float64(time.Second)))
	ctx, cancel := context.WithDeadline(context.Background(), end)
	defer cancel()
	acquire, release, closeFn := lockFor(impl, rdb)
	defer closeFn()
	me := strconv.Itoa(proc)
	res := result{Proc: proc}
	time.Sleep(time.Until(start))
	for time.Now().Before(end) {
		t0 := time.Now()
		err := acquire(ctx)
		// A wait cut by the end of the run counts too, as the least it waited: leaving it
		// out would flatter the lock that starved this process.
		waited := time.Since(t0).Microseconds()
		res.WaitsUs = append(res.WaitsUs, waited)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, redsync.ErrFailed) ||
				errors.Is(err, redislock.ErrNotObtained) {
				break // the run ended while it waited
			}
			return fmt.Errorf("%s acquire: %w", impl, err)
		}
		res.Acquired++
		// The critical section: who held the lock before us?
		prev, err := rdb.GetSet(context.Background(), "bench:owner", me).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
		if prev != me {
			res.Changes++
			res.ChangeWaitsUs = append(res.ChangeWaitsUs, waited)
		}
		if err := release(context.Background()); err != nil {
			return fmt.Errorf("%s release: %w", impl, err)
		}
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}

// lockFor is one process's lock in each library, used as its documentation shows,
// waiting until it is acquired (or the run ends).
func lockFor(impl string, rdb *redis.Client) (acquire, release func(context.Context) error, close func()) {
	switch impl {
	case "rlock":
		c := rlock.New(rdb)
		m := c.NewMutex(key)
		return m.LockContext, func(ctx context.Context) error { _, err := m.UnlockContext(ctx); return err },
			func() { c.Close() }
	case "rlock-blocking":
		// The opt-in blocked wait (WithBlockingWaits): a grant wakes only its waiter.
		c := rlock.New(rdb, rlock.WithBlockingWaits())
		m := c.NewMutex(key)
		return m.LockContext, func(ctx context.Context) error { _, err := m.UnlockContext(ctx); return err },
			func() { c.Close() }
	case "redsync":
		// Its defaults (8 s expiry, a random 50-250 ms pause between tries) with tries
		// without limit, so that Lock waits until it gets the lock, as the others do.
		rs := redsync.New(goredis.NewPool(rdb))
		m := rs.NewMutex(key, redsync.WithTries(math.MaxInt32))
		return m.LockContext, func(ctx context.Context) error { _, err := m.UnlockContext(ctx); return err },
			func() {}
	case "redislock":
		// Retries with its exponential backoff from the recommended 16 ms minimum.
		locker := redislock.New(rdb)
		var held *redislock.Lock
		return func(ctx context.Context) error {
				l, err := locker.Obtain(ctx, key, 8*time.Second,
					&redislock.Options{RetryStrategy: redislock.ExponentialBackoff(16*time.Millisecond, 512*time.Millisecond)})
				held = l
				return err
			}, func(ctx context.Context) error { return held.Release(ctx) },
			func() {}
	}
	panic("unknown impl " + impl)
}

// ---- the driver -------------------------------------------------------------------------

type row struct {
	impl        string
	n           int
	changesPerS float64
	p99         time.Duration
	p99Change   time.Duration
	jain        float64
	conns       int
	acquired    int
	// clientCPU and serverCPU: CPU time (user + system) of every contender process and of
	// the server during the run, what an owner change costs each side.
	clientCPU time.Duration
	serverCPU time.Duration
	seconds   float64
	// load0, load1: the machine's 1-minute load average before and after the run (the
	// contenders share its cores with whatever else runs).
	load0, load1 string
}

func runDriver(seconds float64, contenders, impls, report string) error {
	s, err := testserver.StartMain()
	if err != nil {
		return err
	}
	defer s.Stop()
	admin := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer admin.Close()
	ctx := context.Background()
	version, _ := admin.Info(ctx, "server").Result()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	var rows []row
	for _, nStr := range strings.Split(contenders, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(nStr))
		if err != nil {
			return err
		}
		for _, impl := range strings.Split(impls, ",") {
			if err := admin.FlushAll(ctx).Err(); err != nil {
				return err
			}
			r, err := runOne(ctx, admin, self, s.Addr, impl, n, seconds)
			if err != nil {
				return err
			}
			fmt.Printf("%-9s %3d contenders: %8.0f owner changes/s (%d acquisitions), p99 wait %v (owner changes: %v), Jain %.3f, %d connections, CPU per owner change: clients %v, server %v\n",
				impl, n, r.changesPerS, r.acquired, r.p99.Round(time.Millisecond), r.p99Change.Round(time.Millisecond), r.jain, r.conns,
				perChange(r.clientCPU, r), perChange(r.serverCPU, r))
			rows = append(rows, r)
		}
	}
	table := render(rows, seconds, serverName(version))
	fmt.Println(table)
	if report != "" {
		return writeBlock(report, table)
	}
	return nil
}

func runOne(ctx context.Context, admin *redis.Client, self, addr, impl string, n int, seconds float64) (row, error) {
	base := connected(ctx, admin)
	cpu0 := serverCPU(ctx, admin)
	load0 := loadAvg()
	start := time.Now().Add(time.Second + time.Duration(n)*20*time.Millisecond) // every process started by then
	var cmds []*exec.Cmd
	outs := make([]*strings.Builder, n)
	for i := 0; i < n; i++ {
		c := exec.Command(self, "-child", "-addr", addr, "-impl", impl, "-proc", strconv.Itoa(i),
			"-start", strconv.FormatInt(start.UnixNano(), 10), "-seconds", fmt.Sprint(seconds))
		outs[i] = &strings.Builder{}
		c.Stdout, c.Stderr = outs[i], os.Stderr
		if err := c.Start(); err != nil {
			return row{}, err
		}
		cmds = append(cmds, c)
	}
	// The server's client count, sampled through the run (its peak, less our own).
	peak := 0
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			if c := connected(ctx, admin) - base; c > peak {
				peak = c
			}
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	var failed error
	var clientCPU time.Duration
	for i, c := range cmds {
		if err := c.Wait(); err != nil && failed == nil {
			failed = fmt.Errorf("%s contender %d: %v", impl, i, err)
		}
		clientCPU += c.ProcessState.UserTime() + c.ProcessState.SystemTime()
	}
	close(stop)
	wg.Wait()
	if failed != nil {
		return row{}, failed
	}
	r := row{impl: impl, n: n, conns: peak, clientCPU: clientCPU, serverCPU: serverCPU(ctx, admin) - cpu0,
		load0: load0, load1: loadAvg()}
	var waits, changeWaits []int64
	var counts []float64
	changes := 0
	for _, o := range outs {
		var res result
		sc := bufio.NewScanner(strings.NewReader(o.String()))
		sc.Buffer(make([]byte, 1<<20), 1<<30)
		for sc.Scan() {
			if err := json.Unmarshal(sc.Bytes(), &res); err != nil {
				return row{}, err
			}
		}
		waits = append(waits, res.WaitsUs...)
		changeWaits = append(changeWaits, res.ChangeWaitsUs...)
		counts = append(counts, float64(res.Acquired))
		changes += res.Changes
		r.acquired += res.Acquired
	}
	r.changesPerS = float64(changes) / seconds
	r.seconds = seconds
	r.p99 = time.Duration(percentile(waits, 0.99)) * time.Microsecond
	r.p99Change = time.Duration(percentile(changeWaits, 0.99)) * time.Microsecond
	r.jain = jain(counts)
	return r, nil
}

func connected(ctx context.Context, admin *redis.Client) int {
	text, err := admin.Info(ctx, "clients").Result()
	if err != nil {
		return 0
	}
	n, _ := proto.InfoField(text, "connected_clients")
	return int(n)
}

// loadAvg is the machine's 1-minute load average (/proc/loadavg), "?" where unknown.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) > 0 {
		return f[0]
	}
	return "?"
}

// serverCPU is the server's CPU time so far (INFO cpu: used_cpu_sys + used_cpu_user).
func serverCPU(ctx context.Context, admin *redis.Client) time.Duration {
	text, _ := admin.Info(ctx, "cpu").Result()
	var total float64
	for _, f := range []string{"used_cpu_sys", "used_cpu_user"} {
		v, _ := infoString(text, f)
		x, _ := strconv.ParseFloat(v, 64)
		total += x
	}
	return time.Duration(total * float64(time.Second))
}

// perChange is d per owner change of r.
func perChange(d time.Duration, r row) string {
	changes := r.changesPerS * r.seconds
	if changes < 1 {
		return "–"
	}
	return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond)/changes)
}

func percentile(xs []int64, q float64) int64 {
	if len(xs) == 0 {
		return 0
	}
	sort.Slice(xs, func(i, j int) bool { return xs[i] < xs[j] })
	i := int(math.Ceil(q*float64(len(xs)))) - 1
	if i < 0 {
		i = 0
	}
	return xs[i]
}

// jain is Jain's fairness index of xs: 1 when all are equal, 1/n when one takes all.
func jain(xs []float64) float64 {
	var sum, sq float64
	for _, x := range xs {
		sum += x
		sq += x * x
	}
	if sq == 0 {
		return 0
	}
	return sum * sum / (float64(len(xs)) * sq)
}

func serverName(info string) string {
	if v, ok := infoString(info, "valkey_version"); ok {
		return "Valkey " + v
	}
	v, _ := infoString(info, "redis_version")
	return "Redis " + v
}

func infoString(text, field string) (string, bool) {
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, field+":") {
			return strings.TrimSpace(strings.TrimPrefix(line, field+":")), true
		}
	}
	return "", false
}

func render(rows []row, seconds float64, server string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "### Go clients: one lock, contenders in separate processes (`make bench-go`)\n\n")
	fmt.Fprintf(&b, "%s, module release build, %g s per run, each process one goroutine looping "+
		"acquire (waiting until granted), `GETSET` of the last owner, release. Owner changes/s: "+
		"acquisitions that found another process's mark. p99 wait: of every acquire (a wait cut by the "+
		"end of the run counted as its length so far); p99 handoff wait: of the acquires that took the "+
		"lock from another process (an unfair lock's owner re-acquiring at once does not count). Jain: "+
		"fairness of the acquisitions over the processes (1 = equal). Connections: the server's peak "+
		"`connected_clients` during the run. CPU per owner change: user + system time of every "+
		"contender process (start-up included) and of the server (INFO cpu) over the run, per owner change. Load: "+
		"the machine's 1-minute load average before / after the run. rlock: "+
		"`Mutex.LockContext` with its default queued tickets (with `NOTIFY <tag>` where the module "+
		"names `ticket-notify`: each grant goes to its own process's channel); rlock-blocking: the same with "+
		"`WithBlockingWaits()` (a blocked `WAIT` per waiting goroutine); redsync "+
		"v4.13.0: defaults (random 50-250 ms between tries), tries without limit; bsm/redislock "+
		"v0.9.4: `ExponentialBackoff(16ms, 512ms)`. Ratios: rlock's changes/s over the other's, the "+
		"other's p99 handoff wait over rlock's (above 1: rlock ahead), for rlock's tickets and its blocked waits.\n\n", server, seconds)
	b.WriteString("| contenders | client | owner changes/s | acquisitions | p99 wait | p99 handoff wait | Jain | connections | CPU per owner change: contenders / server | load | changes/s: rlock ahead (tickets / blocking) | p99 handoff: rlock ahead (tickets / blocking) |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	byN := map[string]row{}
	for _, r := range rows {
		if strings.HasPrefix(r.impl, "rlock") {
			byN[fmt.Sprint(r.impl, r.n)] = r
		}
	}
	for _, r := range rows {
		var ratios, p99s []string
		for _, impl := range []string{"rlock", "rlock-blocking"} {
			base, ok := byN[fmt.Sprint(impl, r.n)]
			if !ok || strings.HasPrefix(r.impl, "rlock") {
				continue
			}
			if r.changesPerS > 0 {
				ratios = append(ratios, fmt.Sprintf("%.1fx", base.changesPerS/r.changesPerS))
			}
			if base.p99Change > 0 {
				p99s = append(p99s, fmt.Sprintf("%.1fx", float64(r.p99Change)/float64(base.p99Change)))
			}
		}
		ratio, p99 := "–", "–"
		if len(ratios) > 0 {
			ratio = strings.Join(ratios, " / ")
		}
		if len(p99s) > 0 {
			p99 = strings.Join(p99s, " / ")
		}
		fmt.Fprintf(&b, "| %d | %s | %.0f | %d | %s | %s | %.3f | %d | %s / %s | %s / %s | %s | %s |\n", r.n, r.impl, r.changesPerS,
			r.acquired, ms(r.p99), ms(r.p99Change), r.jain, r.conns, perChange(r.clientCPU, r), perChange(r.serverCPU, r),
			r.load0, r.load1, ratio, p99)
	}
	return b.String()
}

// ms formats a duration in milliseconds with one decimal.
func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }

const (
	beginMark = "<!-- bench-go:begin -->"
	endMark   = "<!-- bench-go:end -->"
)

// writeBlock puts table between the markers in path (appended with them the first time).
func writeBlock(path, table string) error {
	old, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	text := string(old)
	block := beginMark + "\n" + table + endMark + "\n"
	i, j := strings.Index(text, beginMark), strings.Index(text, endMark)
	if i >= 0 && j > i {
		text = text[:i] + block + text[j+len(endMark)+1:]
	} else {
		if text != "" && !strings.HasSuffix(text, "\n\n") {
			text += "\n"
		}
		text += block
	}
	return os.WriteFile(path, []byte(text), 0o644)
}
