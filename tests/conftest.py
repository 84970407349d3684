"""Test setup: without a GPU, run the kernels through the Triton interpreter.

TRITON_INTERPRET must be set before triton_layers (and its @triton.jit kernels) is
imported, so it is set here, at collection time, when no CUDA device is present; the
interpreter then runs without its re-patching per helper call (``tests/fast_interpreter.py``:
the same semantics, a quarter of the suite's time less).

Conventions of every test file: ``F`` is ours (``from triton_layers import functional as
F``), ``TF`` is torch's (``import torch.nn.functional as TF``); dtypes come from
``DTYPES`` / ``LOW_DTYPES`` here; results are checked by ``tests/oracle.py``; the
``looped`` fixture (or ``looped_config``) sends short rows down the long-row paths. A test
that asks for tens of GiB of GPU memory (the ``gpu_memory`` fixture) is marked ``alone``:
``.ci/gpu`` runs those after the parallel suite, one at a time.
"""
import contextlib
import dataclasses
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ.get("TRITON_INTERPRET") == "1":
    from tests import fast_interpreter  # noqa: E402

    fast_interpreter.install()  # (the interpreter without its re-patching per helper call)

import pytest  # noqa: E402

import triton_layers  # noqa: E402,F401
from triton_layers import launch_config  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
LOW_DTYPES = DTYPES[1:]  # fp16, bf16: torch's own error in them is the bar (tests/oracle.py)

# GPUs to plan for on any machine (launch_config.plan_as; the heuristics' gpu argument): the
# names torch.cuda.get_device_name gives, their SMs and the shared memory a program may use.
H100 = launch_config.GPU("NVIDIA H100 80GB HBM3", sm_count=132, shared_memory=232448, capability=(9, 0))
H200 = launch_config.GPU("NVIDIA H200", sm_count=132, shared_memory=232448, capability=(9, 0))


@pytest.fixture
def device() -> str:
    """Where the kernels run: the GPU if there is one, else the CPU through the interpreter."""
    return DEVICE


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# Launch configs that send short rows down the chunked (long-row) paths: the `looped`
# fixture's choices, by name. Small numbers keep the interpreter fast: it pays per loop
# iteration, not per element, so tests of longer rows take a preset with wider chunks.
SMALL = launch_config.shrunk(64, 32, softmax_tile_elements=128)
LOOPED = {
    "fused": launch_config.DEFAULT,  # the real limits: short rows stay in registers
    # Rows over 16 columns in 8-wide chunks; 512-byte weighted-sum tiles (column loops,
    # split columns, several partial rows): the library's own preset.
    "tiny": launch_config.TINY,
    "small": SMALL,  # rows over 64 columns in 32-wide chunks; smaller softmax row tiles
    "medium": launch_config.shrunk(256, 128),  # rows over 256 columns in 128-wide chunks
}


def looped_config(name: str):
    """``with looped_config("small"):`` launches with ``LOOPED["small"]`` inside the block."""
    return launch_config.use_config(LOOPED[name])


@pytest.fixture
def looped(request):
    """Launch with a ``LOOPED`` preset for the test; yields the config.

    "small" unless the test picks one: ``@pytest.mark.parametrize("looped", ["fused",
    "medium"], indirect=True)`` runs it on the real limits and on "medium".
    """
    with looped_config(getattr(request, "param", "small")) as config:
        yield config


# The NaN/Inf tests' rows (tests/nonfinite.py): in registers, or chunked under the "small" limits.
FUSED_N, LOOPED_N = 37, 100


@pytest.fixture(params=["fused", "looped"])
def n_cols(request) -> int:
    """Row length for the in-register path, or for the chunked path with shrunk limits."""
    looped = request.param == "looped"
    with looped_config("small" if looped else "fused"):
        yield LOOPED_N if looped else FUSED_N


def spy_main_inputs(monkeypatch, op) -> list:
    """The main (first) tensor each call of the kernel op ``op`` receives, planned or not, in
    call order: ``seen = spy_main_inputs(monkeypatch, kernel_ops.softmax)``."""
    from triton_layers.calls import doors as _doors

    seen = []
    call_planned, plain = _doors.Op.call_planned, _doors.Op.__call__
    monkeypatch.setattr(_doors.Op, "call_planned", lambda self, plan, x, *args: (
        self is op and seen.append(x), call_planned(self, plan, x, *args))[1])
    monkeypatch.setattr(_doors.Op, "__call__", lambda self, x, *args: (
        self is op and seen.append(x), plain(self, x, *args))[1])
    return seen


# The row limits of the past-2**31 tests' CPU miniature (tests/big_tensors.py): the same kernel
# paths at rows 512x shorter.
MINI_LIMITS = dataclasses.replace(launch_config.shrunk(16, 16), softmax=launch_config.shrunk(64, 16, 128).softmax)


@pytest.fixture
def gpu_memory():
    """``need(gib)`` skips unless the GPU has that much free (a no-op for the CPU
    miniature, which also shrinks the row limits); frees everything afterwards."""
    def need(gib: float) -> None:
        if DEVICE != "cuda":
            return
        torch.cuda.empty_cache()
        free = torch.cuda.mem_get_info()[0] / 2**30
        if free < gib:
            pytest.skip(f"needs {gib:.0f} GiB of free GPU memory, {free:.0f} GiB free")

    with contextlib.nullcontext() if DEVICE == "cuda" else launch_config.use_config(MINI_LIMITS):
        yield need
    if DEVICE == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


@pytest.hookimpl(tryfirst=True)  # (before -m selects by the marks)
def pytest_collection_modifyitems(items):
    """Every test that takes ``gpu_memory`` is marked ``alone`` (beside other workers it would
    skip itself, or run out of memory)."""
    for item in items:
        if "gpu_memory" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.alone)
