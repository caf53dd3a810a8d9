// Waiting with queued tickets (docs/commands/tickets.md): the I/O around internal/proto's ticket
// machine. One hub per server node with waiters: one pub/sub connection hears every
// ticket message (SUBSCRIBE, or SSUBSCRIBE on a cluster node), one command connection
// queues the tickets (`... WAIT t ASYNC ID id`) and collects grants, and one reader
// goroutine routes messages to waiters by request id. So a process holds two connections
// per node however many goroutines wait.
//
// A waiter subscribes its key's ticket channel (refcounted; confirmed before its ticket
// is queued, so a grant cannot be missed), sends its command, gets QUEUED (or the
// ordinary reply), and waits for its note: granted, timeout or error. Where the session's
// probe names `ticket-notify`, the channel is the client's own for that key
// (`rlock_ticket:{key}:<tag>`, the client's random tag) and the ticket is queued with
// `NOTIFY tag`, so a grant reaches only the process it is for, not every process waiting
// on the key; otherwise it is the key's channel, which every waiting process hears. A
// tagged channel whose last waiter left stays subscribed, idle (only this client's
// messages come there, so it hears nothing), and the next wait on the key uses it
// without a SUBSCRIBE; at most maxIdle per session, the one idle longest unsubscribed
// first, none carried over to a new session. Not on a cluster node (design.md 5: only the
// Rust client keeps idle shard channels), nor for the key's channel (an idle subscriber
// there hears every other client's messages): those are unsubscribed linger after their
// last waiter left. A cluster node that no longer serves a channel's slot answers its
// SSUBSCRIBE MOVED, which the reader takes as a broken session (every waiter re-routes):
// so a channel is never counted as subscribed on a node that refused it, and a lingering
// one cannot leave a later waiter deaf once the slot comes back. A
// new session's probe may answer otherwise (a failover to an older module): every
// waiter then moves to the matching channel before it queues again. A lock's, RW
// lock's, fenced lock's, semaphore's or expirable semaphore's waiter on a server naming
// `ticket-holds` holds on its granted note (the fenced token and the permit ids read from
// its detail): the reader sends the confirmation (the same command and id, without WAIT)
// off the holder's path and wakes the waiter at once; the confirmation's reply settles
// the hold's confirm, and one answered TAKENBACK (or left unanswered past confirmBound or
// the lease) reports the hold lost. The semaphore's permits have no owner, so its release
// waits for that confirmation and leaves out permits answered TAKENBACK (semaphore.go). A
// waiter whose detail this client cannot read collects first. Tickets live as long as
// the command connection that queued them; when either connection breaks, both are
// closed (the server drops the tickets and takes back uncollected grants; the command
// connection is the session's own, never the application's pool's, so closing it closes
// the socket), and every waiter re-sends with the same id on new ones. A timed wait ends at its own deadline on the client's clock, whatever
// the server has answered by then (the server's wait ends a little sooner, so that its
// `timeout` message, the answer without a collect, is normally in first). A waiter that
// leaves (its deadline came, its context ended) while its ticket is queued becomes an
// orphan: a later grant is collected and given back, as is a grant heard and not yet
// collected, or in the reply of a command still in flight: never kept by a caller that
// was told no.

package rlock

import (
	"container/list"
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rlock/rlock/clients/go/internal/proto"
)

// ConnectionName is the name the hub's connections give themselves (CLIENT LIST).
const ConnectionName = "rlock-go-tickets"

// Heartbeat is how often a hub with waiters checks its command connection (PING): a
// connection killed while idle loses its tickets without a message.
const heartbeat = time.Second

// commandTimeout bounds one command on the ticket connection (they answer at once).
const commandTimeout = 5 * time.Second

// errLost: the session carrying a command broke; the waiter re-sends on a new one.
var errLost = errors.New("rlock: ticket connection lost")

// errNoTickets: the node's probe did not name the tickets feature (no module, an older
// one, or an ACL refusing the probe); the waiter waits blocked instead (blockedWait).
var errNoTickets = errors.New("rlock: the server does not queue tickets")

type hub struct {
	c     *Client
	node  *redis.Client
	shard bool

	mu    sync.Mutex
	gen   uint64
	sess  *session
	chans map[string]*chanState
	// idle: the tagged channels nobody waits on, still subscribed, the one idle longest
	// first (at most maxIdle; trimIdle); a single server's hub only (keepsIdle).
	idle    *list.List
	waiters map[string]*waiter
	closed  bool
	// caps is what the last session's probe answered.
	caps proto.Capabilities
	// notify: the live session's probe named `ticket-notify`, so waiters queue with
	// `NOTIFY tag` and hear their messages on the key's channel for this client's tag
	// (proto.NotifyChannel); else on the key's channel. Every waiter's channel follows it.
	notify bool
	// blockers: every connection of blocked waits (no read timeout), each on a client of
	// its own, so that one a kill was aimed at is closed rather than reused
	// (killOnCancel); idleBlockers: the ones free, the one used last at the end.
	blockers     map[*redis.Client]struct{}
	idleBlockers []*redis.Client
}

