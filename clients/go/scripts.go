// Scripts mode (issue 39, docs/scripts-mode.md): where the module cannot be loaded, the
// primitives run on Redisson's own Lua scripts (lua/*.lua, byte-identical copies of
// clients/python/rlock/lua, embedded), with the same API; Redisson services, scripts-mode
// clients and module-loaded servers share the names. The mode is chosen once per Client
// (WithMode; auto asks RLOCK.HELLO: "unknown command" means scripts, asked again every
// 30 s in scripts mode and when a module command comes back unknown). Waiting is
// Redisson's: one subscriber connection per server (per node on a cluster), shared by
// every wait there, each woken by the channel's message or at the holder's lease end,
// whichever comes first; no polling. On a cluster with sharded pub/sub the scripts
// SPUBLISH and waiters SSUBSCRIBE on their channel's node, as Redisson 4.7 does.
// internal/proto/scripts.go translates the module's commands (Info, which no Redisson
// script does, answers ErrNeedsModule).

package rlock

import (
	"context"
	"embed"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rlock/rlock/clients/go/internal/proto"
)

//go:embed lua/*.lua
var luaFiles embed.FS

// scripts are the embedded scripts by name (the file name without .lua). go-redis's
// Script.Run sends EVALSHA and, on NOSCRIPT (a failover or SCRIPT FLUSH emptied the
// cache), EVAL, which caches it again.
var scripts, scriptTexts = func() (map[string]*redis.Script, map[string]string) {
	out, texts := map[string]*redis.Script{}, map[string]string{}
	entries, _ := luaFiles.ReadDir("lua")
	for _, e := range entries {
		text, _ := luaFiles.ReadFile("lua/" + e.Name())
		name := strings.TrimSuffix(e.Name(), ".lua")
		out[name], texts[name] = redis.NewScript(string(text)), string(text)
	}
	return out, texts
}()

// ErrNeedsModule: a call scripts mode does not do (Info: no Redisson script reads it).
var ErrNeedsModule = proto.ErrNeedsModule

// SubscriberName is the name of scripts mode's subscriber connection (CLIENT LIST).
const SubscriberName = "rlock-go-subscriber"

// reprobeScripts is how often scripts mode asks again whether the module is there now
// (scripts work on a module-loaded server too, so nothing else would tell).
const reprobeScripts = 30 * time.Second

// modeState is what the probe found, for ModeAuto.
type modeState struct {
	mu      sync.Mutex
	scripts bool
	known   bool
	at      time.Time
}

// scriptsOn tells whether calls go as scripts now.
func (c *Client) scriptsOn(ctx context.Context) bool {
	switch c.opts.mode {
	case ModeModule:
		return false
	case ModeScripts:
		return true
	}
	m := &c.modeNow
	m.mu.Lock()
	if m.known && (!m.scripts || time.Since(m.at) < reprobeScripts) {
		s := m.scripts
		m.mu.Unlock()
		return s
	}
	m.mu.Unlock()
	caps, err := c.Capabilities(ctx)
	if err != nil {
		return false // the call itself will fail and tell; asked again next time
	}
	m.mu.Lock()
	m.scripts, m.known, m.at = !caps.Module && !caps.Refused, true, time.Now()
	s := m.scripts
	m.mu.Unlock()
	return s
}

// forgetMode makes the next call ask again (a module command came back unknown: a
// failover to a server without the module).
func (c *Client) forgetMode() {
	c.modeNow.mu.Lock()
	c.modeNow.known = false
	c.modeNow.mu.Unlock()
}

// Mode is how the client's calls go now: ModeModule or ModeScripts (asking the server
// first with ModeAuto).
func (c *Client) Mode(ctx context.Context) Mode {
	if c.scriptsOn(ctx) {
		return ModeScripts
	}
	return ModeModule
}

// moduleCommand tells whether args is one of the module's commands (`R<PRIMITIVE>.<VERB>`).
func moduleCommand(args []any) bool {
	if len(args) < 2 {
		return false
	}
	w, ok := args[0].(string)
	return ok && strings.HasPrefix(w, "R") && strings.Contains(w, ".")
}

// doScript does a module command with Redisson's script, answering what the module would.
func (c *Client) doScript(ctx context.Context, args []any) (any, error) {
	v, _, err := c.doScriptHint(ctx, args)
	return v, err
}

