"""examples/fp8_mlp.py: the FP8 GEMM (emulated on the CPU, ``torch._scaled_mm`` on an FP8
GPU) and its backward, and a short training run of the FP8 Llama MLP block against bf16's:
both losses decrease and end close, the gradients agree at the start."""
import json

import pytest
import torch

import triton_layers
from examples import fp8_mlp
from triton_layers import functional as F
from triton_layers import uses_kernels

# The tiny run: about a second on the CPU (the norms' torch reference, the GEMM emulated; in
# float32, as bf16 matmuls are ten times slower on the CPU: the FP8 values are the same).
TINY = ["--hidden", "128", "--steps", "40", "--tokens", "256", "--lr", "3e-3", "--latent", "16", "--dtype", "float32",
        "--quiet"]


def _fp8_gpu() -> bool:
    return torch.cuda.is_available() and fp8_mlp.scaled_mm_supported(torch.device("cuda"))


def _activation(rows: int, cols: int, device, dtype=torch.bfloat16):
    """The FP8 activation of a norm of random x (with gradients to x and the norm weight)."""
    x = torch.randn(rows, cols, device=device, dtype=dtype, requires_grad=True)
    weight = (1 + 0.1 * torch.randn(cols, device=device, dtype=dtype)).requires_grad_(True)
    return x, weight, F.rms_norm_fp8(x, weight, use_triton=False)


def test_quantize_rows_convention():
    """Per-row scales amax / 448; each row's largest entry lands on +-448; zeros stay zeros."""
    w = torch.randn(48, 64) * torch.logspace(-6, 3, 48).unsqueeze(1)
    w[5] = 0
    w8, scale = fp8_mlp.quantize_rows(w)
    assert w8.dtype == torch.float8_e4m3fn and scale.shape == (48, 1) and scale.dtype == torch.float32
    amax = w.abs().amax(1, keepdim=True)
    torch.testing.assert_close(scale[amax > 0], (amax / 448)[amax > 0])
    assert (w8[5].float() == 0).all() and torch.isfinite(scale).all()
    nonzero = amax.squeeze(1) > 0
    assert (w8.float().abs().amax(1)[nonzero] == 448).all()
    # e4m3 keeps 3 mantissa bits: within 2**-4 of each entry, relative, above the subnormals
    big = w.abs() > amax * 2**-6
    err = (w8.float() * scale - w).abs()
    assert (err[big] <= 2**-4 * w.abs()[big]).all()


def test_fp8_linear_forward_and_backward():
    """The emulated FP8 GEMM is (a8 * a_scale) @ (w8 * w_scale).T, close to the unquantized
    product even when the weight rows' magnitudes differ by 10**9 (a scale on the wrong row
    would be far off); the backward is the bf16 one, and reaches x and the norm weight."""
    x, norm_weight, rows = _activation(64, 128, "cpu")
    w = (torch.randn(96, 128) * torch.logspace(-6, 3, 96).unsqueeze(1)).to(torch.bfloat16).requires_grad_(True)
    y = fp8_mlp.FP8Linear.apply(rows.activation, w, True)
    assert y.shape == (64, 96) and y.dtype == torch.bfloat16
    a = rows.activation.dequantize().float()
    w8, w_scale = fp8_mlp.quantize_rows(w)
    torch.testing.assert_close(y, ((rows.data.float() * rows.scale) @ (w8.float() * w_scale).t()).to(y.dtype))
    exact = a @ w.detach().float().t()
    rel = ((y.float() - exact).norm(dim=0) / exact.norm(dim=0))  # per output feature
    assert rel.max() < 0.1, rel.max()

    grad = torch.randn_like(y)
    y.backward(grad)
    torch.testing.assert_close(w.grad, (grad.t() @ rows.activation.dequantize()).to(w.dtype))
    assert x.grad is not None and norm_weight.grad is not None
    # what the norm's backward gives on grad @ w: the bf16 norm's, straight through
    x2 = x.detach().clone().requires_grad_(True)
    nw2 = norm_weight.detach().clone().requires_grad_(True)
    F.rms_norm(x2, nw2, use_triton=False).backward(grad @ w.detach())
    torch.testing.assert_close(x.grad, x2.grad)
    torch.testing.assert_close(norm_weight.grad, nw2.grad)


