// The Java client's reader of the protocol contract, spec/vectors/ at the repository's root
// (its README: the format, and who reads what): the ticket channel, the reading of ticket
// messages and what a waiter does with each, which of the module's errors are retried, and
// how a waiting acquire starts (waits.json, through Contention, the rule Backend runs); so that a vector changed by hand, or a client change the vectors do not follow, fails
// this suite. No server needed.
package io.rlock;

import com.google.gson.JsonArray;
import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import io.lettuce.core.RedisCommandExecutionException;
import org.junit.jupiter.api.Test;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;

import static org.junit.jupiter.api.Assertions.*;

class VectorsTest {
    /** spec/vectors, found from the module's folder (Maven runs tests in rlock-client/). */
    static final Path VECTORS = Path.of("").toAbsolutePath().resolve("../../../spec/vectors").normalize();

    static JsonArray load(String file, String field) throws IOException {
        String text = Files.readString(VECTORS.resolve(file), StandardCharsets.UTF_8);
        JsonArray rows = JsonParser.parseString(text).getAsJsonObject().getAsJsonArray(field);
        assertFalse(rows.isEmpty(), "no " + field + " in " + file);
        return rows;
    }

    @Test
    void the_ticket_channel_is_the_vectors() throws IOException {
        String tag = JsonParser.parseString(Files.readString(VECTORS.resolve("channels.json"), StandardCharsets.UTF_8))
                .getAsJsonObject().get("notify_tag").getAsString();
        for (JsonElement e : load("channels.json", "cases")) {
            JsonObject c = e.getAsJsonObject();
            String key = c.get("key").getAsString();
            assertEquals(c.get("ticket").getAsString(), Waits.channel(key), c.toString());
            // A ticket queued with NOTIFY tag: the key's channel + ":" + tag.
            assertEquals(c.get("ticket_notify").getAsString(), Waits.channel(key, tag), c.toString());
            Waits.Waiter w = new Waits.Waiter(List.of("RLOCK.ACQUIRE", key, "o", "30000", "WAIT", "0"), reply -> List.of());
            w.notifyOn(tag);
            assertEquals(c.get("ticket_notify").getAsString(), w.channel, c.toString());
        }
    }

    @Test
    void every_ticket_message_reads_as_the_vectors_say() throws IOException {
        for (JsonElement e : load("tickets.json", "cases")) {
            JsonObject c = e.getAsJsonObject();
            Waits.Note n = Waits.Note.parse(c.get("message").getAsString());
            if (c.get("parsed").isJsonNull()) {
                assertNull(n, c.toString());
                continue;
            }
            assertNotNull(n, c.toString());
            JsonObject p = c.getAsJsonObject("parsed");
            assertEquals(p.get("kind").getAsString(), n.kind(), c.toString());
            assertEquals(p.get("id").getAsString(), n.id(), c.toString());
            assertEquals(p.get("owner").getAsString(), n.owner(), c.toString());
            assertEquals(p.get("detail").getAsString(), n.detail(), c.toString());
            assertEquals(c.get("then").getAsString().toUpperCase(Locale.ROOT), n.action().name(), c.toString());
        }
    }

    /** A JSON reply as the client's reader gives it (null, Long, String, List). */
    static Object reply(JsonElement j) {
        if (j.isJsonNull()) {
            return null;
        }
        if (j.isJsonArray()) {
            List<Object> out = new ArrayList<>();
            j.getAsJsonArray().forEach(x -> out.add(reply(x)));
            return out;
        }
        return j.getAsJsonPrimitive().isNumber() ? (Object) j.getAsLong() : j.getAsString();
    }

    @Test
    void a_granted_message_is_held_on_or_collected_as_the_vectors_say() throws IOException {
        for (JsonElement e : load("tickets.json", "holds")) {
            JsonObject c = e.getAsJsonObject();
            List<String> args = new ArrayList<>(List.of(c.get("command").getAsString(), "k", "o", "30000"));
            if (c.get("permits").getAsBoolean()) {
                args.addAll(List.of("PERMITS", "2"));
            }
            args.addAll(List.of("WAIT", "0", "ID", "r1"));
            Object held = Waits.heldReply(args, c.get("detail").getAsString());
            if (c.get("then").getAsString().equals("collect")) {
                assertSame(Waits.COLLECT, held, c.toString());
            } else {
                assertEquals("hold", c.get("then").getAsString(), c.toString());
                assertEquals(reply(c.get("reply")), held, c.toString());
            }
        }
    }

