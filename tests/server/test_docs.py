"""The documentation and packaging checks, without a server: every relative link in the
repository's Markdown resolves (the file, and the heading an anchor names), the README stays
a front door (at most 250 lines), the project's own pages cite docs/design.md rather than
an unpublished "SPEC n", every command of commands.json has its synopsis, rendered from
commands.json, on its reference page, and every package carries the one version in the
top-level VERSION file (Cargo.toml of the module and of the Rust client, the Python client's pyproject.toml,
the Java poms).

Docs move often (issue 38 moved two thousand lines of README into docs/); a link to a page
or a section that moved fails here instead of in a reader's browser.
"""

import json
import re
import subprocess
import tomllib
import unicodedata
import xml.etree.ElementTree as ET

import pytest

from conftest import ROOT

README_MAX_LINES = 250

# The pages the documentation owns; other folders' READMEs (a client still being written)
# are checked for links only.
OWN_PAGES = ["README.md", "CONTRIBUTING.md", "CHANGELOG.md", "BENCHMARK.md",
             "faults/README.md", "clients/rust/README.md", "clients/python/README.md",
             "clients/java/README.md"]


def markdown_files():
    """Every Markdown file of the checkout, tracked or new, that git does not ignore."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"],
        cwd=ROOT, check=True, capture_output=True, text=True).stdout.split()
    return sorted(p for p in set(out) if (ROOT / p).is_file())


FENCE = re.compile(r"^(```|~~~)")
INLINE_CODE = re.compile(r"`+[^`]*`+")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def prose_lines(text):
    """The lines outside fenced code blocks, with inline code removed: a transcript's
    `[...](...)` is not a link."""
    inside = False
    for n, line in enumerate(text.split("\n"), 1):
        if FENCE.match(line.strip()):
            inside = not inside
            continue
        if not inside:
            yield n, INLINE_CODE.sub("", line)


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped but for hyphens and
    underscores, spaces turned into hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.replace("`", "").lower()
    kept = "".join(c for c in text
                   if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        seen, found = {}, set()
        inside = False
        for line in path.read_text().split("\n"):
            if FENCE.match(line.strip()):
                inside = not inside
                continue
            m = None if inside else HEADING.match(line)
            if m:
                s = slug(m.group(2))
                n = seen.get(s, 0)
                seen[s] = n + 1
                found.add(s if n == 0 else f"{s}-{n}")
        cache[path] = found
    return cache[path]


def broken_links(md):
    page = ROOT / md
    for n, line in prose_lines(page.read_text()):
        for m in LINK.finditer(line):
            dest = m.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", dest):  # http:, https:, mailto:
                continue
            target, _, anchor = dest.partition("#")
            path = (page.parent / target).resolve() if target else page
            if not path.exists():
                yield f"{md}:{n}: {dest}: no such file"
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                yield f"{md}:{n}: {dest}: no heading #{anchor} in {path.relative_to(ROOT)}"


def test_every_relative_link_in_the_markdown_resolves():
    files = markdown_files()
    assert "README.md" in files and "docs/design.md" in files
    broken = [b for md in files for b in broken_links(md)]
    assert broken == [], "\n".join(broken)


def test_the_link_check_catches_a_moved_page_and_a_moved_section(tmp_path, monkeypatch):
    # The check itself, on a page written for it: it would pass anything if the link
    # pattern never matched.
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    (tmp_path / "a.md").write_text(
        "# Title\n## Its `RLOCK.ACQUIRE` part\n[ok](#its-rlockacquire-part) [ok](b.md#b)\n"
        "[gone](c.md) [moved](b.md#nowhere) ![chart](x.svg)\n```\n[not](a link)\n```\n")
    (tmp_path / "b.md").write_text("# B\n")
    assert list(broken_links("a.md")) == [
        "a.md:4: c.md: no such file",
        "a.md:4: b.md#nowhere: no heading #nowhere in b.md",
        "a.md:4: x.svg: no such file",
    ]


def test_the_readme_is_a_front_door_of_at_most_250_lines():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move detail into docs/"


def tracked_text_files():
    """Every file git tracks here that reads as text (the whole project, not only docs)."""
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split()
    files = []
    for p in out:
        try:
            files.append((p, (ROOT / p).read_text()))
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            pass
    return files


def test_nothing_cites_an_unpublished_spec():
    # The contract the project grew from is not in the repository: code, docs and tests
    # cite docs/design.md, which keeps its section numbers.
    spec = re.compile(r"\bSPEC(?:'s)?\b")
    found = [f"{p}:{n}: {line.strip()}" for p, text in tracked_text_files()
             if p != "tests/server/test_docs.py"
             for n, line in enumerate(text.split("\n"), 1) if spec.search(line)]
    assert found == [], "cite docs/design.md sections instead:\n" + "\n".join(found)


def test_every_design_md_citation_names_one_of_its_sections():
    text = (ROOT / "docs" / "design.md").read_text()
    sections = set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", text, re.M))
    cite = re.compile(r"design(?:\.md)?(?:'s)?,? (?:section )?(\d+(?:\.\d+)?)")
    found = [f"{p}: design.md {m}" for p, body in tracked_text_files()
             for m in cite.findall(body) if m not in sections]
    assert found == [], "no such section in docs/design.md:\n" + "\n".join(found)


def test_design_md_keeps_the_contract_s_section_numbers():
    # Code comments cite "design.md 1.4": every such number must stay a section.
    text = (ROOT / "docs" / "design.md").read_text()
    numbers = re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", text, re.M)
    expected = (["1"] + [f"1.{i}" for i in range(1, 9)] + ["2", "3", "4"]
                + [f"4.{i}" for i in range(1, 6)] + [str(i) for i in range(5, 13)])
    assert numbers == expected


REFERENCE_PAGES = [*sorted((ROOT / "docs" / "commands").glob("*.md")),
                   ROOT / "docs" / "internals" / "internal-commands.md"]


def synopsis(args):
    """A command's arguments from commands.json (COMMAND DOCS's schema) as the reference
    pages write them: `<name>`, `[optional]`, `TOKEN <value>`, `A|B`, `x ...`."""
    out = []
    for a in args:
        kind, flags = a["type"], a.get("flags", [])
        if kind == "pure-token":
            text = a["token"]
        elif kind == "block":
            text = synopsis(a["arguments"])
        elif kind == "oneof":
            text = "|".join(synopsis([x]) for x in a["arguments"])
        else:
            text = f"<{a['name']}>"
        if "token" in a and kind != "pure-token":
            text = f"{a['token']} {text}"
        if "multiple" in flags:
            text += " ..."
        if "optional" in flags:
            text = f"[{text}]"
        out.append(text)
    return " ".join(out)


def documented_synopses():
    found = {}
    for page in REFERENCE_PAGES:
        for block in re.findall(r"^```\n(.*?)^```", page.read_text(), re.M | re.S):
            for line in block.strip().split("\n"):
                if re.match(r"R[A-Z]+\.[A-Z]+( |$)", line):
                    found.setdefault(line.split()[0], set()).add(" ".join(line.split()))
    return found


def test_every_command_s_synopsis_on_its_page_is_the_one_commands_json_gives():
    # commands.json is the one description of the commands (COMMAND DOCS comes from it):
    # a reference page that shows an argument it does not have, or misses one, fails here.
    commands = json.loads((ROOT / "commands.json").read_text())
    documented = documented_synopses()
    wrong = []
    for name, spec in sorted(commands.items()):
        want = " ".join(f"{name} {synopsis(spec['arguments'])}".split())
        if want not in documented.get(name, set()):
            wrong.append(f"{name}: commands.json says `{want}`, the docs show "
                         f"{sorted(documented.get(name, [])) or 'nothing'}")
    assert len(commands) >= 39 and wrong == [], "\n".join(wrong)


def test_the_synopsis_renders_every_shape_of_argument():
    args = [{"name": "key", "type": "key"},
            {"name": "side", "type": "oneof", "arguments": [
                {"name": "read", "type": "pure-token", "token": "READ"},
                {"name": "write", "type": "pure-token", "token": "WRITE"}]},
            {"name": "wait", "type": "block", "flags": ["optional"], "arguments": [
                {"name": "timeout-ms", "type": "integer", "token": "WAIT"},
                {"name": "async", "type": "pure-token", "token": "ASYNC", "flags": ["optional"]}]},
            {"name": "id", "type": "string", "token": "ID", "flags": ["optional"]},
            {"name": "field", "type": "string", "flags": ["multiple"]}]
    assert synopsis(args) == ("<key> READ|WRITE [WAIT <timeout-ms> [ASYNC]] [ID <id>] "
                              "<field> ...")


def version():
    return (ROOT / "VERSION").read_text().strip()


def test_version_is_one_semver_line():
    assert re.fullmatch(r"\d+\.\d+\.\d+", version())


@pytest.mark.parametrize("manifest", ["Cargo.toml", "clients/rust/Cargo.toml"])
def test_the_rust_crates_carry_the_version(manifest):
    with open(ROOT / manifest, "rb") as f:
        assert tomllib.load(f)["package"]["version"] == version()


def test_the_python_client_carries_the_version_under_its_free_name():
    with open(ROOT / "clients/python/pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    assert project["version"] == version()
    # `rlock` on PyPI is an unrelated 2019 package; the import name stays `rlock`.
    assert project["name"] == "rlock-redis"


def test_every_java_pom_carries_the_version():
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    poms = sorted((ROOT / "clients/java").rglob("pom.xml"))
    poms = [p for p in poms if "target" not in p.relative_to(ROOT).parts]
    assert poms
    for pom in poms:
        project = ET.parse(pom).getroot()
        versions = [v.text for v in [project.find("m:version", ns)] if v is not None]
        # A module inherits the parent's version; the parent named must be this one.
        if project.findtext("m:parent/m:artifactId", namespaces=ns) == "rlock-parent":
            versions.append(project.findtext("m:parent/m:version", namespaces=ns))
        assert versions and set(versions) == {version()}, f"{pom.relative_to(ROOT)}: {versions}"
