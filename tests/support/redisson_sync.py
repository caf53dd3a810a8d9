"""Redisson's semaphore, permit-expirable semaphore and countdown latch protocols, as its
Java classes send them.

The scripts named below (clients/python/rlock/lua/*.lua) are Redisson's own (RedissonSemaphore, RedissonPermitExpirableSemaphore,
RedissonCountDownLatch; Redisson 4.7.0, unchanged on master 66863978, 2026-08-21), kept
the same in logic so that interop tests run exactly what a Java service runs against the
same names. docs/internals/redisson-sync-layouts.md describes the layout they implement; this file
is the executable half of it. Like tests/support/redisson.py for the plain lock, it knows no
module. Each script's comment gives its KEYS and ARGV.

Java passes `System.currentTimeMillis()` to the permit-expirable scripts; here every such
method takes an optional `now` (ms), so tests can move time without sleeping.
"""

from redisson_scripts import script

import os
import time

from redisson_rw import prefix_name, suffix_name

# RPermitExpirableSemaphore's score for a permit acquired without a lease (leaseTime -1).
NON_EXPIRABLE = 922337203685477

# CountDownLatchPubSub's messages.
ZERO_COUNT_MESSAGE = 0  # the count reached zero: awaiters return
NEW_COUNT_MESSAGE = 1   # a count was set (or the latch deleted): awaiters keep waiting


def semaphore_channel(name):
    """Both semaphores publish on `redisson_sc:{name}` (prefixName rule)."""
    return prefix_name("redisson_sc", name)


def timeout_name(name):
    """The permit-expirable semaphore's zset of permits: `{name}:timeout` (suffixName)."""
    return suffix_name(name, "timeout")


def latch_channel(name):
    """RedissonCountDownLatch.getChannelName: always braces, even around a name that has
    its own `{` (no prefixName rule here)."""
    return "redisson_countdownlatch__channel__{" + name + "}"


def now_ms():
    return int(time.time() * 1000)


def new_permit_id():
    """ServiceManager.generateId: 16 random bytes as lowercase hex (ByteBufUtil.hexDump).
    The scripts get the 16 raw bytes (ByteBufUtil.decodeHexDump): they are the zset member."""
    return os.urandom(16).hex()


# ---- RSemaphore ---------------------------------------------------------------------

# tryAcquireAsync0. KEYS = name; ARGV = permits. 1 taken, 0 not enough (or no key).
SEM_TRY_ACQUIRE = script("semaphore_try_acquire")

# releaseAsync. KEYS = name, channel; ARGV = permits, publish command. Creates the key.
SEM_RELEASE = script("semaphore_release")

# releaseIfExistsAsync. Same KEYS/ARGV; 0 without touching a missing key.
SEM_RELEASE_IF_EXISTS = script("semaphore_release_if_exists")

# drainPermitsAsync. KEYS = name. Returns the old value; SET 0 drops any TTL.
SEM_DRAIN = script("semaphore_drain")

# trySetPermitsAsync. KEYS = name, channel; ARGV = permits, publish command. Publishes
# the permits. The Duration variant adds ARGV[3] = ttl ms and sets with PX.
SEM_TRY_SET = script("semaphore_try_set")

SEM_TRY_SET_TTL = script("semaphore_try_set_ttl")

# addPermitsAsync. KEYS = name, channel; ARGV = delta (may be negative), publish command.
# SET (not INCRBY): drops any TTL. Publishes the new value.
SEM_ADD = script("semaphore_add")


class RedissonSemaphore:
    """A Redisson client's view of one RSemaphore."""

    def __init__(self, r, name, publish="publish"):
        self.r, self.name, self.publish = r, name, publish
        self.channel = semaphore_channel(name)
        self._scripts = {k: r.register_script(v) for k, v in {
            "acquire": SEM_TRY_ACQUIRE, "release": SEM_RELEASE,
            "release_if_exists": SEM_RELEASE_IF_EXISTS, "drain": SEM_DRAIN,
            "try_set": SEM_TRY_SET, "try_set_ttl": SEM_TRY_SET_TTL, "add": SEM_ADD}.items()}

    def _run(self, script, keys, args):
        return self._scripts[script](keys=keys, args=args)

    def try_set_permits(self, permits, ttl_ms=None):
        if ttl_ms is None:
            return self._run("try_set", [self.name, self.channel], [permits, self.publish]) == 1
        return self._run("try_set_ttl", [self.name, self.channel], [permits, self.publish, ttl_ms]) == 1

    def add_permits(self, delta):
        self._run("add", [self.name, self.channel], [delta, self.publish])

    def try_acquire(self, permits=1):
        if permits == 0:
            return True  # Java answers without a call
        return self._run("acquire", [self.name], [permits]) == 1

    def release(self, permits=1):
        if permits:
            self._run("release", [self.name, self.channel], [permits, self.publish])

    def release_if_exists(self, permits=1):
        return self._run("release_if_exists", [self.name, self.channel], [permits, self.publish]) == 1

    def available_permits(self):
        value = self.r.get(self.name)
        return 0 if value is None else int(value)

    def drain_permits(self):
        return int(self._run("drain", [self.name], []))


