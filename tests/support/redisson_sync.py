"""Redisson's semaphore, permit-expirable semaphore and countdown latch protocols, as its
Java classes send them.

The scripts below are Redisson's own (RedissonSemaphore, RedissonPermitExpirableSemaphore,
RedissonCountDownLatch; Redisson 4.7.0, unchanged on master 66863978, 2026-08-21), kept
the same in logic so that interop tests run exactly what a Java service runs against the
same names. docs/redisson-sync-layouts.md describes the layout they implement; this file
is the executable half of it. Like tests/support/redisson.py for the plain lock, it knows no
module. Each script's comment gives its KEYS and ARGV.

Java passes `System.currentTimeMillis()` to the permit-expirable scripts; here every such
method takes an optional `now` (ms), so tests can move time without sleeping.
"""

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
SEM_TRY_ACQUIRE = """
local value = redis.call('get', KEYS[1]);
if (value ~= false and tonumber(value) >= tonumber(ARGV[1])) then
    local val = redis.call('decrby', KEYS[1], ARGV[1]);
    return 1;
end;
return 0;
"""

# releaseAsync. KEYS = name, channel; ARGV = permits, publish command. Creates the key.
SEM_RELEASE = """
local value = redis.call('incrby', KEYS[1], ARGV[1]);
redis.call(ARGV[2], KEYS[2], value);
"""

# releaseIfExistsAsync. Same KEYS/ARGV; 0 without touching a missing key.
SEM_RELEASE_IF_EXISTS = """
if redis.call('exists', KEYS[1]) == 0 then
    return 0
end
local value = redis.call('incrby', KEYS[1], ARGV[1])
redis.call(ARGV[2], KEYS[2], value)
return 1
"""

# drainPermitsAsync. KEYS = name. Returns the old value; SET 0 drops any TTL.
SEM_DRAIN = """
local value = redis.call('get', KEYS[1]);
if (value == false) then
    return 0;
end;
redis.call('set', KEYS[1], 0);
return value;
"""

# trySetPermitsAsync. KEYS = name, channel; ARGV = permits, publish command. Publishes
# the permits. The Duration variant adds ARGV[3] = ttl ms and sets with PX.
SEM_TRY_SET = """
local value = redis.call('get', KEYS[1]);
if (value == false) then
    redis.call('set', KEYS[1], ARGV[1]);
    redis.call(ARGV[2], KEYS[2], ARGV[1]);
    return 1;
end;
return 0;
"""

SEM_TRY_SET_TTL = """
local value = redis.call('get', KEYS[1]);
if (value == false) then
    redis.call('set', KEYS[1], ARGV[1], 'px', ARGV[3]);
    redis.call(ARGV[2], KEYS[2], ARGV[1]);
    return 1;
end;
return 0;
"""

# addPermitsAsync. KEYS = name, channel; ARGV = delta (may be negative), publish command.
# SET (not INCRBY): drops any TTL. Publishes the new value.
SEM_ADD = """
local value = redis.call('get', KEYS[1]);
if (value == false) then
    value = 0;
end;
redis.call('set', KEYS[1], value + ARGV[1]);
redis.call(ARGV[2], KEYS[2], value + ARGV[1]);
"""


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
PES_TRY_ACQUIRE = """
local expiredIds = redis.call('zrangebyscore', KEYS[2], 0, ARGV[3], 'limit', 0, ARGV[1]);
if #expiredIds > 0 then
    redis.call('zrem', KEYS[2], unpack(expiredIds));
    local value = redis.call('incrby', KEYS[1], #expiredIds);
    if tonumber(value) > 0 then
        redis.call(ARGV[5], KEYS[3], value);
    end;
end;
local value = redis.call('get', KEYS[1]);
if (value ~= false and tonumber(value) >= tonumber(ARGV[1])) then
    redis.call('decrby', KEYS[1], ARGV[1]);
    for i = 6, #ARGV, 1 do
        redis.call('zadd', KEYS[2], ARGV[2], ARGV[i]);
    end;
    local ttl = redis.call('pttl', KEYS[1]);
    if ttl > 0 then
        redis.call('pexpire', KEYS[2], ttl);
    end;
    return 'OK';
end;
local v = redis.call('zrange', KEYS[2], 0, 0, 'WITHSCORES');
if v[1] ~= nil and v[2] ~= ARGV[4] then
    return ':' .. tostring(v[2]);
end
return nil;
"""

# tryReleaseAsync(id). KEYS = name, channel, timeout zset; ARGV = id bytes, 1, now,
# publish command. No reclaim. An expired but not yet reclaimed permit is returned to the
# pool (and the new count published) but the reply is 0, as for an unknown id.
PES_RELEASE = """
local expire = redis.call('zscore', KEYS[3], ARGV[1]);
local removed = redis.call('zrem', KEYS[3], ARGV[1]);
if tonumber(removed) ~= 1 then
    return 0;
end;
local value = redis.call('incrby', KEYS[1], ARGV[2]);
redis.call(ARGV[4], KEYS[2], value);
if tonumber(expire) <= tonumber(ARGV[3]) then
    return 0;
end;
return 1;
"""