    @Test
    void the_module_errors_the_vectors_call_retry_are_retried() throws IOException {
        for (JsonElement e : load("errors.json", "errors")) {
            JsonObject row = e.getAsJsonObject();
            String text = row.get("text").getAsString();
            RedisCommandExecutionException err = new RedisCommandExecutionException(text);
            assertEquals(row.get("kind").getAsString().equals("retry"), Wire.isTransient(err), row.toString());
            assertEquals(row.get("code").getAsString(), Wire.serverError(err).split(" ", 2)[0], row.toString());
        }
    }

    static List<String> words(JsonObject c, String field) {
        List<String> out = new ArrayList<>();
        for (JsonElement w : c.getAsJsonArray(field)) {
            out.add(w.getAsString());
        }
        return out;
    }

    @Test
    void every_waiting_command_takes_the_vectors_shapes() throws IOException {
        for (JsonElement e : load("commands.json", "waiting")) {
            JsonObject c = e.getAsJsonObject();
            Waits.Waiter w = new Waits.Waiter(words(c, "command"), reply -> List.of());
            List<String> ticketed = new ArrayList<>();
            for (String word : words(c, "ticketed")) {
                ticketed.add(word.equals("$id") ? w.id : word);
            }
            assertEquals(ticketed, w.ticketed(), c.toString());
            assertEquals(words(c, "look"), w.look(), c.toString());
            if (!c.get("id").isJsonNull()) {
                assertEquals(c.get("id").getAsString(), w.id, c.toString());
            }
        }
    }

    /** The replies a vector stands for, as the client's reader gives them (Long, null, List). */
    static List<Object> replies(JsonElement want) {
        List<Object> out = new ArrayList<>();
        if (want.isJsonNull()) {
            out.add(null);
        } else if (want.isJsonObject()) {
            for (JsonElement b : want.getAsJsonObject().getAsJsonArray("between")) {
                out.add(b.getAsLong());
            }
        } else if (want.isJsonArray()) {
            List<Object> first = new ArrayList<>();
            List<List<Object>> each = new ArrayList<>();
            for (JsonElement w : want.getAsJsonArray()) {
                List<Object> r = replies(w);
                each.add(r);
                first.add(r.get(0));
            }
            out.add(first);
            for (int i = 0; i < each.size(); i++) {
                for (Object alt : each.get(i).subList(1, each.get(i).size())) {
                    List<Object> a = new ArrayList<>(first);
                    a.set(i, alt);
                    out.add(a);
                }
            }
        } else if (want.getAsJsonPrimitive().isNumber()) {
            out.add(want.getAsLong());
        } else {
            out.add(want.getAsString());
        }
        return out;
    }

    @Test
    void every_acquire_reply_reads_as_the_vectors_outcome() throws IOException {
        int read = 0;
        for (JsonElement e : load("replies.json", "cases")) {
            JsonObject c = e.getAsJsonObject();
            String command = c.getAsJsonArray("send").get(0).getAsString();
            String outcome = c.get("outcome").getAsString();
            RlockLock lock = switch (command) {
                case "RLOCK.ACQUIRE" -> new RlockLock(null, "k");
                case "RFENCED.ACQUIRE" -> new RlockFencedLock(null, "f");
                default -> null;
            };
            if (lock == null || outcome.equals("queued")) {
                continue; // queued: Waits takes QUEUED as the ticket's receipt
            }
            for (Object reply : replies(c.get("reply"))) {
                RlockLock.Acquired a = lock.parseAcquire(reply);
                assertEquals(outcome.equals("acquired"), a.held(), c + " " + reply);
                if (a.held() && lock instanceof RlockFencedLock) {
                    assertTrue(a.token() != null && a.token() > 0, c + " " + reply);
                }
                if (!a.held()) {
                    long pttl = a.pttl();
                    assertTrue(pttl == -1 || pttl > 0, c + " " + reply);
                }
                read++;
            }
        }
        assertTrue(read > 5, "read " + read);
    }
    // ---- waits.json: Contention, the rule Backend runs for every waiting acquire ----------

