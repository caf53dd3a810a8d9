// Replica sync failure (clients/java): an acquire that fewer replicas acknowledged than
// RlockOptions.withReplicaSync asked for; the acquire has been undone.
package io.rlock;

/** Fewer replicas acknowledged an acquire than asked for; the acquire was given back. */
public class ReplicaSyncException extends IllegalStateException {
    private static final long serialVersionUID = 1L;
    private final long acknowledged;
    private final int wanted;

    public ReplicaSyncException(long acknowledged, int wanted) {
        super("only " + acknowledged + " of " + wanted + " replicas acknowledged the acquire"
                + " within the replica timeout; it was released");
        this.acknowledged = acknowledged;
        this.wanted = wanted;
    }

    public long acknowledged() { return acknowledged; }
    public int wanted() { return wanted; }
}
