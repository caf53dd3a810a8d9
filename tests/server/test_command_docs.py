"""Every command the module registers has its reference: a heading naming it in one of the
docs/commands/ pages (public commands: synopsis, transcript, replies) or in
docs/internals/internal-commands.md (the internal ones no client may send). Asked of a real
module-loaded server, so a command added to the registration table without its page fails
here; the docs' own links are checked server-free in test_docs.py.
"""

import re

from conftest import ROOT

DOCS = [*sorted((ROOT / "docs" / "commands").glob("*.md")),
        ROOT / "docs" / "internals" / "internal-commands.md"]


def documented_names():
    names = set()
    for page in DOCS:
        inside = False
        for line in page.read_text().split("\n"):
            if line.startswith("```"):
                inside = not inside
            elif not inside and line.startswith("#"):
                names.update(re.findall(r"\b(R[A-Z]+\.[A-Z]+)\b", line))
    return names


def test_every_registered_command_has_a_reference_heading(r):
    registered = {c.decode().upper() if isinstance(c, bytes) else c.upper()
                  for c in r.command_list(module="rlock")}
    assert "RLOCK.ACQUIRE" in registered
    missing = sorted(registered - documented_names())
    assert missing == [], (
        "document each under a heading in docs/commands/<primitive>.md (internal ones in "
        f"docs/internals/internal-commands.md): {missing}")
