"""Test setup: without a GPU, run the kernels through the Triton interpreter.

TRITON_INTERPRET must be set before triton_layers (and its @triton.jit kernels) is
imported, so it is set here, at collection time, when no CUDA device is present.

In every test file ``F`` is ours (``from triton_layers import functional as F``) and
``TF`` is torch's (``import torch.nn.functional as TF``); dtypes come from ``DTYPES`` /
``LOW_DTYPES`` here.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import triton_layers  # noqa: E402,F401
from triton_layers.kernels import _launch  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
LOW_DTYPES = DTYPES[1:]  # fp16, bf16


@pytest.fixture
def device() -> str:
    """Where the kernels run: the GPU if there is one, else the CPU through the interpreter."""
    return DEVICE


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# Launch configs that send small rows down the chunked (long-row) paths, from the library's
# own presets (kernels/_launch.py): TINY (rows over 16 columns), SMALL (over 64).
SMALL = _launch.shrunk(64, 32, softmax_tile_elements=128)


def launch_config(config: "_launch.LaunchConfig"):
    """``with launch_config(cfg):`` launches with ``cfg`` inside the block."""
    return _launch.use_config(config)


@pytest.fixture
def small_blocks():
    """Rows over 256 columns take the looped (long-row) paths, in 128-wide chunks."""
    with _launch.use_config(_launch.shrunk(256, 128)) as config:
        yield config


@pytest.fixture
def softmax_small_blocks():
    """Rows over 64 columns take the looped paths (32-wide chunks); smaller softmax row tiles.

    Small numbers keep the interpreter fast: it pays per loop iteration, not per element.
    """
    with _launch.use_config(SMALL) as config:
        yield config
