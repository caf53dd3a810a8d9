// Unit tests of the plain semaphore's debt (clients/java, SemaphoreDebts; design.md 5): the
// arithmetic of a release against permits the server took back, and a release waiting for
// the name's confirmations in flight. No server: the confirmations are settled by hand.
package io.rlock;

import org.junit.jupiter.api.Test;

import java.util.concurrent.CompletableFuture;
import java.util.concurrent.atomic.AtomicInteger;

import static org.junit.jupiter.api.Assertions.*;

class SemaphoreDebtsTest {
    @Test
    void the_debt_absorbs_what_it_can_of_a_release() {
        assertArrayEquals(new long[] {2, 0}, SemaphoreDebts.absorb(1, 3), "release 3, debt 1: sends 2");
        assertArrayEquals(new long[] {0, 3}, SemaphoreDebts.absorb(5, 2), "release 2, debt 5: sends nothing");
        assertArrayEquals(new long[] {4, 0}, SemaphoreDebts.absorb(0, 4));
        assertArrayEquals(new long[] {0, 0}, SemaphoreDebts.absorb(2, 2));
    }

    @Test
    void a_release_waits_for_the_confirmation_and_sends_nothing_for_a_grant_taken_back() {
        SemaphoreDebts d = new SemaphoreDebts();
        Waits.Confirm c = new Waits.Confirm();
        AtomicInteger told = new AtomicInteger();
        d.held("s", 1, c, told::incrementAndGet);
        CompletableFuture<Long> release = d.toSend("s", 3);
        assertFalse(release.isDone(), "waits for the confirmation in flight");
        assertEquals(3L, Sync.join(d.toSend("other", 3)), "another name does not wait");
        c.settle(Waits.Confirm.Outcome.TAKEN_BACK);
        assertEquals(2L, Sync.join(release), "the permit taken back is not released again");
        assertEquals(1, told.get());
        assertEquals(0, d.debt("s"));
    }

    @Test
    void a_debt_outlives_a_smaller_release_and_is_per_name() {
        SemaphoreDebts d = new SemaphoreDebts();
        Waits.Confirm c = new Waits.Confirm();
        c.settle(Waits.Confirm.Outcome.TAKEN_BACK); // answered before it was registered
        d.held("s", 5, c, () -> { });
        assertEquals(5, d.debt("s"));
        assertEquals(0L, Sync.join(d.toSend("s", 2)), "absorbed whole: nothing sent");
        assertEquals(3, d.debt("s"));
        assertEquals(2L, Sync.join(d.toSend("t", 2)));
        assertEquals(0L, Sync.join(d.toSend("s", 3)));
        assertEquals(4L, Sync.join(d.toSend("s", 4)));
    }

    @Test
    void a_confirmed_or_doubtful_grant_makes_no_debt() {
        SemaphoreDebts d = new SemaphoreDebts();
        Waits.Confirm kept = new Waits.Confirm(), doubt = new Waits.Confirm();
        AtomicInteger told = new AtomicInteger();
        d.held("s", 1, kept, told::incrementAndGet);
        d.held("s", 1, doubt, told::incrementAndGet);
        CompletableFuture<Long> release = d.toSend("s", 2);
        kept.settle(Waits.Confirm.Outcome.CONFIRMED);
        assertFalse(release.isDone(), "waits for every confirmation of the name");
        doubt.settle(Waits.Confirm.Outcome.IN_DOUBT);
        assertEquals(2L, Sync.join(release));
        assertEquals(0, told.get());
        assertEquals(0, d.debt("s"));
    }

    @Test
    void only_a_takenback_answer_is_a_take_back() {
        assertEquals(Waits.Confirm.Outcome.CONFIRMED, Waits.Confirm.of(null));
        assertEquals(Waits.Confirm.Outcome.TAKEN_BACK, Waits.Confirm.of(new io.lettuce.core.RedisCommandExecutionException(
                "TAKENBACK the grant of this request id was taken back")));
        assertEquals(Waits.Confirm.Outcome.IN_DOUBT, Waits.Confirm.of(new io.lettuce.core.RedisCommandExecutionException(
                "ERR max number of clients reached")));
        assertEquals(Waits.Confirm.Outcome.IN_DOUBT, Waits.Confirm.of(new io.lettuce.core.RedisConnectionException("refused")));
    }
}
