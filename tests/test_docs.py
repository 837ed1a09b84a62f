"""Every relative link in the documentation points at a file that exists (and, with an anchor, at a heading there).

The README, docs/, deploy/ and bench/ markdown files are scanned; links inside code blocks and code spans are not
links. `http(s):` and `mailto:` links are not checked (no network in tests).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = sorted({ROOT / "README.md", *ROOT.glob("docs/**/*.md"), *ROOT.glob("deploy/**/*.md"),
                    *ROOT.glob("bench/*.md")})

FENCE = re.compile(r"^(```|~~~)")
CODE_SPAN = re.compile(r"`[^`]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def prose_lines(text: str):
    """(line number, line) outside fenced code blocks, with code spans blanked out."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            yield number, CODE_SPAN.sub("``", line)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: link text kept, lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found, seen = set(), {}
    fenced = False
    for line in path.read_text().splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        match = None if fenced else HEADING.match(line)
        if match:
            base = slug(match.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(document: Path, root: Path = ROOT, pending: set[str] = frozenset()) -> list[str]:
    problems = []
    for number, line in prose_lines(document.read_text()):
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # http:, https:, mailto: ...
                continue
            path_part, _, anchor = target.partition("#")
            where = f"{document.relative_to(root)}:{number}: {target}"
            resolved = (document.parent / path_part).resolve() if path_part else document
            if not resolved.exists():
                try:
                    relative = resolved.relative_to(root).as_posix()
                except ValueError:
                    relative = None
                if relative not in pending:
                    problems.append(f"{where}: no such file")
                continue
            if anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                problems.append(f"{where}: no heading with anchor #{anchor} in {resolved.name}")
    return problems


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_at_an_existing_file(document):
    assert broken_links(document) == []


def test_the_readme_and_the_docs_are_scanned():
    names = {p.relative_to(ROOT).as_posix() for p in DOCUMENTS}
    assert {"README.md", "docs/operating-guide.md", "docs/guarantees.md", "docs/cluster.md"} <= names


def test_a_broken_link_is_reported(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "real.md").write_text("# Real\n\n## A section, with `code`\n")
    (tmp_path / "deploy").mkdir()
    (tmp_path / "deploy" / "prefect.yaml").write_text("")
    readme = tmp_path / "README.md"
    readme.write_text(
        "[ok](docs/real.md) [ok too](docs/real.md#a-section-with-code) [file](deploy/prefect.yaml)\n"
        "[web](https://example.com/missing.md) [self](#title)\n"
        "[gone](docs/missing.md) and ![picture](img/missing.png)\n"
        "[bad anchor](docs/real.md#no-such-section) [moved](deploy/postgres/README.md)\n"
        "`[not a link](nowhere.md)`\n"
        "```\n"
        "[inside a code block](nowhere.md)\n"
        "```\n"
        "# Title\n")
    assert broken_links(readme, root=tmp_path) == [
        "README.md:3: docs/missing.md: no such file",
        "README.md:3: img/missing.png: no such file",
        "README.md:4: docs/real.md#no-such-section: no heading with anchor #no-such-section in real.md",
        "README.md:4: deploy/postgres/README.md: no such file",
    ]
    # From inside docs/, paths are relative to docs/: the README's `deploy/...` is `../deploy/...` there.
    guide = tmp_path / "docs" / "guide.md"
    guide.write_text("[wrong](deploy/prefect.yaml) [right](../deploy/prefect.yaml) [pending](later.md)\n")
    assert broken_links(guide, root=tmp_path) == ["docs/guide.md:1: deploy/prefect.yaml: no such file",
                                                   "docs/guide.md:1: later.md: no such file"]
    assert broken_links(guide, root=tmp_path, pending={"docs/later.md"}) == \
        ["docs/guide.md:1: deploy/prefect.yaml: no such file"]