// doScriptHint is doScript, with how many ms a waiter whose try this was should sleep
// at most before looking again without a message (proto.ScriptCall.Hint).
func (c *Client) doScriptHint(ctx context.Context, args []any) (any, int64, error) {
	pub, err := c.publish(ctx)
	if err != nil {
		return nil, -1, err
	}
	sc, err := proto.ScriptFor(args, pub)
	if err != nil {
		return nil, -1, err
	}
	if sc.Then == proto.ForceRW {
		mode, err := c.rdb.HGet(ctx, sc.Keys[0], "mode").Result()
		if errors.Is(err, redis.Nil) {
			return int64(0), -1, nil
		}
		if err != nil {
			return nil, -1, err
		}
		sc = proto.ForceRWScript(sc.Keys[0], mode, pub)
	}
	var v any
	if sc.Name != "" && sc.Then != proto.One {
		v, err = c.runScript(ctx, sc.Name, sc.Keys, sc.Argv)
		if errors.Is(err, redis.Nil) {
			v, err = nil, nil
		}
		if err != nil {
			return nil, -1, once(sc.Name, err)
		}
	}
	hint := sc.Hint(v)
	switch sc.Then {
	case proto.Permits:
		return sc.PermitReply(v), hint, nil
	case proto.ThenAvailable:
		r, hint, err := c.doScriptHint(ctx, proto.PesAvailableArgs(sc.Keys[0]))
		return r, hint, once(sc.Name, err) // the read after must not make it run again
	}
	if sc.Then == proto.ReadHeld && v != nil {
		// Only this owner changes its own read field: looking after the script is no race.
		owner := strings.TrimSuffix(proto.Strings(sc.Argv[1:2])[0], ":write")
		got, err := c.rdb.HMGet(ctx, sc.Keys[0], "mode", owner).Result()
		if err != nil {
			return nil, -1, err
		}
		if len(got) == 2 && got[0] == "read" && got[1] != nil {
			return nil, -1, proto.ServerError(proto.ReadHeldText)
		}
	}
	if sc.Then.Gets() {
		v, err = c.rdb.Get(ctx, sc.Keys[0]).Result()
		if errors.Is(err, redis.Nil) {
			v, err = nil, nil
		}
		if err != nil {
			return nil, -1, once(sc.Name, err) // the read after must not make it run again
		}
	}
	r, err := sc.Then.Reply(v)
	return r, hint, err
}

// once is err from a call that ran (or may have run) the script name: an
// *OutcomeUnknownError if the script must not run twice (proto.MayResend) and the failure
// may have come after the server received it (a broken connection, a timeout); as is
// otherwise (a dial that failed, a server's error reply: the script did not run).
func once(name string, err error) error {
	if err == nil || name == "" || proto.MayResend(name) || !afterWrite(err) {
		return err
	}
	return &OutcomeUnknownError{Script: name, Err: err}
}

// afterWrite tells whether a transient failure may have come after the command was
// written: any connection failure but a dial's (connection refused, no route...).
func afterWrite(err error) bool {
	var re redis.Error
	if errors.As(err, &re) || !transient(err) {
		return false
	}
	var op *net.OpError
	return !(errors.As(err, &op) && op.Op == "dial") && !errors.Is(err, syscall.ECONNREFUSED)
}

// refusedAttempts is how many times a script a cluster refused before running it
// (MOVED, ASK, TRYAGAIN, CLUSTERDOWN) is sent again on the cluster's once client, which
// follows none of them itself (go-redis's redirects also re-send a command whose
// connection broke after the write); 1 ms doubling between them (a slot in migration).
const refusedAttempts = 9

// runScript runs the script name (EVALSHA, EVAL on NOSCRIPT) on its runner: a nil reply
// is redis.Nil. On a cluster, a script that must not run twice goes without go-redis's
// redirects and retries, and its refusals are sent again here.
func (c *Client) runScript(ctx context.Context, name string, keys []string, argv []any) (any, error) {
	runner, refusals := c.scriptRunner(name)
	for n := 0; ; n++ {
		v, err := scripts[name].Run(ctx, runner, keys, argv...).Result()
		if !refusals || n+1 >= refusedAttempts || !refused(err) {
			return v, err
		}
		if err := sleep(ctx, time.Millisecond<<n); err != nil {
			return nil, err
		}
	}
}

// refused tells whether err is a cluster's refusal of a command it did not run.
func refused(err error) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return false
	}
	code, _, _ := strings.Cut(re.Error(), " ")
	switch code {
	case "MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN":
		return true
	}
	return false
}

