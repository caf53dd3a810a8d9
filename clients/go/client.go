// The Client: one per process and Redis deployment, shared by every lock it makes. It
// owns the client id (the first half of every owner id), the options, the ticket hubs
// (one notification connection per node with waiters) and the replica counts; it sends
// commands through the application's own go-redis client.

package rlock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/rlock/rlock/clients/go/internal/proto"
)

// DefaultWatchdogTimeout is the lease of a lock taken without a lease of its own; the
// watchdog renews it every third of it for as long as it is held (Redisson's
// lockWatchdogTimeout).
const DefaultWatchdogTimeout = 30 * time.Second

// DefaultReplicaSyncTimeout bounds the WAIT for replicas after an acquire.
const DefaultReplicaSyncTimeout = 1 * time.Second

// Mode says how the client talks to the server (docs/scripts-mode.md).
type Mode int

const (
	// ModeAuto (the default): the module's commands where RLOCK.HELLO answers, Redisson's
	// scripts where the server does not know it (scripts.go).
	ModeAuto Mode = iota
	// ModeModule: the rlock module's commands; without the module they fail with the
	// server's "unknown command".
	ModeModule
	// ModeScripts: Redisson's scripts, also on a module-loaded server (Info, which no
	// Redisson script does, answers ErrNeedsModule).
	ModeScripts
)

// WithMode sets how the client talks to the server (default ModeAuto).
func WithMode(m Mode) Option { return func(o *options) { o.mode = m } }

type options struct {
	watchdog       time.Duration
	backoff        proto.Backoff
	replicas       int // -1: as many as are connected (the default); 0: off; n: n
	replicaTimeout time.Duration
	clientID       string
	mode           Mode
	blockingWaits  bool
	// probeFilter rewrites each ticket hub's probe answer: a test double of a server
	// that names less (export_test.go); nil everywhere else.
	probeFilter func(proto.Capabilities) proto.Capabilities
	// confirmHook is told each held grant's confirmation outcome once settled (tests,
	// export_test.go); nil everywhere else.
	confirmHook func(ok bool)
	// killHook is called with a blocked wait's connection id just before the kill
	// that ends it (tests hold the kill back, export_test.go); nil everywhere else.
	killHook func(id int64)
}

// Option configures a Client.
type Option func(*options)

// WithWatchdogTimeout sets the lease of locks taken without one (default 30 s); they
// are renewed every third of it.
func WithWatchdogTimeout(d time.Duration) Option { return func(o *options) { o.watchdog = d } }

// WithRetry sets how transient failures (a broken connection, LOADING, TRYAGAIN, a
// failover's READONLY) are retried: at most attempts tries in all, with capped
// exponential backoff and full jitter between them. Retries of acquires and releases
// carry the same request id, so none is applied twice.
func WithRetry(attempts int, base, max time.Duration) Option {
	return func(o *options) { o.backoff = proto.Backoff{Attempts: attempts, Base: base, Cap: max} }
}

// WithReplicaSync makes every acquire wait (`WAIT replicas timeout`) until that many
// replicas have the lock, releasing it and failing with ErrReplicaSync otherwise. The
// default is as many replicas as the lock's server has connected (none: no WAIT), as
// Redisson's checkLockSyncedSlaves does.
func WithReplicaSync(replicas int, timeout time.Duration) Option {
	return func(o *options) { o.replicas, o.replicaTimeout = replicas, timeout }
}

// WithoutReplicaSync turns the replica sync after acquire off.
func WithoutReplicaSync() Option { return func(o *options) { o.replicas = 0 } }

// WithBlockingWaits makes every wait a blocked `WAIT` on a connection of its own (held
// while it waits, so one per waiting goroutine) instead of a queued ticket on the client's
// one ticket connection (the default). Each grant then wakes only its waiter's connection;
// a ticket's grant message does too where the server names `ticket-notify` (each client
// hears its own channel), but reaches every process waiting on the key where it does not
// (an older module: one ticket channel per key). Worth it there, for one waiting goroutine
// per process and many processes on one key (BENCHMARK.md's Go table); not for many
// waiting goroutines, which each hold a connection and cost the server tens of KB.
func WithBlockingWaits() Option { return func(o *options) { o.blockingWaits = true } }

// WithClientID sets the client part of owner ids (default: a fresh v4 uuid).
func WithClientID(id string) Option { return func(o *options) { o.clientID = id } }

