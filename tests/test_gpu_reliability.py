"""Determinism of every op and the sanitizer driver; run alone on the GPU (``.ci/gpu``).

Determinism: the same inputs give bitwise-identical outputs and gradients from run to
run. On the GPU at shapes that use many programs and the partial-sum reductions
(weight gradients, split columns, chunked rows); on the CPU (interpreter) at small shapes.
The cases are the ops' cards' (tests/training_cases.py, ``determinism``; every kernel op has
some: ``test_every_op_has_a_card``).

Last, scripts/sanitize.py (the compute-sanitizer driver) must pass: in full on the GPU,
with its tiny limits on the CPU.

(Each op's test past 2**31 elements is in its own test file, ``-k past_2_31``, on
tests/big_tensors.py.)
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from triton_layers.kernels import ops

from .conftest import DEVICE, looped_config
from .oracle import run
from .training_cases import CARDS

# The whole file after the parallel suite, with the tests that need GPU memory (.ci/gpu), as it
# always ran: its determinism cases take shapes that fill the device.
pytestmark = pytest.mark.alone
CUDA = torch.cuda.is_available()
DETERMINISM = {name: case for card in CARDS.values() for name, case in card.determinism.items()}


def _run(fn, inputs):
    """fn(*inputs) and the gradients of the inputs that require one, for a fixed dy."""
    torch.manual_seed(1)  # the same dy every time
    y, grads, _ = run(fn, {i: t.detach().clone().requires_grad_(t.requires_grad) for i, t in enumerate(inputs)})
    return [y, *grads.values()]


@pytest.mark.parametrize("name", DETERMINISM)
def test_bitwise_deterministic(name):
    torch.manual_seed(0)
    fn, inputs, small = DETERMINISM[name](DEVICE == "cuda")
    with looped_config("small" if small else "fused"):
        first = _run(fn, inputs)
        second = _run(fn, inputs)
    assert len(first) == len(second) >= 2, name
    for i, (a, b) in enumerate(zip(first, second)):
        assert torch.equal(a, b), f"{name}: output {i} differs between two runs"


# --- the compute-sanitizer driver -----------------------------------------------------


def test_sanitize_driver_passes():
    """scripts/sanitize.py (what scripts/sanitize.sh runs under compute-sanitizer) runs
    every case and agrees with the reference: on the CPU with its tiny limits, every sixth
    case (every third took 19 s of a CI worker, every sixth 12; each kernel op's cases still
    run, and every kernel op must have some: the bench files declare them). The kernels at
    those sizes are each op's own tests'; this is the driver's."""
    root = Path(__file__).resolve().parents[1]
    args = [sys.executable, str(root / "scripts" / "sanitize.py")] + ([] if CUDA else ["--tiny", "--every", "6"])
    env = dict(os.environ, **({} if CUDA else {"TRITON_INTERPRET": "1"}))
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert " 0 failed" in done.stdout.splitlines()[-1]
    ran = {line.split()[1].rstrip(":") for line in done.stdout.splitlines() if line.startswith("ok ")}
    assert set(ops.__all__) <= ran, f"kernel ops without a sanitize case that ran: {sorted(set(ops.__all__) - ran)}"
