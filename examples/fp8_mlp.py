"""FP8 out of our RMSNorm, trained through: a Llama MLP block whose gate and up projections
are FP8 GEMMs fed by ``rms_norm_fp8``, against the same block in bf16.

Run:  python examples/fp8_mlp.py --out fp8_mlp.json   (an FP8 GPU: H100, H200, Ada; 300 steps, ~1 s each run)
      python examples/fp8_mlp.py --device cpu --hidden 128 --steps 40 --tokens 256 --lr 3e-3 --latent 16
                                                     (CPU, a few seconds: the FP8 GEMM emulated, below)

The block (pre-norm, no biases, as Llama's)::

    n   = RMSNorm(x)
    out = x + down(silu(gate(n)) * up(n))

- bf16 baseline: ``TritonRMSNorm`` and bf16 ``nn.Linear`` gate, up and down.
- FP8: ``triton_layers.functional.rms_norm_fp8(x, norm.weight, norm.eps)`` with the default
  recipe (dynamic per-token e4m3: ``data`` FP8 and one fp32 dequantization scale per row)
  feeds gate and up through :class:`FP8Linear`, which quantizes the bf16 weight per output
  row (``scale = amax / 448``, the norm's saturating convention) and multiplies with
  ``torch._scaled_mm``'s rowwise scaling. Both read the one ``activation`` the norm returns
  (:class:`triton_layers.FP8Activation`); their bf16 input gradients add up in it and go
  straight through the quantization into the norm's backward (to x and the norm weight).
  ``down`` stays a bf16 ``nn.Linear``.

Both models start from the same weights (copied) and see the same batches, in the same
order, of a synthetic regression (:class:`Task`): inputs ``x`` of shape ``(tokens, hidden)``,
every entry N(0, 1) but varying in ``--latent`` directions only; the targets ``x + teacher(x)``
of a fixed random Llama MLP (fp32, its output scaled to unit RMS), plus Gaussian noise of
standard deviation ``--noise``, so that the loss has a floor ``noise**2`` as a language
model's has its entropy. The loss is the mean squared error; AdamW trains both.

The check (``verdict`` in the result, and the exit status of the script):

1. both losses decrease: the mean of the last ``--window`` steps is below 3/4 of the mean of
   the first ``--window`` steps (the window at most a quarter of the steps);
2. the FP8 final loss (mean of the last ``--window`` steps) is within ``--rtol`` (5%) of
   the bf16 final loss, relative to the bf16 one;
3. at the first step, on one batch, the FP8 block's gradients of every parameter and of x
   point where the bf16 block's do (cosine similarity >= 0.99): the straight-through
   gradient reaches x and the norm weight, and ``FP8Linear``'s backward is the bf16 one;
4. where ``torch._scaled_mm`` runs, it agrees with the emulation below on one batch
   (relative difference <= 1e-2): the scales and layouts it is handed are the right ones.

Why 5%: e4m3 keeps 3 mantissa bits, so rounding an activation or a weight to it is off by up
to 2**-4 (6.25%) of the value, about 2-3% RMS. A dot product of such values has errors that
are independent from term to term, so the GEMM output carries noise of a few percent of its
own size (both operands quantized), and so does the MLP output: in a squared error, a floor
of a few 1e-3 of the target's variance (measured: about 3e-3, on an H200 with ``--noise 0
--latent 16``, where bf16 gets down to 0.0040 and FP8 stays at 0.0068; this check is not
meant for losses that low). Next to the default run's final loss of about 0.18 (the floor
``noise**2 = 0.09`` plus what 300 steps leave unlearned) that floor moves the loss by about
1%, and the two runs' trajectories, which part at the first rounding, add a little more
(measured on an H200: 0.4%; 0.3 to 1.4% over the variants tried). Published FP8 recipes
(rowwise-scaled GEMMs in Llama pretraining, DeepSeek-V3's 1x128 blocks) stay well within 1%
of bf16's loss in language modelling; 5% leaves room for this small, short regression,
while an error of the plumbing -- a scale inverted, a transposed weight, a gradient lost on
the way to the weights or the norm -- costs tens of percent, stops the loss from
decreasing, or turns a gradient away, and fails one of the checks.

Emulation: where ``torch._scaled_mm`` cannot run (the CPU, a GPU below compute capability
8.9) the FP8 GEMM is computed as ``(qdata * scale) @ (w8 * w_scale).T`` in fp32 and rounded
to the output dtype once: the same FP8 values and scales as ``_scaled_mm`` reads (its fp32
accumulation, not its order of summation), and the same straight-through gradient. Note that
``rms_norm_fp8`` itself refuses CUDA tensors on a GPU below 8.9, so there the example runs
only with ``--device cpu``. On the CPU, triton_layers runs its kernels through the Triton
interpreter when TRITON_INTERPRET=1 is set before it is imported, else its torch reference.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Optional, Sequence

import torch
import torch.nn.functional as TF
from torch import Tensor, nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import triton_layers  # noqa: E402
from triton_layers import FP8Activation, TritonRMSNorm, uses_kernels  # noqa: E402
from triton_layers import functional as F  # noqa: E402

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448
AMAX_FLOOR = triton_layers.fp8.AMAX_FLOOR  # an all-zero row gets a tiny scale and zeros, not NaN
GEMM_RTOL = 1e-2  # torch._scaled_mm vs its fp32 emulation: bf16 output rounding (2**-9) and summation order
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


# --------------------------------------------------------------------------- the FP8 GEMM


def quantize_rows(w: Tensor) -> tuple[Tensor, Tensor]:
    """Per-row FP8 of a weight ``(out_features, in_features)``: ``(w8, scale)`` with ``w8``
    e4m3 and ``scale`` fp32 ``(out_features, 1)``, ``w ~= w8 * scale``.

    The norm's convention (``triton_layers/fp8.py``): ``scale = max(amax, AMAX_FLOOR) / 448``
    of the row, the reciprocal rounded once in fp32, ``w * (1 / scale)`` in fp32, clamped to
    ``[-448, 448]`` and cast round to nearest even."""
    w32 = w.detach().float()
    scale = w32.abs().amax(dim=1, keepdim=True).clamp_min(AMAX_FLOOR) / FP8_MAX
    w8 = (w32 * scale.reciprocal()).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return w8, scale


def scaled_mm_supported(device: torch.device) -> bool:
    """Whether ``torch._scaled_mm`` (rowwise e4m3) runs on ``device``: a CUDA GPU of compute
    capability 8.9 or newer (Ada, Hopper, Blackwell)."""
    device = torch.device(device)
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def fp8_gemm(a8: Tensor, a_scale: Tensor, w8: Tensor, w_scale: Tensor, out_dtype: torch.dtype,
             emulate: bool) -> Tensor:
    """``(a8 * a_scale) @ (w8 * w_scale).T``: ``a8`` (M, K) and ``w8`` (N, K) e4m3, row-major;
    ``a_scale`` (M, 1) and ``w_scale`` (N, 1) fp32. Returns (M, N) in ``out_dtype``.

    ``torch._scaled_mm`` with rowwise scales wants: the first operand row-major, the second
    column-major (``w8.t()`` of the row-major ``w8``), K and N multiples of 16, fp32 scales
    of shapes (M, 1) and (1, N), both contiguous, and a bf16 output (rowwise scaling writes
    bf16 only). ``emulate``: the same product in fp32 torch ops (any device, any size)."""
    if emulate:
        a = a8.float() * a_scale
        w = w8.float() * w_scale
        return (a @ w.t()).to(out_dtype)
    out = torch._scaled_mm(a8, w8.t(), scale_a=a_scale.contiguous(), scale_b=w_scale.reshape(1, -1),
                           out_dtype=torch.bfloat16)
    return out.to(out_dtype)


class FP8Linear(torch.autograd.Function):
    """``y = activation @ weight.T`` with both operands in FP8: ``activation`` the
    :class:`~triton_layers.FP8Activation` of ``rms_norm_fp8`` (per-token e4m3, 2-D), ``weight``
    a high-precision ``(out_features, in_features)`` parameter quantized per output row here.

    Backward, in the activation's dtype (bf16; no FP8 there, as the rowwise recipes of
    torchao keep it): ``grad_input = grad_out @ weight`` for the activation (which the
    norm passes straight through the quantization) and ``grad_weight = grad_out.T @
    activation.dequantize()`` for the weight (the values the forward multiplied)."""

    @staticmethod
    def forward(ctx, activation: FP8Activation, weight: Tensor, emulate: bool) -> Tensor:
        if not isinstance(activation, FP8Activation) or activation.granularity != "per_token":
            raise TypeError("FP8Linear takes the per-token FP8Activation of rms_norm_fp8; got "
                            f"{type(activation).__name__}")
        if activation.dim() != 2:
            raise ValueError(f"FP8Linear takes 2-D activations (tokens, features); got {tuple(activation.shape)}")
        w8, w_scale = quantize_rows(weight)
        ctx.save_for_backward(activation, weight)  # (a detach of an FP8Activation stays FP8)
        return fp8_gemm(activation.qdata, activation.scale, w8, w_scale, activation.dtype, emulate)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        activation, weight = ctx.saved_tensors
        grad_out = grad_out.to(activation.dtype)
        grad_input = grad_weight = None
        if ctx.needs_input_grad[0]:
            grad_input = grad_out @ weight.to(activation.dtype)
        if ctx.needs_input_grad[1]:
            grad_weight = (grad_out.t() @ activation.dequantize()).to(weight.dtype)
        return grad_input, grad_weight, None


# --------------------------------------------------------------------------- the block


def llama_intermediate(hidden: int, multiple_of: int = 256) -> int:
    """Llama's feed-forward width: ``8/3 * hidden`` rounded up to a multiple of ``multiple_of``
    (2816 for 1024)."""
    return multiple_of * math.ceil(8 * hidden / 3 / multiple_of)


class LlamaMLPBlock(nn.Module):
    """``x + down(silu(gate(n)) * up(n))``, ``n = RMSNorm(x)``; gate and up in FP8 with ``fp8``.

    Same parameters (names, shapes) either way, so one state_dict loads into both."""

    def __init__(self, hidden: int, intermediate: int, *, fp8: bool = False, emulate: bool = False,
                 use_triton: Optional[bool] = None) -> None:
        super().__init__()
        self.norm = TritonRMSNorm(hidden, use_triton=use_triton)
        self.gate = nn.Linear(hidden, intermediate, bias=False)
        self.up = nn.Linear(hidden, intermediate, bias=False)
        self.down = nn.Linear(intermediate, hidden, bias=False)
        self.fp8, self.emulate = fp8, emulate

    def forward(self, x: Tensor) -> Tensor:
        """``x``: (tokens, hidden) in the parameters' dtype."""
        if self.fp8:
            rows = F.rms_norm_fp8(x, self.norm.weight, self.norm.eps, use_triton=self.norm.use_triton)
            if rows.activation is None:
                raise RuntimeError("rms_norm_fp8 returned no activation: no gradient will flow (no_grad?)")
            g = FP8Linear.apply(rows.activation, self.gate.weight, self.emulate)
            u = FP8Linear.apply(rows.activation, self.up.weight, self.emulate)
        else:
            n = self.norm(x)
            g, u = self.gate(n), self.up(n)
        return x + self.down(TF.silu(g) * u)