// session is one generation of the hub's two connections.
type session struct {
	gen  uint64
	caps proto.Capabilities // what this session's probe answered
	ps   *redis.PubSub
	// conn is the command connection, the one connection of own: a connection of its
	// own, not one taken from the node's pool, whose Close would put it back in the pool
	// open, its tickets still queued (and their grants kept, never taken back) and a
	// later command of the application's on it. Closing own closes the socket, and the
	// server drops the tickets.
	own    *redis.Client
	conn   *redis.Conn
	sendMu sync.Mutex
	done   chan struct{}
}

type chanState struct {
	refs      int
	confirmed bool
	ready     chan struct{}
	// idleSince is when refs last fell to 0: the key's channel lingers (linger) so that
	// a key waited on again and again is not subscribed and unsubscribed every time.
	idleSince time.Time
	// idleAt: a tagged channel's place in hub.idle while nobody waits on it.
	idleAt *list.Element
}

// linger is how long a channel not kept idle (keepsIdle) stays subscribed after its last
// waiter left.
const linger = 5 * time.Second

// maxIdle bounds the tagged channels a session keeps subscribed with nobody waiting on
// them: a process that waits on many keys does not keep a subscription per key forever.
const maxIdle = 64

type event struct {
	ev  proto.Event
	gen uint64
}

type waiter struct {
	shape   proto.Shape
	channel string
	events  chan event
	orphan  bool
	// confirm: a Holds waiter's confirmation, settled by the reader's confirmGrant when
	// its grant is held on the granted note.
	confirm *confirm
}

// confirm is the outcome of a grant held on its granted note and confirmed off the
// holder's path: confirmed, taken back (TAKENBACK), or left in doubt (another answer, or
// none within its bound), whichever the confirmation settles on first; and the hooks told
// of it. A lock's or permit's hold is lost unless confirmed; a semaphore's release waits
// for it (done) and leaves out permits answered TAKENBACK (semaphore.go).
type confirm struct {
	// within bounds the confirmation's retries (confirmBound, or the lease if shorter).
	within  time.Duration
	mu      sync.Mutex
	settled bool
	outcome proto.Confirmed // ConfirmHeld, ConfirmTakenBack or ConfirmOther, once settled
	hooks   []func(proto.Confirmed)
	done    chan struct{} // closed when settled
}

func newConfirm(within time.Duration) *confirm {
	return &confirm{within: within, done: make(chan struct{})}
}

// onSettle runs f once with the outcome when it is settled (at once if it is).
func (c *confirm) onSettle(f func(proto.Confirmed)) {
	c.mu.Lock()
	if !c.settled {
		c.hooks = append(c.hooks, f)
		c.mu.Unlock()
		return
	}
	o := c.outcome
	c.mu.Unlock()
	f(o)
}

// onLost runs f once if the grant turns out not confirmed (at once if it was not):
// taken back, or left in doubt, which a hold must count as lost.
func (c *confirm) onLost(f func()) {
	c.onSettle(func(o proto.Confirmed) {
		if o != proto.ConfirmHeld {
			f()
		}
	})
}

// settle records the confirmation's outcome once and tells the hooks.
func (c *confirm) settle(o proto.Confirmed) {
	c.mu.Lock()
	if c.settled {
		c.mu.Unlock()
		return
	}
	c.settled, c.outcome = true, o
	hooks := c.hooks
	c.hooks = nil
	close(c.done)
	c.mu.Unlock()
	for _, f := range hooks {
		f(o)
	}
}

// confirmSlot is the context key under which a hold asks waitCall for the confirm of a
// wait that held on its grant (slot: a **confirm, nil when the wait collected or did not
// wait; lease: the hold's, which bounds its confirmation).
type confirmSlot struct{}

type confirmAsk struct {
	slot  **confirm
	lease time.Duration
}

func withConfirmSlot(ctx context.Context, slot **confirm, lease time.Duration) context.Context {
	return context.WithValue(ctx, confirmSlot{}, confirmAsk{slot, lease})
}

// confirmBound bounds the confirmation of a held grant whose ticket connection broke
// before its reply (or the hold's lease, if shorter: past it the lock is gone whatever the
// answer). The confirmation is sent again (same request id) until a definite answer: the
// grant's reply (held), or TAKENBACK (the server took the grant back
// `rlock.ticket-confirm-ms` after the ticket connection closed). A server that restarted
// from its AOF kept the grant and has no ticket connection to take it back from, so the
// wait rides out an outage shorter than this; unanswered by then, the hold is lost.
const confirmBound = 5 * time.Second

// confirmRetry: the pause before the n-th (from 0) retry of a confirmation, 10 ms
// doubling to 200 ms.
func confirmRetry(n int) time.Duration {
	d := 10 * time.Millisecond
	for i := 0; i < n && d < 200*time.Millisecond; i++ {
		d *= 2
	}
	return min(d, 200*time.Millisecond)
}

func newHub(c *Client, node *redis.Client, shard bool) *hub {
	return &hub{c: c, node: node, shard: shard, chans: map[string]*chanState{}, idle: list.New(), waiters: map[string]*waiter{}}
}

