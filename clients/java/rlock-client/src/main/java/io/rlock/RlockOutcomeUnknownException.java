// Scripts mode's "outcome unknown" (clients/java; docs/scripts-mode.md, "Retries"): a
// script that must not run twice was sent and its connection broke (or the call timed out)
// before the reply came. Scripts.MAY_RETRY says which scripts; Wire raises it.
package io.rlock;

import io.lettuce.core.RedisException;

/**
 * Scripts mode: a script that must not run twice (an acquire, a semaphore release or
 * addPermits, a latch countDown...) was sent, and the connection failed after the write:
 * the script may or may not have run, and it is not sent again (without the module no
 * request id makes a second run safe). A Lettuce {@link RedisException}.
 */
public class RlockOutcomeUnknownException extends RedisException {
    private static final long serialVersionUID = 1L;

    public RlockOutcomeUnknownException(String message, Throwable cause) {
        super(message, cause);
    }
}
