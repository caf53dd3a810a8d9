// Scripts mode's "may retry" table (issue 39, docs/scripts-mode.md): which of Redisson's
// scripts may be sent again after a failure that may have come after the server received
// it. Without the module there is no request id to make a second run harmless, so only a
// script whose second run, after an applied first, changes nothing and answers the same
// may go again. The same decisions in every client (the Rust crate's proto/scripts.rs).

package proto

// mayResend is the table, by script name (clients/go/lua/<name>.lua); a script missing
// from it is never re-sent (TestEveryScriptHasAResendDecision keeps it whole).
var mayResend = map[string]bool{
	"lock_acquire": false, // HINCRBY: a second run is a second hold
	// Redisson's unlock latch key (named by the release's request id, which every retry
	// sends again) answers a second run what the first answered.
	"lock_unlock":                 true,
	"lock_renew":                  true,  // PEXPIRE only
	"lock_force_unlock":           false, // a second run answers "was not held"
	"fenced_acquire":              false, // INCR of the token, HINCRBY
	"fenced_acquire_token":        false, // the same
	"read_acquire":                false, // HINCRBY, one more timeout key
	"read_unlock":                 true,  // the unlock latch, as lock_unlock
	"read_renew":                  true,  // PEXPIRE only
	"read_force_unlock":           false, // a second run answers "was not held"
	"write_acquire":               false, // HINCRBY
	"write_unlock":                true,  // the unlock latch, as lock_unlock
	"write_force_unlock":          false, // a second run answers "was not held"
	"semaphore_try_set":           false, // a second run answers "already set"
	"semaphore_try_set_ttl":       false, // the same
	"semaphore_add":               false, // SET value + n
	"semaphore_try_acquire":       false, // DECRBY
	"semaphore_release":           false, // INCRBY
	"semaphore_release_if_exists": false, // INCRBY
	"semaphore_drain":             false, // a second run answers 0: the count is lost
	"pes_available":               true,  // a read; expired ids are reclaimed once
	"pes_acquired":                true,  // the same
	"pes_get_permits":             true,  // the same
	"pes_lease_time":              true,  // the same
	"pes_set_permits":             true,  // sets to a target: a second run finds it
	"pes_add":                     false, // SET value + n
	"pes_try_acquire":             false, // DECRBY and ZADD of fresh ids
	"pes_release":                 false, // a second run answers "not held"
	"pes_release_many":            false, // the same
	"pes_update_lease":            true,  // ZADD of the same id's expiry
	"latch_try_set":               false, // a second run answers "already set"
	"latch_count_down":            false, // DECR
	"latch_delete":                false, // a second run answers "was not there"
}

// MayResend tells whether the script name may be sent again after a failure that may
// have come after the write.
func MayResend(name string) bool { return mayResend[name] }
