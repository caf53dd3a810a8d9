// The engine every owned hold shares: the Mutex, the fenced lock and both sides of the
// read-write lock are one owner id holding one server-side hold, re-entrant per handle.
// It acquires (at once, then as a queued ticket), counts re-entries, releases, extends,
// renews with the watchdog, and reports a lost hold. The primitives only choose the
// command words (proto.Hold) and read the acquire reply.

package rlock

import (
	"context"
	"sync"
	"time"

	"github.com/rlock/rlock/clients/go/internal/proto"
)

type hold struct {
	c       *Client
	words   proto.Hold
	lease   time.Duration // 0: the watchdog's
	tryWait time.Duration // TryLock's wait limit (0: no wait)
	parse   func(any) (proto.Acquired, error)
	// seen: what this handle's last waiting acquire found (proto.StartWait).
	seen proto.Contention

	mu        sync.Mutex
	holds     int
	epoch     uint64
	done      chan struct{}
	err       error // why the last hold ended: ErrLost, or ErrNotHeld when released
	leaseFrom time.Time
	token     int64
	stopWatch chan struct{}
}

func newHold(c *Client, words proto.Hold, lease, tryWait time.Duration) *hold {
	done := make(chan struct{})
	close(done)
	return &hold{c: c, words: words, lease: lease, tryWait: tryWait, parse: proto.ParseAcquire,
		done: done, err: ErrNotHeld}
}

func (h *hold) leaseOrWatchdog() time.Duration {
	if h.lease > 0 {
		return h.lease
	}
	return h.c.opts.watchdog
}

// acquire takes one hold. wait < 0: answer at once (ErrTaken when held by another);
// forever: wait until granted or ctx ends; otherwise wait up to wait (ErrTimeout).
func (h *hold) acquire(ctx context.Context, op string, wait time.Duration, forever bool) error {
	lease := h.leaseOrWatchdog()
	leaseMs := proto.Millis(lease)
	for {
		h.mu.Lock()
		reentry, epoch := h.holds > 0, h.epoch
		h.mu.Unlock()
		id := proto.RequestID()
		sent := time.Now()
		build := func(waitMs int64) []any { return h.words.Acquire(leaseMs, waitMs, id) }
		satisfied := func(v any) bool { a, err := h.parse(v); return err != nil || a.Held }
		var reply any
		var err error
		// A wait that held on its granted note (design.md 5) leaves its confirm here.
		var cf *confirm
		if reentry {
			// A re-entry never waits: the server answers at once.
			reply, err = h.c.doRetry(ctx, build(-1))
		} else {
			w := wait
			if wait < 0 {
				w = 0
			}
			reply, err = h.c.waitCall(withConfirmSlot(ctx, &cf, lease), h.words.Key, w, forever, &h.seen, build, satisfied)
		}
		if err != nil {
			return opErr(op, h.words.Key, err)
		}
		a, err := h.parse(reply)
		if err != nil {
			return opErr(op, h.words.Key, err)
		}
		if !a.Held {
			if reentry {
				// We thought we held it and another owner does: ours was lost. Report
				// it, then start over as a new acquire.
				h.lost(epoch)
				continue
			}
			return opErr(op, h.words.Key, notServed(ctx, wait, forever))
		}
		// A grant after a long wait started its lease somewhere between the send and
		// now; when a renewal would already be due, re-arm it now and count from there.
		if time.Since(sent) > lease/3 {
			renewAt := time.Now()
			if ok, rerr := h.renewOnce(ctx, leaseMs); rerr == nil && ok {
				sent = renewAt
			} else if rerr == nil {
				if !reentry {
					continue // handed the lock, then it was gone: wait again
				}
			}
		}
		if err := h.replicaSync(ctx, leaseMs); err != nil {
			return opErr(op, h.words.Key, err)
		}
		h.mu.Lock()
		if h.holds == 0 {
			h.epoch++
			h.done = make(chan struct{})
			h.err = nil
			h.stopWatch = make(chan struct{})
			go h.watch(h.epoch, h.stopWatch, h.done)
		}
		h.holds++
		h.leaseFrom = sent
		if a.Token != 0 {
			h.token = a.Token
		}
		held := h.epoch
		h.mu.Unlock()
		if cf != nil {
			// A grant taken back before its confirmation landed is a lost hold.
			cf.onLost(func() { h.lost(held) })
		}
		return nil
	}
}

