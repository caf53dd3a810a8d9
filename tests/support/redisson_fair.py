"""Redisson's fair lock (`RFairLock`, RedissonFairLock) and its 4.4+ non-reentrant variants
(`RedissonNonReentrantLock`, `RedissonNonReentrantFairLock`), as they behave on the wire,
for the tests that show what happens when they share a name with rlock
(tests/interop/test_redisson_fair.py, docs/migrating-from-redisson.md). Read from
redisson/redisson master 66863978 (the same in 4.7.0).

rlock's clients never run these (the module and scripts mode implement the plain RLock),
so they are kept here, beside the tests, rather than in the Python client's lua/ folder
(redisson_scripts.py). Keys and arguments are Redisson's:

- fair acquire (tryLockInnerAsync, the EVAL_LONG form `tryLock(wait, ...)` sends):
  KEYS = lock, `redisson_lock_queue:{name}` (list of waiting owners),
  `redisson_lock_timeout:{name}` (zset owner -> ms until it is dropped);
  ARGV = lease ms, owner, thread wait time ms, now ms. nil = acquired, else a time to wait.
- fair unlock (unlockInnerAsync): KEYS = lock, queue, timeout, channel, unlock latch;
  ARGV = message, lease ms, owner, now ms, publish command, latch ms. The unlock message
  goes to the *next waiter's own* channel, `<channel>:<owner>`, not to the lock's channel.
- non-reentrant acquire: RLock's, except that the holder asking again gets an error.
"""

from redisson import channel

FAIR_ACQUIRE = """
while true do
  local first = redis.call('lindex', KEYS[2], 0)
  if first == false then break end
  local timeout = redis.call('zscore', KEYS[3], first)
  if timeout ~= false and tonumber(timeout) <= tonumber(ARGV[4]) then
    redis.call('zrem', KEYS[3], first)
    redis.call('lpop', KEYS[2])
  else
    break
  end
end
if (redis.call('exists', KEYS[1]) == 0)
    and ((redis.call('exists', KEYS[2]) == 0) or (redis.call('lindex', KEYS[2], 0) == ARGV[2])) then
  redis.call('lpop', KEYS[2])
  redis.call('zrem', KEYS[3], ARGV[2])
  local keys = redis.call('zrange', KEYS[3], 0, -1)
  for i = 1, #keys, 1 do
    redis.call('zincrby', KEYS[3], -tonumber(ARGV[3]), keys[i])
  end
  redis.call('hset', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return nil
end
if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return nil
end
local timeout = redis.call('zscore', KEYS[3], ARGV[2])
if timeout ~= false then
  local ttl = redis.call('pttl', KEYS[1])
  return math.max(0, ttl)
end
local last = redis.call('lindex', KEYS[2], -1)
local ttl
if last ~= false and last ~= ARGV[2] and redis.call('zscore', KEYS[3], last) ~= false then
  ttl = tonumber(redis.call('zscore', KEYS[3], last)) - tonumber(ARGV[4])
else
  ttl = redis.call('pttl', KEYS[1])
end
local timeout = ttl + tonumber(ARGV[3]) + tonumber(ARGV[4])
if redis.call('zadd', KEYS[3], timeout, ARGV[2]) == 1 then
  redis.call('rpush', KEYS[2], ARGV[2])
end
return ttl
"""

FAIR_UNLOCK = """
local val = redis.call('get', KEYS[5])
if val ~= false then return tonumber(val) end
while true do
  local first = redis.call('lindex', KEYS[2], 0)
  if first == false then break end
  local timeout = redis.call('zscore', KEYS[3], first)
  if timeout ~= false and tonumber(timeout) <= tonumber(ARGV[4]) then
    redis.call('zrem', KEYS[3], first)
    redis.call('lpop', KEYS[2])
  else
    break
  end
end
if (redis.call('exists', KEYS[1]) == 0) then
  local next = redis.call('lindex', KEYS[2], 0)
  if next ~= false then redis.call(ARGV[5], KEYS[4] .. ':' .. next, ARGV[1]) end
  redis.call('set', KEYS[5], 1, 'px', ARGV[6])
  return 1
end
if (redis.call('hexists', KEYS[1], ARGV[3]) == 0) then return nil end
local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1)
if (counter > 0) then
  redis.call('pexpire', KEYS[1], ARGV[2])
  redis.call('set', KEYS[5], 0, 'px', ARGV[6])
  return 0
end
redis.call('del', KEYS[1])
redis.call('set', KEYS[5], 1, 'px', ARGV[6])
local next = redis.call('lindex', KEYS[2], 0)
if next ~= false then redis.call(ARGV[5], KEYS[4] .. ':' .. next, ARGV[1]) end
return 1
"""

NON_REENTRANT_ACQUIRE = """
if redis.call('exists', KEYS[1]) == 0 then
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return nil
end
if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  return redis.error_reply(ARGV[3])
end
return redis.call('pttl', KEYS[1])
"""

REENTRY_ERROR = "NON_REENTRANT_REACQUIRE"


def prefix_name(prefix, name):
    return f"{prefix}:{name}" if "{" in name else f"{prefix}:{{{name}}}"


class RedissonFairLock:
    """One owner's view of an RFairLock, driving its scripts with the client's clock."""

    def __init__(self, r, name, owner, lease=30_000, wait_ms=5_000):
        self.r, self.name, self.owner, self.lease, self.wait_ms = r, name, owner, lease, wait_ms
        self.queue = prefix_name("redisson_lock_queue", name)
        self.timeouts = prefix_name("redisson_lock_timeout", name)
        # Each fair waiter listens on a channel of its own.
        self.own_channel = f"{channel(name)}:{owner}"
        self._acquire = r.register_script(FAIR_ACQUIRE)
        self._unlock = r.register_script(FAIR_UNLOCK)
        self._request = 0

    def try_lock(self, now_ms):
        """None when acquired, else the time to wait (the owner is queued)."""
        return self._acquire(keys=[self.name, self.queue, self.timeouts],
                             args=[self.lease, self.owner, self.wait_ms, now_ms])

    def unlock(self, now_ms):
        self._request += 1
        latch = f"redisson_unlock_latch:{{{self.name}}}:{self.owner}:{self._request}"
        return self._unlock(keys=[self.name, self.queue, self.timeouts, channel(self.name), latch],
                            args=[0, self.lease, self.owner, now_ms, "publish", 1000])


class RedissonNonReentrantLock:
    """RedissonNonReentrantLock: RLock's keys, channel and unlock; acquire refuses re-entry."""

    def __init__(self, r, name, owner, lease=30_000):
        self.r, self.name, self.owner, self.lease = r, name, owner, lease
        self._acquire = r.register_script(NON_REENTRANT_ACQUIRE)

    def try_lock(self):
        return self._acquire(keys=[self.name], args=[self.lease, self.owner, REENTRY_ERROR])
