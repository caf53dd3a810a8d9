// Package testserver starts real module-loaded Redis servers for the client's tests: one
// server on a free 127.0.0.1 port, or a 3-master cluster (as tests/support/
// cluster_helpers.py builds one), stopped by t.Cleanup. The module comes from
// $RLOCK_MODULE (default ../../target/debug/librlock.so, relative to clients/go), the
// server from $REDIS_SERVER (default redis-server on PATH). Every wait is a bounded
// poll, never a fixed sleep.
package testserver

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Module is the path of librlock.so.
func Module() string {
	if m := os.Getenv("RLOCK_MODULE"); m != "" {
		return m
	}
	_, file, _, _ := runtime.Caller(0)
	// internal/testserver -> clients/go -> the repository root
	p, _ := filepath.Abs(filepath.Join(filepath.Dir(file), "..", "..", "..", "..", "target", "debug", "librlock.so"))
	return p
}

// Binary is the server binary.
func Binary() string {
	if s := os.Getenv("REDIS_SERVER"); s != "" {
		return s
	}
	return "redis-server"
}

// Server is one started server.
type Server struct {
	Port int
	Addr string
	Dir  string
	// cmdline: the server's arguments, for Restart.
	cmdline []string
	cmd     *exec.Cmd
	// exited gets the process's exit once.
	exited   chan error
	stopOnce sync.Once
}

// WaitUntil polls pred every few milliseconds until it holds or timeout passes, then
// fails the test naming what.
func WaitUntil(t testing.TB, timeout time.Duration, what string, pred func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !pred() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func freePort(t testing.TB, bus bool) int {
	for i := 0; i < 100; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !bus {
			return port
		}
		// A cluster node also listens on port + 10000 (its bus).
		if port+10000 > 65535 {
			continue
		}
		if l2, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+10000)); err == nil {
			l2.Close()
			return port
		}
	}
	t.Fatal("no free port")
	return 0
}

// Start starts one module-loaded server with extra config args ("--name", "value", ...).
func Start(t testing.TB, args ...string) *Server {
	t.Helper()
	return start(t, false, args...)
}

// StartBare starts one server without the module (scripts mode's tests).
func StartBare(t testing.TB, args ...string) *Server {
	t.Helper()
	s, err := launchWith(false, func() int { return freePort(t, false) }, t.TempDir, args...)
	if err != nil {
		t.Fatalf("server did not start: %v", err)
	}
	t.Cleanup(s.Stop)
	return s
}

func start(t testing.TB, bus bool, args ...string) *Server {
	t.Helper()
	s, err := launch(func() int { return freePort(t, bus) }, t.TempDir, args...)
	if err != nil {
		t.Fatalf("server did not start: %v", err)
	}
	t.Cleanup(s.Stop)
	return s
}

// StartMain starts one module-loaded server outside a test (TestMain: the runnable
// examples' server); the caller stops it.
func StartMain(args ...string) (*Server, error) {
	dir, err := os.MkdirTemp("", "rlock-go-")
	if err != nil {
		return nil, err
	}
	port := func() int {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0
		}
		defer l.Close()
		return l.Addr().(*net.TCPAddr).Port
	}
	n := 0
	return launch(port, func() string {
		n++
		d := filepath.Join(dir, strconv.Itoa(n))
		_ = os.MkdirAll(d, 0o755)
		return d
	}, args...)
}

func launch(port func() int, tempDir func() string, args ...string) (*Server, error) {
	return launchWith(true, port, tempDir, args...)
}

func launchWith(module bool, port func() int, tempDir func() string, args ...string) (*Server, error) {
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		s := &Server{Port: port(), Dir: tempDir()}
		s.Addr = "127.0.0.1:" + strconv.Itoa(s.Port)
		cmdline := append([]string{"--port", strconv.Itoa(s.Port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", s.Dir,
			"--logfile", filepath.Join(s.Dir, "server.log"),
			"--enable-debug-command", "yes"}, args...)
		if module {
			cmdline = append(cmdline, "--loadmodule", Module())
		}
		s.cmdline = cmdline
		if err := s.run(); err != nil {
			lastErr = err
			continue // most likely the port was taken meanwhile
		}
		return s, nil
	}
	return nil, lastErr
}

