// Integration tests of per-client ticket channels (`NOTIFY tag`, docs/commands/tickets.md):
// two clients waiting on one lock each hear only their own ticket's messages, on their own
// tagged channel, and nothing goes to the key's channel; a client whose probe does not
// name `ticket-notify` (a test double of the answer) queues on the key's channel as
// before, and moves to its tagged channel when a later probe (after a reconnect) names
// it; on a cluster the tagged channel is SSUBSCRIBEd on the key's node. A tagged channel
// stays subscribed between waits (one SUBSCRIBE for many), at most 64 idle per ticket
// connection, none carried over a reconnect; the key's channel, and a cluster node's
// channels, are still unsubscribed after their last waiter.

package rlock_test

import (
	"context"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	rlock "github.com/rlock/rlock/clients/go"
	"github.com/rlock/rlock/clients/go/internal/testserver"
)

// heard is every ticket message the server published, by channel (a pattern
// subscription on rlock_ticket:*, which sees them whoever they are for).
type heard struct {
	mu sync.Mutex
	by map[string][]string
}

func (h *heard) on(channel string) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.by[channel]...)
}

func listenTickets(t *testing.T, s *testserver.Server) *heard {
	t.Helper()
	ctx := context.Background()
	ps := s.Client(t).PSubscribe(ctx, "rlock_ticket:*")
	if _, err := ps.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ps.Close() })
	h := &heard{by: map[string][]string{}}
	go func() {
		for m := range ps.Channel() {
			h.mu.Lock()
			h.by[m.Channel] = append(h.by[m.Channel], m.Payload)
			h.mu.Unlock()
		}
	}()
	return h
}

func numsub(rdb *redis.Client, ch string) int64 {
	return rdb.PubSubNumSub(context.Background(), ch).Val()[ch]
}

// withoutNotify is a probe answer without the `ticket-notify` feature (an older module).
func withoutNotify(c rlock.Capabilities) rlock.Capabilities {
	var kept []string
	for _, f := range c.Features {
		if f != "ticket-notify" {
			kept = append(kept, f)
		}
	}
	c.Features = kept
	return c
}

func TestTwoClientsWaitingOnOneLockHearOnlyTheirOwnTicketsMessages(t *testing.T) {
	s, rdb, a := setup(t)
	ctx := context.Background()
	caps, err := a.Capabilities(ctx)
	must(t, err)
	if !caps.Has("ticket-notify") {
		t.Fatalf("the module does not name ticket-notify: %v", caps.Features)
	}
	b := rlock.New(s.Client(t))
	t.Cleanup(func() { b.Close() })
	h := listenTickets(t, s)
	takeOutside(t, rdb, "k")
	ma, mb := a.NewMutex("k"), b.NewMutex("k")
	ga := within(ma.LockContext)
	testserver.WaitUntil(t, 10*time.Second, "a queued", func() bool { return infoWaiters(t, "RLOCK.INFO", "k") == 1 })
	gb := within(mb.LockContext)
	testserver.WaitUntil(t, 10*time.Second, "b queued", func() bool { return infoWaiters(t, "RLOCK.INFO", "k") == 2 })
	key := "rlock_ticket:{k}"
	chA, chB := key+":"+rlock.TicketTag(a), key+":"+rlock.TicketTag(b)
	if chA == chB || !regexp.MustCompile(`^[0-9a-f]{16}$`).MatchString(rlock.TicketTag(a)) {
		t.Fatalf("tags %q and %q", rlock.TicketTag(a), rlock.TicketTag(b))
	}
	if n, na, nb := numsub(rdb, key), numsub(rdb, chA), numsub(rdb, chB); n != 0 || na != 1 || nb != 1 {
		t.Fatalf("subscribers: key channel %d, a's %d, b's %d; want 0, 1, 1", n, na, nb)
	}
	releaseOutside(t, rdb, "k")
	must(t, <-ga)
	_, err = ma.Unlock()
	must(t, err)
	must(t, <-gb)
	_, err = mb.Unlock()
	must(t, err)
	testserver.WaitUntil(t, 10*time.Second, "both grants heard", func() bool {
		return len(h.on(chA)) == 1 && len(h.on(chB)) == 1
	})
	// Each handoff published one message, on its waiter's channel only.
	if got := h.on(key); len(got) != 0 {
		t.Fatalf("messages on the key's channel: %q", got)
	}
	if !strings.HasPrefix(h.on(chA)[0], "granted:") || !strings.Contains(h.on(chA)[0], ma.Owner()) ||
		!strings.Contains(h.on(chB)[0], mb.Owner()) {
		t.Fatalf("a heard %q, b heard %q", h.on(chA), h.on(chB))
	}
}