// Client makes locks and synchronizers on one Redis deployment. It is safe for
// concurrent use; make one per process and share it.
type Client struct {
	rdb     redis.UniversalClient
	single  *redis.Client
	cluster *redis.ClusterClient
	opts    options
	seq     atomic.Uint64
	// tag names this client's ticket channels (`NOTIFY tag`, proto.NotifyChannel): 16
	// random lowercase hex digits, drawn once, so that a grant message reaches only the
	// client whose ticket it is.
	tag string

	modeNow modeState
	// subs: scripts mode's subscriber connections by node address (one on a single
	// server), each made on its node's first wait.
	subs map[string]*subHub
	// publishCmd: the scripts' publish command once asked ("" before; Client.publish).
	publishCmd string
	// once sends scripts mode's scripts that must not run twice: a copy of the
	// application's client without go-redis's own retries (which re-send a command
	// whose reply was lost) and, on a cluster, without its redirects (which do too),
	// made on first use.
	once     redis.UniversalClient
	onceMade bool

	// semLedgers: per semaphore name, its grants held on their granted message and not yet
	// confirmed, and the permits taken back (semaphore.go); under semMu.
	semMu      sync.Mutex
	semLedgers map[string]*semLedger

	mu       sync.Mutex
	hubs     map[string]*hub // by node address
	replicas map[string]replicaCount
	closed   bool
}

type replicaCount struct {
	n  int
	at time.Time
}

// New makes a Client on rdb, a *redis.Client or a *redis.ClusterClient (the
// application's own; Close does not close it).
func New(rdb redis.UniversalClient, opts ...Option) *Client {
	o := options{
		watchdog:       DefaultWatchdogTimeout,
		backoff:        proto.DefaultBackoff,
		replicas:       -1,
		replicaTimeout: DefaultReplicaSyncTimeout,
	}
	for _, f := range opts {
		f(&o)
	}
	if o.clientID == "" {
		o.clientID = uuid.NewString()
	}
	if o.backoff.Attempts < 1 {
		o.backoff.Attempts = 1
	}
	c := &Client{rdb: rdb, opts: o, tag: newTag(), hubs: map[string]*hub{}, replicas: map[string]replicaCount{},
		semLedgers: map[string]*semLedger{}}
	switch r := rdb.(type) {
	case *redis.ClusterClient:
		c.cluster = r
	case *redis.Client:
		c.single = r
	default:
		panic("rlock: New needs a *redis.Client or a *redis.ClusterClient")
	}
	return c
}

// Close stops the client's notification connections; waits in progress end with
// ErrClosed. Locks still held stay held until their lease ends.
func (c *Client) Close() error {
	c.mu.Lock()
	c.closed = true
	hubs := c.hubs
	c.hubs = map[string]*hub{}
	subs := c.subs
	c.subs = nil
	once := c.once
	c.once = nil
	c.mu.Unlock()
	if once != nil {
		_ = once.Close()
	}
	for _, h := range hubs {
		h.close()
	}
	for _, s := range subs {
		s.close()
	}
	return nil
}

// newTag draws a client's notification tag: 8 bytes from a secure source, in hex.
func newTag() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("rlock: no random source: " + err.Error())
	}
	return hex.EncodeToString(b[:])
}

// ID is the client part of this client's owner ids.
func (c *Client) ID() string { return c.opts.clientID }

// newOwner is a fresh owner id `<client id>:<n>`: one per handle.
func (c *Client) newOwner() string {
	return c.opts.clientID + ":" + itoa(int64(c.seq.Add(1)))
}

func itoa(n int64) string { return proto.Strings([]any{n})[0] }

// do runs one command through the application's client (routed by key in a cluster):
// a nil reply is (nil, nil).
func (c *Client) do(ctx context.Context, args []any) (any, error) {
	module := moduleCommand(args)
	if module && c.scriptsOn(ctx) {
		return c.doScript(ctx, args)
	}
	v, err := c.rdb.Do(ctx, args...).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if module && c.opts.mode == ModeAuto && err != nil &&
		strings.HasPrefix(strings.ToLower(err.Error()), "err unknown command") {
		// A failover to a server without the module: ask again, and go as a script.
		c.forgetMode()
		if c.scriptsOn(ctx) {
			return c.doScript(ctx, args)
		}
	}
	return v, err
}

