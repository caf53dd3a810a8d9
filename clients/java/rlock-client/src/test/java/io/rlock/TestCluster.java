// Test support (clients/java tests): a real local Redis Cluster of 3 masters, module-loaded
// or (scripts mode) not, on free ports of 127.0.0.1, built as tests/support/cluster_helpers.py
// builds one: cluster-enabled servers, a third of the slots each (CLUSTER ADDSLOTSRANGE),
// CLUSTER MEET, then wait for cluster_state:ok everywhere. Slots can be moved the classic
// way (SETSLOT, MIGRATE).
package io.rlock;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;

public final class TestCluster implements AutoCloseable {
    public final List<TestServer> masters = new ArrayList<>();
    static final int[][] RANGES = {{0, 5460}, {5461, 10922}, {10923, 16383}};

    public TestCluster() {
        this(true);
    }

    /** `module` false: module-less nodes, as a managed service's cluster (scripts mode). */
    public TestCluster(boolean module) {
        try {
            String[] conf = {"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", "2000"};
            for (int i = 0; i < 3; i++) {
                masters.add(module ? new TestServer(conf) : TestServer.withoutModule(conf));
            }
            for (int i = 0; i < 3; i++) {
                masters.get(i).call("CLUSTER", "ADDSLOTSRANGE", Integer.toString(RANGES[i][0]), Integer.toString(RANGES[i][1]));
                // Distinct config epochs from the start, as redis-cli --cluster create sets
                // them: left at 0 they are told apart by collisions over several gossip
                // rounds, and a slot moved meanwhile can be claimed back by its old owner.
                masters.get(i).call("CLUSTER", "SET-CONFIG-EPOCH", Integer.toString(i + 1));
            }
            for (int i = 1; i < 3; i++) {
                masters.get(0).call("CLUSTER", "MEET", "127.0.0.1", Integer.toString(masters.get(i).port));
            }
            TestServer.waitUntil(Duration.ofSeconds(20), "cluster_state:ok on every node", () -> masters.stream()
                    .allMatch(m -> m.redis().clusterInfo().contains("cluster_state:ok")
                            && m.redis().clusterNodes().lines().count() == 3));
        } catch (RuntimeException e) {
            close();
            throw e;
        }
    }

    /** The master that owns `key`'s slot now (as the masters themselves say). */
    public TestServer ownerOf(String key) {
        int slot = slot(key);
        for (TestServer m : masters) {
            if (owner(m, slot) == m.port) {
                return m;
            }
        }
        throw new IllegalStateException("no owner for slot " + slot);
    }

    public int slot(String key) {
        return masters.get(0).redis().clusterKeyslot(key).intValue();
    }

    String id(TestServer m) {
        return (String) m.call("CLUSTER", "MYID");
    }

    /** The port of `slot`'s owner in `via`'s view (CLUSTER NODES), or -1. */
    static int owner(TestServer via, int slot) {
        for (String line : via.redis().clusterNodes().split("\n")) {
            String[] f = line.trim().split(" ");
            if (f.length < 9 || !f[2].contains("master")) {
                continue;
            }
            for (int i = 8; i < f.length; i++) {
                if (f[i].startsWith("[")) {
                    continue; // a slot migrating or importing: not served from here yet
                }
                String[] r = f[i].split("-");
                int lo = Integer.parseInt(r[0]), hi = Integer.parseInt(r[r.length - 1]);
                if (slot >= lo && slot <= hi) {
                    return Integer.parseInt(f[1].substring(f[1].indexOf(':') + 1, f[1].indexOf('@')));
                }
            }
        }
        return -1;
    }

    /** A master other than `m`. */
    TestServer other(TestServer m) {
        return masters.get(0) == m ? masters.get(1) : masters.get(0);
    }

    /**
     * Classic resharding, redis-cli's steps: IMPORTING, MIGRATING, then MIGRATE every key
     * of the slot (the lock's, and the module's request-id records beside it).
     */
    void beginMigration(int slot, TestServer src, TestServer dst) {
        settleEpochs();
        String s = Integer.toString(slot);
        dst.call("CLUSTER", "SETSLOT", s, "IMPORTING", id(src));
        src.call("CLUSTER", "SETSLOT", s, "MIGRATING", id(dst));
        while (true) {
            List<?> keys = (List<?>) src.call("CLUSTER", "GETKEYSINSLOT", s, "100");
            if (keys.isEmpty()) {
                return;
            }
            List<String> cmd = new ArrayList<>(List.of("MIGRATE", "127.0.0.1", Integer.toString(dst.port), "", "0", "5000", "KEYS"));
            keys.forEach(k -> cmd.add((String) k));
            src.call(cmd.toArray(String[]::new));
        }
    }

    /**
     * Ends a classic migration: SETSLOT NODE on the new owner first (it takes a config epoch
     * above every other), then the old owner, then the rest, as redis-cli does; then every
     * node agrees.
     */
    void finishMigration(int slot, TestServer src, TestServer dst) {
        String dstId = id(dst);
        List<TestServer> order = new ArrayList<>(List.of(dst, src));
        masters.stream().filter(m -> m != dst && m != src).forEach(order::add);
        for (TestServer m : order) {
            m.call("CLUSTER", "SETSLOT", Integer.toString(slot), "NODE", dstId);
        }
        waitOwner(slot, dst);
    }

    /**
     * Waits until every node knows every master's config epoch alike, the epochs are
     * distinct, and every node's current epoch is their maximum. A slot's new owner then
     * takes an epoch above all others when it claims the slot; with a stale current epoch
     * it could take one another node has, and gossip sent by the old owner before its
     * SETSLOT could win the slot back on a node that had not yet heard the new claim.
     */
    void settleEpochs() {
        TestServer.waitUntil(Duration.ofSeconds(20), "config epochs agreed, distinct and current on every node", () -> {
            String seen = null;
            for (TestServer m : masters) {
                java.util.TreeMap<String, Long> epochs = new java.util.TreeMap<>();
                for (String line : m.redis().clusterNodes().split("\n")) {
                    String[] f = line.trim().split(" ");
                    if (f.length >= 8 && f[2].contains("master")) {
                        epochs.put(f[0], Long.parseLong(f[6]));
                    }
                }
                long max = epochs.values().stream().mapToLong(Long::longValue).max().orElse(0);
                if (epochs.size() != masters.size() || epochs.values().stream().distinct().count() != epochs.size()
                        || !m.redis().clusterInfo().contains("cluster_current_epoch:" + max + "\r")) {
                    return false;
                }
                if (seen != null && !seen.equals(epochs.toString())) {
                    return false;
                }
                seen = epochs.toString();
            }
            return true;
        });
    }

    void waitOwner(int slot, TestServer dst) {
        try {
            TestServer.waitUntil(Duration.ofSeconds(20), "every node sees slot " + slot + " on " + dst.port,
                    () -> masters.stream().allMatch(m -> owner(m, slot) == dst.port));
        } catch (AssertionError e) {
            StringBuilder views = new StringBuilder(e.getMessage());
            for (TestServer m : masters) {
                views.append("\n-- CLUSTER NODES on ").append(m.port).append(":\n").append(m.redis().clusterNodes());
            }
            throw new AssertionError(views.toString(), e);
        }
    }

    @Override
    public void close() {
        for (TestServer m : masters) {
            m.close();
        }
    }
}
