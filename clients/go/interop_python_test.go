// Interop with the Python client (clients/python) on the same names: a Go holder hands
// the lock to a Python waiter queued in the server, and a Python holder to a Go waiter,
// so the two clients agree on the lock's key, owner fields, ticket channel and messages.
// The Python side runs in a process of its own, from the tests' virtualenv (RLOCK_PYTHON,
// default ../../.venv/bin/python, which `make test-go` builds); skipped without one.

package rlock_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlock "github.com/rlock/rlock/clients/go"
	"github.com/rlock/rlock/clients/go/internal/testserver"
)

// pythonLock takes rlock.Lock(name) with a 20 s wait, says so, holds it until a line
// comes on stdin, then releases it.
const pythonLock = `
import sys, redis, rlock
r = redis.Redis(host="127.0.0.1", port=int(sys.argv[1]))
lock = rlock.Lock(r, sys.argv[2], blocking_timeout=20)
print("acquired" if lock.acquire() else "timeout", flush=True)
sys.stdin.readline()
lock.release()
print("released", flush=True)
`

// python is the tests' Python with redis-py, and the Python client's directory.
func python(t *testing.T) (string, string) {
	t.Helper()
	py := os.Getenv("RLOCK_PYTHON")
	if py == "" {
		py, _ = filepath.Abs(filepath.Join("..", "..", ".venv", "bin", "python"))
	}
	if err := exec.Command(py, "-c", "import redis").Run(); err != nil {
		t.Skipf("no Python with redis-py at %s (make venv, or RLOCK_PYTHON)", py)
	}
	dir, _ := filepath.Abs(filepath.Join("..", "python"))
	return py, dir
}

// pyHolder is one running Python lock process.
type pyHolder struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines *bufio.Scanner
}

func startPython(t *testing.T, port int, name string) *pyHolder {
	t.Helper()
	py, dir := python(t)
	cmd := exec.Command(py, "-c", pythonLock, fmt.Sprint(port), name)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+dir)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return &pyHolder{cmd: cmd, in: in, lines: bufio.NewScanner(out)}
}

// next is the Python side's next line, within 30 s.
func (p *pyHolder) next(t *testing.T) string {
	t.Helper()
	got := make(chan string, 1)
	go func() {
		if p.lines.Scan() {
			got <- p.lines.Text()
		} else {
			got <- "EOF"
		}
	}()
	select {
	case line := <-got:
		return line
	case <-time.After(30 * time.Second):
		t.Fatal("the Python side said nothing within 30 s")
		return ""
	}
}

func TestALockPassesBetweenTheGoAndPythonClients(t *testing.T) {
	s, _, c := setup(t)
	ctx := context.Background()
	g := c.NewMutex("shared")
	if err := g.Lock(); err != nil {
		t.Fatal(err)
	}
	p := startPython(t, s.Port, "shared")
	testserver.WaitUntil(t, 20*time.Second, "the Python waiter queued", func() bool {
		return infoWaiters(t, "RLOCK.INFO", "shared") == 1
	})
	// Go hands the lock to the Python waiter.
	if freed, err := g.Unlock(); err != nil || !freed {
		t.Fatalf("Unlock = %v, %v", freed, err)
	}
	if line := p.next(t); line != "acquired" {
		t.Fatalf("Python: %q, want acquired", line)
	}
	if err := g.TryLock(); !errors.Is(err, rlock.ErrTaken) {
		t.Fatalf("Go TryLock while Python holds = %v, want ErrTaken", err)
	}
	// And Python hands it to a Go waiter.
	errc := make(chan error, 1)
	go func() { errc <- g.LockContext(ctx) }()
	testserver.WaitUntil(t, 10*time.Second, "the Go waiter queued", func() bool {
		return infoWaiters(t, "RLOCK.INFO", "shared") == 1
	})
	if _, err := io.WriteString(p.in, "release\n"); err != nil {
		t.Fatal(err)
	}
	if line := p.next(t); !strings.HasPrefix(line, "released") {
		t.Fatalf("Python: %q, want released", line)
	}
	select {
	case err := <-errc:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the Go waiter was not handed the lock")
	}
	if g.Held() != 1 {
		t.Fatal("Go does not hold the lock")
	}
}
