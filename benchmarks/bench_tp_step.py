"""Tensor-parallel training step (TP over every rank): our norms against torch's under one plan.

A Llama-style decoder stack, torchtitan's layout and plan: per layer an RMSNorm, causal
attention (SDPA; 16 heads of 128) and a SwiGLU feed-forward (intermediate 5632, Llama's
8/3 rule), the residual added between them, a final RMSNorm; bf16 weights, AdamW. No
embedding or output head: the step's input is a random batch of hidden states and its loss
the mean square of the output, so that the step is the decoder the plan shards. The plan
(one mesh over every rank): ``SequenceParallel`` on the norms (the sequence dim sharded),
attention sharded by heads (``ColwiseParallel`` wq/wk/wv, ``RowwiseParallel`` wo back to
sequence shards), the feed-forward likewise. Implementations, each built from one
state_dict:

- ``torch``: ``nn.RMSNorm``, the residual added by ``h = x + a`` before the norm, torch's
  ``SequenceParallel`` on every norm;
- ``triton_layers``: ``TritonRMSNorm``, the second norm of each layer fusing the residual
  add (``y, h = norm(a, residual=x)``) under ``triton_layers.parallel.SequenceParallel``,
  our kernels running on each rank's sequence shard (eager and under torch.compile).

Modes ``eager`` and ``compile`` (the whole stack under ``torch.compile``). The loop is
``benchmarks/train_loop.py``'s ``build`` and ``time_round``: every variant built and warmed
up, then ROUNDS interleaved rounds of STEPS steps of each. Per variant, from rank 0: the
median step time over the rounds with its min-max, tokens/s, peak memory; ``norm_us``: the
GPU time per step of the norm kernels in a profile of PROFILED_STEPS steps (kernels whose
name says norm, ``rsqrt`` or ``GammaBeta``: torch's and ours eagerly; compiled, Inductor's
kernels that fuse torch's norm with its neighbours are counted whole, so that column is an
upper bound there); and, eagerly, the collectives of one step (forward and backward) as
``CommDebugMode`` counts them and the bytes they move (``comm_bytes``: every rank's input
tensors to the collectives). The same plan should move the same bytes whichever norm it
holds: our ops run on the local shards and add no collective.

Rows go to ``tp_step.csv`` and the top kernels of each variant's profile to
``tp_kernels.txt``, in the results folder of rank 0.

``--per-call`` times one norm call instead, forward and backward, on the step's shapes
(the sequence shard of a ``batch x seq_len x hidden`` activation, bf16 on GPUs): torch's
``nn.RMSNorm`` under torch's ``SequenceParallel`` against ``TritonRMSNorm`` under the same
style (``rmsnorm``), and the residual add then ``nn.RMSNorm`` against our fused
``norm(a, residual=x)`` under ``triton_layers.parallel.SequenceParallel``
(``add_rmsnorm``), and the FP8 per-token RMSNorm on the same shards, its reference (torch's
ops on the DTensors) against the kernels on each rank's rows (``rmsnorm_fp8_per_token``,
its gradient through the activation). Inputs and output gradients are DTensors sharded on
the sequence, as the plan hands them over; the gradients of the inputs and the weight are taken with
``torch.autograd.grad``. At these sizes the GPU finishes each call's kernels long before
the host issues the next, so the time per call is the host's: ``benchmarks.bench_host``'s
loop (calls, then one sync; the impls interleaved over rounds: median and min-max). Rows go
to ``tp_call.csv``, a cProfile of our calls to ``tp_call_profile.txt``.

Run (2 GPUs; about 3 minutes on 2 H100s, most of it compiling)::

    torchrun --standalone --nproc_per_node=2 -m benchmarks.bench_tp_step --out DIR
    torchrun --standalone --nproc_per_node=2 -m benchmarks.bench_tp_step --quick   # CPU, gloo, tiny
    torchrun --standalone --nproc_per_node=2 -m benchmarks.bench_tp_step --per-call --out DIR

``--quick`` is a tiny config that runs on CPU ranks over gloo (the kernels through the
Triton interpreter when ``TRITON_INTERPRET=1``): what the tests dry-run.
"""
from __future__ import annotations

import argparse
import collections
import copy
import dataclasses
import os
import sys
from typing import Callable, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as nnF
from torch import nn

from benchmarks import bench_host, harness, report, train_loop

