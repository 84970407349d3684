"""One home per measurement: a GPU figure lives in BENCHMARKS.md (a launch knob's in
docs/TUNING.md), and the pages of reasons link to it instead of writing it again, so that a new
run cannot leave a stale copy behind. The README's "When to use it" has its ten headline
figures, each linked; docs/EXAMPLE.md is the one home of the example's own CPU and GPU runs."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REASON_PAGES = ["docs/LIMITS.md", "docs/ARCHITECTURE.md", "docs/INTEGRATIONS.md", "docs/API.md",
                "docs/BAD_INPUTS.md", "docs/NAN_INF.md"]
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


@pytest.mark.parametrize("page", REASON_PAGES)
def test_reason_pages_link_to_figures_instead_of_copying_them(page):
    prose = _prose((ROOT / page).read_text(encoding="utf-8"))
    copies = [prose[max(0, m.start() - 40):m.end()].replace("\n", " ") for m in FIGURE.finditer(prose)]
    assert not copies, (f"{page}: measured figures written here; link to the BENCHMARKS.md table "
                        f"(or docs/TUNING.md section) that holds them instead: {copies}")


def test_the_pattern_finds_figures():
    """The check above would pass on any page if the pattern matched nothing."""
    found = [m.group() for m in FIGURE.finditer(_prose(
        "66 us against 91; 1.2-1.3x slower; 85-91% of copy; 24.5 ms; 3,003 us; 0.98x; "
        "32x262144 and ~150 us and +-25% and [a](../B.md#softmax-99-1) and `7 us`"))]
    assert found == ["66 us", "1.2-1.3x", "85-91%", "24.5 ms", "3,003 us", "0.98x"]