func (h *hold) renewOnce(ctx context.Context, leaseMs int64) (bool, error) {
	v, err := h.c.doRetry(ctx, h.words.Renew(leaseMs))
	if err != nil {
		return false, err
	}
	return proto.ParseBool("RENEW", v)
}

// replicaSync waits until the replicas connected to the lock's server have the lock
// (RENEW then WAIT on one connection: WAIT counts that connection's own writes, and the
// RENEW covers the lock even when another client's handoff wrote it). Too few: the
// lock is released again and ErrReplicaSync returned.
func (h *hold) replicaSync(ctx context.Context, leaseMs int64) error {
	if h.c.opts.replicas == 0 {
		return nil
	}
	node, err := h.c.nodeFor(ctx, h.words.Key)
	if err != nil {
		return err
	}
	n := h.c.replicasToSync(ctx, node)
	if n <= 0 {
		return nil
	}
	renew := h.words.Renew(leaseMs)
	if h.c.scriptsOn(ctx) {
		if renew, err = scriptEval(renew); err != nil {
			return err
		}
	}
	pipe := node.Pipeline()
	pipe.Do(ctx, renew...)
	w := pipe.Do(ctx, proto.WaitReplicas(n, proto.Millis(h.c.opts.replicaTimeout))...)
	_, err = pipe.Exec(ctx)
	acked, perr := w.Int64()
	if err == nil && perr == nil && acked >= int64(n) {
		return nil
	}
	h.mu.Lock()
	first := h.holds == 0
	h.mu.Unlock()
	if first {
		_, _ = h.c.doRetry(ctx, h.words.Release(0, proto.RequestID()))
	}
	if err != nil {
		return err
	}
	return &replicaError{wanted: n, acked: acked}
}

type replicaError struct {
	wanted int
	acked  int64
}

func (e *replicaError) Error() string {
	return ErrReplicaSync.Error() + ": " + itoa(e.acked) + " of " + itoa(int64(e.wanted)) + " acknowledged"
}
func (e *replicaError) Unwrap() error { return ErrReplicaSync }

// release gives back one hold: freed reports that it was the last.
func (h *hold) release(ctx context.Context, op string) (freed bool, err error) {
	h.mu.Lock()
	if h.holds == 0 {
		err := h.err
		h.mu.Unlock()
		if err == nil {
			err = ErrNotHeld
		}
		return false, opErr(op, h.words.Key, err)
	}
	epoch, last := h.epoch, h.holds == 1
	if last {
		// Stop renewing before the lock can be freed, so a late renewal never reports
		// the loss of a lock given up on purpose.
		close(h.stopWatch)
		h.stopWatch = nil
	}
	h.mu.Unlock()
	var leaseMs int64
	if h.lease == 0 {
		leaseMs = proto.Millis(h.c.opts.watchdog) // a re-entrant release keeps the full lease
	}
	v, err := h.c.doRetry(ctx, h.words.Release(leaseMs, proto.RequestID()))
	if err == nil {
		var r proto.Released
		if r, err = proto.ParseRelease(v); err == nil {
			switch r {
			case proto.StillHeld:
				h.mu.Lock()
				if h.epoch == epoch && h.holds > 1 {
					h.holds--
				}
				h.mu.Unlock()
				return false, nil
			case proto.Freed:
				h.end(epoch, ErrNotHeld)
				return true, nil
			default:
				h.lost(epoch)
				return false, opErr(op, h.words.Key, ErrLost)
			}
		}
	}
	if last {
		// Unknown outcome: the lock is left to its lease, which nobody renews now.
		h.end(epoch, ErrNotHeld)
	}
	return false, opErr(op, h.words.Key, err)
}

