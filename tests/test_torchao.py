"""torchao's float8 training fed by our FP8 norms (triton_layers/integrations/torchao.py): its
Float8Linear takes our per-tensor FP8 output as cast, and everything it computes equals what it
computes when it casts the same norm's output itself (the same bytes: the same scale
convention, reciprocal), gradients included, eager and compiled."""
import warnings

import pytest
import torch
from torch import nn

float8 = pytest.importorskip("torchao.float8")

from triton_layers import FP8Recipe, functional as F  # noqa: E402
from triton_layers.integrations.torchao import float8_training_input  # noqa: E402


class _Block(nn.Module):
    """An RMSNorm then a linear; ``ours``: the norm writes FP8 that the linear takes as cast."""

    def __init__(self, ours: bool):
        super().__init__()
        self.ours = ours
        self.w = nn.Parameter(torch.randn(128))
        self.proj = nn.Linear(128, 64)

    def forward(self, x):
        if self.ours:
            return self.proj(float8_training_input(F.rms_norm_fp8(x, self.w, recipe=FP8Recipe("per_tensor")),
                                                   self.proj))
        return self.proj(F.rms_norm(x, self.w))


def _run(module, x0):
    x = x0.clone().requires_grad_()
    module.zero_grad()
    out = module(x)
    out.sum().backward()
    return out, x.grad, module.w.grad, module.proj.weight.grad


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_float8_linear_takes_our_per_tensor_output(device, compiled):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours, theirs = _Block(True).to(device), _Block(False).to(device)
        theirs.load_state_dict(ours.state_dict())
        float8.convert_to_float8_training(ours)
        float8.convert_to_float8_training(theirs)
        x0 = torch.randn(32, 128, device=device)
        want = _run(theirs, x0)
        if compiled:
            torch._dynamo.reset()
            got = _run(torch.compile(ours, backend="aot_eager", fullgraph=True), x0)
        else:
            got = _run(ours, x0)
    for a, b in zip(got, want):
        assert a is not None
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_per_token_and_other_inputs_are_refused(device):
    proj = float8.convert_to_float8_training(nn.Sequential(nn.Linear(128, 64)))[0]
    x = torch.randn(4, 128, device=device)
    with pytest.raises(ValueError, match="per_tensor"):
        float8_training_input(F.rms_norm_fp8(x, None, recipe=FP8Recipe("per_token")), proj)
    with pytest.raises(TypeError, match="Float8Linear"):
        float8_training_input(F.rms_norm_fp8(x, None, recipe=FP8Recipe("per_tensor")), nn.Linear(128, 64))
    with pytest.raises(TypeError, match="FP8Rows"):
        float8_training_input(x, proj)
