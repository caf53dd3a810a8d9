// A refusal of the rlock module (clients/java), chosen by the code word its error reply
// starts with; the module's src/vocab/errors.rs states the scheme (BAD<ARG>, NOTA<KIND>,
// OVERFLOW, ...). Wire turns each server error of the module into one, in one place.
package io.rlock;

import io.lettuce.core.RedisCommandExecutionException;

/**
 * A refusal of the rlock module: a Lettuce {@link RedisCommandExecutionException} (code that
 * catches that keeps working) whose message is the server's whole reply, code word first,
 * with the word as {@link #code()} and its {@link Kind}.
 */
public class RlockServerException extends RedisCommandExecutionException {
    private static final long serialVersionUID = 1L;

    /** What a refusal means. */
    public enum Kind {
        /** An argument out of its range or shape ({@code BADLEASE}, {@code BADOWNER}, ...). */
        BAD_ARGUMENT,
        /** The key holds something that is not this primitive ({@code NOTALOCK}, ...). */
        NOT_THIS_PRIMITIVE,
        /** A count, a token or a permit total would overflow ({@code OVERFLOW}). */
        OVERFLOW,
        /** The key's waiter limit is reached ({@code TOOMANYWAITERS}). */
        TOO_MANY_WAITERS,
        /** An owner's read holds are at their limit ({@code TOOMANYHOLDS}). */
        TOO_MANY_HOLDS,
        /** A holder of the read lock asked for the write lock ({@code READHELD}). */
        READ_HELD,
        /** An internal command from a client, or its payload malformed ({@code INTERNALCMD}, {@code BADPAYLOAD}). */
        INTERNAL,
        /** A bug in the module, caught; details in the server log ({@code RLOCKBUG}). */
        MODULE_BUG,
        /**
         * A ticket's grant the server took back: its connection closed and no confirmation
         * came within {@code rlock.ticket-confirm-ms} ({@code TAKENBACK}; design.md 5).
         */
        TAKEN_BACK
    }

    private final String code;
    private final Kind kind;

    RlockServerException(String message, String code, Kind kind, Throwable cause) {
        super(message, cause);
        this.code = code;
        this.kind = kind;
    }

    /** The code word the reply starts with ({@code BADLEASE}, ...). */
    public String code() {
        return code;
    }

    /** What the refusal means. */
    public Kind kind() {
        return kind;
    }

    /** The kind of a module code word; null for codes that are not the module's ({@code ERR}, {@code NOPERM}). */
    static Kind kindOf(String code) {
        switch (code) {
            case "OVERFLOW": return Kind.OVERFLOW;
            case "TOOMANYWAITERS": return Kind.TOO_MANY_WAITERS;
            case "TOOMANYHOLDS": return Kind.TOO_MANY_HOLDS;
            case "READHELD": return Kind.READ_HELD;
            case "INTERNALCMD":
            case "BADPAYLOAD": return Kind.INTERNAL;
            case "RLOCKBUG": return Kind.MODULE_BUG;
            case "TAKENBACK": return Kind.TAKEN_BACK;
            default:
                if (code.startsWith("NOTA")) {
                    return Kind.NOT_THIS_PRIMITIVE;
                }
                return code.startsWith("BAD") ? Kind.BAD_ARGUMENT : null;
        }
    }

    /** {@code e} as a refusal of the module when it is one, else unchanged. */
    static Throwable of(Throwable e) {
        if (!(e instanceof RedisCommandExecutionException) || e instanceof RlockServerException) {
            return e;
        }
        String message = String.valueOf(e.getMessage());
        String code = message.split(" ", 2)[0];
        Kind kind = kindOf(code);
        return kind == null ? e : new RlockServerException(message, code, kind, e);
    }
}
