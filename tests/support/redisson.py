"""Redisson's lock protocol, as its RedissonLock sends it (facts about the wire protocol,
kept here so the interop tests run the very scripts a Java service would)."""

from redisson_scripts import script

# tryLockInnerAsync: KEYS[1] = lock; ARGV[1] = lease ms, ARGV[2] = owner ("<uuid>:<thread>").
ACQUIRE = script("lock_acquire")

# unlockInnerAsync with the unlock latch: KEYS = lock, channel, latch;
# ARGV = message, lease ms, owner, publish command, latch timeout ms.
UNLOCK = script("lock_unlock")

# renewExpirationAsync (the watchdog): KEYS[1] = lock; ARGV[1] = lease ms, ARGV[2] = owner.
RENEW = script("lock_renew")

# forceUnlockAsync: KEYS = lock, channel; ARGV = message, publish.
FORCE_UNLOCK = script("lock_force_unlock")


def channel(key):
    """Redisson's prefixName rule: braces around the key unless it already has one."""
    return f"redisson_lock__channel:{key}" if "{" in key else f"redisson_lock__channel:{{{key}}}"


class Redisson:
    """A Redisson client's view of one lock, driving its own Lua scripts."""

    def __init__(self, r, key, owner, lease=30_000):
        self.r, self.key, self.owner, self.lease = r, key, owner, lease
        self._acquire = r.register_script(ACQUIRE)
        self._unlock = r.register_script(UNLOCK)
        self._force = r.register_script(FORCE_UNLOCK)
        self._request = 0

    def try_lock(self):
        """None when acquired, else the holder's PTTL (Redisson's contract)."""
        return self._acquire(keys=[self.key], args=[self.lease, self.owner])

    def unlock(self):
        """1 freed, 0 still held (count went down), None not held."""
        self._request += 1
        latch = f"redisson_unlock_latch:{{{self.key}}}:{self.owner}:{self._request}"
        return self._unlock(keys=[self.key, channel(self.key), latch],
                            args=[0, self.lease, self.owner, "publish", 1000])

    def force_unlock(self):
        return self._force(keys=[self.key, channel(self.key)], args=[0, "publish"])
