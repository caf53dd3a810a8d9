// What the black-box tests (package rlock_test) may see of the client's insides: its
// notification tag (which names its ticket channels), a test double of the ticket hub's
// probe answer (a server that names less than it can do), and each held grant's
// confirmation outcome.

package rlock

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
