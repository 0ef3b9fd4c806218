"""Docs are self-contained: every ``docs/<file>.md §N`` cited in the code, the tests, the docs
and the README names a section that exists, every cited ``docs/*.md`` file exists, and nothing
cites THEORY.md or DESIGN.md, which are not in the repository."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [*sorted((ROOT / "src").rglob("*.py")), *sorted((ROOT / "src").rglob("*.yaml")),
           *sorted((ROOT / "tests").rglob("*.py")), *sorted((ROOT / "docs").glob("*.md")),
           *sorted((ROOT / "benchmarks").rglob("*.py")), ROOT / "README.md",
           ROOT / "benchmarks" / "README.md"]
#: ``docs/theory.md §8``, ``docs/theory.md`` §12, ``docs/theory.md §1-§7``, ``§5 and §7``,
#: ``§9, §10 and §5``.
CITATION = re.compile(r"docs/([\w-]+)\.md`{0,2}\s*(§\s?\d+(?:(?:\s*,\s*|\s+and\s+|\s*[-–]\s*)"
                      r"§?\s?\d+)*)")
FILE = re.compile(r"docs/([\w-]+)\.md")
HEADING = re.compile(r"^#+\s+(\d+)\.\s", re.MULTILINE)


def _sections(doc: str) -> set[int]:
    return {int(n) for n in HEADING.findall((ROOT / "docs" / f"{doc}.md").read_text("utf-8"))}


def _cited(text: str) -> list[tuple[str, list[int]]]:
    out = []
    for match in CITATION.finditer(text):
        numbers = [int(n) for n in re.findall(r"\d+", match.group(2))]
        if re.search(r"\d\s*[-–]\s*§?\s?\d", match.group(2)):  # a range: every section in it
            numbers = list(range(min(numbers), max(numbers) + 1))
        out.append((match.group(1), numbers))
    return out


def test_the_citation_pattern() -> None:
    text = ("see docs/theory.md §8, ``docs/theory.md`` §12; (docs/theory.md §1-§7) and "
            "docs/negatives.md; docs/theory.md §9, §10 and §5")
    assert _cited(text) == [("theory", [8]), ("theory", [12]), ("theory", list(range(1, 8))),
                            ("theory", [9, 10, 5])]


def test_every_cited_section_exists() -> None:
    missing = []
    count = 0
    for path in SOURCES:
        if not path.is_file() or path == Path(__file__).resolve():
            continue
        text = path.read_text(encoding="utf-8")
        for doc in set(FILE.findall(text)):
            if not (ROOT / "docs" / f"{doc}.md").is_file():
                missing.append(f"{path.relative_to(ROOT)}: docs/{doc}.md does not exist")
        for doc, numbers in _cited(text):
            count += 1
            if not (ROOT / "docs" / f"{doc}.md").is_file():
                continue
            have = _sections(doc)
            missing += [f"{path.relative_to(ROOT)}: docs/{doc}.md §{n} does not exist"
                        for n in numbers if n not in have]
    assert not missing, "\n".join(missing)
    assert count >= 50  # the docstrings do cite their formulas


def test_nothing_cites_files_outside_the_repository() -> None:
    stale = [f"{path.relative_to(ROOT)}:{i}: {line.strip()}"
             for path in SOURCES if path.is_file() and path != Path(__file__).resolve()
             for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if re.search(r"\b(THEORY|DESIGN)\.md|\bTHEORY section", line)]
    assert not stale, "\n".join(stale)
