"""The README is the front door: short, and every page under docs/ is one link away from it.

Relative links in README.md and docs/*.md must point at files that exist, and an anchor into a
Markdown page must name one of its headings (GitHub's slugs). Fast and offline: it reads
Markdown, nothing else.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 250

# A Markdown link's target: `](target)` or `](target "title")`.
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)


def relative_links(path: Path) -> list[str]:
    """The file part of each relative link in ``path`` (code blocks skipped): not a URL
    (``http:``, ``https:``, ``mailto:``...), not an anchor in the same page."""
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    found = []
    for target in LINK.findall(text):
        if target.startswith("#") or re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
            continue
        found.append(target.split("#", 1)[0].split("?", 1)[0])
    return found


def broken(path: Path) -> list[str]:
    return [target for target in relative_links(path)
            if not (path.parent / target).resolve().exists()]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return {slug(heading) for heading in re.findall(r"^#{1,6} +(.*?)#*$", text, re.M)}


def broken_anchors(path: Path) -> list[str]:
    """Links to ``page.md#anchor`` (or ``#anchor`` in the same page) whose page has no such
    heading."""
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    bad = []
    for target in LINK.findall(text):
        if "#" not in target or re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
            continue
        file, anchor = target.split("#", 1)
        page = (path.parent / file).resolve() if file else path
        if page.suffix == ".md" and page.is_file() and anchor not in anchors(page):
            bad.append(target)
    return bad


def doc_pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def test_readme_is_at_most_250_lines() -> None:
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_README_LINES, (
        f"README.md has {lines} lines (at most {MAX_README_LINES}): move detail to docs/")


def test_readme_relative_links_resolve() -> None:
    assert relative_links(README), "README.md links nothing"
    assert broken(README) == [], "README.md links files that do not exist"


def test_readme_links_every_docs_page() -> None:
    linked = {(ROOT / target).resolve() for target in relative_links(README)}
    missing = [page.name for page in doc_pages() if page.resolve() not in linked]
    assert doc_pages() and not missing, f"README.md does not link docs/{missing}"


@pytest.mark.parametrize("page", doc_pages(), ids=lambda page: page.name)
def test_docs_relative_links_resolve(page: Path) -> None:
    assert broken(page) == [], f"docs/{page.name} links files that do not exist"


@pytest.mark.parametrize("page", doc_pages(), ids=lambda page: page.name)
def test_docs_page_opens_with_a_title_and_a_summary(page: Path) -> None:
    lines = page.read_text(encoding="utf-8").splitlines()
    assert lines and lines[0].startswith("# "), f"docs/{page.name} does not open with '# Title'"
    summary = next((line for line in lines[1:] if line.strip()), "")
    assert summary and not summary.startswith(("#", "```", "|", "-")), (
        f"docs/{page.name}: its title is not followed by a one-line summary")


@pytest.mark.parametrize("page", [README, *doc_pages()], ids=lambda page: page.name)
def test_anchors_name_a_heading(page: Path) -> None:
    assert broken_anchors(page) == [], f"{page.name} links anchors that no heading makes"
