// spec/vectors/waits.json (how a waiting acquire starts) run through the client's own
// rule, proto.Contention and proto.StartWait, the code every waiting primitive's
// waitCall goes through: both arrays, each case named on failure. The other vector
// files are read in internal/proto/vectors_test.go. RLOCK_VECTORS points at another
// copy of the folder.

package rlock_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"testing"
	"time"

	"github.com/rlock/rlock/clients/go/internal/proto"
)

type waitsFile struct {
	ContendedForMs int64 `json:"contended_for_ms"`
	TriesFirst     []struct {
		Found      *string `json:"found"`
		AgoMs      *int64  `json:"ago_ms"`
		TriesFirst bool    `json:"tries_first"`
	} `json:"tries_first"`
	Acquires []struct {
		Before  *string  `json:"before"`
		Replies []string `json:"replies"`
		Sends   []string `json:"sends"`
		After   string   `json:"after"`
	} `json:"acquires"`
}

func readWaits(t *testing.T) waitsFile {
	t.Helper()
	dir := os.Getenv("RLOCK_VECTORS")
	if dir == "" {
		_, file, _, _ := runtime.Caller(0)
		dir = filepath.Join(filepath.Dir(file), "..", "..", "spec", "vectors")
	}
	b, err := os.ReadFile(filepath.Join(dir, "waits.json"))
	if err != nil {
		t.Fatal(err) // a vector file deleted by mistake must not pass quietly
	}
	var f waitsFile
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	if len(f.TriesFirst) == 0 || len(f.Acquires) == 0 {
		t.Fatal("waits.json: an array is empty")
	}
	return f
}

// finding sets c to what a vector's finding says, made at `at` (nil: none yet).
func finding(t *testing.T, c *proto.Contention, found *string, at time.Time) {
	t.Helper()
	if found == nil {
		return
	}
	switch *found {
	case "held":
		c.Found(true, at)
	case "free":
		c.Found(false, at)
	default:
		t.Fatalf("no finding %q", *found)
	}
}

func TestWaitsVectorsTriesFirst(t *testing.T) {
	f := readWaits(t)
	if f.ContendedForMs != proto.ContendedFor.Milliseconds() {
		t.Fatalf("contended_for_ms %d, the client's %v", f.ContendedForMs, proto.ContendedFor)
	}
	for n, c := range f.TriesFirst {
		var seen proto.Contention
		t0 := time.Now()
		finding(t, &seen, c.Found, t0)
		ago := time.Duration(0)
		if c.AgoMs != nil {
			ago = time.Duration(*c.AgoMs) * time.Millisecond
		}
		if got := seen.TriesFirst(t0.Add(ago)); got != c.TriesFirst {
			t.Errorf("tries_first[%d] %+v: got %v", n, c, got)
		}
	}
}

func TestWaitsVectorsAcquires(t *testing.T) {
	for n, c := range readWaits(t).Acquires {
		var seen proto.Contention
		t0 := time.Now()
		finding(t, &seen, c.Before, t0)
		replies := c.Replies
		next := func(kind string) string {
			if len(replies) == 0 {
				t.Fatalf("acquires[%d]: a %s past the case's replies", n, kind)
			}
			r := replies[0]
			replies = replies[1:]
			return r
		}
		var sent []string
		// The clock stands still at t0: what an acquire leaves is read at once after it.
		now := func() time.Time { return t0 }
		try := func() (any, bool, error) {
			sent = append(sent, "try")
			switch r := next("try"); r {
			case "taken":
				return nil, true, nil
			case "held":
				return int64(100), false, nil
			default:
				t.Fatalf("acquires[%d]: a try answered %q", n, r)
				return nil, false, nil
			}
		}
		queue := func(asked bool, last any) proto.Waited {
			sent = append(sent, "wait")
			switch r := next("wait"); r {
			case "at_once":
				return proto.Waited{Granted: true, AtOnce: true}
			case "queued":
				return proto.Waited{Granted: true}
			case "timeout":
				return proto.Waited{Reply: int64(100)}
			default:
				t.Fatalf("acquires[%d]: a wait answered %q", n, r)
				return proto.Waited{}
			}
		}
		if _, err := proto.StartWait(&seen, true, now, try, queue); err != nil {
			t.Fatalf("acquires[%d]: %v", n, err)
		}
		if len(replies) != 0 || !reflect.DeepEqual(sent, c.Sends) {
			t.Errorf("acquires[%d] %+v: sent %v, replies left %v", n, c, sent, replies)
		}
		// What the acquire left: held (the next one queues at once) or free (it tries).
		if got := !seen.TriesFirst(t0); got != (c.After == "held") {
			t.Errorf("acquires[%d] %+v: left held=%v", n, c, got)
		}
	}
}

// A try (no wait) neither follows nor changes a handle's finding.
func TestWaitsTryAloneKeepsTheFinding(t *testing.T) {
	var seen proto.Contention
	t0 := time.Now()
	seen.Found(true, t0)
	tries := 0
	_, _ = proto.StartWait(&seen, false, func() time.Time { return t0 },
		func() (any, bool, error) { tries++; return nil, true, nil },
		func(bool, any) proto.Waited { t.Fatal("a try queued"); return proto.Waited{} })
	if tries != 1 || seen.TriesFirst(t0) {
		t.Fatalf("tries %d, finding changed: %v", tries, seen.TriesFirst(t0))
	}
}