// doRetry runs one command, retrying transient failures with backoff. The command must
// be safe to repeat (idempotent, or carrying a request id).
func (c *Client) doRetry(ctx context.Context, args []any) (any, error) {
	for n := 0; ; n++ {
		v, err := c.do(ctx, args)
		if err == nil || !transient(err) || n+1 >= c.opts.backoff.Attempts {
			return v, err
		}
		if err := sleep(ctx, c.opts.backoff.Delay(n)); err != nil {
			return nil, err
		}
	}
}

// sleep pauses d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// transient tells whether err is worth a retry: the connection broke, or the server
// is loading, failing over or reshaping. The caller's own context ending is not.
func transient(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, ErrOutcomeUnknown) {
		return false
	}
	var re redis.Error
	if errors.As(err, &re) {
		return proto.TransientReply(re.Error())
	}
	if errors.Is(err, redis.ErrClosed) || errors.Is(err, ErrClosed) {
		return false
	}
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed)
}

// redirected tells whether err is a cluster redirection (the key's slot is elsewhere).
func redirected(err error) bool {
	if err == nil {
		return false
	}
	s := err.Error()
	return strings.HasPrefix(s, "MOVED ") || strings.HasPrefix(s, "ASK ")
}

// nodeFor is the server that holds key: the client itself, or the cluster's master for
// the key's slot.
func (c *Client) nodeFor(ctx context.Context, key string) (*redis.Client, error) {
	if c.single != nil {
		return c.single, nil
	}
	return c.cluster.MasterForKey(ctx, key)
}

// hubFor is the ticket hub of the node that holds key.
func (c *Client) hubFor(ctx context.Context, key string) (*hub, error) {
	node, err := c.nodeFor(ctx, key)
	if err != nil {
		return nil, err
	}
	addr := node.Options().Addr
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	h := c.hubs[addr]
	if h == nil {
		h = newHub(c, node, c.cluster != nil)
		c.hubs[addr] = h
	}
	return h, nil
}

// Capabilities is what a server can do, as its RLOCK.HELLO answered
// (docs/commands/module.md): NoModule for a server without the module.
type Capabilities = proto.Capabilities

// NoModule is the Capabilities of a server without the module.
var NoModule = proto.NoModule

// Capabilities asks the server (in a cluster, any node) what it can do: the module's
// version, protocol and features, NoModule without the module, or Refused: true when the
// server's ACL refuses the probe. Waits use the same probe, asked by each node's ticket
// hub when it connects and again after each reconnect: a node that does not name the
// tickets feature gets blocked waits.
func (c *Client) Capabilities(ctx context.Context) (Capabilities, error) {
	return proto.ParseHello(c.rdb.Do(ctx, proto.HelloArgs()...).Result())
}

// replicasToSync is how many replicas an acquire on node waits for: the option, or the
// replicas the node has connected (INFO replication, read at most once a second).
func (c *Client) replicasToSync(ctx context.Context, node *redis.Client) int {
	if c.opts.replicas >= 0 {
		return c.opts.replicas
	}
	addr := node.Options().Addr
	c.mu.Lock()
	rc, ok := c.replicas[addr]
	c.mu.Unlock()
	if ok && time.Since(rc.at) < time.Second {
		return rc.n
	}
	// ROLE, as the Rust, Python and Java clients read it: the replicas the primary has
	// online (INFO's connected_slaves also counts one still loading, which cannot ack).
	role, err := node.Do(ctx, "ROLE").Slice()
	n := 0
	if err == nil {
		n = proto.RoleReplicas(role)
	} else if ok {
		n = rc.n
	}
	c.mu.Lock()
	c.replicas[addr] = replicaCount{n: n, at: time.Now()}
	c.mu.Unlock()
	return n
}

// waitCall runs a call that may wait, as proto.StartWait's rule says from seen (the
// handle's findings; nil: always the first way): first without waiting (on the shared
// client, one round trip when it can be served now), then, when satisfied says the reply
// is not enough and the call may wait, as a queued ticket on the key's hub; a handle that
// found it held lately queues at once. build makes the command for a wait in ms (-1: no
// WAIT; 0: no limit) with the call's request id; the same id serves the try and the wait,
// since a call that was not served changed nothing. The wait ends by the call's deadline,
// counted from its start (or the context's, if sooner): the ticket's WAIT is what is left
// of it, rounded up, and the hub ends a ticket's wait at that on the client's clock.
// Returns the last reply, not satisfied when the wait ran out without it.
func (c *Client) waitCall(ctx context.Context, key string, wait time.Duration, forever bool,
	seen *proto.Contention, build func(waitMs int64) []any, satisfied func(any) bool) (any, error) {
	start := time.Now()
	try := func() (any, bool, error) {
		reply, err := c.doRetry(ctx, build(-1))
		return reply, err == nil && satisfied(reply), err
	}
	queue := func(asked bool, last any) proto.Waited {
		reply, atOnce, err := c.queueWait(ctx, key, start, wait, forever, build, satisfied, asked, last)
		return proto.Waited{Reply: reply, Err: err, Granted: err == nil && satisfied(reply), AtOnce: atOnce}
	}
	return proto.StartWait(seen, forever || wait > 0, time.Now, try, queue)
}