# ---- RPermitExpirableSemaphore ----------------------------------------------------------

# Every script but tryRelease(id) and trySetPermits/addPermits first reclaims expired
# permits: ZRANGEBYSCORE timeout 0 now, ZREM them, INCRBY the count by how many, and
# publish the new count when it is positive.

# tryAcquireAsync(ids, timeoutDate). KEYS = name, timeout zset, channel; ARGV = permits,
# expiry (absolute ms, or NON_EXPIRABLE), now, NON_EXPIRABLE, publish command, then the
# permit ids as raw bytes. Reclaims at most `permits` expired ids. Returns 'OK' when taken,
# else ':<earliest expiry>' when some permit expires, else nil.
PES_TRY_ACQUIRE = script("pes_try_acquire")

# tryReleaseAsync(id). KEYS = name, channel, timeout zset; ARGV = id bytes, 1, now,
# publish command. No reclaim. An expired but not yet reclaimed permit is returned to the
# pool (and the new count published) but the reply is 0, as for an unknown id.
PES_RELEASE = script("pes_release")

# tryReleaseAsync(ids). KEYS = name, channel, timeout zset; ARGV = count, now, publish
# command, ids. All or nothing: 0 if any id is unknown or expired. Publishes how many.
PES_RELEASE_MANY = script("pes_release_many")

# The next five share the reclaim prefix (written out in each .lua file). KEYS = name,
# timeout zset, channel.

# availablePermitsAsync. ARGV = now, publish command. A write: it reclaims.
PES_AVAILABLE = script("pes_available")

# getPermitsAsync: available + ZCOUNT (0 when there is no count key).
PES_GET_PERMITS = script("pes_get_permits")

# acquiredPermitsAsync: ZCOUNT after the reclaim.
PES_ACQUIRED = script("pes_acquired")

# updateLeaseTimeAsync. ARGV = id bytes, new expiry (absolute or NON_EXPIRABLE), now,
# publish command. 1 when the (unexpired) permit exists.
PES_UPDATE_LEASE = script("pes_update_lease")

# getLeaseTimeAsync. ARGV = id bytes, NON_EXPIRABLE, now, publish command. -1 without a
# lease, the remaining ms, or 0 for an unknown permit (Java then throws).
PES_LEASE_TIME = script("pes_lease_time")

# trySetPermitsAsync. KEYS = name, channel; ARGV = permits, publish command.
PES_TRY_SET = SEM_TRY_SET

# setPermitsAsync. KEYS = name, channel, timeout zset; ARGV = permits, publish command.
# Makes available + acquired equal `permits`; publishes the permits when it changed.
PES_SET_PERMITS = script("pes_set_permits")

# addPermitsAsync. KEYS = name, channel; ARGV = delta, publish command. Publishes the
# delta (not the new value), only when it is positive.
PES_ADD = script("pes_add")


