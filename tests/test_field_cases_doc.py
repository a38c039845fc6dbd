"""docs/FIELD-CASES.md: every "field case N" cited in the repository has a section, and every test
the document names exists."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "FIELD-CASES.md"
SEARCHED = ["shardkit", "tests", "benchmarks", "docs", "scripts", "examples", "configs"]
SUFFIXES = {".py", ".md", ".c", ".h", ".yaml", ".yml", ".toml", ".cfg", ".txt"}
# "field case 12", "Case 18's", "cases 8 and 10", "field cases 5/7/9/11/14/15/24", "cases 12, 14"
CITATION = re.compile(r"(?i)\b(?:field\s+)?cases?\s+(\d+(?:\s*(?:,|/|\band\b|&|\+)\s*\d+)*)")
# test names cite cases too: test_case5_..., test_case11_14_...
TEST_NAME = re.compile(r"\btest_case((?:\d+_)*\d+)")
LISTED_TEST = re.compile(r"`(tests/test_\w+\.py)::(test_\w+)`")


def _sources() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "Makefile"]
    for folder in SEARCHED:
        files += [p for p in sorted((ROOT / folder).rglob("*"))
                  if p.is_file() and p.suffix in SUFFIXES and "results" not in p.parts]
    return [p for p in files if p.exists() and p != DOC]


def _citations() -> dict[int, list[str]]:
    """case number -> ["path:line", ...] for every citation outside the document itself."""
    found: dict[int, list[str]] = {}
    for path in _sources():
        text = path.read_text(encoding="utf-8", errors="replace")
        for lineno, line in enumerate(text.splitlines(), 1):
            numbers = [n for m in CITATION.finditer(line) for n in re.findall(r"\d+", m.group(1))]
            numbers += [n for m in TEST_NAME.finditer(line) for n in m.group(1).split("_")]
            for n in numbers:
                found.setdefault(int(n), []).append(f"{path.relative_to(ROOT)}:{lineno}")
    return found


def _headings() -> list[int]:
    return [int(n) for n in re.findall(r"^## (\d+)\. \S", DOC.read_text(encoding="utf-8"), re.M)]


def test_citation_pattern_reads_every_form():
    line = ("field case 12; Case 18's repro; cases 8 and 10; field cases 5/7/9/11/14/15/24; "
            "cases 12, 14 and 15; test_case11_14_empty; test_case5_shards_10_10_5")
    numbers = [n for m in CITATION.finditer(line) for n in re.findall(r"\d+", m.group(1))]
    numbers += [n for m in TEST_NAME.finditer(line) for n in m.group(1).split("_")]
    assert numbers == ["12", "18", "8", "10", "5", "7", "9", "11", "14", "15", "24", "12", "14",
                       "15", "11", "14", "5"]


def test_every_cited_case_has_a_section():
    cited = _citations()
    # the grep really sees the code's citations (~100 of them, from the package and the tests)
    assert sum(len(v) for v in cited.values()) > 50
    assert {2, 5, 12, 15, 19, 20, 24} <= set(cited)
    headings = set(_headings())
    missing = {n: where[:3] for n, where in sorted(cited.items()) if n not in headings}
    assert not missing, f"cited in code but no '## N.' section in {DOC.name}: {missing}"


def test_sections_are_unique_and_in_order():
    headings = _headings()
    assert len(headings) >= 15
    assert headings == sorted(set(headings))


def test_every_listed_test_exists():
    text = DOC.read_text(encoding="utf-8")
    listed = LISTED_TEST.findall(text)
    assert len(listed) > 40
    absent = [f"{path}::{name}" for path, name in listed
              if not (ROOT / path).is_file()
              or not re.search(rf"^def {name}\(", (ROOT / path).read_text(encoding="utf-8"), re.M)]
    assert not absent, f"{DOC.name} names tests that do not exist: {absent}"


def test_every_section_names_a_test_or_says_none():
    sections = re.split(r"^## ", DOC.read_text(encoding="utf-8"), flags=re.M)[1:]
    for section in sections:
        title = section.splitlines()[0]
        assert "**Tests:**" in section, title
        tests_part = section.split("**Tests:**", 1)[1]
        assert LISTED_TEST.search(tests_part) or "No test yet" in tests_part, title


# "issue 12", "issues 9 and 10", "Issue #3": numbers of a tracker the repository does not hold
ISSUE_CITATION = re.compile(r"(?i)\bissues?\s+#?\d+")


def test_no_issue_numbers_are_cited():
    assert ISSUE_CITATION.findall("as in issue 12; Issue #3; issues 9") == [
        "issue 12", "Issue #3", "issues 9"]
    cited = [f"{path.relative_to(ROOT)}:{lineno}" for path in _sources() + [DOC]
             for lineno, line in enumerate(path.read_text(encoding="utf-8", errors="replace")
                                           .splitlines(), 1)
             if ISSUE_CITATION.search(line) and path != Path(__file__).resolve()]
    assert not cited, f"cite the behaviour or a docs/ section, not a tracker's issue: {cited}"