func TestAClientWhoseProbeLacksTicketNotifyWaitsOnTheKeysChannel(t *testing.T) {
	s, rdb, _ := setup(t)
	c := rlock.New(s.Client(t), rlock.WithProbeFilter(withoutNotify))
	t.Cleanup(func() { c.Close() })
	h := listenTickets(t, s)
	takeOutside(t, rdb, "k")
	m := c.NewMutex("k")
	got := within(m.LockContext)
	testserver.WaitUntil(t, 10*time.Second, "the waiter queued", func() bool { return infoWaiters(t, "RLOCK.INFO", "k") == 1 })
	key := "rlock_ticket:{k}"
	tagged := key + ":" + rlock.TicketTag(c)
	if n, nt := numsub(rdb, key), numsub(rdb, tagged); n != 1 || nt != 0 {
		t.Fatalf("subscribers: key channel %d, tagged %d; want 1, 0", n, nt)
	}
	releaseOutside(t, rdb, "k")
	must(t, <-got)
	testserver.WaitUntil(t, 10*time.Second, "the grant heard on the key's channel", func() bool { return len(h.on(key)) == 1 })
	if len(h.on(tagged)) != 0 {
		t.Fatalf("messages on the tagged channel: %q", h.on(tagged))
	}
}

// A wait follows its ticket connection's latest probe: queued on the key's channel while
// the probe lacked the feature, it queues again with NOTIFY on its tagged channel once a
// reconnect's probe names it.
func TestAWaiterMovesToItsTaggedChannelWhenAReprobeNamesTicketNotify(t *testing.T) {
	s, rdb, _ := setup(t)
	var notify atomic.Bool
	c := rlock.New(s.Client(t), rlock.WithProbeFilter(func(caps rlock.Capabilities) rlock.Capabilities {
		if notify.Load() {
			return caps
		}
		return withoutNotify(caps)
	}))
	t.Cleanup(func() { c.Close() })
	ctx := context.Background()
	takeOutside(t, rdb, "k")
	m := c.NewMutex("k")
	got := within(m.LockContext)
	key := "rlock_ticket:{k}"
	tagged := key + ":" + rlock.TicketTag(c)
	testserver.WaitUntil(t, 10*time.Second, "queued on the key's channel", func() bool {
		return infoWaiters(t, "RLOCK.INFO", "k") == 1 && numsub(rdb, key) == 1
	})
	notify.Store(true)
	id := ticketCommandConn(ctx, rdb)
	if id == "" {
		t.Fatal("no ticket connection")
	}
	must(t, rdb.Do(ctx, "CLIENT", "KILL", "ID", id).Err())
	testserver.WaitUntil(t, 20*time.Second, "queued again on the tagged channel", func() bool {
		return infoWaiters(t, "RLOCK.INFO", "k") == 1 && numsub(rdb, tagged) == 1 && numsub(rdb, key) == 0
	})
	releaseOutside(t, rdb, "k")
	must(t, <-got)
	if m.Held() != 1 {
		t.Fatal("the waiter does not hold the lock")
	}
}

func TestClusterTicketsAreHeardOnTheClientsTaggedChannelOnTheKeysNode(t *testing.T) {
	_, rdb, c := clusterSetup(t)
	ctx := context.Background()
	holder := c.NewMutex("k1")
	must(t, holder.Lock())
	waiter := c.NewMutex("k1")
	got := within(waiter.LockContext)
	node, err := rdb.MasterForKey(ctx, "k1")
	must(t, err)
	key := "rlock_ticket:{k1}"
	tagged := key + ":" + rlock.TicketTag(c)
	testserver.WaitUntil(t, 10*time.Second, "the waiter queued on its tagged channel", func() bool {
		info, _ := holder.Info(ctx)
		n := node.PubSubShardNumSub(ctx, key, tagged).Val()
		return info != nil && info.Waiters == 1 && n[tagged] == 1 && n[key] == 0
	})
	_, err = holder.Unlock()
	must(t, err)
	must(t, <-got)
	if waiter.Held() != 1 {
		t.Fatal("the waiter does not hold the lock")
	}
	// A cluster node's channel is not kept idle: unsubscribed once its linger is over.
	_, err = waiter.Unlock()
	must(t, err)
	rlock.SweepTickets(c)
	testserver.WaitUntil(t, 10*time.Second, "the tagged channel unsubscribed on the node", func() bool {
		return node.PubSubShardNumSub(ctx, tagged).Val()[tagged] == 0
	})
}

// waitQueued makes m wait on its key as a queued ticket (the key held from rdb first,
// released once the ticket is queued), then unlocks it.
func waitQueued(t *testing.T, rdb *redis.Client, m *rlock.Mutex, key string) {
	t.Helper()
	takeOutside(t, rdb, key)
	got := within(m.LockContext)
	testserver.WaitUntil(t, 10*time.Second, "the waiter queued", func() bool { return infoWaiters(t, "RLOCK.INFO", key) == 1 })
	releaseOutside(t, rdb, key)
	must(t, <-got)
	_, err := m.Unlock()
	must(t, err)
}

