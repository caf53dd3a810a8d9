"""Scripts mode's names against the module suite's transcription of Redisson's
(tests/support/redisson*.py): every key and channel `rlock._scripts` builds is the one a
Redisson service builds for the same name, with and without braces of its own (Redisson's
prefixName/suffixName rules, and the latch channel that has none). Pure: no server.
"""

from __future__ import annotations

import pytest
import redisson
import redisson_rw
import redisson_sync

from rlock import _scripts

NAMES = ["k", "orders:42", "{app}:k", "a{b}c"]
OWNER = "0f0e0d0c-0b0a-0908-0706-050403020100:7"


@pytest.mark.parametrize("name", NAMES)
def test_every_key_and_channel_is_redissons(name):
    b = name.encode()
    assert _scripts.lock_channel(b).decode() == redisson.channel(name)
    assert _scripts.lock_channel(b).decode() == redisson_rw.lock_channel(name)
    assert _scripts.rw_channel(b).decode() == redisson_rw.rw_channel(name)
    assert _scripts.token_key(b).decode() == redisson_rw.token_key(name)
    assert (_scripts.rw_timeout_prefix(b, OWNER.encode()).decode()
            == redisson_rw.timeout_prefix(name, OWNER))
    assert _scripts.rw_key_prefix(b).decode() == redisson_rw.key_prefix(name, OWNER)
    assert (_scripts.unlock_latch(b, b"rid").decode()
            == redisson_rw.unlock_latch(name, "rid"))
    assert _scripts.semaphore_channel(b).decode() == redisson_sync.semaphore_channel(name)
    assert _scripts.timeout_zset(b).decode() == redisson_sync.timeout_name(name)
    assert _scripts.latch_channel(b).decode() == redisson_sync.latch_channel(name)


def test_the_scripts_are_the_files_the_transcriptions_load():
    assert _scripts.script("lock_acquire").text == redisson.ACQUIRE
    assert _scripts.script("read_unlock").text == redisson_rw.READ_UNLOCK
    assert _scripts.script("pes_try_acquire").text == redisson_sync.PES_TRY_ACQUIRE
    assert _scripts.NON_EXPIRABLE == redisson_sync.NON_EXPIRABLE


def test_options_are_read_after_the_positional_arguments():
    pos, opts = _scripts._split(["RLOCK.RELEASE", "k", "ID", 30000, "ID", "r1"], 2)
    assert pos == [b"k", b"ID", b"30000"] and opts == {b"ID": b"r1"}  # owner "ID"
    pos, opts = _scripts._split(["RPSEMAPHORE.ACQUIRE", "p", -1, "PERMITS", 2, "ID", "x"], 2)
    assert pos == [b"p", b"-1"] and opts == {b"PERMITS": b"2", b"ID": b"x"}


def test_a_malformed_permit_id_is_refused_before_any_script():
    with pytest.raises(Exception, match="32 hex digits"):
        _scripts._raw_id(b"not-hex")