// extend re-arms the lease of a held lock to its full length.
func (h *hold) extend(ctx context.Context) (bool, error) {
	h.mu.Lock()
	held, epoch := h.holds > 0, h.epoch
	h.mu.Unlock()
	if !held {
		return false, opErr("extend", h.words.Key, ErrNotHeld)
	}
	at := time.Now()
	ok, err := h.renewOnce(ctx, proto.Millis(h.leaseOrWatchdog()))
	if err != nil {
		return false, opErr("extend", h.words.Key, err)
	}
	if !ok {
		h.lost(epoch)
		return false, opErr("extend", h.words.Key, ErrLost)
	}
	h.mu.Lock()
	if h.epoch == epoch {
		h.leaseFrom = at
	}
	h.mu.Unlock()
	return true, nil
}

// end closes epoch with why (ErrLost or ErrNotHeld for a release).
func (h *hold) end(epoch uint64, why error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.epoch != epoch || h.holds == 0 {
		return
	}
	h.holds = 0
	h.err = why
	if h.stopWatch != nil {
		close(h.stopWatch)
		h.stopWatch = nil
	}
	close(h.done)
}

func (h *hold) lost(epoch uint64) { h.end(epoch, ErrLost) }

// watch renews the hold of epoch every third of the watchdog lease (a lock with a fixed
// lease is only watched for its end), with the loop every renewed thing shares (watch).
func (h *hold) watch(epoch uint64, stop, done chan struct{}) {
	lease := h.leaseOrWatchdog()
	watch(h.c, lease, h.lease == 0, stop, done,
		func() time.Time { h.mu.Lock(); defer h.mu.Unlock(); return h.leaseFrom },
		func(at time.Time) {
			h.mu.Lock()
			if h.epoch == epoch && at.After(h.leaseFrom) {
				h.leaseFrom = at
			}
			h.mu.Unlock()
		},
		h.words.Renew(proto.Millis(lease)),
		func() { h.lost(epoch) })
}

// watch is the watchdog loop of one held thing (a lock's hold, a permit): while renew,
// it sends renewCmd (answering 1 while held, 0 when not) every third of lease, counting
// the lease from each renewal's send (from / renewed); without renew it only waits for
// the lease's end. A renewal that fails transiently is retried with backoff until the
// lease would have run out; 0, or the lease running out, calls lost. It returns when
// stop or done is closed.
func watch(c *Client, lease time.Duration, renew bool, stop, done <-chan struct{},
	from func() time.Time, renewed func(time.Time), renewCmd []any, lost func()) {
	interval := lease / 3
	retry := 0
	for {
		next := time.Until(from().Add(lease))
		if renew {
			next = time.Until(from().Add(interval))
			if retry > 0 {
				next = c.opts.backoff.Delay(retry)
			}
		}
		t := time.NewTimer(next)
		select {
		case <-stop:
			t.Stop()
			return
		case <-done:
			t.Stop()
			return
		case <-t.C:
		}
		if !time.Now().Before(from().Add(lease)) {
			lost()
			return
		}
		if !renew {
			continue // extended meanwhile
		}
		// The renewal runs beside the lease's end: a call stuck on a cut-off connection
		// (go-redis waits up to its ReadTimeout) must not delay the loss being reported
		// when the lease, counted from the last renewal's send, has run out.
		at := time.Now()
		type reply struct {
			v   any
			err error
		}
		got := make(chan reply, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), interval)
			defer cancel()
			v, err := c.do(ctx, renewCmd)
			got <- reply{v, err}
		}()
		end := time.NewTimer(time.Until(from().Add(lease)))
		var r reply
		select {
		case r = <-got:
			end.Stop()
		case <-end.C:
			lost()
			return
		case <-stop:
			end.Stop()
			return
		case <-done:
			end.Stop()
			return
		}
		if r.err != nil {
			retry++
			continue
		}
		retry = 0
		ok, err := proto.ParseBool("renew", r.v)
		if err != nil || !ok {
			lost()
			return
		}
		renewed(at)
	}
}

// doneChan and errNow are Done and Err of the primitives.
func (h *hold) doneChan() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.done
}

func (h *hold) errNow() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.holds > 0 {
		return nil
	}
	return h.err
}

func (h *hold) held() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.holds
}