// cmdCalls is how many times the server ran cmd since CONFIG RESETSTAT (INFO commandstats).
func cmdCalls(t *testing.T, rdb *redis.Client, cmd string) int {
	t.Helper()
	for _, line := range strings.Split(rdb.Info(context.Background(), "commandstats").Val(), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":calls="); ok {
			n, err := strconv.Atoi(strings.SplitN(rest, ",", 2)[0])
			must(t, err)
			return n
		}
	}
	return 0
}

// A tagged ticket channel stays subscribed between waits (design.md 5): one SUBSCRIBE for
// five queued waits on one key, none undone, even once the key channel's linger is over.
func TestATaggedTicketChannelIsSubscribedOnceForManyWaits(t *testing.T) {
	_, rdb, c := setup(t)
	ctx := context.Background()
	must(t, rdb.ConfigResetStat(ctx).Err())
	m := c.NewMutex("k")
	for i := 0; i < 5; i++ {
		waitQueued(t, rdb, m, "k")
	}
	rlock.SweepTickets(c)
	tagged := "rlock_ticket:{k}:" + rlock.TicketTag(c)
	if n := numsub(rdb, tagged); n != 1 {
		t.Fatalf("subscribers of the tagged channel after the last wait: %d, want 1", n)
	}
	if sub, unsub := cmdCalls(t, rdb, "subscribe"), cmdCalls(t, rdb, "unsubscribe"); sub != 1 || unsub != 0 {
		t.Fatalf("SUBSCRIBE %d, UNSUBSCRIBE %d; want 1, 0", sub, unsub)
	}
}

// At most 64 idle tagged channels per ticket connection: the 65th unsubscribes the one
// idle longest.
func TestIdleTaggedTicketChannelsAreBoundedTheOldestUnsubscribed(t *testing.T) {
	_, rdb, c := setup(t)
	ctx := context.Background()
	for i := 0; i < 65; i++ {
		key := "k" + strconv.Itoa(i)
		waitQueued(t, rdb, c.NewMutex(key), key)
	}
	first := "rlock_ticket:{k0}:" + rlock.TicketTag(c)
	testserver.WaitUntil(t, 10*time.Second, "64 idle channels, the first one gone", func() bool {
		chans := rdb.PubSubChannels(ctx, "rlock_ticket:*").Val()
		return len(chans) == 64 && !slices.Contains(chans, first)
	})
}

// Without `ticket-notify` the key's channel (which hears every client's messages) is not
// kept idle: it is unsubscribed once its linger after the last waiter is over.
func TestTheKeysTicketChannelIsUnsubscribedAfterItsLastWaiter(t *testing.T) {
	_, rdb, _ := setup(t)
	c := rlock.New(rdb, rlock.WithProbeFilter(withoutNotify))
	t.Cleanup(func() { c.Close() })
	waitQueued(t, rdb, c.NewMutex("k"), "k")
	key := "rlock_ticket:{k}"
	if n := numsub(rdb, key); n != 1 {
		t.Fatalf("subscribers of the key's channel within its linger: %d, want 1", n)
	}
	rlock.SweepTickets(c)
	testserver.WaitUntil(t, 10*time.Second, "the key's channel unsubscribed", func() bool { return numsub(rdb, key) == 0 })
}

// A new ticket connection forgets the idle channels of the one it replaces: a wait on a
// key whose channel was idle subscribes again there, and is granted.
func TestAWaitAfterAReconnectSubscribesItsIdleChannelAgain(t *testing.T) {
	_, rdb, c := setup(t)
	ctx := context.Background()
	m := c.NewMutex("k")
	waitQueued(t, rdb, m, "k")
	tagged := "rlock_ticket:{k}:" + rlock.TicketTag(c)
	if n := numsub(rdb, tagged); n != 1 {
		t.Fatalf("subscribers of the idle channel: %d, want 1", n)
	}
	id := ticketCommandConn(ctx, rdb)
	if id == "" {
		t.Fatal("no ticket connection")
	}
	// Killed while nobody waits: the next wait's command finds it broken, and the hub
	// makes a new session (both connections) for it.
	must(t, rdb.ConfigResetStat(ctx).Err())
	must(t, rdb.Do(ctx, "CLIENT", "KILL", "ID", id).Err())
	waitQueued(t, rdb, m, "k")
	if sub := cmdCalls(t, rdb, "subscribe"); sub != 1 {
		t.Fatalf("SUBSCRIBE %d after the reconnect, want 1", sub)
	}
	testserver.WaitUntil(t, 10*time.Second, "one subscriber, on the new connection", func() bool { return numsub(rdb, tagged) == 1 })
}
