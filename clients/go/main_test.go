// TestMain starts the one server the runnable examples (example_test.go) talk to; every
// test starts its own (setup in mutex_test.go).

package rlock_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/rlock/rlock/clients/go/internal/testserver"
)

// exampleAddr is the examples' server (go doc shows them with "localhost:6379").
var exampleAddr string

func TestMain(m *testing.M) {
	s, err := testserver.StartMain()
	if err != nil {
		fmt.Fprintln(os.Stderr, "examples' server:", err)
		os.Exit(1)
	}
	exampleAddr = s.Addr
	code := m.Run()
	s.Stop()
	os.Exit(code)
}
