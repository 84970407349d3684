"""The Python snippets of the README and docs/INTEGRATIONS.md run as written (in this process: on the CPU through the
interpreter, as the rest of the suite). The tensor-parallel plan runs under torchrun in
tests/test_tensor_parallel.py; the CUDA-graph snippet needs a GPU."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BLOCKS = [block for page in (README, ROOT / "docs" / "INTEGRATIONS.md")
          for block in re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S)]


def _label(block: str) -> str:
    return next((line for line in block.splitlines() if line and not line.startswith(("import", "from"))),
                "")[:40]


@pytest.mark.parametrize("block", [b for b in BLOCKS if not b.startswith("# torchrun")], ids=_label)
def test_readme_snippet_runs(block, tmp_path, monkeypatch):
    if "torch.cuda.graph" in block and not torch.cuda.is_available():
        pytest.skip("the CUDA-graph snippet needs a GPU")
    if "from torchao" in block:
        pytest.importorskip("torchao.float8")  # (CI installs it beside the newest torch only)
    monkeypatch.chdir(tmp_path)  # (snippets that write files write them here)
    exec(compile(block, str(README), "exec"), {"__name__": "__readme__"})


def test_getting_started_is_near_the_top():
    """The three ways in come within the README's first 60 lines."""
    lines = README.read_text(encoding="utf-8").splitlines()
    assert any(line.startswith("## Getting started") for line in lines[:25])
    start = next(i for i, line in enumerate(lines) if line.startswith("## Getting started"))
    assert any("3. Call the functional ops" in line for line in lines[start:60])

