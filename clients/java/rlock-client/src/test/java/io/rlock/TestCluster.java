// Test support (clients/java tests): a real local Redis Cluster of 3 module-loaded masters
// on free ports of 127.0.0.1, built as tests/support/cluster_helpers.py builds one: cluster-enabled
// servers, a third of the slots each (CLUSTER ADDSLOTSRANGE), CLUSTER MEET, then wait for
// cluster_state:ok everywhere.
package io.rlock;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;

final class TestCluster implements AutoCloseable {
    final List<TestServer> masters = new ArrayList<>();
    private static final int[][] RANGES = {{0, 5460}, {5461, 10922}, {10923, 16383}};

    TestCluster() {
        try {
            for (int i = 0; i < 3; i++) {
                masters.add(new TestServer("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                        "--cluster-node-timeout", "2000"));
            }
            for (int i = 0; i < 3; i++) {
                masters.get(i).call("CLUSTER", "ADDSLOTSRANGE", Integer.toString(RANGES[i][0]), Integer.toString(RANGES[i][1]));
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

    /** The master that owns `key`'s slot. */
    TestServer ownerOf(String key) {
        long slot = masters.get(0).redis().clusterKeyslot(key);
        for (int i = 0; i < 3; i++) {
            if (slot >= RANGES[i][0] && slot <= RANGES[i][1]) {
                return masters.get(i);
            }
        }
        throw new IllegalStateException("no owner for slot " + slot);
    }

    @Override
    public void close() {
        for (TestServer m : masters) {
            m.close();
        }
    }
}
