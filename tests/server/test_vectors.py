"""The module's side of spec/vectors/replies.json: every reply a client reads, as a real
server sends it. Each case's setup runs on a fresh server (RESP2, redis-py's raw replies),
then its command, whose reply must match the vector; the Rust client reads the same
vectors' replies into outcomes (clients/rust/src/vectors.rs), so a module whose replies
drift from what the clients parse fails here, and a client that drifts fails there."""

import json
import pathlib

import pytest

VECTORS = pathlib.Path(__file__).resolve().parents[2] / "spec" / "vectors"
CASES = json.loads((VECTORS / "replies.json").read_text(encoding="utf-8"))["cases"]


def matches(got, want) -> bool:
    """Whether a redis-py RESP2 reply is the vector's (see replies.json, `about`)."""
    if want is None or isinstance(want, bool):
        return got is want
    if isinstance(want, int):
        return isinstance(got, int) and got == want
    if isinstance(want, str):
        return isinstance(got, bytes) and got == want.encode()
    if isinstance(want, dict):
        lo, hi = want["between"]
        return isinstance(got, int) and lo <= got <= hi
    return (isinstance(got, list) and len(got) == len(want)
            and all(matches(g, w) for g, w in zip(got, want)))


@pytest.mark.parametrize("case", CASES, ids=[" ".join(c["send"]) + f" [{c['outcome']}]"
                                             for c in CASES])
def test_the_module_replies_as_the_vectors_say(r, case):
    for command in case["setup"]:
        r.execute_command(*command)
    got = r.execute_command(*case["send"])
    assert matches(got, case["reply"]), (got, case["reply"])
