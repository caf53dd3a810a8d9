"""The pure account a client keeps with a plain semaphore whose waits hold on their grant's
message (rlock._permits): the debt arithmetic as a table, then what each settling of a
confirmation does to it. No server needed; the integration tests are in test_tickets.py."""

import pytest
from redis.exceptions import ConnectionError, ResponseError

from rlock import _permits
from rlock._tickets import Confirm


@pytest.mark.parametrize("debt, release, debt_after, sent", [
    # No debt: the whole release is sent.
    (0, 1, 0, 1),
    (0, 3, 0, 3),
    # A debt smaller than the release: paid, the rest sent.
    (1, 3, 0, 2),
    # A debt as large or larger: nothing sent, what is left stays owed.
    (1, 1, 0, 0),
    (5, 2, 3, 0),
])
def test_a_release_pays_the_debt_first_and_sends_the_rest(debt, release, debt_after, sent):
    assert _permits.absorb(debt, release) == (debt_after, sent)


class Client:
    """A stand-in for a redis-py client: the ledgers are kept per client object."""


TAKENBACK = ResponseError("TAKENBACK the grant of this request id was taken back")


@pytest.mark.parametrize("reply, in_doubt, debt", [
    # Confirmed: the grant stands, the release is the application's to send.
    (1, False, 0),
    # TAKENBACK: the server returned the permits itself.
    (TAKENBACK, False, 2),
    # Another refusal, or no answer within the retry limit: in doubt, no debt.
    (ResponseError("WRONGTYPE Operation against a key"), False, 0),
    (None, True, 0),
])
def test_only_a_definite_takenback_makes_a_debt(reply, in_doubt, debt):
    client, confirm = Client(), Confirm()
    _permits.held(client, "s", confirm, 2)
    assert _permits.in_flight(client, "s") == (confirm,)
    if in_doubt:
        confirm.settle(False)  # what a confirmation retried to its limit ends with
    else:
        confirm.settle_with(reply)
    assert _permits.in_flight(client, "s") == ()
    assert _permits.debt(client, "s") == debt
    assert _permits.release(client, "s", 3) == 3 - debt
    assert _permits.debt(client, "s") == 0


def test_the_debt_is_per_client_and_name_and_paid_across_releases():
    a, b, confirm = Client(), Client(), Confirm()
    _permits.held(a, "s", confirm, 5)
    confirm.settle_with(TAKENBACK)
    assert _permits.debt(a, "s") == 5
    assert _permits.debt(b, "s") == 0 and _permits.debt(a, "t") == 0
    assert _permits.release(b, "s", 1) == 1 and _permits.release(a, "t", 1) == 1
    assert _permits.release(a, "s", 2) == 0 and _permits.debt(a, "s") == 3
    assert _permits.release(a, "s", 4) == 1 and _permits.debt(a, "s") == 0


def test_a_grant_settled_before_it_is_registered_counts_at_once():
    client, confirm = Client(), Confirm()
    confirm.settle_with(TAKENBACK)
    _permits.held(client, "s", confirm, 1)
    assert _permits.in_flight(client, "s") == () and _permits.debt(client, "s") == 1


def test_a_confirmation_unanswered_is_in_doubt_not_taken_back():
    confirm = Confirm()
    confirm.settle_with(ConnectionError("no answer"))
    assert confirm.outcome is False and not confirm.taken_back
