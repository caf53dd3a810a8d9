// Scripts mode (issue 39, docs/scripts-mode.md): where the module cannot be loaded, the
// primitives run on Redisson's own Lua scripts (lua/*.lua, byte-identical copies of
// clients/python/rlock/lua, embedded), with the same API; Redisson services, scripts-mode
// clients and module-loaded servers share the names. The mode is chosen once per Client
// (WithMode; auto asks RLOCK.HELLO: "unknown command" means scripts, asked again every
// 30 s in scripts mode and when a module command comes back unknown). Waiting is
// Redisson's: one subscriber connection per client, shared by every wait, each woken by
// the channel's message or at the holder's lease end, whichever comes first; no polling.
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
	sc, err := proto.ScriptFor(args, "publish")
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
		sc = proto.ForceRWScript(sc.Keys[0], mode, "publish")
	}
	var v any
	if sc.Name != "" && sc.Then != proto.One {
		v, err = scripts[sc.Name].Run(ctx, c.scriptRunner(sc.Name), sc.Keys, sc.Argv...).Result()
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

// scriptRunner is where the script name goes: a script that must not run twice goes on
// c.once (no go-redis retries), any other on the application's client.
func (c *Client) scriptRunner(name string) redis.Scripter {
	if proto.MayResend(name) || c.single == nil {
		return c.rdb
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.onceMade && !c.closed {
		o := *c.single.Options()
		o.MaxRetries = -1 // go-redis: -1 is none
		c.once, c.onceMade = redis.NewClient(&o), true
	}
	if c.once == nil {
		return c.rdb
	}
	return c.once
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

// scriptsWait is waitCall in scripts mode, after a first try that was not satisfied:
// Redisson's wait. Subscribe the lock's channel on the client's subscriber connection
// (confirmed before trying, so an unlock message cannot be missed), try, and sleep until
// a message or the holder's lease end (the PTTL the try answered), whichever comes first.
func (c *Client) scriptsWait(ctx context.Context, wait time.Duration, forever bool,
	build func(waitMs int64) []any, satisfied func(any) bool, reply any) (any, error) {
	channel, leased, ok := proto.WaitChannel(build(-1))
	if !ok {
		return nil, ErrNeedsModule
	}
	sub, err := c.subscriber()
	if err != nil {
		return nil, err
	}
	w, err := sub.join(ctx, channel)
	if err != nil {
		return nil, err
	}
	defer sub.leave(w)
	var deadline <-chan time.Time
	if !forever {
		t := time.NewTimer(wait)
		defer t.Stop()
		deadline = t.C
	}
	for {
		reply, hint, err := c.scriptTry(ctx, build(-1))
		if err != nil || satisfied(reply) {
			return reply, err
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
			return c.doRetry(ctx, build(-1))
		case <-ctx.Done():
			stop()
			return nil, ctx.Err()
		}
		stop()
	}
}

// subHub is scripts mode's one subscriber connection per client: Redisson's channels,
// refcounted, each message waking every local waiter of its channel (they race for the
// lock as Redisson's do); a broken connection (go-redis resubscribes on reconnect) wakes
// every waiter, which tries again.
type subHub struct {
	ps *redis.PubSub

	mu    sync.Mutex
	chans map[string]*subChan
}

type subChan struct {
	refs    int
	ready   chan struct{}
	waiters map[*subWaiter]struct{}
}

type subWaiter struct {
	channel string
	wake    chan struct{}
}

func (c *Client) subscriber() (*subHub, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	if c.sub == nil {
		if c.single == nil {
			return nil, errors.New("rlock scripts mode: waits on a cluster need the module (not built yet in the Go client)")
		}
		o := *c.single.Options()
		o.ClientName = SubscriberName
		o.ReadTimeout = -1
		node := redis.NewClient(&o)
		c.sub = &subHub{ps: node.Subscribe(context.Background()), chans: map[string]*subChan{}}
		c.subNode = node
		go c.sub.read()
	}
	return c.sub, nil
}

func (s *subHub) join(ctx context.Context, channel string) (*subWaiter, error) {
	w := &subWaiter{channel: channel, wake: make(chan struct{}, 1)}
	s.mu.Lock()
	st := s.chans[channel]
	if st == nil {
		st = &subChan{ready: make(chan struct{}), waiters: map[*subWaiter]struct{}{}}
		s.chans[channel] = st
		if err := s.ps.Subscribe(ctx, channel); err != nil {
			delete(s.chans, channel)
			s.mu.Unlock()
			return nil, err
		}
	}
	st.refs++
	st.waiters[w] = struct{}{}
	ready := st.ready
	s.mu.Unlock()
	select {
	case <-ready:
		return w, nil
	case <-ctx.Done():
		s.leave(w)
		return nil, ctx.Err()
	case <-time.After(commandTimeout):
		s.leave(w)
		return nil, errors.New("rlock scripts mode: no subscription confirmation")
	}
}

func (s *subHub) leave(w *subWaiter) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.chans[w.channel]
	if st == nil {
		return
	}
	if _, ok := st.waiters[w]; !ok {
		return
	}
	delete(st.waiters, w)
	st.refs--
	if st.refs == 0 {
		delete(s.chans, w.channel)
		ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
		_ = s.ps.Unsubscribe(ctx, w.channel)
		cancel()
	}
}

func (s *subHub) read() {
	for {
		msg, err := s.ps.Receive(context.Background())
		if err != nil {
			if errors.Is(err, redis.ErrClosed) {
				return
			}
			s.wakeAll("")
			continue
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				s.mu.Lock()
				if st := s.chans[m.Channel]; st != nil {
					select {
					case <-st.ready:
					default:
						close(st.ready)
					}
				}
				s.mu.Unlock()
			}
		case *redis.Message:
			s.wakeAll(m.Channel)
		}
	}
}

// wakeAll wakes the waiters of channel ("": of every channel).
func (s *subHub) wakeAll(channel string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for ch, st := range s.chans {
		if channel != "" && ch != channel {
			continue
		}
		for w := range st.waiters {
			select {
			case w.wake <- struct{}{}:
			default:
			}
		}
	}
}

func (s *subHub) close() { _ = s.ps.Close() }
