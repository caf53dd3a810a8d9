"""Redisson's read-write lock and fenced lock protocols, as its Java classes send them.

The scripts named below (clients/python/rlock/lua/*.lua) are Redisson's own (RedissonReadLock, RedissonWriteLock, ReadLockTask,
RedissonFencedLock; Redisson 4.7.0, unchanged on master 66863978, 2026-08-21), kept
verbatim in logic so that the interop tests run exactly what a Java service runs against
the same names. docs/internals/redisson-layouts.md describes the layout they implement; this file is
the executable half of it. Like tests/support/redisson.py for the plain lock, it knows no module.
"""

from redisson_scripts import script

from redisson import UNLOCK


def prefix_name(prefix, name):
    """RedissonObject.prefixName: `prefix:{name}`, or `prefix:name` when name has a `{`."""
    return f"{prefix}:{name}" if "{" in name else f"{prefix}:{{{name}}}"


def suffix_name(name, suffix):
    """RedissonObject.suffixName: `{name}:suffix`, or `name:suffix` when name has a `{`."""
    return f"{name}:{suffix}" if "{" in name else f"{{{name}}}:{suffix}"


def rw_channel(name):
    """Both halves of a read-write lock publish on `redisson_rwlock:{name}`."""
    return prefix_name("redisson_rwlock", name)


def lock_channel(name):
    """The plain (and fenced) lock's channel, `redisson_lock__channel:{name}`."""
    return prefix_name("redisson_lock__channel", name)


def timeout_prefix(name, owner):
    """Per-read-hold timeout keys are `<this>:<n>`, n = 1..hold count of `owner`."""
    return suffix_name(name, owner) + ":rwlock_timeout"


def timeout_key(name, owner, n):
    return f"{timeout_prefix(name, owner)}:{n}"


def key_prefix(name, owner):
    """RedissonReadLock.getKeyPrefix: the timeout prefix cut before `:<owner>`, which is
    `{name}` (or `name` when it has a `{`); unlock and renew rebuild timeout keys from it."""
    return timeout_prefix(name, owner).split(":" + owner)[0]


def token_key(name):
    """The fenced lock's counter: a plain string key `redisson_lock_token:{name}`."""
    return prefix_name("redisson_lock_token", name)


def unlock_latch(name, request_id):
    """RedissonBaseLock.getUnlockLatchName: remembers an unlock's reply for its retries."""
    return prefix_name("redisson_unlock_latch", name) + ":" + request_id


UNLOCK_MESSAGE = 0       # LockPubSub: wake one waiter
READ_UNLOCK_MESSAGE = 1  # LockPubSub: wake every waiter

# RedissonReadLock.tryLockInnerAsync. KEYS = name, timeout prefix;
# ARGV = lease ms, reader field "<uuid>:<thread>", writer field "<uuid>:<thread>:write".
READ_ACQUIRE = script("read_acquire")

# RedissonReadLock.unlockInnerAsync. KEYS = name, rw channel, timeout prefix, key prefix,
# unlock latch; ARGV = UNLOCK_MESSAGE, reader field, publish command, latch timeout ms.
READ_UNLOCK = script("read_unlock")

# ReadLockTask's watchdog, for one lock. KEYS = name, key prefix (pairs, one per lock);
# ARGV = lease ms, then per lock: number of reader fields, the fields.
READ_RENEW = script("read_renew")

# RedissonReadLock.forceUnlockAsync. KEYS = name, rw channel; ARGV = UNLOCK_MESSAGE, publish.
READ_FORCE_UNLOCK = script("read_force_unlock")

# RedissonWriteLock.tryLockInnerAsync. KEYS = name; ARGV = lease ms, writer field.
WRITE_ACQUIRE = script("write_acquire")

# RedissonWriteLock.unlockInnerAsync. KEYS = name, rw channel, unlock latch;
# ARGV = READ_UNLOCK_MESSAGE, lease ms, writer field, publish command, latch timeout ms.
WRITE_UNLOCK = script("write_unlock")

# RedissonWriteLock.forceUnlockAsync. KEYS = name, rw channel; ARGV = READ_UNLOCK_MESSAGE, publish.
WRITE_FORCE_UNLOCK = script("write_force_unlock")

# RedissonFencedLock.tryLockInnerAsync(leaseTime, unit, threadId), behind lockAndGetToken
# and tryLockAndGetToken. KEYS = name, token key; ARGV = lease ms, owner field.
# Reply {-1, token} when acquired or re-entered, {pttl, -1} when held by another.
FENCED_ACQUIRE_TOKEN = script("fenced_acquire_token")

# RedissonFencedLock's override of the plain tryLockInnerAsync (lock(), tryLock()): the
# same rule, the token still incremented, nil/PTTL reply. KEYS = name, token key.
FENCED_ACQUIRE = script("fenced_acquire")

# RedissonLock.unlockInnerAsync: the fenced lock does not override unlock, so its release
# is the plain lock's script (KEYS = name, lock channel, unlock latch; ARGV = message,
# lease ms, owner, publish command, latch ms).
LOCK_UNLOCK = UNLOCK


