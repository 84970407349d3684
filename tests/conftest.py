"""Test setup: without a GPU, run the kernels through the Triton interpreter.

TRITON_INTERPRET must be set before triton_layers (and its @triton.jit kernels) is
imported, so it is set here, at collection time, when no CUDA device is present.
"""
import contextlib
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import triton_layers  # noqa: E402,F401

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture
def device() -> str:
    """Where the kernels run: the GPU if there is one, else the CPU through the interpreter."""
    return DEVICE


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@contextlib.contextmanager
def launch_limits(**values: int):
    """Set ``triton_layers.kernels._launch`` limits (e.g. ``MAX_FUSED_COLS=16``) for the
    duration of a ``with`` block, so that small rows take the chunked paths; restores them."""
    from triton_layers.kernels import _launch

    saved = {name: getattr(_launch, name) for name in values}
    try:
        for name, value in values.items():
            setattr(_launch, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(_launch, name, value)


@pytest.fixture
def small_blocks(monkeypatch):
    """Shrink the kernels' block limits so the looped (long-row) paths run on small rows."""
    from triton_layers.kernels import _launch

    monkeypatch.setattr(_launch, "MAX_FUSED_COLS", 256)
    monkeypatch.setattr(_launch, "LN_FWD_MAX_FUSED_COLS", 256)
    monkeypatch.setattr(_launch, "LOOP_BLOCK", 128)
    return _launch