def test_shared_activation_gradients_add():
    """gate and up read one activation: the norm sees the sum of their input gradients."""
    x, norm_weight, rows = _activation(32, 64, "cpu")
    w1, w2 = (torch.randn(48, 64, dtype=torch.bfloat16) / 8 for _ in range(2))
    g = fp8_mlp.FP8Linear.apply(rows.activation, w1, True)
    u = fp8_mlp.FP8Linear.apply(rows.activation, w2, True)
    g1, g2 = torch.randn_like(g), torch.randn_like(u)
    torch.autograd.backward([g, u], [g1, g2])
    x2 = x.detach().clone().requires_grad_(True)
    F.rms_norm(x2, norm_weight.detach(), use_triton=False).backward(g1 @ w1 + g2 @ w2)
    torch.testing.assert_close(x.grad, x2.grad)


def test_fp8_mlp_trains_close_to_bf16(tmp_path, capsys):
    """The example's check at a tiny size on the CPU (the GEMM emulated)."""
    out_file = tmp_path / "fp8_mlp.json"
    result = fp8_mlp.main(["--device", "cpu", "--use-triton", "false", "--out", str(out_file), *TINY])
    assert "PASS" in capsys.readouterr().out
    verdict = result["verdict"]
    assert result["config"]["emulate"] and result["config"]["norm_path"] == "torch reference"
    for name in ("bf16", "fp8"):
        losses = result["losses"][name]
        assert len(losses) == 40 and all(torch.isfinite(torch.tensor(losses)))
        assert verdict[name]["final"] < 0.75 * verdict[name]["first"], verdict[name]
    assert verdict["rel_diff"] <= 0.05 and verdict["grads_agree"] and verdict["passed"], verdict
    # the FP8 run is not the bf16 run: the quantization shows, a little
    assert result["losses"]["fp8"] != result["losses"]["bf16"]
    with open(out_file) as f:
        saved = json.load(f)
    assert saved["losses"] == result["losses"] and saved["verdict"]["passed"]


def test_fp8_mlp_on_the_kernels(device):
    """A few steps with the norms' kernels (the Triton interpreter on the CPU, under the
    tests' TRITON_INTERPRET=1): the losses of their torch reference, to the rounding."""
    if not uses_kernels(torch.empty(0, device=device), None):
        pytest.skip("no kernels here (no GPU, TRITON_INTERPRET unset)")
    if device == "cuda" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("rms_norm_fp8 needs compute capability 8.9")
    args = ["--device", device, "--hidden", "128", "--steps", "3", "--tokens", "32", "--latent", "16", "--quiet"]
    ours = fp8_mlp.main([*args, "--use-triton", "true"])
    assert ours["config"]["norm_path"] == "Triton kernels"
    ref = fp8_mlp.main([*args, "--use-triton", "false"])
    for name in ("bf16", "fp8"):
        torch.testing.assert_close(torch.tensor(ours["losses"][name]), torch.tensor(ref["losses"][name]),
                                   rtol=1e-2, atol=0)
    assert ours["verdict"]["grads_agree"], ours["verdict"]["grad_cos"]


@pytest.mark.skipif(not _fp8_gpu(), reason="torch._scaled_mm needs a GPU of compute capability 8.9")
def test_scaled_mm_matches_emulation():
    """On an FP8 GPU: torch._scaled_mm with the example's rowwise scales is its emulation."""
    _, _, rows = _activation(256, 128, "cuda")
    w8, w_scale = fp8_mlp.quantize_rows(torch.randn(96, 128, device="cuda") * torch.logspace(-3, 3, 96,
                                                                                               device="cuda")[:, None])
    real = fp8_mlp.fp8_gemm(rows.data, rows.scale, w8, w_scale, torch.bfloat16, emulate=False).float()
    emulated = fp8_mlp.fp8_gemm(rows.data, rows.scale, w8, w_scale, torch.float32, emulate=True)
    assert ((real - emulated).norm() / emulated.norm()).item() < fp8_mlp.GEMM_RTOL
    assert triton_layers.FP8Activation is type(rows.activation)
