"""The documentation holds together: a short README, relative links that resolve, no pointers outside the repository.

Reads README.md and docs/**/*.md as text; nothing is built or trained.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
README_MAX_BYTES = 15_000  # the front door: what hasten is, set-up, own data and model, one result, links
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]

FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")
INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.MULTILINE)
HTML_LINK = re.compile(r"<(?:img|a)\b[^>]*?\b(?:src|href)=\"([^\"]+)\"", re.IGNORECASE)
ISSUE_NUMBER = re.compile(r"\b[Ii]ssue \d+")


def prose(text: str) -> str:
    """The text without fenced code blocks and inline code, where a bracket is not a link."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def relative_targets(text: str) -> list[str]:
    """Every link target that names a file of this repository (no scheme, not only an #anchor), without its #part."""
    body = prose(text)
    found = [m.group(1) for pattern in (INLINE_LINK, REFERENCE_LINK, HTML_LINK) for m in pattern.finditer(body)]
    targets = []
    for target in found:
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("#"):
            continue  # http(s), mailto: ...; an anchor on the same page
        targets.append(target.split("#", 1)[0].split("?", 1)[0])
    return targets


def page_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_readme_is_a_front_door() -> None:
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size:,} bytes (at most {README_MAX_BYTES:,}): move detail to docs/"


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in relative_targets(page.read_text(encoding="utf-8")):
        resolved = (page.parent / target).resolve()
        if not resolved.is_relative_to(ROOT) or not resolved.exists():
            broken.append(target)
    assert not broken, f"{page_id(page)} links to missing or outside files: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_no_work_items_or_outside_files(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    assert not ISSUE_NUMBER.findall(text), f"{page_id(page)} names work items: {ISSUE_NUMBER.findall(text)}"
    assert "../shared" not in text, f"{page_id(page)} points into ../shared, outside the repository"


def test_link_finder_sees_links_and_skips_code() -> None:
    text = (
        'See [guide](docs/guide/data.md#folders), ![plot](a.png), <img src="b.png" width=3>,\n'
        "[web](https://example.com), [here](#data), `[not](code.md)`\n\n"
        "```\n[also not](code.md)\n```\n\n[ref]: docs/x.md\n"
    )
    assert relative_targets(text) == ["docs/guide/data.md", "a.png", "docs/x.md", "b.png"]


def test_results_section_has_its_page() -> None:
    """benchmarks/results_section.py rewrites the block between its markers in docs/benchmarks.md."""
    from benchmarks import results_section

    text = results_section.PAGE.read_text(encoding="utf-8")
    assert results_section.PAGE.parent == ROOT / "docs"
    assert text.count(results_section.BEGIN) == 1 and text.count(results_section.END) == 1
    assert text.index(results_section.BEGIN) < text.index(results_section.END)


def test_results_section_rewrites_only_its_block(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks import results_section

    page = tmp_path / "docs" / "benchmarks.md"
    page.parent.mkdir()
    begin, end = results_section.BEGIN, results_section.END
    page.write_text(f"# Benchmarks\n\nbefore\n\n{begin}\nstale\n{end}\n\nafter\n")
    monkeypatch.setattr(results_section, "ROOT", tmp_path)
    monkeypatch.setattr(results_section, "PAGE", page)
    monkeypatch.setattr(results_section, "BENCH", tmp_path / "bench")  # nothing has run
    monkeypatch.setattr(results_section, "DOCS", tmp_path / "docs" / "results")
    assert results_section.main() == 0
    text = page.read_text()
    assert "stale" not in text and "has not been run here" in text
    assert text.startswith("# Benchmarks\n\nbefore\n\n") and text.endswith(f"{end}\n\nafter\n")


def test_copied_report_links_only_kept_plots(tmp_path: Path) -> None:
    from benchmarks.results_section import copy_report

    report = tmp_path / "report.md"
    report.write_text("# bench\n\n![a](accuracy_vs_time.png)\n\ntext\n\n![b](peak_memory.png)\n\nend\n")
    copy_report(report, tmp_path / "headline.md", {"accuracy_vs_time.png": "headline-accuracy-vs-time.png"})
    copied = (tmp_path / "headline.md").read_text()
    assert copied == "# bench\n\n![a](headline-accuracy-vs-time.png)\n\ntext\n\nend\n"