// run starts the server's process with its arguments and waits for its PING.
func (s *Server) run() error {
	s.cmd = exec.Command(Binary(), s.cmdline...)
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %v", Binary(), err)
	}
	s.exited = make(chan error, 1)
	go func() { s.exited <- s.cmd.Wait() }()
	if err := s.waitPing(s.exited); err != nil {
		_ = s.cmd.Process.Kill()
		return err
	}
	return nil
}

// Restart kills the server (SIGKILL: nothing more is written), keeps its port closed for
// down, and starts it again on the same port, directory and arguments (so with
// `--appendonly yes` it reloads what it had written), answering PING once loaded.
func (s *Server) Restart(t testing.TB, down time.Duration) {
	t.Helper()
	_ = s.cmd.Process.Kill()
	<-s.exited
	time.Sleep(down)
	if err := s.run(); err != nil {
		t.Fatalf("the server did not start again on port %d: %v", s.Port, err)
	}
}

// Stop kills the server and waits for it to exit.
func (s *Server) Stop() {
	s.stopOnce.Do(func() {
		_ = s.cmd.Process.Kill()
		<-s.exited
	})
}

func (s *Server) waitPing(exited chan error) error {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			log, _ := os.ReadFile(filepath.Join(s.Dir, "server.log"))
			return fmt.Errorf("server exited (%v): %s", err, log)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("no PING answer in 15 s")
}

// Client is a go-redis client on the server, closed at cleanup.
func (s *Server) Client(t testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	t.Cleanup(func() { c.Close() })
	return c
}

// Kill kills the server at once (SIGKILL).
func (s *Server) Kill() { _ = s.cmd.Process.Kill() }

// Cluster is three module-loaded masters splitting the 16384 slots.
type Cluster struct {
	Nodes []*Server
}

// StartCluster builds a 3-master cluster and waits until every node reports it ok.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	return startCluster(t, true)
}

// StartBareCluster is StartCluster without the module (scripts mode's cluster tests).
func StartBareCluster(t testing.TB) *Cluster {
	t.Helper()
	return startCluster(t, false)
}

func startCluster(t testing.TB, module bool) *Cluster {
	t.Helper()
	cl := &Cluster{}
	for i := 0; i < 3; i++ {
		s, err := launchWith(module, func() int { return freePort(t, true) }, t.TempDir, "--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000")
		if err != nil {
			t.Fatalf("server did not start: %v", err)
		}
		t.Cleanup(s.Stop)
		cl.Nodes = append(cl.Nodes, s)
	}
	ctx := context.Background()
	ranges := [][2]int{{0, 5460}, {5461, 10922}, {10923, 16383}}
	for i, n := range cl.Nodes {
		c := n.Client(t)
		slots := make([]any, 0, ranges[i][1]-ranges[i][0]+2)
		slots = append(slots, "CLUSTER", "ADDSLOTS")
		for s := ranges[i][0]; s <= ranges[i][1]; s++ {
			slots = append(slots, s)
		}
		if err := c.Do(ctx, slots...).Err(); err != nil {
			t.Fatal(err)
		}
		// Distinct config epochs from the start, as redis-cli --cluster create sets them:
		// left at 0 they are told apart by collisions over several gossip rounds, and a
		// slot moved meanwhile can be claimed back by its old owner.
		if err := c.Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err(); err != nil {
			t.Fatal(err)
		}
	}
	c0 := cl.Nodes[0].Client(t)
	for _, n := range cl.Nodes[1:] {
		if err := c0.Do(ctx, "CLUSTER", "MEET", "127.0.0.1", n.Port).Err(); err != nil {
			t.Fatal(err)
		}
	}
	clients := []*redis.Client{}
	for _, n := range cl.Nodes {
		clients = append(clients, n.Client(t))
	}
	WaitUntil(t, 30*time.Second, "cluster_state:ok on every node", func() bool {
		for _, c := range clients {
			info, err := c.ClusterInfo(ctx).Result()
			if err != nil || !strings.Contains(info, "cluster_state:ok") ||
				!strings.Contains(info, "cluster_known_nodes:3") {
				return false
			}
		}
		return true
	})
	return cl
}

// Client is a go-redis cluster client, closed at cleanup.
func (cl *Cluster) Client(t testing.TB) *redis.ClusterClient {
	addrs := []string{}
	for _, n := range cl.Nodes {
		addrs = append(addrs, n.Addr)
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { c.Close() })
	return c
}
