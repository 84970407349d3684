"""One home per measurement: a GPU figure lives in BENCHMARKS.md (a launch knob's in
docs/TUNING.md), and the pages of reasons link to it instead of writing it again, so that a new
run cannot leave a stale copy behind. The README's "When to use it" has its ten headline
figures, each linked; docs/EXAMPLE.md is the one home of the example's own CPU and GPU runs.
A dated note (what a run measured, at which commit) is a file of docs/journal/, and every link to
a section or a note resolves."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REASON_PAGES = ["docs/LIMITS.md", "docs/ARCHITECTURE.md", "docs/INTEGRATIONS.md", "docs/API.md"]
# A measured figure: a time, a bandwidth, a rate, a percentage or a ratio ("66 us", "1.2-1.3x",
# "85-91%"). Shapes (32x262144) are not figures; a number after "~" or "+-" is a rule of thumb
# (a kernel under ~150 us is host-bound), not a measurement.
FIGURE = re.compile(r"(?<![\w.~])(?<!\+-)\d[\d,]*(?:\.\d+)?(?:-\d[\d,]*(?:\.\d+)?)?"
                    r"(?:\s?(?:us|ms|GB/s|tokens/s|%)|x)(?!\w)")


def _prose(text: str) -> str:
    """``text`` without code (blocks and spans) and without link targets (a heading's anchor may
    hold numbers)."""
    text = re.sub(r"```.*?```|`[^`\n]*`", "", text, flags=re.S)
    return re.sub(r"\]\([^)\s]*\)", "]", text)


# What a run measured, beside FIGURE: a date or a commit hash (which run, at which code), registers
# and spills a thread, bytes and shared memory. A dated note is a docs/journal/ file.
RUN_FACT = re.compile(r"(?<![\w/#.-])(?:20\d\d-\d\d-\d\d|(?=[0-9a-f]*\d)[0-9a-f]{7,12}(?![\w-])"
                      r"|\d[\d,]*(?:-\d[\d,]*)?\s?(?:registers|KB|KiB|MB|MiB|GB|GiB|bytes)\b)")


@pytest.mark.parametrize("page", REASON_PAGES)
def test_reason_pages_link_to_figures_instead_of_copying_them(page):
    prose = _prose((ROOT / page).read_text(encoding="utf-8"))
    copies = [prose[max(0, m.start() - 40):m.end()].replace("\n", " ")
              for pattern in (FIGURE, RUN_FACT) for m in pattern.finditer(prose)]
    assert not copies, (f"{page}: measured figures, dates or commit hashes written here; link to the "
                        f"BENCHMARKS.md table, the docs/TUNING.md section or the docs/journal/ note that "
                        f"holds them instead: {copies}")


def test_the_run_fact_pattern_finds_dates_hashes_registers_and_bytes():
    found = [m.group() for m in RUN_FACT.finditer(_prose(
        "on 2026-11-24; at a15d6d8; 96 registers; 232 bytes; 192 KB; 64 MiB; 56-496 bytes; "
        "the journal/2026-11-24-x.md link, [a](#h-2026-11-24), ffn2816, fp8, `0f4e2a1`"))]
    assert found == ["2026-11-24", "a15d6d8", "96 registers", "232 bytes", "192 KB", "64 MiB", "56-496 bytes"]


def test_docstrings_hold_no_dated_runs():
    """The code's docstrings and comments say what the code does and why, not which run measured
    it when: no date of a run in triton_layers/ (a dated note is a docs/journal/ file)."""
    dated = [f"{path.relative_to(ROOT)}:{n}" for path in sorted((ROOT / "triton_layers").rglob("*.py"))
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if re.search(r"\b20\d\d-\d\d-\d\d\b", line)]
    assert not dated, f"dated runs in the code (move them to docs/journal/): {dated}"


def test_the_pattern_finds_figures():
    """The check above would pass on any page if the pattern matched nothing."""
    found = [m.group() for m in FIGURE.finditer(_prose(
        "66 us against 91; 1.2-1.3x slower; 85-91% of copy; 24.5 ms; 3,003 us; 0.98x; "
        "32x262144 and ~150 us and +-25% and [a](../B.md#softmax-99-1) and `7 us`"))]
    assert found == ["66 us", "1.2-1.3x", "85-91%", "24.5 ms", "3,003 us", "0.98x"]


# Links. A dated note lives in docs/journal/ (append-only, one file per topic and date); the pages
# of the current state link to it. A moved section or a renamed heading breaks a link, not silently.
JOURNAL = ROOT / "docs" / "journal"
LINKED_PAGES = ["README.md", "BENCHMARKS.md", *sorted(p.relative_to(ROOT).as_posix()
                                                    for p in (ROOT / "docs").rglob("*.md"))]


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub gives ``page``: its headings' (lower case, punctuation but ``-`` and
    ``_`` dropped, spaces as ``-``, a repeated one suffixed ``-1``, ``-2``, ...) and those of
    ``<a name="...">`` / ``<a id="...">`` (an old heading's anchor kept where its section moved)."""
    text = page.read_text(encoding="utf-8")
    seen: dict[str, int] = {}
    anchors = set(re.findall(r"<a (?:name|id)=\"([^\"]+)\"", text))
    for heading in re.findall(r"^#+ (.*)$", re.sub(r"```.*?```", "", text, flags=re.S), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _broken(path: Path, targets) -> list[str]:
    broken = []
    for target in targets:
        if re.match(r"[a-z]+:", target):
            continue  # (https: and other absolute links)
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists():
            broken.append(target)
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(target)
    return broken


@pytest.mark.parametrize("page", LINKED_PAGES)
def test_links_resolve(page):
    """Every relative link of ``page`` (BENCHMARKS.md#anchor and journal/... ones included) names a
    file of the repository and, after a ``#``, one of its anchors."""
    path = ROOT / page
    text = re.sub(r"```.*?```|`[^`\n]*`", "", path.read_text(encoding="utf-8"), flags=re.S)  # (code is not links)
    broken = _broken(path, re.findall(r"\]\(([^)\s]+)\)", text))
    assert not broken, f"{page}: links that resolve to nothing: {broken}"


def test_code_points_at_sections_that_exist():
    """A ``BENCHMARKS.md#anchor`` or ``docs/journal/...md`` named in the code (docstrings and
    comments) resolves too: the code's pointers are not edited when a docs page moves."""
    broken = []
    for folder in ("triton_layers", "benchmarks", "examples"):
        for source in sorted((ROOT / folder).rglob("*.py")):
            text = source.read_text(encoding="utf-8")
            targets = re.findall(r"(?<![\w/.])((?:BENCHMARKS\.md#[\w-]+)|(?:docs/journal/[\w.-]+\.md(?:#[\w-]+)?))", text)
            broken += [f"{source.relative_to(ROOT)}: {t}" for t in _broken(ROOT / "README.md", targets)]
    assert not broken, f"pointers in the code that resolve to nothing: {broken}"


def test_journal_files_are_dated_and_indexed():
    """docs/journal/ holds one file per topic and date, ``YYYY-MM-DD-topic.md``, each opening with
    its title; its README says the rules, and BENCHMARKS.md's index links every entry. (That an
    entry is never edited once committed is a rule for review: CI cannot see it.)"""
    assert (JOURNAL / "README.md").exists()
    entries = sorted(p for p in JOURNAL.glob("*.md") if p.name != "README.md")
    assert entries, "docs/journal/ has no entries"
    undated = [p.name for p in entries if not re.match(r"\d{4}-\d{2}-\d{2}-[a-z0-9][a-z0-9-]*\.md$", p.name)]
    assert not undated, f"journal files not named YYYY-MM-DD-topic.md: {undated}"
    untitled = [p.name for p in entries if not p.read_text(encoding="utf-8").startswith("# ")]
    assert not untitled, f"journal files that do not open with a one-line title: {untitled}"
    index = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    unlisted = [p.name for p in entries if f"docs/journal/{p.name}" not in index]
    assert not unlisted, f"journal files BENCHMARKS.md's notes do not list: {unlisted}"
