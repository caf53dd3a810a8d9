// Retry policy: capped exponential backoff with full jitter, and which server errors are
// worth a retry. Pure: the caller sleeps.

package proto

import (
	"math/rand"
	"sync"
	"time"
)

// jitter is the backoff's random source, seeded per process so that clients started
// together diverge (the global source is only seeded by itself from Go 1.20 on).
var jitter = struct {
	sync.Mutex
	*rand.Rand
}{Rand: rand.New(rand.NewSource(time.Now().UnixNano()))}

// Backoff is a retry policy: at most Attempts tries in all, the n-th retry after a pause
// drawn from [0, min(Cap, Base<<n)] (full jitter, which spreads clients that failed
// together).
type Backoff struct {
	Attempts int
	Base     time.Duration
	Cap      time.Duration
}

// DefaultBackoff: 5 tries within about 2 s, enough to ride over a reconnect or a
// failover's first moments without hiding an outage.
var DefaultBackoff = Backoff{Attempts: 5, Base: 50 * time.Millisecond, Cap: 1 * time.Second}

// Delay is the pause before retry number n (0-based).
func (b Backoff) Delay(n int) time.Duration {
	d := b.Cap
	if n < 30 {
		if e := b.Base << n; e > 0 && e < d {
			d = e
		}
	}
	if d <= 0 {
		return 0
	}
	jitter.Lock()
	defer jitter.Unlock()
	return time.Duration(jitter.Int63n(int64(d) + 1))
}

// TransientReply tells whether a server error text is worth a retry: the server is
// loading, failing over or a cluster is reshaping. Everything else (bad input, a wrong
// type, the module's refusals) would answer the same again.
func TransientReply(text string) bool { return ErrorKind(ErrorCode(text)) == KindRetry }
