"""The docs hold together: the README stays the newcomer's page (16 KB at most, a two-command quick start),
every relative link and #anchor between README.md, CONTRIBUTING.md and docs/*.md resolves as GitHub renders
it, each docs page opens with a summary (and a contents list when it has many sections), every page is
reachable from the README, and no paragraph is said twice."""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
PAGES = [README, REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]
README_LIMIT = 16 * 1024
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.DOTALL)
LINK_TARGET = re.compile(r"\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")  # [text](target) and ![alt](target)
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.MULTILINE)
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def prose(text: str) -> list[str]:
    """The lines outside fenced code blocks (code blocks become empty lines, so paragraphs stay apart)."""
    lines, fenced = [], None
    for line in text.splitlines():
        match = FENCE.match(line)
        if fenced is None and match:
            fenced = match.group(1)
            lines.append("")
        elif fenced is not None:
            if line.strip().startswith(fenced):
                fenced = None
            lines.append("")
        else:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading (github-slugger): the rendered text, lower-cased, every character that is
    not a letter, mark, number, connector (`_`), hyphen or space dropped, and each space made a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link or image: its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").lower()
    kept = (c for c in text if c in " -" or unicodedata.category(c)[0] in "LMN" or unicodedata.category(c) == "Pc")
    return "".join(kept).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor, numbered as GitHub numbers repeats (name, name-1, name-2, ...)."""
    seen: Counter[str] = Counter()
    found = set()
    for line in prose(path.read_text(encoding="utf-8")):
        if match := HEADING.match(line):
            base = slug(match.group(2))
            found.add(base if not seen[base] else f"{base}-{seen[base]}")
            seen[base] += 1
    return found


def targets(path: Path) -> list[str]:
    """Every link target written in the page's prose (inline code is text, not links)."""
    text = INLINE_CODE.sub("", "\n".join(prose(path.read_text(encoding="utf-8"))))
    return LINK_TARGET.findall(text) + REFERENCE.findall(text)


def broken_links(path: Path) -> list[str]:
    broken = []
    for target in targets(path):
        if SCHEME.match(target):
            continue  # a web address: not ours to check offline
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and (linked.suffix != ".md" or anchor not in anchors(linked)):
            broken.append(f"{target}: no heading #{anchor} in {linked.name}")
    return broken


def section(text: str, title: str) -> str:
    """The README section under `## title`, up to the next `## `."""
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def paragraphs(path: Path) -> list[str]:
    blocks = re.split(r"\n\s*\n", "\n".join(prose(path.read_text(encoding="utf-8"))))
    return [" ".join(block.split()) for block in blocks if block.strip()]


def test_the_slug_follows_githubs_rules():
    assert slug("The queue: `--asap`, `board wait`, `run --wait`") == "the-queue---asap-board-wait-run---wait"
    assert slug("Pushes to the team's chat") == "pushes-to-the-teams-chat"
    assert slug("Prometheus: `/metrics`") == "prometheus-metrics"
    assert slug("`[fit]` keys and `max_fill`") == "fit-keys-and-max_fill"
    assert slug("Times, durations and cards") == "times-durations-and-cards"
    assert slug("Ask in memory: `board fit`, `book --model`") == "ask-in-memory-board-fit-book---model"
    assert slug("Cards × time → [the board](board.md)") == "cards--time--the-board"


def test_repeated_headings_are_numbered(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## Usage\n\n```\n## not a heading\n```\n\n## Usage\n")
    assert anchors(page) == {"title", "usage", "usage-1"}


def test_a_link_to_a_missing_page_or_heading_is_found(tmp_path):
    (tmp_path / "other.md").write_text("# Other\n\n## The one heading\n")
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n## Here\n\n[ok](other.md#the-one-heading) [ok](#here) [web](https://example.org/x#y)\n"
                    "`[code](nowhere.md)`\n\n```\n[fenced](nowhere.md)\n```\n\n"
                    "[gone](missing.md) [wrong](other.md#the-other-heading) [self](#there)\n")
    assert broken_links(page) == ["missing.md: no such file", "other.md#the-other-heading: no heading"
                                  " #the-other-heading in other.md", "#there: no heading #there in page.md"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves(page):
    assert broken_links(page) == []


def test_the_readme_is_a_newcomers_page():
    size = len(README.read_bytes())
    assert size <= README_LIMIT, f"README.md is {size} bytes; at most {README_LIMIT}: move the detail to docs/"


def test_the_quick_start_is_exactly_make_run_and_make_test():
    quick_start = section(README.read_text(encoding="utf-8"), "Quick start")
    block = quick_start.split("```", 2)[1]
    assert block.strip("\n").splitlines() == ["make run", "make test"]


def test_every_page_is_reachable_from_the_readme():
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in targets(README) if not SCHEME.match(t)}
    assert [str(p.relative_to(REPO)) for p in PAGES[1:] if p.resolve() not in linked] == []


@pytest.mark.parametrize("page", PAGES[1:], ids=lambda p: str(p.relative_to(REPO)))
def test_each_page_opens_with_a_summary_and_lists_its_sections(page):
    text = page.read_text(encoding="utf-8")
    title, _, rest = text.partition("\n\n")
    assert HEADING.match(title) and title.startswith("# "), "a page starts with its # title"
    summary = rest.split("\n\n", 1)[0]
    assert summary and not re.match(r"\s*([#|>!<-]|```|~~~|\d+\.\s)", summary), "then a one-paragraph summary"
    head, *sections = re.split(r"^## ", "\n".join(prose(text)), flags=re.MULTILINE)
    if len(sections) > 3:  # a long page: its contents, before the first section, link every section
        listed = {t.removeprefix("#") for t in re.findall(r"\]\((#[^)]+)\)", INLINE_CODE.sub("", head))}
        missing = [s.splitlines()[0] for s in sections if slug(s.splitlines()[0]) not in listed]
        assert missing == [], f"the contents list lacks {missing}"


def test_no_paragraph_is_said_twice():
    """A fact lives on one page; another page links to it. (Short lines such as 'At 80×24:' may repeat.)"""
    seen: Counter[str] = Counter(p for page in PAGES for p in paragraphs(page) if len(p) >= 80)
    assert [p for p, count in seen.items() if count > 1] == []
