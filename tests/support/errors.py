"""The module's error replies, read from spec/vectors/errors.json (generated from
src/vocab/errors.rs and checked against it by `cargo test -p rlock`), so that the tests
assert the module's exact texts without a copy of their own: each constant's name without
its ``ERR_`` prefix (``SYNTAX``, ``NOT_A_LOCK``, ``WRONGTYPE``...)."""

import json
import pathlib

_VECTORS = pathlib.Path(__file__).resolve().parents[2] / "spec" / "vectors" / "errors.json"

#: Every error row of the vector: name, code, kind (and ``of`` for wrong-type), text.
ROWS = json.loads(_VECTORS.read_text(encoding="utf-8"))["errors"]

for _row in ROWS:
    globals()[_row["name"].removeprefix("ERR_")] = _row["text"]
del _row


def text(error):
    """What redis-py's exception shows: it drops the codes it maps to its own classes."""
    for code in ("ERR ", "READONLY "):
        if error.startswith(code):
            return error[len(code):]
    return error