class _Requests:
    """Unlock request ids, unique per helper, as Redisson's generateId makes them."""

    def __init__(self, owner):
        self.owner, self.n = owner, 0

    def next(self):
        self.n += 1
        return f"{self.owner}:{self.n}"


class RedissonReadWriteLock:
    """One Redisson thread's view of an RReadWriteLock: `owner` is "<uuid>:<thread id>".

    read_*/write_* return what the Java scripts return: acquire -> None or the PTTL;
    unlock -> 1 released, 0 still held, None not held; force -> 1/0.
    """

    def __init__(self, r, name, owner, lease=30_000, publish="publish", latch_ms=1000):
        self.r, self.name, self.owner, self.lease = r, name, owner, lease
        self.publish, self.latch_ms = publish, latch_ms
        self.writer_field = owner + ":write"
        self._requests = _Requests(owner)
        self._read_acquire = r.register_script(READ_ACQUIRE)
        self._read_unlock = r.register_script(READ_UNLOCK)
        self._read_renew = r.register_script(READ_RENEW)
        self._read_force = r.register_script(READ_FORCE_UNLOCK)
        self._write_acquire = r.register_script(WRITE_ACQUIRE)
        self._write_unlock = r.register_script(WRITE_UNLOCK)
        self._write_force = r.register_script(WRITE_FORCE_UNLOCK)

    def read_lock(self, lease=None):
        return self._read_acquire(keys=[self.name, timeout_prefix(self.name, self.owner)],
                                  args=[lease or self.lease, self.owner, self.writer_field])

    def read_unlock(self, request_id=None):
        latch = unlock_latch(self.name, request_id or self._requests.next())
        return self._read_unlock(
            keys=[self.name, rw_channel(self.name), timeout_prefix(self.name, self.owner),
                  key_prefix(self.name, self.owner), latch],
            args=[UNLOCK_MESSAGE, self.owner, self.publish, self.latch_ms])

    def read_renew(self, lease=None):
        """The watchdog's renewal of this owner's read holds: [1] renewed, [0] none held."""
        return self._read_renew(keys=[self.name, key_prefix(self.name, self.owner)],
                                args=[lease or self.lease, 1, self.owner])

    def read_force_unlock(self):
        return self._read_force(keys=[self.name, rw_channel(self.name)],
                                args=[UNLOCK_MESSAGE, self.publish])

    def write_lock(self, lease=None):
        return self._write_acquire(keys=[self.name], args=[lease or self.lease, self.writer_field])

    def write_unlock(self, request_id=None):
        latch = unlock_latch(self.name, request_id or self._requests.next())
        return self._write_unlock(
            keys=[self.name, rw_channel(self.name), latch],
            args=[READ_UNLOCK_MESSAGE, self.lease, self.writer_field, self.publish, self.latch_ms])

    def write_force_unlock(self):
        return self._write_force(keys=[self.name, rw_channel(self.name)],
                                 args=[READ_UNLOCK_MESSAGE, self.publish])

    def timeout_keys(self):
        """This owner's per-hold timeout keys as they exist now."""
        count = int(self.r.hget(self.name, self.owner) or 0)
        return [timeout_key(self.name, self.owner, n) for n in range(1, count + 1)]


class RedissonFencedLock:
    """One Redisson thread's view of an RFencedLock."""

    def __init__(self, r, name, owner, lease=30_000, publish="publish", latch_ms=1000):
        self.r, self.name, self.owner, self.lease = r, name, owner, lease
        self.publish, self.latch_ms = publish, latch_ms
        self._requests = _Requests(owner)
        self._acquire_token = r.register_script(FENCED_ACQUIRE_TOKEN)
        self._acquire = r.register_script(FENCED_ACQUIRE)
        self._unlock = r.register_script(LOCK_UNLOCK)

    def try_lock_and_get_token(self, lease=None):
        """The token when acquired (or re-entered), None when held by another: what
        tryLockAndGetToken() returns. The raw script reply is kept in `last_reply`."""
        self.last_reply = self._acquire_token(keys=[self.name, token_key(self.name)],
                                              args=[lease or self.lease, self.owner])
        ttl, token = self.last_reply
        return token if ttl == -1 else None

    def try_lock(self, lease=None):
        """lock()/tryLock() of a fenced lock: None when acquired, else the PTTL."""
        return self._acquire(keys=[self.name, token_key(self.name)],
                             args=[lease or self.lease, self.owner])

    def get_token(self):
        """getToken(): GET of the token key, None when no token was ever issued."""
        value = self.r.get(token_key(self.name))
        return None if value is None else int(value)

    def unlock(self, request_id=None):
        latch = unlock_latch(self.name, request_id or self._requests.next())
        return self._unlock(keys=[self.name, lock_channel(self.name), latch],
                            args=[UNLOCK_MESSAGE, self.lease, self.owner, self.publish, self.latch_ms])
