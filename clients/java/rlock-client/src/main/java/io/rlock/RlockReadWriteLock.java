// The read-write lock of the rlock Java client (clients/java; design.md 4.1): a
// java.util.concurrent.locks.ReadWriteLock over RRWLOCK.*, Redisson's RReadWriteLock
// layout. Each half is the re-entrant lock with the RW commands, so waiting, watchdog,
// lost signal and JDK conventions are the lock's.
package io.rlock;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.locks.ReadWriteLock;

/**
 * Many readers or one writer, both re-entrant per thread; the writer may also read.
 * Waiting is FIFO in the server and a queued writer is served before readers that came
 * after it. A thread that reads and asks for the write lock gets an error at once
 * ("release the read lock first") instead of waiting on itself.
 */
public final class RlockReadWriteLock implements ReadWriteLock {
    private final Half read;
    private final Half write;
    private final String name;

    RlockReadWriteLock(RlockClient client, String name) {
        this.name = name;
        this.read = new Half(client, name, "READ");
        this.write = new Half(client, name, "WRITE");
    }

    public String getName() {
        return name;
    }

    @Override
    public RlockLock readLock() {
        return read;
    }

    @Override
    public RlockLock writeLock() {
        return write;
    }

    /** One side of the lock. */
    static final class Half extends RlockLock {
        private final String side;

        Half(RlockClient client, String name, String side) {
            super(client, name);
            this.side = side;
        }

        @Override
        List<String> acquireArgs(String owner, long leaseMs) {
            return new ArrayList<>(List.of("RRWLOCK.ACQUIRE", name, side, owner, Long.toString(leaseMs)));
        }

        @Override
        List<String> releaseArgs(String owner) {
            return new ArrayList<>(List.of("RRWLOCK.RELEASE", name, side, owner));
        }

        @Override
        List<String> renewArgs(String owner, long leaseMs) {
            return List.of("RRWLOCK.RENEW", name, side, owner, Long.toString(leaseMs));
        }

        @Override
        List<String> forceArgs() {
            return List.of("RRWLOCK.FORCERELEASE", name, side);
        }

        /** Redisson's fields: the reader is `<owner>`, the writer `<owner>:write`. */
        @Override
        String field(String owner) {
            return side.equals("WRITE") ? owner + ":write" : owner;
        }

        /** Locked in this half's mode (Redisson reads the hash's `mode` field). */
        @Override
        public CompletableFuture<Boolean> isLockedAsync() {
            String mode = side.equals("WRITE") ? "write" : "read";
            return client.wire().sendRetrying(List.of("HGET", name, "mode")).thenApply(mode::equals);
        }
    }
}