// close tears the hub down; its waiters see ErrClosed.
func (h *hub) close() {
	h.mu.Lock()
	h.closed = true
	s := h.sess
	h.sess = nil
	for b := range h.blockers {
		_ = b.Close()
	}
	h.blockers, h.idleBlockers = nil, nil
	for _, w := range h.waiters {
		deliver(w, event{ev: proto.Event{Lost: true}, gen: ^uint64(0)})
	}
	h.mu.Unlock()
	if s != nil {
		s.shutdown()
	}
}

func (s *session) shutdown() {
	select {
	case <-s.done:
		return
	default:
	}
	close(s.done)
	_ = s.ps.Close()
	// go-redis's Conn may not be closed while a command runs on it: close it once the
	// command in flight (if any) has returned. Until then the server may still hold a
	// ticket of ours there; a waiter queuing again under the same id meanwhile is safe
	// (a grant under that id is either collected by it, or taken back and forgotten).
	go func() {
		s.sendMu.Lock()
		defer s.sendMu.Unlock()
		s.closeConn()
	}()
}

// newCommandClient is a session's own client for its command connection: the node's
// options, one connection at most, none made ahead.
func newCommandClient(node *redis.Client) *redis.Client {
	o := *node.Options()
	o.PoolSize = 1
	o.MaxActiveConns = 1
	o.MinIdleConns = 0
	o.MaxIdleConns = 1
	return redis.NewClient(&o)
}

// closeConn closes the command connection for real (its own client), so the server
// drops the tickets queued on it and takes back their unconfirmed grants.
func (s *session) closeConn() {
	_ = s.conn.Close() // back to own's pool, which the next line closes
	_ = s.own.Close()
}

func deliver(w *waiter, e event) {
	select {
	case w.events <- e:
	default: // a waiter has at most one note and a few losses pending; never block the reader
	}
}

// join registers a waiter and counts its channel, subscribing it on a live session.
func (h *hub) join(shape proto.Shape) (*waiter, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, ErrClosed
	}
	w := &waiter{shape: shape, channel: h.channelOf(shape.Key()), events: make(chan event, 16)}
	h.waiters[shape.ID()] = w
	h.ref(w.channel)
	return w, nil
}

// channelOf is the channel key's tickets are heard on (h.mu held): the client's tagged
// channel where the live session's probe named `ticket-notify`, else the key's.
func (h *hub) channelOf(key string) string {
	if h.notify {
		return proto.NotifyChannel(key, h.c.tag)
	}
	return proto.TicketChannel(key)
}

// ref counts one waiter on channel (h.mu held), subscribing it on a live session. An
// idle channel is used as it is: its subscription is live on the current session (the
// session's end forgets it), so no grant can be missed.
func (h *hub) ref(channel string) {
	st := h.chans[channel]
	if st == nil {
		st = &chanState{ready: make(chan struct{})}
		h.chans[channel] = st
		if h.sess != nil {
			h.subscribe(h.sess, channel)
		}
	}
	if st.idleAt != nil {
		h.idle.Remove(st.idleAt)
		st.idleAt = nil
	}
	st.refs++
}

// keepsIdle tells whether channels stay subscribed idle after their last waiter (h.mu
// held): tagged ones (`ticket-notify`), where only this client's messages come, and only
// on a single server; a cluster node's shard channels linger as the key's channel does
// (design.md 5 says where only the Rust client keeps them idle).
func (h *hub) keepsIdle() bool { return h.notify && !h.shard }

// forget drops channel's state (h.mu held), idle or not; the caller unsubscribes it, or
// knows it is not subscribed.
func (h *hub) forget(channel string) {
	if st := h.chans[channel]; st != nil && st.idleAt != nil {
		h.idle.Remove(st.idleAt)
	}
	delete(h.chans, channel)
}

// trimIdle unsubscribes the tagged channels idle longest while more than maxIdle are
// idle (h.mu held). Only confirmed ones: an unconfirmed subscription's confirmation is
// still to come and must find its state (confirmed trims again then). With no live
// session nothing is subscribed: the state just goes.
func (h *hub) trimIdle() {
	for e := h.idle.Front(); e != nil && h.idle.Len() > maxIdle; {
		next := e.Next()
		ch := e.Value.(string)
		if st := h.chans[ch]; h.sess == nil || st.confirmed {
			h.forget(ch)
			if h.sess != nil {
				h.unsubscribe(h.sess, ch)
			}
		}
		e = next
	}
}

// rechannel moves every waiter to the channel h.notify gives (h.mu held, no live
// session: nothing is subscribed), after a new session's probe changed the answer. Each
// waiter queues again on that session, so its next ticket is queued the matching way.
func (h *hub) rechannel() {
	h.chans = map[string]*chanState{}
	h.idle.Init()
	for _, w := range h.waiters {
		w.channel = h.channelOf(w.shape.Key())
		h.ref(w.channel)
	}
}

func (h *hub) subscribe(s *session, channel string) {
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	var err error
	if h.shard {
		err = s.ps.SSubscribe(ctx, channel)
	} else {
		err = s.ps.Subscribe(ctx, channel)
	}
	if err != nil {
		go h.broken(s.gen)
	}
}

