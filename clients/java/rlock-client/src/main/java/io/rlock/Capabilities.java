// The capability probe (clients/java): what `RLOCK.HELLO` says about the server a
// connection reached. The client asks it on its command connection before the first
// waiting call, and again after each reconnect (a failover may reach another server);
// nothing guesses from error texts. The Rust client's proto/hello.rs is the reference.
package io.rlock;

import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.Objects;

/**
 * What a server can do: the rlock module's version, protocol and features, or
 * {@link #NO_MODULE} when the server does not know {@code RLOCK.HELLO} (no module, or one
 * older than the command). Waits queue tickets only when {@link #tickets()} says so.
 */
public final class Capabilities {
    /** The protocol version this client speaks: a server answering a lower one lacks something it sends. */
    public static final long PROTOCOL_VERSION = 1;

    /** A server without the rlock module. */
    public static final Capabilities NO_MODULE = new Capabilities(false, "", 0, List.of(), "");

    /** The probe's command. */
    static final List<String> HELLO = List.of("RLOCK.HELLO");

    private final boolean module;
    private final String version;
    private final long protocol;
    private final List<String> features;
    private final String replication;

    private Capabilities(boolean module, String version, long protocol, List<String> features, String replication) {
        this.module = module;
        this.version = version;
        this.protocol = protocol;
        this.features = List.copyOf(features);
        this.replication = replication;
    }

    /** Whether the rlock module answered. */
    public boolean module() { return module; }

    /** The module's version, "major.minor.patch" ("" without the module). */
    public String version() { return version; }

    /** The wire protocol's version (0 without the module). */
    public long protocol() { return protocol; }

    /**
     * The feature words: {@code tickets}, {@code ticket-holds} (a {@code granted} message
     * means held; the client confirms off the holder's path), {@code request-ids}, one per primitive
     * ({@code lock}, {@code fenced}, {@code rwlock}, {@code semaphore},
     * {@code permit-expirable-semaphore}, {@code latch}), {@code sharded-channels} in
     * cluster mode.
     */
    public List<String> features() { return features; }

    /** The module's {@code rlock.replication} setting: "commands" or "effects". */
    public String replication() { return replication; }

    /** Whether the server names {@code feature} (and speaks this client's protocol). */
    public boolean has(String feature) {
        return module && protocol >= PROTOCOL_VERSION && features.contains(feature);
    }

    /** Whether the server queues tickets ({@code WAIT t ASYNC ID id}). */
    public boolean tickets() {
        return has("tickets");
    }

    /**
     * Reads the probe's reply as {@link Reply} gives it (a RESP3 map or RESP2 pairs, both
     * flat), by field name, so that the module may add fields.
     */
    static Capabilities parse(Object reply) {
        if (!(reply instanceof List<?> flat) || flat.size() % 2 != 0) {
            throw new IllegalStateException("RLOCK.HELLO answered " + reply + ", not its map");
        }
        String version = "", replication = "";
        Long protocol = null;
        List<String> features = new ArrayList<>();
        for (int i = 0; i < flat.size(); i += 2) {
            Object v = flat.get(i + 1);
            switch (String.valueOf(flat.get(i))) {
                case "version" -> version = String.valueOf(v);
                case "protocol" -> protocol = v instanceof Long n ? n : null;
                case "features" -> {
                    if (v instanceof List<?> words) {
                        words.forEach(w -> features.add(String.valueOf(w)));
                    }
                }
                case "replication" -> replication = String.valueOf(v);
                default -> { } // a field added later
            }
        }
        if (protocol == null) {
            throw new IllegalStateException("RLOCK.HELLO answered no protocol: " + reply);
        }
        return new Capabilities(true, version, protocol, features, replication);
    }

    /**
     * The probe's failure read: "unknown command" is {@link #NO_MODULE}; anything else (an
     * ACL refusal, a broken connection) is null: it says nothing about the module.
     */
    static Capabilities fromError(Throwable e) {
        String m = Wire.serverError(e);
        return m != null && m.toLowerCase(Locale.ROOT).startsWith("err unknown command") ? NO_MODULE : null;
    }

    @Override
    public boolean equals(Object o) {
        return o instanceof Capabilities c && module == c.module && protocol == c.protocol
                && version.equals(c.version) && features.equals(c.features) && replication.equals(c.replication);
    }

    @Override
    public int hashCode() {
        return Objects.hash(module, version, protocol, features, replication);
    }

    @Override
    public String toString() {
        return module ? "Capabilities[version=" + version + ", protocol=" + protocol + ", features=" + features
                + ", replication=" + replication + "]" : "Capabilities[NO_MODULE]";
    }
}