OP = "tp_step"
IMPLS = ("torch", "triton_layers")
NORM_KERNEL_WORDS = ("norm", "rsqrt", "gammabeta")  # kernel names (lower case) counted as the norms'


@dataclasses.dataclass(frozen=True)
class Size:
    """The stack's sizes, a batch, and how many steps a round times."""

    hidden: int
    layers: int
    heads: int
    intermediate: int
    batch: int
    seq_len: int
    steps_per_round: int
    rounds: int
    profiled_steps: int


CONFIGS = {
    "llama-2048x8": Size(2048, 8, 16, 5632, batch=2, seq_len=4096, steps_per_round=4, rounds=7, profiled_steps=2),
    "tiny": Size(32, 2, 4, 64, batch=2, seq_len=8, steps_per_round=1, rounds=2, profiled_steps=1),  # --quick
}


class Attention(nn.Module):
    """Causal multi-head attention on this rank's heads (the projections' local outputs)."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.head_dim = dim // heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (w(x).view(b, s, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = nnF.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1, self.w3 = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(nnF.silu(self.w1(x)) * self.w3(x))


class Layer(nn.Module):
    """Pre-norm decoder layer; ``fused``: the second norm adds the residual itself."""

    def __init__(self, size: Size, norm: type, fused: bool):
        super().__init__()
        self.fused = fused
        self.attention_norm, self.ffn_norm = norm(size.hidden), norm(size.hidden)
        self.attention = Attention(size.hidden, size.heads)
        self.feed_forward = FeedForward(size.hidden, size.intermediate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.attention(self.attention_norm(x))
        if self.fused:
            y, h = self.ffn_norm(a, residual=x)
        else:
            h = x + a
            y = self.ffn_norm(h)
        return h + self.feed_forward(y)


class Stack(nn.Module):
    def __init__(self, size: Size, impl: str):
        super().__init__()
        import triton_layers

        ours = impl == "triton_layers"
        norm = triton_layers.TritonRMSNorm if ours else nn.RMSNorm
        self.layers = nn.ModuleList(Layer(size, norm, fused=ours) for _ in range(size.layers))
        self.norm = norm(size.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


def plan(model: Stack, impl: str) -> dict:
    """torchtitan's plan for the stack: sequence-parallel norms, attention and feed-forward
    sharded by heads / hidden units, their outputs reduce-scattered back to sequence shards."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel)

    from triton_layers.parallel import SequenceParallel as ResidualSequenceParallel

    def gather():  # the input a DTensor (as torchtitan): the three projections' gradients sum before one reduce-scatter
        return PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))

    styles = {"norm": SequenceParallel()}
    for i in range(len(model.layers)):
        p = f"layers.{i}."
        styles.update({
            p + "attention_norm": SequenceParallel(),
            p + "attention": gather(),
            **{p + f"attention.{w}": ColwiseParallel() for w in ("wq", "wk", "wv")},
            p + "attention.wo": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
            p + "ffn_norm": ResidualSequenceParallel() if impl == "triton_layers" else SequenceParallel(),
            p + "feed_forward": gather(),
            p + "feed_forward.w1": ColwiseParallel(), p + "feed_forward.w3": ColwiseParallel(),
            p + "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
        })
    return styles


def setup(size: Size, label: str, mesh, device: torch.device) -> train_loop.Setup:
    """One state_dict (random norm weights: not all ones), every impl built from it."""
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.parallel import parallelize_module

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    base = Stack(size, "torch")
    with torch.no_grad():
        for name, p in base.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
    state = base.state_dict()
    rank, world = dist.get_rank(), dist.get_world_size()
    local_seq = size.seq_len // world
    torch.manual_seed(1)  # the same batch everywhere; each rank takes its shard of the sequence
    batch = torch.randn(size.batch, size.seq_len, size.hidden)[:, rank * local_seq:(rank + 1) * local_seq]
    batch = batch.contiguous().to(device, dtype)

    def model(impl: str) -> nn.Module:
        m = Stack(size, impl)
        m.load_state_dict(copy.deepcopy(state), strict=True)
        return parallelize_module(m.to(device, dtype), mesh, plan(m, impl))

    def loss(forward) -> torch.Tensor:
        out = forward(DTensor.from_local(batch, mesh, [Shard(1)], run_check=False))
        return out.to_local().float().square().mean()  # this rank's share of the loss

    return train_loop.Setup(label, size.batch, size.seq_len, size.steps_per_round, model, loss)


