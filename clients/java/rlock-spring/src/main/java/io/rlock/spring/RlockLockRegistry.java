// Spring Integration's LockRegistry on rlock (rlock-spring): what RedisLockRegistry is to a
// plain Redis, so executeLocked, LockRegistryLeaderInitiator and every component taking a
// LockRegistry run on rlock's server-side FIFO waits instead of polling every 100 ms.
package io.rlock.spring;

import io.rlock.RlockClient;
import io.rlock.RlockLock;
import org.springframework.integration.support.locks.DistributedLock;
import org.springframework.integration.support.locks.ExpirableLockRegistry;
import org.springframework.integration.support.locks.RenewableLockRegistry;

import java.time.Duration;
import java.util.Map;
import java.util.Objects;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.locks.Condition;

/**
 * A registry of distributed locks, one per key, stored as rlock's re-entrant lock (Redisson's
 * RLock layout) at {@code <registryKey>:<lockKey>}.
 *
 * <p>As with Spring's RedisLockRegistry, keys are Strings, a lock is re-entrant and owned by
 * the thread that took it, and {@link #renewLock} extends the current thread's hold. Unlike
 * it, a waiting thread is queued in the server and handed the lock when it is released (no
 * polling, first come first served), and by default a hold has no fixed expiry: the client's
 * watchdog renews it while the process lives (30 s lease, Redisson's default), so a long
 * critical section is not silently unprotected. {@code expireAfter} gives every hold a fixed
 * lease instead, renewed only by {@link #renewLock}, as RedisLockRegistry's does.
 *
 * <p>{@code unlock()} by a thread that does not hold the lock, or whose hold was lost (expired,
 * force-released), throws {@link IllegalMonitorStateException}, the JDK's convention.
 */
public class RlockLockRegistry implements ExpirableLockRegistry<DistributedLock>, RenewableLockRegistry<DistributedLock> {
    /** The default key prefix of the registry's locks. */
    public static final String DEFAULT_REGISTRY_KEY = "rlock-registry";

    private final RlockClient client;
    private final String registryKey;
    private final Duration expireAfter;
    private final Map<String, RegistryLock> locks = new ConcurrentHashMap<>();

    /** Locks at {@code rlock-registry:<key>}, kept by the watchdog. */
    public RlockLockRegistry(RlockClient client) {
        this(client, DEFAULT_REGISTRY_KEY, null);
    }

    public RlockLockRegistry(RlockClient client, String registryKey) {
        this(client, registryKey, null);
    }

    /**
     * @param expireAfter every hold's fixed lease (renewed only by renewLock), or null for
     *                    the watchdog's renewed lease
     */
    public RlockLockRegistry(RlockClient client, String registryKey, Duration expireAfter) {
        this.client = Objects.requireNonNull(client, "client");
        if (registryKey == null || registryKey.isEmpty()) {
            throw new IllegalArgumentException("registryKey must be a non-empty string");
        }
        if (expireAfter != null && (expireAfter.isNegative() || expireAfter.toMillis() < 1)) {
            throw new IllegalArgumentException("expireAfter must be at least 1 ms, got " + expireAfter);
        }
        this.registryKey = registryKey;
        this.expireAfter = expireAfter;
    }

    public RlockClient getClient() {
        return client;
    }

    /** The server key of `lockKey`'s lock. */
    public String keyOf(String lockKey) {
        return registryKey + ":" + lockKey;
    }

    private static String path(Object lockKey) {
        if (!(lockKey instanceof String s)) {
            throw new IllegalArgumentException("lock keys are Strings, got "
                    + (lockKey == null ? "null" : lockKey.getClass().getName()));
        }
        return s;
    }

    @Override
    public DistributedLock obtain(Object lockKey) {
        String path = path(lockKey);
        RegistryLock lock = locks.computeIfAbsent(path, p -> new RegistryLock(client.getLock(keyOf(p))));
        lock.lastObtained = System.currentTimeMillis();
        return lock;
    }