// scriptRunner is where the script name goes, and whether the caller must follow a
// cluster's refusals itself: a script that must not run twice goes on c.once (a copy of
// the application's client without go-redis's retries, or on a cluster without its
// redirects, which re-send after a broken connection too), any other on the
// application's client.
func (c *Client) scriptRunner(name string) (redis.Scripter, bool) {
	if proto.MayResend(name) {
		return c.rdb, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.onceMade && !c.closed {
		if c.single != nil {
			o := *c.single.Options()
			o.MaxRetries = -1 // go-redis: -1 is none
			c.once = redis.NewClient(&o)
		} else {
			o := *c.cluster.Options()
			o.MaxRedirects = -1 // go-redis: -1 is none (one send, no retry after a break)
			o.MaxRetries = -1
			c.once = redis.NewClusterClient(&o)
		}
		c.onceMade = true
	}
	if c.once == nil {
		return c.rdb, false
	}
	return c.once, c.cluster != nil
}

// publish is the scripts' publish command: "publish", or on a cluster with sharded
// pub/sub "spublish" as Redisson 4.7 does, asked once (SPUBLISH to a channel nobody
// hears: "unknown command" or NOPERM means it has not; any other error reply means it
// has; a connection failure is not an answer, asked again next time).
func (c *Client) publish(ctx context.Context) (string, error) {
	if c.cluster == nil {
		return "publish", nil
	}
	c.mu.Lock()
	p := c.publishCmd
	c.mu.Unlock()
	if p != "" {
		return p, nil
	}
	err := c.rdb.Do(ctx, "SPUBLISH", "rlock:probe:spublish", "").Err()
	var re redis.Error
	switch {
	case err == nil:
		p = "spublish"
	case errors.As(err, &re):
		t := strings.ToLower(re.Error())
		if strings.HasPrefix(t, "err unknown command") || strings.HasPrefix(t, "noperm") {
			p = "publish"
		} else {
			p = "spublish"
		}
	default:
		return "", err
	}
	c.mu.Lock()
	c.publishCmd = p
	c.mu.Unlock()
	return p, nil
}

// scriptTry is one try of a scripts-mode wait, with doRetry's retries of transient
// failures: the module's reply and the try's hint.
func (c *Client) scriptTry(ctx context.Context, args []any) (any, int64, error) {
	for n := 0; ; n++ {
		v, hint, err := c.doScriptHint(ctx, args)
		if err == nil || !transient(err) || n+1 >= c.opts.backoff.Attempts {
			return v, hint, err
		}
		if err := sleep(ctx, c.opts.backoff.Delay(n)); err != nil {
			return nil, -1, err
		}
	}
}

// scriptEval is args as one EVAL (for a pipeline, after which nothing could resend it on
// NOSCRIPT): the renewal before replica sync's WAIT.
func scriptEval(args []any) ([]any, error) {
	sc, err := proto.ScriptFor(args, "publish")
	if err != nil {
		return nil, err
	}
	out := []any{"EVAL", scriptTexts[sc.Name], len(sc.Keys)}
	for _, k := range sc.Keys {
		out = append(out, k)
	}
	return append(out, sc.Argv...), nil
}

// scriptsWait is waitCall's wait in scripts mode (after a first try that was not
// satisfied, or instead of it when the handle found the lock held lately): Redisson's
// wait. Subscribe the lock's channel on the subscriber connection of its node (confirmed
// before trying, so an unlock message cannot be missed), try, and sleep until a message
// or the holder's lease end (the PTTL the try answered), whichever comes first.
// A subscription that ended (the connection broke, or the slot left the node) is made
// again, where the slot is now, before the next try. atOnce: its first try took it.
func (c *Client) scriptsWait(ctx context.Context, wait time.Duration, forever bool,
	build func(waitMs int64) []any, satisfied func(any) bool) (reply any, atOnce bool, err error) {
	channel, leased, ok := proto.WaitChannel(build(-1))
	if !ok {
		return nil, false, ErrNeedsModule
	}
	w, err := c.subscribe(ctx, channel)
	if err != nil {
		return nil, false, err
	}
	defer func() {
		if w != nil {
			w.hub.leave(w)
		}
	}()
	var deadline <-chan time.Time
	if !forever {
		t := time.NewTimer(wait)
		defer t.Stop()
		deadline = t.C
	}
	for first := true; ; first = false {
		if w.broken.Load() {
			w.hub.leave(w)
			again, err := c.subscribe(ctx, channel)
			if err != nil {
				w = nil
				return nil, false, err
			}
			w = again
		}
		reply, hint, err := c.scriptTry(ctx, build(-1))
		if err != nil || satisfied(reply) {
			return reply, first && err == nil, err
		}
		var leaseEnd <-chan time.Time
		var t *time.Timer
		if leased && hint >= 0 {
			t = time.NewTimer(time.Duration(hint) * time.Millisecond)
			leaseEnd = t.C
		}
		stop := func() {
			if t != nil {
				t.Stop()
			}
		}
		select {
		case <-w.wake:
		case <-leaseEnd:
		case <-deadline:
			stop()
			// One last look: a release may have come with the deadline.
			reply, err := c.doRetry(ctx, build(-1))
			return reply, false, err
		case <-ctx.Done():
			stop()
			return nil, false, ctx.Err()
		}
		stop()
	}
}

// subscribe joins channel on the subscriber of its node, confirmed: on a cluster the
// master of the channel's slot (its hash tag is the primitive's name), or the node a
// refused SSUBSCRIBE named (MOVED: the slot map may lag behind a slot just moved, on
// the node go-redis reads it from too), a few times with backoff.
func (c *Client) subscribe(ctx context.Context, channel string) (*subWaiter, error) {
	addr := ""
	for n := 0; ; n++ {
		hub, err := c.subscriber(ctx, channel, addr)
		var w *subWaiter
		if err == nil {
			w, err = hub.join(ctx, channel)
		}
		var moved *subscribeRefused
		if err == nil || c.cluster == nil || ctx.Err() != nil || n+1 >= c.opts.backoff.Attempts ||
			!(errors.As(err, &moved) || transient(err)) {
			return w, err
		}
		addr = ""
		if moved != nil {
			addr = moved.addr
		}
		c.cluster.ReloadState(ctx)
		if moved == nil || addr == "" {
			if err := sleep(ctx, c.opts.backoff.Delay(n)); err != nil {
				return nil, err
			}
		}
	}
}

// subscribeRefused: the node answered a subscription with an error; addr is the node a
// MOVED names ("" for any other refusal).
type subscribeRefused struct{ text, addr string }

func (e *subscribeRefused) Error() string {
	return "rlock scripts mode: the node refused the subscription: " + e.text
}

// subHub is one subscriber connection of scripts mode: per client on a single server,
// per node on a cluster (SSUBSCRIBE where the scripts SPUBLISH: only the node of the
// channel's slot hears it). Redisson's channels, refcounted, one at a time; each message
// wakes every local waiter of its channel (they race for the lock as Redisson's do). A
// broken connection, or a node ending a shard channel's subscription (its slot left),
// marks the channel's waiters broken and wakes them: each subscribes again (leave, then
// join: go-redis's own resubscribe after a reconnect sends every shard channel in one
// SSUBSCRIBE, which a node refuses across slots) and tries again.
type subHub struct {
	ps      *redis.PubSub
	node    *redis.Client
	sharded bool

	mu    sync.Mutex
	chans map[string]*subChan
}

type subChan struct {
	refs    int
	ready   chan struct{}
	failed  *subscribeRefused // refused before confirmed (ready is closed too)
	waiters map[*subWaiter]struct{}
}

type subWaiter struct {
	hub     *subHub
	st      *subChan
	channel string
	wake    chan struct{}
	broken  atomic.Bool
}

// subscriber is the subscriber of the node that serves channel (or of the node at addr,
// if not ""), made on first use.
func (c *Client) subscriber(ctx context.Context, channel, addr string) (*subHub, error) {
	sharded := false
	if c.cluster != nil {
		pub, err := c.publish(ctx)
		if err != nil {
			return nil, err
		}
		sharded = pub == "spublish"
	}
	node, err := c.nodeFor(ctx, channel)
	if err != nil {
		return nil, err
	}
	if addr == "" {
		addr = node.Options().Addr
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	if c.subs == nil {
		c.subs = map[string]*subHub{}
	}
	if h := c.subs[addr]; h != nil {
		return h, nil
	}
	o := *node.Options()
	o.Addr = addr
	o.ClientName = SubscriberName
	o.ReadTimeout = -1
	o.MaxRetries = -1
	own := redis.NewClient(&o)
	h := &subHub{node: own, sharded: sharded, chans: map[string]*subChan{}}
	if sharded {
		h.ps = own.SSubscribe(context.Background())
	} else {
		h.ps = own.Subscribe(context.Background())
	}
	c.subs[addr] = h
	go h.read()
	return h, nil
}

func (s *subHub) join(ctx context.Context, channel string) (*subWaiter, error) {
	w := &subWaiter{hub: s, channel: channel, wake: make(chan struct{}, 1)}
	s.mu.Lock()
	st := s.chans[channel]
	if st == nil {
		st = &subChan{ready: make(chan struct{}), waiters: map[*subWaiter]struct{}{}}
		s.chans[channel] = st
		var err error
		if s.sharded {
			err = s.ps.SSubscribe(ctx, channel)
		} else {
			err = s.ps.Subscribe(ctx, channel)
		}
		if err != nil {
			delete(s.chans, channel)
			s.mu.Unlock()
			return nil, err
		}
	}
	st.refs++
	st.waiters[w] = struct{}{}
	w.st = st
	ready := st.ready
	s.mu.Unlock()
	select {
	case <-ready:
		s.mu.Lock()
		failed := st.failed
		s.mu.Unlock()
		if failed != nil {
			s.leave(w)
			return nil, failed
		}
		return w, nil
	case <-ctx.Done():
		s.leave(w)
		return nil, ctx.Err()
	case <-time.After(commandTimeout):
		s.leave(w)
		return nil, errors.New("rlock scripts mode: no subscription confirmation")
	}
}

// leave ends w's wait; the channel's last waiter unsubscribes it, unless a new
// subscription of the channel replaced its broken one meanwhile.
func (s *subHub) leave(w *subWaiter) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := w.st
	if st == nil {
		return
	}
	if _, ok := st.waiters[w]; !ok {
		return
	}
	delete(st.waiters, w)
	st.refs--
	if st.refs > 0 {
		return
	}
	switch s.chans[w.channel] {
	case st:
		delete(s.chans, w.channel)
	case nil: // broken and detached: go-redis may still count it subscribed
	default:
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	if s.sharded {
		_ = s.ps.SUnsubscribe(ctx, w.channel)
	} else {
		_ = s.ps.Unsubscribe(ctx, w.channel)
	}
	cancel()
}

func (s *subHub) read() {
	for {
		msg, err := s.ps.Receive(context.Background())
		if err != nil {
			if errors.Is(err, redis.ErrClosed) {
				return
			}
			var re redis.Error
			if errors.As(err, &re) {
				// A refused SSUBSCRIBE (MOVED: the slot is elsewhere), which names no
				// channel: every subscription not yet confirmed fails, and its waiters
				// find the channel's node again.
				s.failPending(re.Error())
				continue
			}
			s.breakAll()
			continue
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			s.mu.Lock()
			st := s.chans[m.Channel]
			if st != nil {
				select {
				case <-st.ready:
					if m.Kind == "sunsubscribe" || m.Kind == "unsubscribe" {
						// Confirmed and in use, so not ours: the node ended it (its slot
						// left).
						s.breakChannel(m.Channel, st)
					}
				default:
					if m.Kind == "ssubscribe" || m.Kind == "subscribe" {
						close(st.ready)
					}
				}
			}
			s.mu.Unlock()
		case *redis.Message:
			s.wakeAll(m.Channel)
		}
	}
}

// failPending fails every subscription not yet confirmed with the error reply text.
func (s *subHub) failPending(text string) {
	refusal := &subscribeRefused{text: text}
	if f := strings.Fields(text); len(f) == 3 && (f[0] == "MOVED" || f[0] == "ASK") {
		refusal.addr = f[2]
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for ch, st := range s.chans {
		select {
		case <-st.ready:
		default:
			st.failed = refusal
			delete(s.chans, ch) // the next join subscribes anew
			close(st.ready)
		}
	}
}

// breakAll marks every waiter broken and wakes it (the connection broke: a release may
// have been missed while it was down).
func (s *subHub) breakAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for ch, st := range s.chans {
		s.breakChannel(ch, st)
	}
}

// breakChannel detaches the channel's subscription, so that the next join subscribes
// anew, and marks its waiters broken and wakes them (s.mu held).
func (s *subHub) breakChannel(channel string, st *subChan) {
	delete(s.chans, channel)
	for w := range st.waiters {
		w.broken.Store(true)
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

// wakeAll wakes the waiters of channel.
func (s *subHub) wakeAll(channel string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := s.chans[channel]; st != nil {
		for w := range st.waiters {
			select {
			case w.wake <- struct{}{}:
			default:
			}
		}
	}
}

func (s *subHub) close() {
	_ = s.ps.Close()
	_ = s.node.Close()
}
