// What the black-box tests (package rlock_test) may see of the client's insides: its
// notification tag (which names its ticket channels), a test double of the ticket hub's
// probe answer (a server that names less than it can do), each held grant's
// confirmation outcome, the kill that ends a blocked wait (held back), and the ticket
// hubs' sweep of idle channels (without its wait).

package rlock

import "time"

// TicketTag is c's notification tag (`NOTIFY tag`).
func TicketTag(c *Client) string { return c.tag }

// WithProbeFilter rewrites every probe answer a ticket hub reads (RLOCK.HELLO).
func WithProbeFilter(f func(Capabilities) Capabilities) Option {
	return func(o *options) { o.probeFilter = f }
}

// WithConfirmHook is told each held grant's confirmation outcome (true: confirmed) once
// it is settled.
func WithConfirmHook(f func(ok bool)) Option {
	return func(o *options) { o.confirmHook = f }
}

// WithKillHook is called with a blocked wait's connection id just before the kill that
// ends it (its context ended); the kill waits for it to return.
func WithKillHook(f func(id int64)) Option {
	return func(o *options) { o.killHook = f }
}

// SweepTickets runs each ticket hub's sweep as if every idle channel's linger had passed.
func SweepTickets(c *Client) {
	c.mu.Lock()
	hubs := make([]*hub, 0, len(c.hubs))
	for _, h := range c.hubs {
		hubs = append(hubs, h)
	}
	c.mu.Unlock()
	for _, h := range hubs {
		h.mu.Lock()
		if h.sess != nil {
			h.sweep(h.sess, time.Now().Add(linger+time.Second))
		}
		h.mu.Unlock()
	}
}
