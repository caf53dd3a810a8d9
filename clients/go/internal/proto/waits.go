// How a waiting acquire starts (spec/vectors/waits.json): by asking without waiting on
// the client's quick path, or by queueing at once, from what its handle's last waiting
// acquire found. Pure logic: the client (waitCall in package rlock) hands in the I/O as
// two functions, so the blocking, timed and context-bound waits of every primitive share
// this one rule.

package proto

import (
	"sync"
	"time"
)

// ContendedFor is how long a handle's waiting acquires queue at once after one found
// the lock or the permits held by another: a contended loop acquires far more often.
const ContendedFor = time.Second

// Contention is what a handle's last waiting acquire found: held by another (and when),
// or free. Why it is kept: on an uncontended lock a queued ticket costs the hand-off of
// its reply from the ticket connection's reader to the caller, a try on the caller's own
// path does not; on a contended one a try that fails before every wait costs the server
// a command per acquisition. The zero value has found nothing yet; a nil *Contention
// always tries first and records nothing (a call no handle keeps findings for).
type Contention struct {
	mu     sync.Mutex
	heldAt time.Time // zero: found free, or nothing yet
}

// TriesFirst tells whether a waiting acquire starting at now asks without waiting
// first: unless the last one found it held less than ContendedFor ago.
func (c *Contention) TriesFirst(now time.Time) bool {
	if c == nil {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.heldAt.IsZero() || now.Sub(c.heldAt) >= ContendedFor
}

// Found records what a waiting acquire found at now: held by another, or free.
func (c *Contention) Found(held bool, now time.Time) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if held {
		c.heldAt = now
	} else {
		c.heldAt = time.Time{}
	}
}

// Waited is how a queued (or blocked, or scripts-mode) wait ended.
type Waited struct {
	Reply any
	Err   error
	// Granted: Reply is the grant. AtOnce: the waiting command was answered with it
	// (not QUEUED first); a blocked WAIT cannot tell, and says false.
	Granted, AtOnce bool
}

// StartWait runs one acquire that may wait (waits: it has a wait, forever or a limit;
// not a re-entry, which never waits), by seen's rule: try (the command without WAIT;
// taken: its reply is the grant), and, if that did not take it, queue with the rest of
// the wait (asked: a try was made, last its reply). Without waits it is a try alone,
// which neither follows nor changes seen. A try's error ends the call, seen unchanged.
// Returns the last reply and error.
func StartWait(seen *Contention, waits bool, now func() time.Time,
	try func() (reply any, taken bool, err error),
	queue func(asked bool, last any) Waited) (any, error) {
	if !waits {
		reply, _, err := try()
		return reply, err
	}
	asked := false
	var last any
	if seen.TriesFirst(now()) {
		reply, taken, err := try()
		if err != nil {
			return reply, err
		}
		// A try that found it held changed nothing in the server: the wait may reuse
		// its request id.
		seen.Found(!taken, now())
		if taken {
			return reply, nil
		}
		asked, last = true, reply
	}
	w := queue(asked, last)
	// A wait that ended without the grant (a timeout, the context's end, an error), or
	// whose grant came after QUEUED or cannot tell, found it held.
	seen.Found(!(w.Err == nil && w.Granted && w.AtOnce), now())
	return w.Reply, w.Err
}
