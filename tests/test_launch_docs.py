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
                                              dataclasses.fields(launch_config.LaunchConfig)
                                              if dataclasses.is_dataclass(getattr(launch_config.DEFAULT, f.name))]
    missing = [f"{c.__name__}.{f.name}" for c in configs for f in dataclasses.fields(c)
               if (c.__name__, f.name) not in documented]
    assert not missing, f"launch knobs without a section in docs/TUNING.md: {missing}"


def test_every_knob_says_what_it_decides():
    """Each field of the launch configs has its docstring (what it decides), and each op's class
    points at its TUNING.md sections once (the reasons and measurements)."""
    import ast

    tree = ast.parse((ROOT / "triton_layers" / "launch_config.py").read_text(encoding="utf-8"))
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    undocumented = []
    # (every op's class: the types of LaunchConfig's fields, read from the module, not named here)
    names = [type(getattr(launch_config.DEFAULT, f.name)).__name__ for f in dataclasses.fields(launch_config.LaunchConfig)]
    for name in [n for n in names if n in classes] + ["LaunchConfig"]:
        body = classes[name].body
        for i, node in enumerate(body):
            if isinstance(node, ast.AnnAssign):
                doc = body[i + 1] if i + 1 < len(body) else None
                if not (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)
                        and isinstance(doc.value.value, str) and doc.value.value.strip()):
                    undocumented.append(f"{name}.{node.target.id}")
        if name != "LaunchConfig":
            assert f'docs/TUNING.md, "{name}.<field>"' in ast.get_docstring(classes[name]), name
    assert not undocumented, f"knobs without a docstring: {undocumented}"
