// The `rlock.*` properties of rlock-spring's Boot auto-configuration: the client's options
// and the LockRegistry's, each default the client's own (RlockOptions' DEFAULT_*).
package io.rlock.spring;

import io.rlock.RlockOptions;
import org.springframework.boot.context.properties.ConfigurationProperties;

import java.time.Duration;

/** Bound from {@code rlock.*}. */
@ConfigurationProperties(prefix = "rlock")
public class RlockProperties {
    /** Whether to build the rlock client and LockRegistry from the application's RedisConnectionFactory. */
    private boolean enabled = true;
    /** Lease of a hold taken without one, renewed every third of it (Redisson's lockWatchdogTimeout). */
    private Duration watchdogTimeout = RlockOptions.DEFAULT_WATCHDOG_TIMEOUT;
    /** Tries of a transiently failing command, the first included. */
    private int retryAttempts = RlockOptions.DEFAULT_RETRY_ATTEMPTS;
    /** How waiting calls wait: AUTO (queued tickets when the module takes them), TICKETS or BLOCKING. */
    private RlockOptions.WaitMode waitMode = RlockOptions.WaitMode.AUTO;
    /** After each lock acquire, wait for every connected replica to acknowledge it (Redisson's checkLockSyncedSlaves). */
    private boolean replicaSync = true;
    /** How long that wait lasts (Redisson's slavesSyncTimeout). */
    private Duration replicaSyncTimeout = RlockOptions.DEFAULT_REPLICA_TIMEOUT;
    private final Registry registry = new Registry();

    /** The LockRegistry's settings. */
    public static class Registry {
        /** Prefix of the registry's lock keys (`<key>:<lock key>`). */
        private String key = RlockLockRegistry.DEFAULT_REGISTRY_KEY;
        /** A fixed lease for every hold (as RedisLockRegistry's expireAfter); unset: the watchdog keeps holds. */
        private Duration expireAfter;

        public String getKey() { return key; }
        public void setKey(String key) { this.key = key; }
        public Duration getExpireAfter() { return expireAfter; }
        public void setExpireAfter(Duration expireAfter) { this.expireAfter = expireAfter; }
    }

    /** The client options these properties make. */
    public RlockOptions toOptions() {
        RlockOptions o = RlockOptions.defaults().withWatchdogTimeout(watchdogTimeout).withRetryAttempts(retryAttempts)
                .withWaitMode(waitMode);
        return replicaSync ? o.withReplicaSync(RlockOptions.REPLICAS_CONNECTED, replicaSyncTimeout) : o.withoutReplicaSync();
    }

    public boolean isEnabled() { return enabled; }
    public void setEnabled(boolean enabled) { this.enabled = enabled; }
    public Duration getWatchdogTimeout() { return watchdogTimeout; }
    public void setWatchdogTimeout(Duration watchdogTimeout) { this.watchdogTimeout = watchdogTimeout; }
    public int getRetryAttempts() { return retryAttempts; }
    public void setRetryAttempts(int retryAttempts) { this.retryAttempts = retryAttempts; }
    public RlockOptions.WaitMode getWaitMode() { return waitMode; }
    public void setWaitMode(RlockOptions.WaitMode waitMode) { this.waitMode = waitMode; }
    public boolean isReplicaSync() { return replicaSync; }
    public void setReplicaSync(boolean replicaSync) { this.replicaSync = replicaSync; }
    public Duration getReplicaSyncTimeout() { return replicaSyncTimeout; }
    public void setReplicaSyncTimeout(Duration replicaSyncTimeout) { this.replicaSyncTimeout = replicaSyncTimeout; }
    public Registry getRegistry() { return registry; }
}
