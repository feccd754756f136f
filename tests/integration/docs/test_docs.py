"""The documentation holds together: every relative link in README.md, docs/*.md and BENCHMARKS.md reaches an existing
file (and, with ``#anchor``, a heading of it, by GitHub's slugs), the README stays a short front door that indexes
every docs page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
README_MAX_LINES = 300


def pages(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", root / "BENCHMARKS.md", *sorted((root / "docs").glob("*.md"))]


def prose(text: str) -> str:
    """``text`` without fenced code blocks and inline code spans, where ``[a](b)`` and ``# x`` are not Markdown."""
    text = re.sub(r"^(```|~~~).*?^\1[ \t]*$", "", text, flags=re.MULTILINE | re.DOTALL)
    return re.sub(r"(`+)(?!`).+?(?<!`)\1(?!`)", "", text, flags=re.DOTALL)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its text lower-cased, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor in ``page``; a repeated slug gets -1, -2, ... as on GitHub."""
    code_free = re.sub(r"^(```|~~~).*?^\1[ \t]*$", "", page.read_text(), flags=re.MULTILINE | re.DOTALL)
    seen: dict[str, int] = {}
    result = set()
    for match in re.finditer(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", code_free, flags=re.MULTILINE):
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f"{base}-{count}")
    return result


def relative_links(page: Path) -> list[str]:
    targets = re.findall(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", prose(page.read_text()))
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t)]  # http:, https:, mailto: ... are not ours


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: {resolved.name} has no heading with that anchor")
    return broken


@pytest.mark.parametrize("page", pages(), ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    assert page.exists(), f"{page.relative_to(ROOT)} is missing"
    assert not broken_links(page), f"{page.relative_to(ROOT)}: broken links: {broken_links(page)}"


def test_readme_is_a_short_front_door():
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; keep it to {README_MAX_LINES}, the rest in docs/"


def test_readme_indexes_every_docs_page():
    linked = {(ROOT / link.partition("#")[0]).resolve() for link in relative_links(ROOT / "README.md")}
    unlisted = [page.name for page in sorted((ROOT / "docs").glob("*.md")) if page.resolve() not in linked]
    assert not unlisted, f"docs pages the README's index does not link: {unlisted}"


def test_the_link_checker_catches_what_it_should(tmp_path):
    """A missing file, a missing anchor and a repeated heading's anchor; links in code are not links."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## Set-up: `make` it\n\n## Set-up: `make` it\n")
    (tmp_path / "README.md").write_text(
        "[ok](docs/a.md#set-up-make-it-1) [file](docs/b.md) [anchor](docs/a.md#nowhere) [web](https://x.org/y)\n"
        "`[code](docs/c.md)`\n\n```\n[block](docs/d.md)\n```\n[self](#title)\n"
    )
    assert broken_links(tmp_path / "README.md") == [
        "docs/b.md: no such file",
        "docs/a.md#nowhere: a.md has no heading with that anchor",
        "#title: README.md has no heading with that anchor",
    ]