// unref drops one count of a channel (h.mu held), so that a key waited on again and
// again costs no SUBSCRIBE round trip per wait. The last one leaves a tagged channel
// idle (keepsIdle; the longest idle beyond maxIdle is unsubscribed), any other
// subscribed for linger (sweep unsubscribes it then).
func (h *hub) unref(channel string) {
	st := h.chans[channel]
	if st == nil {
		return
	}
	st.refs--
	if st.refs <= 0 && st.idleAt == nil {
		st.idleSince = time.Now()
		if h.keepsIdle() {
			st.idleAt = h.idle.PushBack(channel)
			h.trimIdle()
		}
	}
}

// sweep unsubscribes the channels not kept idle (keepsIdle) once nobody has waited on
// them for linger (h.mu held); idle ones stay (trimIdle bounds them). Only confirmed ones: an unconfirmed
// subscription's confirmation is still to come, and must find its state (confirmations
// always match the state they were sent for).
func (h *hub) sweep(s *session, now time.Time) {
	for ch, st := range h.chans {
		if st.refs <= 0 && st.idleAt == nil && st.confirmed && now.Sub(st.idleSince) > linger {
			h.forget(ch)
			h.unsubscribe(s, ch)
		}
	}
}

func (h *hub) unsubscribe(s *session, channel string) {
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	if h.shard {
		_ = s.ps.SUnsubscribe(ctx, channel)
	} else {
		_ = s.ps.Unsubscribe(ctx, channel)
	}
}

// rejoin moves a waiter to shape's fresh request id (its old id was answered TAKENBACK,
// and has no ticket queued), keeping its channel count and its events.
func (h *hub) rejoin(w *waiter, shape proto.Shape) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.waiters[w.shape.ID()] == w {
		delete(h.waiters, w.shape.ID())
	}
	w.shape = shape
	h.waiters[shape.ID()] = w
}

// leave unregisters a waiter whose wait is over (nothing of it is left in the server).
func (h *hub) leave(w *waiter) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.waiters[w.shape.ID()] == w {
		delete(h.waiters, w.shape.ID())
		h.unref(w.channel)
	}
}

// abandon turns a waiter whose ticket may still be queued into an orphan: its grant,
// if one comes, is collected and given back by the hub.
func (h *hub) abandon(w *waiter) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.waiters[w.shape.ID()] != w {
		return
	}
	w.orphan = true
	for {
		select {
		case e := <-w.events:
			h.orphanEvent(w, e.ev)
		default:
			return
		}
	}
}

// orphanEvent handles a note for an orphan (h.mu held).
func (h *hub) orphanEvent(w *waiter, ev proto.Event) {
	if ev.Note == nil {
		return
	}
	delete(h.waiters, w.shape.ID())
	h.unref(w.channel)
	// A grant, or a kind this client does not know (which may have been one): collect,
	// and give back what the reply says was granted.
	if (ev.Note.Kind == proto.Granted || ev.Note.Kind == proto.Other) && !w.shape.Latch {
		s := h.sess
		go h.giveBack(s, w)
	}
}

// giveBack collects an orphan's grant (which confirms it) and undoes it.
func (h *hub) giveBack(s *session, w *waiter) {
	if s == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	s.sendMu.Lock()
	reply, err := s.conn.Do(ctx, w.shape.Look()...).Result()
	s.sendMu.Unlock()
	if errors.Is(err, redis.Nil) {
		reply, err = nil, nil
	}
	if err != nil {
		return // the connection broke: the server took the grant back itself
	}
	for _, undo := range proto.Undo(&w.shape, reply) {
		_, _ = h.c.doRetry(ctx, undo)
	}
}

// session returns the live session, making one (and subscribing every counted channel)
// when there is none, and waits until w's channel's subscription is confirmed.
func (h *hub) session(ctx context.Context, w *waiter) (*session, error) {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil, ErrClosed
	}
	s := h.sess
	if s == nil {
		h.gen++
		s = &session{gen: h.gen, done: make(chan struct{}), own: newCommandClient(h.node)}
		s.conn = s.own.Conn()
		ctx2, cancel := context.WithTimeout(context.Background(), commandTimeout)
		// The probe, first on every new session: a reconnect may have reached another
		// server (a failover) that can do less. Without tickets the connection is closed
		// unnamed.
		caps, err := proto.ParseHello(s.conn.Do(ctx2, proto.HelloArgs()...).Result())
		if err == nil && h.c.opts.probeFilter != nil {
			caps = h.c.opts.probeFilter(caps)
		}
		if err == nil && !caps.Tickets() {
			err = errNoTickets
		}
		if err == nil {
			err = s.conn.ClientSetName(ctx2, ConnectionName).Err()
		}
		cancel()
		if err == nil || errors.Is(err, errNoTickets) {
			h.caps = caps
			s.caps = caps
		}
		if err != nil {
			s.closeConn()
			h.mu.Unlock()
			return nil, err
		}
		if h.shard {
			s.ps = h.node.SSubscribe(context.Background())
		} else {
			s.ps = h.node.Subscribe(context.Background())
		}
		if notify := caps.Has("ticket-notify"); notify != h.notify {
			// Before h.sess is set: rechannel's refs only count, the loop below
			// subscribes (each channel once).
			h.notify = notify
			h.rechannel()
		}
		h.sess = s
		for ch, st := range h.chans {
			if st.refs <= 0 {
				h.forget(ch) // idle since the last session: not subscribed again
				continue
			}
			st.confirmed = false
			st.ready = make(chan struct{})
			h.subscribe(s, ch)
		}
		go h.read(s)
	}
	var st *chanState
	if w != nil {
		st = h.chans[w.channel]
	}
	h.mu.Unlock()
	if st == nil {
		return s, nil
	}
	t := time.NewTimer(commandTimeout)
	defer t.Stop()
	select {
	case <-st.ready:
		return s, nil
	case <-s.done:
		return nil, errLost
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-t.C:
		h.broken(s.gen)
		return nil, errLost
	}
}

