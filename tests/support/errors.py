"""The module's error replies, exactly as src/vocab/errors.rs defines them, in one place."""

SYNTAX = "ERR syntax error"
LEASE = "ERR lease-ms must be an integer from 1 to 3153600000000"
TIMEOUT = "ERR timeout-ms must be an integer from 0 to 3153600000000"
EMPTY_OWNER = "ERR owner must not be empty"
EMPTY_ID = "ERR request-id must not be empty"
NOT_A_LOCK = ("ERR key holds a hash that is not a lock "
              "(every field value must be a positive integer hold count)")
WRONGTYPE = "WRONGTYPE Operation against a key holding the wrong kind of value"
TOO_MANY_WAITERS = "ERR too many clients waiting for this lock (see rlock.max-waiters-per-key)"
INTERNAL = "ERR rlock internal error (details in the server log)"
ROLE_CHANGED = "READONLY this server became a replica while the client waited for the lock"


def text(error):
    """What redis-py's exception shows: it drops the codes it maps to its own classes."""
    for code in ("ERR ", "READONLY "):
        if error.startswith(code):
            return error[len(code):]
    return error

# Countdown latch (RLATCH.*)
NOT_A_LATCH = "ERR key holds a string that is not a latch count (it must be a decimal integer)"
LATCH_COUNT = "ERR count must be an integer from 1 to 9223372036854775807"
LATCH_OVERFLOW = "ERR latch count would overflow"
# Semaphores (RSEMAPHORE.*, RPSEMAPHORE.*)
NOT_A_SEMAPHORE = "ERR key holds a string that is not a permit count (it must be a decimal integer)"
NOT_A_PERMIT_SET = "ERR the permit set is not a semaphore's (every score must be an integer expiry in ms)"
PERMITS = "ERR permits must be an integer from 0 to 2147483647"
PERMITS_DELTA = "ERR permits must be an integer from -2147483647 to 2147483647"
PERMIT_COUNT = "ERR permits must be an integer from 1 to 1024"
PERMITS_OVERFLOW = "ERR permit count would overflow"
PERMIT_LEASE = "ERR lease-ms must be -1 (no lease) or an integer from 1 to 3153600000000"
PERMIT_ID = "ERR permit-id must be 2 to 64 hex digits, an even number of them"
TTL = "ERR ttl-ms must be an integer from 1 to 3153600000000"
# Queued tickets (docs/tickets.md)
ASYNC = "ERR ASYNC needs WAIT and ID"
