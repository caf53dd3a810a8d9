"""The capability probe: what ``RLOCK.HELLO`` says about the server a connection reached.

Each ticket connection (one per server or cluster node) asks it once when it connects,
and again after every reconnect, so that a failover to a server without the module is
noticed; nothing guesses from error texts. Pure: the command and the reading of its
reply (``capabilities`` in `rlock._io` asks it on an ordinary connection).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Tuple

#: The probe's command.
HELLO_ARGS: Tuple[str, ...] = ("RLOCK.HELLO",)

#: The protocol version this client speaks (the module's ``protocol`` field): a server
#: that answers a lower one lacks something this client sends.
PROTOCOL_VERSION = 1


@dataclass(frozen=True)
class Capabilities:
    """What a server can do. ``module`` is False when the server does not know
    ``RLOCK.HELLO`` (no rlock module, or one older than the command): waits then block
    a connection (``WAIT``), never queue tickets."""

    module: bool
    version: str = ""
    protocol: int = 0
    features: Tuple[str, ...] = field(default=())
    replication: str = ""

    def has(self, feature: str) -> bool:
        """Whether the server names ``feature`` (``tickets``, ``request-ids``, ``lock``,
        ``fenced``, ``rwlock``, ``semaphore``, ``permit-expirable-semaphore``,
        ``latch``, ``sharded-channels``)."""
        return self.module and self.protocol >= PROTOCOL_VERSION and feature in self.features

    @property
    def tickets(self) -> bool:
        """Whether the server queues tickets (``WAIT t ASYNC ID id``)."""
        return self.has("tickets")


#: A server without the module.
NO_MODULE = Capabilities(module=False)


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, (bytes, bytearray)) else str(v)


def parse_hello(reply: Any) -> Capabilities:
    """Reads the probe's reply: a dict (RESP3), flat pairs (RESP2), or the exception the
    call raised. "unknown command" is `NO_MODULE`; any other error (an ACL refusal) is
    raised again: it says nothing about the module."""
    if isinstance(reply, Exception):
        text = _text(reply).lower()
        # redis-py drops the ERR code word; another client may keep it.
        if text.startswith("unknown command") or text.startswith("err unknown command"):
            return NO_MODULE
        raise reply
    if isinstance(reply, (list, tuple)) and len(reply) % 2 == 0:
        reply = dict(zip(reply[::2], reply[1::2]))
    if not isinstance(reply, dict):
        raise ValueError(f"RLOCK.HELLO answered {reply!r}, not its map")
    fields = {_text(k): v for k, v in reply.items()}
    protocol = fields.get("protocol")
    if not isinstance(protocol, int):
        raise ValueError(f"RLOCK.HELLO answered no protocol: {reply!r}")
    return Capabilities(
        module=True,
        version=_text(fields.get("version", "")),
        protocol=protocol,
        features=tuple(_text(f) for f in fields.get("features") or ()),
        replication=_text(fields.get("replication", "")),
    )