# --------------------------------------------------------------------------- data


class Task:
    """The synthetic regression: inputs of low rank, the targets of a fixed random Llama MLP.

    ``x = z @ P / sqrt(latent)``, ``z ~ N(0, 1)`` of shape ``(tokens, latent)`` and ``P`` a
    fixed ``(latent, hidden)`` N(0, 1) matrix: every entry of x is N(0, 1), but x varies in
    ``latent`` directions only (activations of a trained model, too, keep most of their
    variance in a few directions; with isotropic inputs a random teacher takes thousands of
    steps to learn). The target: ``x + teacher(x) + noise * N(0, 1)``, ``teacher`` a fixed
    random Llama MLP (weightless RMSNorm, SwiGLU) in fp32 whose output has unit RMS."""

    def __init__(self, hidden: int, intermediate: int, latent: int, noise: float, device: torch.device,
                 seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.hidden, self.latent, self.noise, self.device = hidden, latent, noise, device
        self.proj = torch.randn(latent, hidden, generator=gen).to(device) / math.sqrt(latent)
        self.gate = torch.randn(intermediate, hidden, generator=gen).to(device) / math.sqrt(hidden)
        self.up = torch.randn(intermediate, hidden, generator=gen).to(device) / math.sqrt(hidden)
        self.down = torch.randn(hidden, intermediate, generator=gen).to(device) / math.sqrt(intermediate)
        self.seed = seed
        self.gain = 1.0
        probe = torch.randn(4096, latent, generator=gen).to(device) @ self.proj
        self.gain = 1.0 / self.teacher(probe).square().mean().sqrt().item()

    def teacher(self, x: Tensor) -> Tensor:
        """The teacher MLP's output (without the residual) in fp32."""
        n = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6)
        return self.gain * (TF.silu(n @ self.gate.t()) * (n @ self.up.t())) @ self.down.t()

    def batch(self, step: int, tokens: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """Batch ``step``: ``(x, target)``, x ``(tokens, hidden)`` in ``dtype``, the target in
        fp32 (from x as rounded to ``dtype``). The same for every call with the same step: both
        runs see the same batches, made where they are used."""
        gen = torch.Generator(self.device).manual_seed(self.seed * 1_000_003 + step)
        x = (torch.randn(tokens, self.latent, generator=gen, device=self.device) @ self.proj).to(dtype)
        noise = torch.randn(tokens, self.hidden, generator=gen, device=self.device)
        return x, x.float() + self.teacher(x.float()) + self.noise * noise


# --------------------------------------------------------------------------- training


def loss_fn(model: nn.Module, x: Tensor, target: Tensor) -> Tensor:
    """Mean squared error, in fp32."""
    return (model(x).float() - target).square().mean()


def train(model: nn.Module, task: Task, steps: int, tokens: int, dtype: torch.dtype, lr: float) -> list[float]:
    """``steps`` AdamW steps on the task's batches 0, 1, ...; the loss of every step."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    for step in range(steps):
        x, target = task.batch(step, tokens, dtype)
        loss = loss_fn(model, x, target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return torch.stack(losses).tolist() if losses else []


def gradient_agreement(bf16: nn.Module, fp8: nn.Module, x: Tensor, target: Tensor) -> dict[str, float]:
    """Cosine similarity of the two models' gradients on one batch, by parameter, and of x's."""
    grads = []
    for model in (bf16, fp8):
        model.zero_grad(set_to_none=True)
        xg = x.detach().clone().requires_grad_(True)
        loss_fn(model, xg, target).backward()
        grads.append({**{name: p.grad for name, p in model.named_parameters()}, "x": xg.grad})
        model.zero_grad(set_to_none=True)
    cos = {}
    for name, g in grads[0].items():
        other = grads[1][name]
        if g is None or other is None:
            cos[name] = float("nan")  # a missing gradient: fails the check
            continue
        cos[name] = TF.cosine_similarity(g.float().flatten(), other.float().flatten(), dim=0).item()
    return cos


@torch.no_grad()
def gemm_vs_emulation(model: LlamaMLPBlock, x: Tensor) -> float:
    """``torch._scaled_mm``'s FP8 GEMM against its fp32 emulation, on the gate projection of
    the norm's FP8 output for ``x``: the relative (Frobenius) difference. Both read the same
    FP8 values and scales, so they differ by the bf16 rounding of the output and the order of
    summation (~1e-3); a scale read on the wrong axis or an operand in the wrong layout
    costs O(1)."""
    rows = F.rms_norm_fp8(x, model.norm.weight, model.norm.eps, use_triton=model.norm.use_triton)
    w8, w_scale = quantize_rows(model.gate.weight)
    real = fp8_gemm(rows.data, rows.scale, w8, w_scale, torch.bfloat16, emulate=False).float()
    emulated = fp8_gemm(rows.data, rows.scale, w8, w_scale, torch.float32, emulate=True)
    return ((real - emulated).norm() / emulated.norm()).item()


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def verdict(bf16_losses: list[float], fp8_losses: list[float], cos: dict[str, float], window: int,
            rtol: float, min_cos: float, gemm_diff: Optional[float] = None) -> dict:
    """The checks of the module docstring, each with its numbers, and ``passed``
    (``gemm_diff``: :func:`gemm_vs_emulation`'s, None where the GEMM is emulated)."""
    w = max(1, min(window, len(bf16_losses) // 4))
    out: dict = {"window": w, "rtol": rtol, "min_cos": min_cos}
    for name, losses in (("bf16", bf16_losses), ("fp8", fp8_losses)):
        first, last = _mean(losses[:w]), _mean(losses[-w:])
        out[name] = {"first": first, "final": last, "decreasing": bool(last < 0.75 * first)}
    b, f = out["bf16"]["final"], out["fp8"]["final"]
    out["rel_diff"] = abs(f - b) / b
    out["close"] = bool(out["rel_diff"] <= rtol)
    out["grad_cos"] = cos
    out["grads_agree"] = bool(all(c >= min_cos for c in cos.values()))  # (nan fails)
    out["gemm_vs_emulation"] = gemm_diff
    out["gemm_ok"] = bool(gemm_diff is None or gemm_diff <= GEMM_RTOL)
    finite = all(math.isfinite(v) for v in (*bf16_losses, *fp8_losses))
    out["passed"] = bool(finite and out["bf16"]["decreasing"] and out["fp8"]["decreasing"] and out["close"]
                         and out["grads_agree"] and out["gemm_ok"])
    return out


# --------------------------------------------------------------------------- command line


def _parse(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=300, help="training steps of each run")
    parser.add_argument("--hidden", type=int, default=1024, help="model width")
    parser.add_argument("--intermediate", type=int, default=None,
                        help="feed-forward width (default: Llama's, 8/3 * hidden up to a multiple of 256)")
    parser.add_argument("--tokens", type=int, default=4096, help="rows per batch (batch * seq)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16",
                        help="parameters and activations of both runs (the baseline keeps the name bf16); "
                             "the FP8 GEMM writes bf16 on the GPU")
    parser.add_argument("--use-triton", choices=["auto", "true", "false"], default="auto",
                        help="the norms' kernels (auto: on the GPU, and on the CPU under TRITON_INTERPRET=1) "
                             "or their torch reference (false)")
    parser.add_argument("--emulate", choices=["auto", "true", "false"], default="auto",
                        help="the FP8 GEMM in fp32 torch ops; auto: where torch._scaled_mm cannot run")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--latent", type=int, default=32, help="directions the inputs vary in")
    parser.add_argument("--noise", type=float, default=0.3, help="target noise std (the loss floor is its square)")
    parser.add_argument("--window", type=int, default=20, help="steps averaged for the first and final loss")
    parser.add_argument("--rtol", type=float, default=0.05, help="bound on |fp8 - bf16| / bf16 of the final loss")
    parser.add_argument("--min-cos", type=float, default=0.99, help="bound on the first step's gradient cosines")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="write the curves and the verdict to this json file")
    parser.add_argument("--quiet", action="store_true", help="print only the verdict")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> dict:
    """Train the bf16 and the FP8 block; print and return the curves and the verdict."""
    args = _parse(argv)
    device = torch.device(args.device)
    dtype = DTYPES[args.dtype]
    intermediate = args.intermediate or llama_intermediate(args.hidden)
    emulate = {"auto": not scaled_mm_supported(device), "true": True, "false": False}[args.emulate]
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        raise SystemExit(f"rms_norm_fp8 needs a GPU of compute capability 8.9 or newer; {device} is "
                         f"{torch.cuda.get_device_capability(device)}: run with --device cpu")
    if not emulate:
        if dtype is not torch.bfloat16:
            raise SystemExit("torch._scaled_mm with rowwise scales writes bf16: use --dtype bfloat16 "
                             "(or --emulate true)")
        if args.hidden % 16 or intermediate % 16:
            raise SystemExit(f"torch._scaled_mm needs K and N multiples of 16; got hidden {args.hidden}, "
                             f"intermediate {intermediate}")

    use_triton = {"auto": None, "true": True, "false": False}[args.use_triton]

    torch.manual_seed(args.seed)
    bf16 = LlamaMLPBlock(args.hidden, intermediate, use_triton=use_triton).to(device=device, dtype=dtype)
    fp8 = LlamaMLPBlock(args.hidden, intermediate, fp8=True, emulate=emulate, use_triton=use_triton)
    fp8.to(device=device, dtype=dtype)
    fp8.load_state_dict(bf16.state_dict())  # same init
    task = Task(args.hidden, intermediate, args.latent, args.noise, device, seed=args.seed + 1)

    kernels = uses_kernels(torch.empty(0, device=device, dtype=dtype), use_triton)
    path = "Triton kernels" if kernels else "torch reference"
    gemm = "emulated in fp32" if emulate else "torch._scaled_mm (rowwise)"
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    if not args.quiet:
        print(f"{name}: hidden {args.hidden}, intermediate {intermediate}, {args.tokens} tokens/step, "
              f"{args.steps} steps, {args.dtype}; norm: {path}; FP8 GEMM: {gemm}")

    probe = task.batch(-1, args.tokens, dtype)
    cos = gradient_agreement(bf16, fp8, *probe)
    gemm_diff = None if emulate else gemm_vs_emulation(fp8, probe[0])
    times = {}
    curves = {}
    for label, model in (("bf16", bf16), ("fp8", fp8)):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        curves[label] = train(model, task, args.steps, args.tokens, dtype, args.lr)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times[label] = time.perf_counter() - start

    result = verdict(curves["bf16"], curves["fp8"], cos, args.window, args.rtol, args.min_cos, gemm_diff)
    if not args.quiet:
        every = max(1, args.steps // 10)
        print(f"{'step':>6} {'bf16':>10} {'fp8':>10}")
        for i in list(range(0, args.steps, every)) + [args.steps - 1]:
            print(f"{i + 1:>6} {curves['bf16'][i]:>10.5f} {curves['fp8'][i]:>10.5f}")
        print("grad cosine at step 1: " + ", ".join(f"{k} {v:.4f}" for k, v in cos.items()))
        if gemm_diff is not None:
            print(f"torch._scaled_mm vs its fp32 emulation: relative difference {gemm_diff:.2e} (<= {GEMM_RTOL:g})")
        print(f"time: bf16 {times['bf16']:.2f}s, fp8 {times['fp8']:.2f}s (first-call compiles included)")
    print(f"final loss (mean of last {result['window']}): bf16 {result['bf16']['final']:.5f}, "
          f"fp8 {result['fp8']['final']:.5f}, rel diff {result['rel_diff']:.2%} (<= {args.rtol:.0%}: "
          f"{result['close']}); decreasing: bf16 {result['bf16']['decreasing']}, fp8 {result['fp8']['decreasing']}; "
          f"grads agree: {result['grads_agree']} -> {'PASS' if result['passed'] else 'FAIL'}")

    out = {"config": {**vars(args), "intermediate": intermediate, "emulate": emulate, "norm_path": path,
                      "device_name": name, "torch": torch.__version__},
           "losses": curves, "seconds": times, "verdict": result}
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    sys.exit(0 if main()["verdict"]["passed"] else 1)