def comm_volume(variant: train_loop.Variant) -> tuple[dict, int]:
    """The collectives of one eager step, as CommDebugMode counts them, and the bytes of their
    input tensors on this rank."""
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.utils._python_dispatch import TorchDispatchMode

    nbytes = [0]

    class Bytes(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            # (the collectives alone: a wait moves nothing, and where it runs, in a subclass's
            # dispatch or at our launch boundary, is no difference in traffic)
            if "c10d" in func.namespace and func._opname != "wait_tensor":
                for a in args:
                    for t in (a if isinstance(a, (list, tuple)) else [a]):
                        if isinstance(t, torch.Tensor):
                            nbytes[0] += t.numel() * t.element_size()
            return func(*args, **(kwargs or {}))

    with CommDebugMode() as comm, Bytes():
        variant.step()
    counts = {str(op).split(".")[-1]: n for op, n in comm.get_comm_counts().items()}
    return counts, nbytes[0]


def norm_time(variant: train_loop.Variant, steps: int) -> tuple[float, list]:
    """GPU microseconds per step of the norm kernels, and the profile's top kernels."""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            variant.step()
        torch.cuda.synchronize()
    kernels = collections.Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels[e.name] += e.time_range.elapsed_us() / steps
    norm_us = sum(us for name, us in kernels.items() if any(w in name.lower() for w in NORM_KERNEL_WORDS))
    return norm_us, kernels.most_common(25)


@dataclasses.dataclass
class Row:
    config: str
    mode: str
    impl: str
    world: int
    batch: int
    seq_len: int
    rounds: int
    steps_per_round: int
    step_ms: float
    step_ms_min: float
    step_ms_max: float
    tokens_per_s: float
    peak_mib: float
    norm_us: float
    comm_counts: str
    comm_bytes: float
    loss: float
    # torch's step over ours within each round (train_loop.paired_ratios): median, min, max
    paired_ratio: float = float("nan")
    paired_ratio_min: float = float("nan")
    paired_ratio_max: float = float("nan")


def measure(size: Size, label: str, modes: list[str], mesh, device: torch.device) -> tuple[list[Row], list[str]]:
    """Each (mode, impl) built, timed over ``size.rounds`` interleaved rounds (ABBA), profiled:
    one Row each, ours with torch's step over ours paired within each round; and the lines of
    each one's top kernels."""
    cuda = device.type == "cuda"
    built = train_loop.build_all(setup(size, label, mesh, device), [(m, i) for m in modes for i in IMPLS], device,
                                 label, say)
    train_loop.time_interleaved(built, size.rounds, size.steps_per_round, cuda, label, say)
    rows, lines = [], []
    for v in built:
        norm_us, comms, nbytes, top = float("nan"), "", float("nan"), []
        if v.step is not None and cuda:
            norm_us, top = norm_time(v, size.profiled_steps)
        if v.step is not None and v.mode == "eager":
            counts, nbytes = comm_volume(v)
            comms = " ".join(f"{k}={n}" for k, n in sorted(counts.items()))
        ms, low, high = v.step_ms()
        theirs = next((t for t in built if t.mode == v.mode and t.impl == "torch"), None)
        paired = train_loop.paired_ratios(theirs, v) if v.impl != "torch" and theirs is not None \
            else (train_loop.NAN,) * 3
        rows.append(Row(label, v.mode, v.impl, dist.get_world_size(), size.batch, size.seq_len, size.rounds,
                        size.steps_per_round, ms, low, high, size.batch * size.seq_len / (ms / 1e3), v.peak_mib,
                        norm_us, comms, nbytes, v.loss, *paired))
        lines += [f"## {label} {v.mode} {v.impl}: top kernels, us per step"]
        lines += [f"{us:10.1f}  {name[:160]}" for name, us in top] + [""]
    return rows, lines


def say(text: str) -> None:
    """Progress on stderr, from rank 0 alone."""
    if dist.get_rank() == 0:
        print(f"    {text}", file=sys.stderr, flush=True)


def table(rows: list[Row]) -> list[str]:
    """Markdown: per mode, each impl's step time and tokens/s, ours over torch (min-max rule)."""
    out = ["| mode | impl | step ms (min-max) | tokens/s | torch / ours | norms' GPU us/step | peak MiB | "
           "collectives (one eager step) | bytes moved | first loss |", "|---|---|---|---|---|---|---|---|---|---|"]
    by = {(r.mode, r.impl): r for r in rows}
    for r in rows:
        ratio = ""
        theirs = by.get((r.mode, "torch"))
        if r.impl != "torch" and theirs is not None:
            ratio = report.ratio_text(*report.step_ratio(dataclasses.asdict(theirs), dataclasses.asdict(r)))
        out.append(f"| {r.mode} | {r.impl} | {r.step_ms:.2f} ({r.step_ms_min:.2f}-{r.step_ms_max:.2f}) | "
                   f"{r.tokens_per_s:,.0f} | {ratio} | {r.norm_us:.0f} | {r.peak_mib:.0f} | {r.comm_counts} | "
                   f"{r.comm_bytes / 2**20:.1f} MiB | {r.loss:.5g} |")
    return out


def call_steps(size: Size, mesh, device: torch.device) -> dict[str, dict[str, Callable[[], object]]]:
    """Per case (``rmsnorm``, ``add_rmsnorm``, ``rmsnorm_fp8_per_token``), per impl: one norm
    call's forward and backward on DTensor inputs sharded on the sequence, as the step's plan
    makes them (see the module's docstring, ``--per-call``; the FP8 case's "torch" is our
    reference, torch's ops on the DTensors, where no torch module writes FP8)."""
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.parallel import SequenceParallel as TorchSequenceParallel, parallelize_module

    import triton_layers
    from triton_layers.parallel import SequenceParallel as ResidualSequenceParallel

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    local = (size.batch, size.seq_len // dist.get_world_size(), size.hidden)
    torch.manual_seed(2)

    def sharded() -> "DTensor":
        t = torch.randn(local, device=device, dtype=dtype)
        return DTensor.from_local(t, mesh, [Shard(1)], run_check=False).requires_grad_()

    x, a, dy, dh = sharded(), sharded(), sharded().detach(), sharded().detach()

    def norm(impl: str, style) -> nn.Module:
        m = triton_layers.TritonRMSNorm(size.hidden) if impl == "triton_layers" else nn.RMSNorm(size.hidden)
        with torch.no_grad():
            m.weight.copy_(1 + 0.1 * torch.randn(size.hidden))
        return parallelize_module(m.to(device, dtype), mesh, style)

    def plain(m: nn.Module) -> Callable[[], object]:
        return lambda: torch.autograd.grad(m(x), (x, m.weight), dy)

    def torch_add(m: nn.Module) -> Callable[[], object]:
        def step():
            h = x + a
            return torch.autograd.grad((m(h), h), (x, a, m.weight), (dy, dh))
        return step

    def fused(m: nn.Module) -> Callable[[], object]:
        return lambda: torch.autograd.grad(m(a, residual=x), (x, a, m.weight), (dy, dh))

    def fp8(use_triton: bool) -> Callable[[], object]:
        # (the FP8 per-token norm on the same shards: the kernels on each rank's rows, or the
        # reference in torch's ops on the DTensors)
        from torch.distributed.tensor import Replicate

        from triton_layers import FP8Recipe, functional as F

        weight = DTensor.from_local((1 + 0.1 * torch.randn(size.hidden, device=device)).to(dtype), mesh,
                                    [Replicate()], run_check=False).requires_grad_()
        recipe = FP8Recipe("per_token")
        return lambda: torch.autograd.grad(
            F.rms_norm_fp8(x, weight, recipe=recipe, use_triton=use_triton).activation, (x, weight), dy)

    return {
        "rmsnorm": {"torch": plain(norm("torch", TorchSequenceParallel())),
                    "triton_layers": plain(norm("triton_layers", TorchSequenceParallel()))},
        "add_rmsnorm": {"torch": torch_add(norm("torch", TorchSequenceParallel())),
                        "triton_layers": fused(norm("triton_layers", ResidualSequenceParallel()))},
        "rmsnorm_fp8_per_token": {"torch": fp8(False), "triton_layers": fp8(None)},
    }


def measure_calls(size: Size, label: str, device: torch.device, mesh, out: Optional[str]) -> list[dict]:
    """Host time per norm call (forward + backward) of each case and impl, interleaved; a
    cProfile of ours into ``out`` (rank 0). The tiny config (``--quick``) a few calls only."""
    import cProfile
    import io
    import pstats
    import statistics


    rows, profiles = [], io.StringIO()
    rounds, calls, warmup = (2, 3, 2) if label == "tiny" else (bench_host.ROUNDS, bench_host.CALLS, bench_host.WARMUP)
    for case, steps in call_steps(size, mesh, device).items():
        times = bench_host.interleaved(steps, rounds, calls, warmup)
        for impl, t in times.items():
            rows.append(dict(config=label, case=case, impl=impl, world=dist.get_world_size(), rounds=len(t),
                             calls=calls, host_us=round(statistics.median(t), 1),
                             host_us_min=round(min(t), 1), host_us_max=round(max(t), 1)))
        prof = cProfile.Profile()
        prof.enable()
        bench_host.host_us(steps["triton_layers"], 200 if calls == bench_host.CALLS else calls)
        prof.disable()
        profiles.write(f"\n===== {case}, triton_layers: forward and backward calls =====\n")
        pstats.Stats(prof, stream=profiles).sort_stats("tottime").print_stats(30)
    if out is not None and dist.get_rank() == 0:
        with open(os.path.join(out, "tp_call_profile.txt"), "w") as f:
            f.write(profiles.getvalue())
    return rows


def call_table(rows: list[dict]) -> list[str]:
    """Markdown: per case, each impl's host us per call, ours over torch's (rounds' min-max)."""
    out = ["| case | impl | host us per call, fwd+bwd (min-max) | ours / torch |", "|---|---|---|---|"]
    by = {(r["case"], r["impl"]): r for r in rows}
    for r in rows:
        theirs = by[(r["case"], "torch")]
        ratio = "" if r["impl"] == "torch" else (
            f"{r['host_us'] / theirs['host_us']:.2f}x ({r['host_us_min'] / theirs['host_us_max']:.2f}-"
            f"{r['host_us_max'] / theirs['host_us_min']:.2f})")
        out.append(f"| {r['case']} | {r['impl']} | {r['host_us']:.0f} ({r['host_us_min']:.0f}-{r['host_us_max']:.0f}) "
                   f"| {ratio} |")
    return out


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="bench-results", help="results folder (rank 0 writes)")
    parser.add_argument("--quick", action="store_true", help="a tiny config (CPU ranks over gloo too)")
    parser.add_argument("--no-compile", action="store_true", help="eager only")
    parser.add_argument("--per-call", action="store_true", help="one norm call's host time instead of the step")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds of the step (default: the config's)")
    opts = parser.parse_args(argv)
    from torch.distributed.device_mesh import init_device_mesh

    cuda = torch.cuda.is_available() and not opts.quick
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    label = "tiny" if opts.quick else "llama-2048x8"
    size = CONFIGS[label] if opts.rounds is None else dataclasses.replace(CONFIGS[label], rounds=opts.rounds)
    modes = ["eager"] if opts.no_compile or not cuda else ["eager", "compile"]
    mesh = init_device_mesh(device.type, (world,))
    folder = opts.out if opts.quick else os.path.join(opts.out, report.gpu_folder(harness.device_name()))
    if rank == 0:
        os.makedirs(folder, exist_ok=True)
    try:
        if opts.per_call:
            rows = measure_calls(size, label, device, mesh, folder)
            if rank == 0:
                bench_host.write_csv(os.path.join(folder, "tp_call.csv"), rows)
                print(f"TP={world} norm call, {label} shard of {size.batch} x {size.seq_len} x {size.hidden}, "
                      f"{harness.device_name() if cuda else 'CPU'}:")
                print("\n".join(call_table(rows)))
            return
        rows, lines = measure(size, label, modes, mesh, device)
        if rank == 0:
            import csv

            with open(os.path.join(folder, "tp_step.csv"), "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=[x.name for x in dataclasses.fields(Row)])
                w.writeheader()
                w.writerows(dataclasses.asdict(r) for r in rows)
            with open(os.path.join(folder, "tp_kernels.txt"), "w") as f:
                f.write("\n".join(lines))
            print(f"TP={world} step, {label} (hidden {size.hidden}, {size.layers} layers, batch {size.batch} x "
                  f"{size.seq_len} tokens), {harness.device_name() if cuda else 'CPU'}:")
            print("\n".join(table(rows)))
    finally:
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # gloo can abort a process in the interpreter's teardown (examples/distributed_check.py)


if __name__ == "__main__":
    main()