// queueWait is the wait of waitCall, started at start: a queued ticket on the key's hub
// (a blocked wait where the server has no tickets; a scripts-mode wait), for what is left
// of the wait. asked: a try came first, last its reply (not satisfied). atOnce: the
// waiting command was answered with its final reply, not QUEUED first (false for a
// blocked wait, which cannot tell).
func (c *Client) queueWait(ctx context.Context, key string, start time.Time, wait time.Duration, forever bool,
	build func(waitMs int64) []any, satisfied func(any) bool, asked bool, last any) (reply any, atOnce bool, err error) {
	if c.scriptsOn(ctx) {
		return c.scriptsWait(ctx, wait, forever, build, satisfied)
	}
	reply = last
	var until time.Time
	if !forever {
		until = start.Add(wait)
	}
	ctxBound := false
	if dl, ok := ctx.Deadline(); ok && (until.IsZero() || dl.Before(until)) {
		// The server drops the ticket when the caller would stop waiting anyway.
		until, ctxBound = dl, true
	}
	for tries := 0; ; tries++ {
		waitMs := int64(0)
		if !until.IsZero() {
			left := time.Until(until)
			if left <= 0 && ctxBound {
				return reply, false, context.DeadlineExceeded
			}
			if left <= 0 && !asked {
				// The wait ran out before it was queued: a timed acquire asks once.
				reply, err = c.doRetry(ctx, build(-1))
				return reply, true, err
			}
			if left <= 0 {
				return reply, false, nil // the first try's reply: not satisfied
			}
			waitMs = proto.MillisUp(left)
		}
		h, err := c.hubFor(ctx, key)
		if err != nil {
			return nil, false, err
		}
		queued := false
		if c.opts.blockingWaits {
			err = errNoTickets
		} else {
			reply, err = h.wait(ctx, build(waitMs), &queued)
		}
		atOnce = !queued
		if errors.Is(err, errNoTickets) {
			reply, err = h.blockedWait(ctx, build(waitMs))
			atOnce = false
		}
		if err == nil && ctxBound && !satisfied(reply) {
			// The wait ended at the context's deadline (maybe a moment before the
			// context itself): the context's error, as a wait that the context ended.
			return reply, false, context.DeadlineExceeded
		}
		if c.cluster != nil && (redirected(err) || errors.Is(err, errLost)) && tries < c.opts.backoff.Attempts {
			// The slot moved, or the node's ticket connections broke (a failover, a
			// restart): learn the layout again and queue on the key's node, same id.
			c.cluster.ReloadState(ctx)
			if serr := sleep(ctx, c.opts.backoff.Delay(tries)); serr != nil {
				return nil, false, serr
			}
			continue
		}
		return reply, atOnce, err
	}
}

// notServed is the error of a call that was not served: the caller's context ended, a
// wait limit passed (ErrTimeout), or it did not wait (ErrTaken).
func notServed(ctx context.Context, wait time.Duration, forever bool) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if forever || wait > 0 {
		return ErrTimeout
	}
	return ErrTaken
}

// waitFor is waitCall for a call that must be satisfied: the reply that satisfied it,
// or the error that says why not (notServed, or the failure), naming op and key.
func (c *Client) waitFor(ctx context.Context, op, key string, wait time.Duration, forever bool,
	seen *proto.Contention, build func(waitMs int64) []any, satisfied func(any) bool) (any, error) {
	reply, err := c.waitCall(ctx, key, wait, forever, seen, build, satisfied)
	if err != nil {
		return nil, opErr(op, key, err)
	}
	if !satisfied(reply) {
		return reply, opErr(op, key, notServed(ctx, wait, forever))
	}
	return reply, nil
}

// call runs one command that does not wait, with retries (it must be idempotent or carry
// a request id), naming op and key in its error.
func (c *Client) call(ctx context.Context, op, key string, args []any) (any, error) {
	v, err := c.doRetry(ctx, args)
	return v, opErr(op, key, err)
}