# tryReleaseAsync(ids). KEYS = name, channel, timeout zset; ARGV = count, now, publish
# command, ids. All or nothing: 0 if any id is unknown or expired. Publishes how many.
PES_RELEASE_MANY = """
for i = 4, #ARGV, 1 do
    local expire = redis.call('zscore', KEYS[3], ARGV[i]);
    if expire == false or tonumber(expire) <= tonumber(ARGV[2]) then
        return 0;
    end;
end;
local expiredIds = redis.call('zrangebyscore', KEYS[3], 0, ARGV[2], 'limit', 0, -1);
if #expiredIds > 0 then
    redis.call('zrem', KEYS[3], unpack(expiredIds));
    local value = redis.call('incrby', KEYS[1], #expiredIds);
    if tonumber(value) > 0 then
        redis.call(ARGV[3], KEYS[2], value);
    end;
end;
local keys = {};
for i = 4, #ARGV, 1 do
    table.insert(keys, ARGV[i]);
end;
local removed = redis.call('zrem', KEYS[3], unpack(keys));
redis.call('incrby', KEYS[1], removed);
redis.call(ARGV[3], KEYS[2], removed);
return removed;
"""

# The reclaim prefix shared by availablePermits, getPermits, acquiredPermits,
# updateLeaseTime and getLeaseTime. KEYS = name, timeout zset, channel. ARGV[now_arg] =
# now, ARGV[pub_arg] = publish command.
_RECLAIM = """
local expiredIds = redis.call('zrangebyscore', KEYS[2], 0, ARGV[{now}], 'limit', 0, -1);
if #expiredIds > 0 then
    redis.call('zrem', KEYS[2], unpack(expiredIds));
    local value = redis.call('incrby', KEYS[1], #expiredIds);
    if tonumber(value) > 0 then
        redis.call(ARGV[{pub}], KEYS[3], value);
    end;
    {after}
end;
"""

# availablePermitsAsync. ARGV = now, publish command. A write: it reclaims.
PES_AVAILABLE = _RECLAIM.format(now=1, pub=2, after="return value;") + """
local ret = redis.call('get', KEYS[1]);
return ret == false and 0 or ret;
"""

# getPermitsAsync: available + ZCOUNT (0 when there is no count key).
PES_GET_PERMITS = _RECLAIM.format(now=1, pub=2, after="") + """
local available = redis.call('get', KEYS[1]);
if available == false then
    return 0
end;
local acquired = redis.call('zcount', KEYS[2], 0, '+inf');
if acquired == false then
    return tonumber(available)
end;
return tonumber(available) + acquired;
"""

# acquiredPermitsAsync: ZCOUNT after the reclaim.
PES_ACQUIRED = _RECLAIM.format(now=1, pub=2, after="") + """
local acquired = redis.call('zcount', KEYS[2], 0, '+inf');
return acquired == false and 0 or acquired;
"""

# updateLeaseTimeAsync. ARGV = id bytes, new expiry (absolute or NON_EXPIRABLE), now,
# publish command. 1 when the (unexpired) permit exists.
PES_UPDATE_LEASE = _RECLAIM.format(now=3, pub=4, after="") + """
local value = redis.call('zscore', KEYS[2], ARGV[1]);
if (value ~= false) then
    redis.call('zadd', KEYS[2], ARGV[2], ARGV[1]);
    return 1;
end;
return 0;
"""

# getLeaseTimeAsync. ARGV = id bytes, NON_EXPIRABLE, now, publish command. -1 without a
# lease, the remaining ms, or 0 for an unknown permit (Java then throws).
PES_LEASE_TIME = _RECLAIM.format(now=3, pub=4, after="") + """
local value = redis.call('zscore', KEYS[2], ARGV[1]);
if (value ~= false) then
    return tonumber(value) == tonumber(ARGV[2]) and -1 or tonumber(value) - tonumber(ARGV[3]);
end;
return 0;
"""

# trySetPermitsAsync. KEYS = name, channel; ARGV = permits, publish command.
PES_TRY_SET = SEM_TRY_SET

# setPermitsAsync. KEYS = name, channel, timeout zset; ARGV = permits, publish command.
# Makes available + acquired equal `permits`; publishes the permits when it changed.
PES_SET_PERMITS = """
local available = redis.call('get', KEYS[1]);
if (available == false) then
    redis.call('set', KEYS[1], ARGV[1]);
    redis.call(ARGV[2], KEYS[2], ARGV[1]);
    return;
end;
local acquired = redis.call('zcount', KEYS[3], 0, '+inf');
local maximum = (acquired == false and 0 or acquired) + tonumber(available);
if (maximum == tonumber(ARGV[1])) then
    return;
end;
redis.call('incrby', KEYS[1], tonumber(ARGV[1]) - maximum);
redis.call(ARGV[2], KEYS[2], ARGV[1]);
"""

# addPermitsAsync. KEYS = name, channel; ARGV = delta, publish command. Publishes the
# delta (not the new value), only when it is positive.
PES_ADD = """
local value = redis.call('get', KEYS[1]);
if (value == false) then
    value = 0;
end;
redis.call('set', KEYS[1], tonumber(value) + tonumber(ARGV[1]));
if tonumber(ARGV[1]) > 0 then
    redis.call(ARGV[2], KEYS[2], ARGV[1]);
end;
"""


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
LATCH_COUNT_DOWN = """
local v = redis.call('decr', KEYS[1]);
if v <= 0 then redis.call('del', KEYS[1]) end;
if v == 0 then redis.call(ARGV[2], KEYS[2], ARGV[1]) end;
"""

# trySetCountAsync. KEYS = name, channel; ARGV = NEW_COUNT_MESSAGE, count, publish command.
LATCH_TRY_SET = """
if redis.call('exists', KEYS[1]) == 0 then
    redis.call('set', KEYS[1], ARGV[2]);
    redis.call(ARGV[3], KEYS[2], ARGV[1]);
    return 1
else
    return 0
end
"""

# deleteAsync. KEYS = name, channel; ARGV = NEW_COUNT_MESSAGE, publish command.
LATCH_DELETE = """
if redis.call('del', KEYS[1]) == 1 then
    redis.call(ARGV[2], KEYS[2], ARGV[1]);
    return 1
else
    return 0
end
"""


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