// broken ends session generation gen: both connections are closed (the server drops
// their tickets and takes back uncollected grants) and every waiter is told.
func (h *hub) broken(gen uint64) {
	h.mu.Lock()
	s := h.sess
	if s == nil || s.gen != gen {
		h.mu.Unlock()
		return
	}
	h.sess = nil
	for id, w := range h.waiters {
		if w.orphan {
			delete(h.waiters, id)
			h.unref(w.channel)
			continue
		}
		deliver(w, event{ev: proto.Event{Lost: true}, gen: gen})
	}
	for ch, st := range h.chans {
		if st.refs <= 0 {
			h.forget(ch) // idle: its subscription goes with the session
		}
	}
	h.mu.Unlock()
	s.shutdown()
}

// read is the session's reader: it confirms subscriptions, routes ticket messages, and
// checks the command connection while anyone waits.
func (h *hub) read(s *session) {
	lastSweep := time.Now()
	for {
		if now := time.Now(); now.Sub(lastSweep) > heartbeat {
			lastSweep = now
			h.mu.Lock()
			if h.sess == s {
				h.sweep(s, now)
			}
			h.mu.Unlock()
		}
		msg, err := s.ps.ReceiveTimeout(context.Background(), heartbeat)
		select {
		case <-s.done:
			return
		default:
		}
		if err != nil {
			var ne interface{ Timeout() bool }
			if errors.As(err, &ne) && ne.Timeout() {
				if !h.ping(s) {
					h.broken(s.gen)
					return
				}
				continue
			}
			h.broken(s.gen)
			return
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "sunsubscribe" {
				h.slotLeft(s, m.Channel)
				continue
			}
			h.confirmed(s, m)
		case *redis.Message:
			note, ok := proto.ParseNote(m.Payload)
			if !ok {
				continue
			}
			h.mu.Lock()
			if w := h.waiters[note.ID]; w != nil && h.sess == s {
				switch {
				case w.orphan:
					h.orphanEvent(w, proto.Event{Note: &note})
				case note.Kind == proto.Granted && w.confirm != nil && s.caps.Has("ticket-holds") && holdable(&w.shape, note.Detail):
					// Held now: the confirmation goes out beside the waiter's wake-up,
					// not before it (design.md 5).
					held, _ := w.shape.HoldReply(note.Detail)
					go h.confirmGrant(s, w.shape.Look(), held, w.confirm)
					deliver(w, event{ev: proto.Event{Note: &note, Held: true}, gen: s.gen})
				default:
					deliver(w, event{ev: proto.Event{Note: &note}, gen: s.gen})
				}
			}
			h.mu.Unlock()
		}
	}
}

// slotLeft handles a sunsubscribe: ours for an idle channel (sweep, trimIdle), or the
// server's own when the channel's slot left the node (Valkey 9's atomic slot migration),
// which takes an idle channel out of the idle set too. The old node answers the slot's
// tickets MOVED on that channel, which we no longer hear, and never grants them; so its
// waiters are told their ticket is gone, and waitCall learns the layout again and queues
// on the new owner with the same request id.
func (h *hub) slotLeft(s *session, channel string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.sess != s {
		return
	}
	st := h.chans[channel]
	if st == nil || !st.confirmed {
		// Ours: sweep or trimIdle forgot the channel before unsubscribing it, and a
		// channel joined again since is confirmed only by a reply that comes after this
		// one.
		return
	}
	h.forget(channel) // the waiters below leave; nothing is subscribed here now
	for id, w := range h.waiters {
		if w.channel != channel {
			continue
		}
		if w.orphan {
			delete(h.waiters, id) // its ticket went with the slot: no grant to give back
			continue
		}
		deliver(w, event{ev: proto.Event{Lost: true}, gen: s.gen})
	}
}

