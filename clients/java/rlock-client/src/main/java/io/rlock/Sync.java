// The blocking faces of the async core (clients/java, internal): every blocking method of
// the client is its CompletionStage twin awaited here, so each behaviour is written once.
// Interruption cancels the wait, which Waits turns into "leave nothing behind".
package io.rlock;

import java.util.concurrent.CancellationException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ExecutionException;

final class Sync {
    private Sync() {}

    /** Awaits `f`; on interruption cancels it and throws, unless it had completed already. */
    static <T> T interruptibly(CompletableFuture<T> f) throws InterruptedException {
        try {
            return f.get();
        } catch (InterruptedException ie) {
            if (f.cancel(true) || !f.isDone()) {
                throw ie;
            }
            // It completed meanwhile: the caller got what it asked for; keep the flag.
            Thread.currentThread().interrupt();
            return join(f);
        } catch (ExecutionException e) {
            throw rethrow(e);
        }
    }

    /** Awaits `f` whatever interrupts come; the interrupt flag is restored after. */
    static <T> T uninterruptibly(CompletableFuture<T> f) {
        boolean interrupted = false;
        try {
            while (true) {
                try {
                    return f.get();
                } catch (InterruptedException ie) {
                    interrupted = true;
                } catch (ExecutionException e) {
                    throw rethrow(e);
                }
            }
        } finally {
            if (interrupted) {
                Thread.currentThread().interrupt();
            }
        }
    }

    static <T> T join(CompletableFuture<T> f) {
        try {
            return f.join();
        } catch (CompletionException | CancellationException e) {
            throw rethrow(e);
        }
    }

    static RuntimeException rethrow(Throwable e) {
        Throwable c = Wire.unwrap(e);
        if (c instanceof RuntimeException r) {
            return r;
        }
        if (c instanceof Error err) {
            throw err;
        }
        return new CompletionException(c);
    }

    /** Cancelling `down` (the caller's future) cancels `up` (the wait it was made from). */
    static <T> CompletableFuture<T> linked(CompletableFuture<T> down, CompletableFuture<?> up) {
        down.whenComplete((v, e) -> {
            if (down.isCancelled()) {
                up.cancel(true);
            }
        });
        return down;
    }

    static long asLong(Object v) {
        if (v instanceof Long l) {
            return l;
        }
        if (v instanceof String s) {
            return Long.parseLong(s);
        }
        throw new IllegalStateException("unexpected reply " + v);
    }
}