    /** Forgets locks obtained more than `age` ms ago and not held in this process (the server keeps nothing for them). */
    @Override
    public void expireUnusedOlderThan(long age) {
        long now = System.currentTimeMillis();
        locks.values().removeIf(l -> now - l.lastObtained >= age && l.localHolds.get() == 0);
    }

    /** Renews the current thread's hold of `lockKey` for expireAfter (or the watchdog timeout). */
    @Override
    public void renewLock(Object lockKey) {
        renewLock(lockKey, expireAfter != null ? expireAfter : client.options().watchdogTimeout());
    }

    /**
     * Sets the current thread's hold of `lockKey` to expire `ttl` from now.
     *
     * @throws IllegalStateException when the current thread does not hold it
     */
    @Override
    public void renewLock(Object lockKey, Duration ttl) {
        String path = path(lockKey);
        Objects.requireNonNull(ttl, "ttl");
        RegistryLock lock = locks.get(path);
        RlockLock rl = lock != null ? lock.lock : client.getLock(keyOf(path));
        if (!rl.renewLease(ttl.toMillis(), TimeUnit.MILLISECONDS)) {
            throw new IllegalStateException("could not renew lock " + keyOf(path) + ": the current thread does not hold it");
        }
    }

    @Override
    public String toString() {
        return "RlockLockRegistry{registryKey=" + registryKey + ", expireAfter="
                + (expireAfter == null ? "watchdog" : expireAfter) + "}";
    }

    /** One key's lock: rlock's lock with the registry's lease. */
    final class RegistryLock implements DistributedLock {
        final RlockLock lock;
        /** Holds taken in this process and not yet released (expireUnusedOlderThan keeps these). */
        final AtomicInteger localHolds = new AtomicInteger();
        volatile long lastObtained;

        RegistryLock(RlockLock lock) {
            this.lock = lock;
        }

        /** The registry's lease in ms, -1 for the watchdog. */
        private long lease() {
            return expireAfter == null ? -1 : expireAfter.toMillis();
        }

        private static long ttl(Duration ttl) {
            Objects.requireNonNull(ttl, "ttl");
            if (ttl.toMillis() < 1) {
                throw new IllegalArgumentException("ttl must be at least 1 ms, got " + ttl);
            }
            return ttl.toMillis();
        }

        private boolean held(boolean got) {
            if (got) {
                localHolds.incrementAndGet();
            }
            return got;
        }

        @Override
        public void lock() {
            lock.lock(lease(), TimeUnit.MILLISECONDS);
            held(true);
        }

        @Override
        public void lock(Duration ttl) {
            lock.lock(ttl(ttl), TimeUnit.MILLISECONDS);
            held(true);
        }

        @Override
        public void lockInterruptibly() throws InterruptedException {
            lock.lockInterruptibly(lease(), TimeUnit.MILLISECONDS);
            held(true);
        }

        @Override
        public boolean tryLock() {
            try {
                return tryLock(0, TimeUnit.MILLISECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                return false;
            }
        }

        @Override
        public boolean tryLock(long time, TimeUnit unit) throws InterruptedException {
            return held(lock.tryLock(time, lease(), unit));
        }

        @Override
        public boolean tryLock(Duration waitTime, Duration ttl) throws InterruptedException {
            return held(lock.tryLock(waitTime.toMillis(), ttl(ttl), TimeUnit.MILLISECONDS));
        }

        @Override
        public void unlock() {
            try {
                lock.unlock();
            } finally {
                localHolds.updateAndGet(n -> Math.max(0, n - 1));
            }
        }

        /** Not supported: the server keeps no wait-set for a Condition (nor does RedisLockRegistry). */
        @Override
        public Condition newCondition() {
            return lock.newCondition();
        }

        /** The server key of this lock. */
        public String getKey() {
            return lock.getName();
        }

        @Override
        public String toString() {
            return "RlockLockRegistry.RegistryLock{" + lock.getName() + "}";
        }
    }
}
