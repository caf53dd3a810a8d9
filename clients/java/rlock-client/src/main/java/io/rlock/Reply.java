// The one Lettuce output every rlock command is read with (clients/java, internal): a
// reply of any shape becomes plain Java values, so that the primitives read their replies
// (nil, an integer, a string, an array, a RESP3 map) without one output class per command.
package io.rlock;

import io.lettuce.core.codec.StringCodec;
import io.lettuce.core.output.CommandOutput;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Deque;
import java.util.List;

/**
 * A reply as Java values: {@code null} (nil), {@link Long}, {@link String} (bulk and
 * status replies, UTF-8), {@link Double}, {@link Boolean}, and {@code List<Object>} for
 * arrays, sets and maps (a RESP3 map comes flat, key then value, as under RESP2). A server
 * error completes the command exceptionally with Lettuce's
 * {@code RedisCommandExecutionException}, whose message is the error text.
 *
 * <p>{@link #normalize} puts another driver's reply (Jedis: {@code byte[]} for bulk and
 * status replies) into the same values.
 */
public final class Reply extends CommandOutput<String, String, Object> {
    /** The arrays being filled, innermost on top; empty while the reply is a scalar. */
    private final Deque<List<Object>> open = new ArrayDeque<>();
    /** Lettuce's nesting depth of the innermost open array. */
    private int depth;
    /** Whether Lettuce handed this output anything (see {@link #get()}). */
    private boolean touched;

    /** Public for transports that dispatch through Lettuce themselves (rlock-spring's). */
    public Reply() {
        super(StringCodec.UTF8, null);
    }

    /**
     * The reply. Lettuce drops a {@code +QUEUED} status reply without calling the output (it
     * takes it for MULTI's), and every other reply, nil included, sets something: an output
     * left untouched was answered {@code QUEUED}, which is what a queued ticket answers.
     */
    @Override
    public Object get() {
        return touched ? output : "QUEUED";
    }

    /** Another driver's reply as these values: byte arrays decoded as UTF-8, lists element by element. */
    public static Object normalize(Object v) {
        if (v instanceof byte[] b) {
            return new String(b, StandardCharsets.UTF_8);
        }
        if (v instanceof java.util.Collection<?> c) {
            List<Object> out = new ArrayList<>(c.size());
            for (Object o : c) {
                out.add(normalize(o));
            }
            return out;
        }
        if (v instanceof java.util.Map<?, ?> m) {
            List<Object> out = new ArrayList<>(m.size() * 2);
            m.forEach((k, x) -> {
                out.add(normalize(k));
                out.add(normalize(x));
            });
            return out;
        }
        if (v instanceof ByteBuffer bb) {
            return StandardCharsets.UTF_8.decode(bb.duplicate()).toString();
        }
        return v;
    }

    private void add(Object v) {
        touched = true;
        List<Object> top = open.peek();
        if (top == null) {
            output = v;
        } else {
            top.add(v);
        }
    }

    @Override
    public void set(ByteBuffer bytes) {
        add(bytes == null ? null : StandardCharsets.UTF_8.decode(bytes).toString());
    }

    @Override
    public void setSingle(ByteBuffer bytes) {
        set(bytes);
    }

    @Override
    public void setBigNumber(ByteBuffer bytes) {
        set(bytes);
    }

    @Override
    public void set(long integer) {
        add(integer);
    }

    @Override
    public void set(double number) {
        add(number);
    }

    @Override
    public void set(boolean value) {
        add(value);
    }

    @Override
    public void multi(int count) {
        // A RESP2 null array (count -1) is nil, as a null bulk string is.
        touched = true;
        if (count < 0) {
            add(null);
            return;
        }
        List<Object> list = new ArrayList<>(Math.min(count, 64));
        add(list);
        if (open.isEmpty() && output != list) {
            output = list;
        }
        open.push(list);
        depth++;
        if (count == 0) {
            close();
        }
    }

    private void close() {
        open.pop();
        depth--;
    }

    @Override
    public void multiArray(int count) {
        multi(count);
    }

    @Override
    public void multiSet(int count) {
        multi(count);
    }

    @Override
    public void multiMap(int count) {
        multi(count < 0 ? count : count * 2);
    }

    @Override
    public void multiPush(int count) {
        multi(count);
    }

    @Override
    public void complete(int depth) {
        // Lettuce calls this after each element with the depth it is at; an array is done
        // when the reading went back above it.
        while (this.depth > 0 && depth < this.depth) {
            close();
        }
    }
}