func (h *hub) confirmed(s *session, m *redis.Subscription) {
	if m.Kind != "subscribe" && m.Kind != "ssubscribe" {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	st := h.chans[m.Channel]
	if st == nil || h.sess != s || st.confirmed {
		return
	}
	st.confirmed = true
	close(st.ready)
	if st.idleAt != nil {
		h.trimIdle() // it went idle before it was confirmed
	}
}

// confirmGrant confirms a grant held on its granted note: look (the same command and id,
// without WAIT) on the session's command connection, which replays the grant's reply
// (held: nil, 1, the fenced lock's [nil, token], the permit ids). TAKENBACK settles it
// taken back; another answer (the lock found held by another, an error) settles it in
// doubt (proto.ConfirmAnswer). With no answer (the connection broke, the server restarts,
// or refuses new connections at maxclients) it is sent again on the application's
// connections, backing off (confirmRetry), until a definite answer or cf.within has passed
// (then in doubt). A redirection (the grant's slot moved on before the confirmation came:
// the migration carried the lock and its request id's record), TRYAGAIN or LOADING (a
// restarted server reading its AOF) is followed the same way, through the application's
// client, which routes by key in a cluster.
func (h *hub) confirmGrant(s *session, look []any, held any, cf *confirm) {
	settle := func(o proto.Confirmed) {
		if f := h.c.opts.confirmHook; f != nil {
			f(o == proto.ConfirmHeld) // first: a test reads it once a release has waited
		}
		cf.settle(o)
	}
	answer := func(v any, err error) proto.Confirmed {
		if errors.Is(err, redis.Nil) {
			v, err = nil, nil
		}
		var re redis.Error
		switch {
		case err == nil:
			return proto.ConfirmAnswer(v, "", false, held)
		case errors.As(err, &re):
			return proto.ConfirmAnswer(nil, err.Error(), true, held)
		}
		return proto.ConfirmRetry // no answer: a broken connection, a timeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	s.sendMu.Lock()
	reply, err := s.conn.Do(ctx, look...).Result()
	s.sendMu.Unlock()
	cancel()
	if o := answer(reply, err); o != proto.ConfirmRetry {
		settle(o)
		return
	}
	var re redis.Error
	if !errors.As(err, &re) {
		h.broken(s.gen)
	}
	until := time.Now().Add(cf.within)
	for n := 0; ; n++ {
		left := time.Until(until)
		if left <= 0 {
			settle(proto.ConfirmOther)
			return
		}
		// go-redis bounds a read by its ReadTimeout, not by the context: the wait for
		// the reply is bounded here instead.
		type result struct {
			v   any
			err error
		}
		got := make(chan result, 1)
		go func() {
			cctx, cancel := context.WithTimeout(context.Background(), left)
			defer cancel()
			v, err := h.c.rdb.Do(cctx, look...).Result()
			got <- result{v, err}
		}()
		t := time.NewTimer(left)
		select {
		case r := <-got:
			t.Stop()
			if o := answer(r.v, r.err); o != proto.ConfirmRetry {
				settle(o)
				return
			}
			if h.c.cluster != nil && redirected(r.err) {
				h.c.cluster.ReloadState(context.Background())
			}
			_ = sleep(context.Background(), min(confirmRetry(n), time.Until(until)))
		case <-t.C:
			settle(proto.ConfirmOther)
			return
		}
	}
}

// ping checks the command connection while anyone waits.
func (h *hub) ping(s *session) bool {
	h.mu.Lock()
	n := len(h.waiters)
	h.mu.Unlock()
	if n == 0 {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	return s.conn.Ping(ctx).Err() == nil
}

// send runs one command of w's on the session's command connection; queue: it queues a
// ticket, which takes `NOTIFY tag` where the session's probe named `ticket-notify` (the
// waiter's channel, set by the same probe, is then the tagged one).
func (h *hub) send(ctx context.Context, w *waiter, args []any, queue bool) (uint64, any, error) {
	s, err := h.session(ctx, w)
	if err != nil {
		return 0, nil, err
	}
	if queue && s.caps.Has("ticket-notify") {
		args = proto.Notify(args, h.c.tag)
	}
	cctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	s.sendMu.Lock()
	reply, err := s.conn.Do(cctx, args...).Result()
	s.sendMu.Unlock()
	if errors.Is(err, redis.Nil) {
		return s.gen, nil, nil
	}
	var re redis.Error
	if err != nil && !errors.As(err, &re) {
		// No reply: the command may or may not have queued a ticket. Close the session
		// so that the server forgets whatever it did, and queue again.
		h.broken(s.gen)
		return s.gen, nil, errLost
	}
	return s.gen, reply, err
}

// wait runs one waiting command (with `WAIT w`) as a queued ticket and returns its
// final reply: the grant collected, or the ordinary reply after a timeout. A timed wait
// ends at its own deadline on the client's clock (Machine.Deadline), whatever the server
// has answered by then, a command in flight included: a frozen or loaded server's answer
// comes late. The server's wait is asked to end a little sooner (proto.TimeoutLead), so
// its `timeout` message is normally in first. queued, if not nil, is told whether a
// command of the wait was answered QUEUED (Machine.Queued).
func (h *hub) wait(ctx context.Context, args []any, queued *bool) (any, error) {
	shape, ok := proto.ShapeOf(args)
	if !ok {
		return nil, errors.New("rlock: not a waiting command")
	}
	w, err := h.join(shape)
	if err != nil {
		return nil, err
	}
	if ask, asked := ctx.Value(confirmSlot{}).(confirmAsk); asked && shape.Holds() {
		// The caller takes the hold's confirm (and reports a take-back): it may hold on
		// the granted message. Any other caller collects.
		w.confirm = newConfirm(confirmBound)
		if ask.lease > 0 && ask.lease < confirmBound {
			w.confirm.within = ask.lease
		}
	}
	started := time.Now()
	m := proto.NewMachine(shape, started)
	if queued != nil {
		defer func() { *queued = m.Queued }()
	}
	var deadline <-chan time.Time
	if dl, timed := m.Deadline(); timed {
		t := time.NewTimer(time.Until(dl))
		defer t.Stop()
		deadline = t.C
	}
	step := m.Start(started)
	var gen uint64
	losses := 0
	var lastErr error
	// pending: the reply of the command in flight; pause: the backoff before sending
	// again after a lost connection. Events wait in w.events meanwhile, so that a note
	// is never read before the reply of the command that queued its ticket.
	var pending chan sent
	var pause <-chan time.Time
	for {
		if step.Done {
			h.leave(w)
			return outcome(ctx, w, step)
		}
		var events <-chan event
		if pending == nil && pause == nil {
			if step.Send != nil {
				pending = h.sendAsync(ctx, w, step.Send, step.Queue)
				step = proto.Step{Wait: true}
			} else {
				events = w.events
			}
		}
		select {
		case r := <-pending:
			pending = nil
			if errors.Is(r.err, errNoTickets) {
				h.leave(w) // nothing was sent: the probe came first
				return nil, r.err
			}
			if errors.Is(r.err, errLost) || (r.err != nil && transient(r.err)) {
				if h.shard {
					// A cluster node's session broke: the node may have failed over or
					// given the slot away; waitCall asks the cluster again where to queue.
					h.leave(w)
					return nil, errLost
				}
				lastErr = r.err
				losses++
				if losses >= h.c.opts.backoff.Attempts+1 {
					h.leave(w)
					return nil, lastErr
				}
				pause = time.After(h.c.opts.backoff.Delay(losses - 1))
				continue
			}
			if r.err != nil && !isRedisErr(r.err) {
				h.abandonOrLeave(w, m, nil)
				return nil, r.err
			}
			gen = r.gen
			step = m.On(proto.Event{Reply: r.reply, Err: r.err}, time.Now())
			if m.Shape.ID() != w.shape.ID() {
				h.rejoin(w, m.Shape) // TAKENBACK: queued again under a fresh id
			}
		case <-pause:
			pause = nil
			step = m.On(proto.Event{Lost: true}, time.Now())
			if step.Wait { // nothing was outstanding: send the same command again
				step = m.Start(time.Now())
			}
		case e := <-events:
			if e.gen == ^uint64(0) {
				h.leave(w)
				return nil, ErrClosed
			}
			if e.ev.Lost && e.gen != gen {
				continue
			}
			if e.ev.Lost && h.shard {
				h.leave(w) // the session, and our ticket with it, is gone: re-route
				return nil, errLost
			}
			step = m.On(e.ev, time.Now())
		case <-ctx.Done():
			h.abandonOrLeave(w, m, pending)
			return nil, ctx.Err()
		case <-deadline:
			// expire has left (or orphaned) the waiter itself.
			return outcome(ctx, w, h.expire(w, m, gen, pending))
		}
	}
}

// outcome is the reply of w's finished wait; a grant held on its granted message leaves
// its confirm where the caller asked for it (withConfirmSlot).
func outcome(ctx context.Context, w *waiter, step proto.Step) (any, error) {
	if step.Held {
		if ask, ok := ctx.Value(confirmSlot{}).(confirmAsk); ok {
			*ask.slot = w.confirm
		}
	}
	return step.Reply, step.Err
}

// sent is the outcome of one command on the ticket connection (hub.send).
type sent struct {
	gen   uint64
	reply any
	err   error
}

// sendAsync runs hub.send in a goroutine of its own, so that the waiter can leave at its
// deadline while the command waits for its reply.
func (h *hub) sendAsync(ctx context.Context, w *waiter, args []any, queue bool) chan sent {
	out := make(chan sent, 1)
	go func() {
		g, reply, err := h.send(ctx, w, args, queue)
		out <- sent{g, reply, err}
	}()
	return out
}

// expire ends w's wait at its deadline (Machine.Expire): from the events heard by then,
// read under h.mu so that no more can come, its outcome; under the same lock it leaves
// as an orphan (its ticket may still be queued, or a command is in flight), or gives
// back a grant heard and not collected. gen is the session its last command went on.
func (h *hub) expire(w *waiter, m *proto.Machine, gen uint64, pending chan sent) proto.Step {
	h.mu.Lock()
	var heard []proto.Event
	for drained := false; !drained; {
		select {
		case e := <-w.events:
			if !e.ev.Lost || e.gen == gen {
				heard = append(heard, e.ev)
			}
		default:
			drained = true
		}
	}
	step, leaves := m.Expire(heard, time.Now())
	registered := h.waiters[w.shape.ID()] == w
	switch {
	case !registered:
	case leaves == proto.LeavesOrphan && (pending != nil || h.sess != nil && h.sess.gen == gen):
		// As ctx's end would (abandon), but now: a message after this goes to the
		// orphan (a reply in flight goes to lateReply).
		w.orphan = true
	case leaves == proto.LeavesUndo && !w.shape.Latch:
		delete(h.waiters, w.shape.ID())
		h.unref(w.channel)
		go h.giveBack(h.sess, w)
	default:
		// Known gone, or gone with the session its ticket was queued on.
		delete(h.waiters, w.shape.ID())
		h.unref(w.channel)
	}
	h.mu.Unlock()
	if pending != nil {
		go h.lateReply(w, pending)
	}
	return step
}

// lateReply settles the command that was in flight when its waiter left (its deadline,
// or its context's end): a ticket it queued is the orphan's, whose note settles it; any
// other reply is the wait's answer nobody takes, so a grant in it is given back.
func (h *hub) lateReply(w *waiter, pending chan sent) {
	r := <-pending
	if s, ok := r.reply.(string); ok && r.err == nil && s == "QUEUED" {
		return
	}
	h.leave(w)
	if r.err != nil || w.shape.Latch {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	for _, undo := range proto.Undo(&w.shape, r.reply) {
		_, _ = h.c.doRetry(ctx, undo)
	}
}

// blockedWait runs a waiting command (with `WAIT w`, no ASYNC) as a blocked wait on a
// connection of its own: how a wait goes on a server whose probe did not name tickets.
// The caller's context ending kills that connection (CLIENT KILL ID, killOnCancel),
// which drops the wait in the server; a grant that raced the kill is given back.
func (h *hub) blockedWait(ctx context.Context, args []any) (any, error) {
	shape, ok := proto.ShapeOf(args)
	if !ok {
		return nil, errors.New("rlock: not a waiting command")
	}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil, ErrClosed
	}
	b := h.takeBlocker()
	h.mu.Unlock()
	conn := b.Conn()
	id, err := conn.ClientID(ctx).Result()
	if err != nil {
		h.putBlocker(b, conn, false)
		return nil, err
	}
	finished := make(chan struct{})
	go h.killOnCancel(ctx, b, conn, id, finished)
	reply, err := conn.Do(context.Background(), args...).Result()
	close(finished) // conn is killOnCancel's from here
	if errors.Is(err, redis.Nil) {
		reply, err = nil, nil
	}
	if ctx.Err() != nil {
		if err == nil {
			uctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
			defer cancel()
			for _, undo := range proto.Undo(&shape, reply) {
				_, _ = h.c.doRetry(uctx, undo)
			}
		}
		return nil, ctx.Err()
	}
	return reply, err
}

// killOnCancel ends a blocked wait whose caller's context ended before its reply: CLIENT
// KILL ID id on another connection, which drops the wait in the server. It gives the
// wait's connection back once the wait has finished: for the next blocked wait if no
// kill was aimed at it, else closed. A kill may still be on its way when the wait's
// reply has come (the grant raced it), and would end whichever blocked wait ran on the
// connection by the time it lands.
func (h *hub) killOnCancel(ctx context.Context, b *redis.Client, conn *redis.Conn, id int64, finished chan struct{}) {
	select {
	case <-finished:
		h.putBlocker(b, conn, false)
		return
	case <-ctx.Done():
	}
	select {
	case <-finished: // the reply came first: nothing to kill
		h.putBlocker(b, conn, false)
		return
	default:
	}
	if f := h.c.opts.killHook; f != nil {
		f(id)
	}
	kctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	_ = h.node.ClientKillByFilter(kctx, "ID", proto.Strings([]any{id})[0]).Err()
	cancel()
	<-finished
	h.putBlocker(b, conn, true)
}

// takeBlocker is a free connection for a blocked wait, on a client of its own (h.mu
// held): one connection, no read timeout (the server ends the wait, or a kill does).
func (h *hub) takeBlocker() *redis.Client {
	if n := len(h.idleBlockers); n > 0 {
		b := h.idleBlockers[n-1]
		h.idleBlockers = h.idleBlockers[:n-1]
		return b
	}
	o := *h.node.Options()
	o.ReadTimeout = -1
	o.ContextTimeoutEnabled = false
	o.PoolSize, o.MaxActiveConns, o.MinIdleConns, o.MaxIdleConns = 1, 1, 0, 1
	b := redis.NewClient(&o)
	if h.blockers == nil {
		h.blockers = map[*redis.Client]struct{}{}
	}
	h.blockers[b] = struct{}{}
	return b
}

// putBlocker gives back a blocked wait's connection: kept for the next one (at most the
// node's pool size of them idle), or closed with its client when a kill was aimed at it
// (killed), or the hub closed.
func (h *hub) putBlocker(b *redis.Client, conn *redis.Conn, killed bool) {
	_ = conn.Close() // back to b's own pool
	h.mu.Lock()
	_, open := h.blockers[b]
	keep := open && !killed && len(h.idleBlockers) < h.node.Options().PoolSize
	if keep {
		h.idleBlockers = append(h.idleBlockers, b)
	} else {
		delete(h.blockers, b)
	}
	h.mu.Unlock()
	if open && !keep {
		_ = b.Close()
	}
}

// abandonOrLeave ends w's wait before its answer (its context ended): an orphan while a
// ticket of its may be queued or a command is in flight (pending, settled by lateReply).
func (h *hub) abandonOrLeave(w *waiter, m *proto.Machine, pending chan sent) {
	if m.Outstanding || pending != nil {
		h.abandon(w)
	} else {
		h.leave(w)
	}
	if pending != nil {
		go h.lateReply(w, pending)
	}
}

// holdable tells whether a granted note's detail gives shape's grant without a collect.
func holdable(shape *proto.Shape, detail string) bool {
	_, ok := shape.HoldReply(detail)
	return ok
}

func isRedisErr(err error) bool {
	var re redis.Error
	return errors.As(err, &re) || errors.As(err, new(proto.ServerError))
}
