// The lost-lock signal of the rlock Java client (clients/java): what a holder is told
// when its watchdog finds a hold gone (expired while the process stalled, force-released,
// a failover that lost it). Redisson only logs this; rlock tells the holder.
package io.rlock;

/** Called (on the client's scheduler thread) once per hold found lost. Keep it short. */
@FunctionalInterface
public interface LockLostListener {
    /**
     * @param name   the lock, semaphore or permit name
     * @param owner  the owner id that held it (`<client id>:<thread id>`, or a permit id)
     * @param reason why the hold is known lost
     */
    void lost(String name, String owner, String reason);
}
