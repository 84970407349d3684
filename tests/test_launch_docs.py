"""docs/TUNING.md is the one home of the launch knobs' reasons: every field of every launch
config has its section there, and the code points at it."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from triton_layers import launch_config

ROOT = Path(__file__).resolve().parents[1]


def test_every_launch_knob_has_its_section():
    headings = re.findall(r"^### (\w+)\.(.+)$", (ROOT / "docs" / "TUNING.md").read_text(encoding="utf-8"), flags=re.M)
    documented = {(cls, name.strip()) for cls, names in headings for name in names.split(",")}
    configs = [launch_config.LaunchConfig] + [type(getattr(launch_config.DEFAULT, f.name)) for f in
                                              dataclasses.fields(launch_config.LaunchConfig)]
    missing = [f"{c.__name__}.{f.name}" for c in configs for f in dataclasses.fields(c)
               if (c.__name__, f.name) not in documented]
    assert not missing, f"launch knobs without a section in docs/TUNING.md: {missing}"


def test_the_code_points_at_each_section():
    code = (ROOT / "triton_layers" / "launch_config.py").read_text(encoding="utf-8")
    pointers = re.findall(r'# docs/TUNING.md, "(\w+\.\w+)"', code)
    text = (ROOT / "docs" / "TUNING.md").read_text(encoding="utf-8")
    for pointer in pointers:
        assert re.search(rf"^### {re.escape(pointer)}\b", text, flags=re.M), f"{pointer}: no such section"
    assert len(pointers) >= 30
