"""Loads Redisson's Lua scripts from the one place they are kept: the Python client's
package data, `clients/python/rlock/lua/<name>.lua` (the scripts-mode client runs the same
files; see docs/scripts-mode.md). The module suite's transcriptions (redisson.py,
redisson_rw.py, redisson_sync.py) read them through `script`, so that what the interop
tests run and what the client runs cannot drift apart.
"""

from pathlib import Path

LUA_DIR = Path(__file__).resolve().parents[2] / "clients" / "python" / "rlock" / "lua"


def script(name):
    """The text of `<name>.lua` (its leading `--` comment says where Redisson sends it)."""
    return (LUA_DIR / f"{name}.lua").read_text()
