"""The copies of Redisson's scripts, without a server: the Python client's
`clients/python/rlock/lua/` is the one source (docs/scripts-mode.md, "Where the scripts
live"); a client that must package its own copy (the Rust crate, which embeds them with
include_str! and must stay packageable on its own) keeps byte-identical files of the same
names. A copy edited by hand, or one the source no longer has, fails here: scripts mode's
interop rests on every client sending the very scripts Redisson sends.
"""

from conftest import ROOT

SOURCE = ROOT / "clients" / "python" / "rlock" / "lua"


def copies():
    """Every `*.lua` under clients/ other than the source's own files."""
    return sorted(p for p in (ROOT / "clients").rglob("*.lua")
                  if p.parent != SOURCE and "target" not in p.relative_to(ROOT).parts)


def test_the_source_has_the_scripts():
    assert len(list(SOURCE.glob("*.lua"))) > 20


def test_the_rust_crate_has_a_copy_of_every_script():
    rust = {p.name for p in (ROOT / "clients" / "rust" / "lua").glob("*.lua")}
    assert rust == {p.name for p in SOURCE.glob("*.lua")}


def test_every_copy_is_byte_identical_to_the_source():
    found = copies()
    assert found, "no copy found: the Rust crate keeps one in clients/rust/lua"
    for copy in found:
        source = SOURCE / copy.name
        assert source.is_file(), f"{copy.relative_to(ROOT)} has no source in {SOURCE.relative_to(ROOT)}"
        assert copy.read_bytes() == source.read_bytes(), (
            f"{copy.relative_to(ROOT)} differs from {source.relative_to(ROOT)}: copy it again")