class RedissonPermitExpirableSemaphore:
    """A Redisson client's view of one RPermitExpirableSemaphore. Permit ids are the hex
    strings Java hands out; the zset holds their raw bytes."""

    def __init__(self, r, name, publish="publish"):
        self.r, self.name, self.publish = r, name, publish
        self.channel = semaphore_channel(name)
        self.timeout = timeout_name(name)
        scripts = {"acquire": PES_TRY_ACQUIRE, "release": PES_RELEASE,
                   "release_many": PES_RELEASE_MANY, "available": PES_AVAILABLE,
                   "permits": PES_GET_PERMITS, "acquired": PES_ACQUIRED,
                   "update": PES_UPDATE_LEASE, "lease": PES_LEASE_TIME, "try_set": PES_TRY_SET,
                   "set": PES_SET_PERMITS, "add": PES_ADD}
        self._scripts = {k: r.register_script(v) for k, v in scripts.items()}
        self.last_reply = None

    def _run(self, script, keys, args):
        return self._scripts[script](keys=keys, args=args)

    def _reclaiming(self, script, args):
        return self._run(script, [self.name, self.timeout, self.channel], args)

    def try_acquire(self, permits=1, lease_ms=-1, now=None, ids=None):
        """The permit ids when taken, else [] (Java's tryAcquire). `last_reply` keeps the
        script's raw answer (b'OK', b':<expiry>' or None)."""
        now = now_ms() if now is None else now
        ids = ids or [new_permit_id() for _ in range(permits)]
        expiry = NON_EXPIRABLE if lease_ms == -1 else now + lease_ms
        args = [permits, expiry, now, NON_EXPIRABLE, self.publish, *(bytes.fromhex(i) for i in ids)]
        reply = self._run("acquire", [self.name, self.timeout, self.channel], args)
        self.last_reply = reply.encode() if isinstance(reply, str) else reply
        return ids if self.last_reply == b"OK" else []

    def try_release(self, permit_id, now=None):
        now = now_ms() if now is None else now
        return self._run("release", [self.name, self.channel, self.timeout],
                         [bytes.fromhex(permit_id), 1, now, self.publish]) == 1

    def try_release_many(self, permit_ids, now=None):
        now = now_ms() if now is None else now
        return self._run("release_many", [self.name, self.channel, self.timeout],
                         [len(permit_ids), now, self.publish, *(bytes.fromhex(i) for i in permit_ids)])

    def update_lease_time(self, permit_id, lease_ms, now=None):
        now = now_ms() if now is None else now
        expiry = NON_EXPIRABLE if lease_ms == -1 else now + lease_ms
        return self._reclaiming("update", [bytes.fromhex(permit_id), expiry, now, self.publish]) == 1

    def lease_time(self, permit_id, now=None):
        now = now_ms() if now is None else now
        return self._reclaiming("lease", [bytes.fromhex(permit_id), NON_EXPIRABLE, now, self.publish])

    def available_permits(self, now=None):
        now = now_ms() if now is None else now
        return int(self._reclaiming("available", [now, self.publish]))

    def get_permits(self, now=None):
        now = now_ms() if now is None else now
        return int(self._reclaiming("permits", [now, self.publish]))

    def acquired_permits(self, now=None):
        now = now_ms() if now is None else now
        return int(self._reclaiming("acquired", [now, self.publish]))

    def try_set_permits(self, permits):
        return self._run("try_set", [self.name, self.channel], [permits, self.publish]) == 1

    def set_permits(self, permits):
        self._run("set", [self.name, self.channel, self.timeout], [permits, self.publish])

    def add_permits(self, delta):
        self._run("add", [self.name, self.channel], [delta, self.publish])


# ---- RCountDownLatch --------------------------------------------------------------------

# countDownAsync. KEYS = name, channel; ARGV = ZERO_COUNT_MESSAGE, publish command. DECR;
# the key goes at <= 0 (a countDown on no latch creates -1 and deletes it); the zero
# message only when it reaches exactly 0.
LATCH_COUNT_DOWN = script("latch_count_down")

# trySetCountAsync. KEYS = name, channel; ARGV = NEW_COUNT_MESSAGE, count, publish command.
LATCH_TRY_SET = script("latch_try_set")

# deleteAsync. KEYS = name, channel; ARGV = NEW_COUNT_MESSAGE, publish command.
LATCH_DELETE = script("latch_delete")


class RedissonCountDownLatch:
    """A Redisson client's view of one RCountDownLatch."""

    def __init__(self, r, name, publish="publish"):
        self.r, self.name, self.publish = r, name, publish
        self.channel = latch_channel(name)
        self._count_down = r.register_script(LATCH_COUNT_DOWN)
        self._try_set = r.register_script(LATCH_TRY_SET)
        self._delete = r.register_script(LATCH_DELETE)

    def try_set_count(self, count):
        return self._try_set(keys=[self.name, self.channel],
                             args=[NEW_COUNT_MESSAGE, count, self.publish]) == 1

    def count_down(self):
        self._count_down(keys=[self.name, self.channel], args=[ZERO_COUNT_MESSAGE, self.publish])

    def get_count(self):
        value = self.r.get(self.name)
        return 0 if value is None else int(value)

    def delete(self):
        return self._delete(keys=[self.name, self.channel], args=[NEW_COUNT_MESSAGE, self.publish]) == 1