    /** Sets `c` to a vector's finding (null: none yet), made at `at`. */
    static void finding(Contention c, JsonElement found, long at) {
        if (found.isJsonNull()) {
            return;
        }
        switch (found.getAsString()) {
            case "held" -> c.found(true, at);
            case "free" -> c.found(false, at);
            default -> fail("no finding " + found);
        }
    }

    @Test
    void whether_a_waiting_acquire_tries_first_is_the_vectors() throws IOException {
        long contended = JsonParser.parseString(Files.readString(VECTORS.resolve("waits.json"), StandardCharsets.UTF_8))
                .getAsJsonObject().get("contended_for_ms").getAsLong();
        assertEquals(contended, Contention.CONTENDED_FOR_MS);
        for (JsonElement e : load("waits.json", "tries_first")) {
            JsonObject c = e.getAsJsonObject();
            Contention seen = new Contention();
            long t0 = System.nanoTime();
            finding(seen, c.get("found"), t0);
            long ago = c.get("ago_ms").isJsonNull() ? 0 : c.get("ago_ms").getAsLong();
            assertEquals(c.get("tries_first").getAsBoolean(), seen.triesFirst(t0 + ago * 1_000_000), c.toString());
        }
    }

    @Test
    void what_a_waiting_acquire_sends_and_leaves_is_the_vectors() throws IOException {
        for (JsonElement e : load("waits.json", "acquires")) {
            JsonObject c = e.getAsJsonObject();
            Contention seen = new Contention();
            long t0 = System.nanoTime();
            finding(seen, c.get("before"), t0);
            List<String> replies = new ArrayList<>();
            c.getAsJsonArray("replies").forEach(r -> replies.add(r.getAsString()));
            List<String> sent = new ArrayList<>();
            List<Long> waits = new ArrayList<>();
            // The clock stands still at t0: what an acquire leaves is read at once after it.
            // A grant is the reply "granted"; a lock held by another, its PTTL.
            java.util.concurrent.CompletableFuture<Object> r = Contention.start(seen, 5_000, () -> t0,
                    () -> {
                        sent.add("try");
                        assertFalse(replies.isEmpty(), c + ": a try past the replies");
                        return switch (replies.remove(0)) {
                            case "taken" -> java.util.concurrent.CompletableFuture.completedFuture("granted");
                            case "held" -> java.util.concurrent.CompletableFuture.completedFuture(100L);
                            default -> fail(c + ": a try's reply");
                        };
                    },
                    "granted"::equals, reply -> fail(c + ": nothing is given back"),
                    left -> {
                        sent.add("wait");
                        waits.add(left);
                        assertFalse(replies.isEmpty(), c + ": a wait past the replies");
                        return java.util.concurrent.CompletableFuture.completedFuture(switch (replies.remove(0)) {
                            case "at_once" -> new Contention.Waited("granted", true);
                            case "queued" -> new Contention.Waited("granted", false);
                            case "timeout" -> new Contention.Waited(100L, false);
                            default -> fail(c + ": a wait's reply");
                        });
                    });
            assertTrue(r.isDone(), c.toString());
            List<String> sends = new ArrayList<>();
            c.getAsJsonArray("sends").forEach(x -> sends.add(x.getAsString()));
            assertEquals(sends, sent, c.toString());
            assertTrue(replies.isEmpty(), c + ": replies left " + replies);
            assertEquals(List.of(5_000L).subList(0, waits.size()), waits, c + ": the wait is the rest of it");
            // What it left: held (the next one queues at once) or free (it tries first).
            assertEquals(c.get("after").getAsString().equals("held"), !seen.triesFirst(t0), c.toString());
        }
    }

    @Test
    void the_try_and_the_wait_are_the_same_command() {
        List<String> args = List.of("RLOCK.ACQUIRE", "k", "o", "30000", "WAIT", "5000", "ID", "i");
        assertEquals(List.of("RLOCK.ACQUIRE", "k", "o", "30000", "ID", "i"), Contention.withoutWait(args));
        assertEquals(List.of("RLOCK.ACQUIRE", "k", "o", "30000", "WAIT", "1200", "ID", "i"), Contention.withWait(args, 1200));
    }
}
