"""functional.NormOptions: the norm call's values named once, in the order the route takes them
(so that the record and the route cannot drift apart), built by the public norms, both modules
and hub alike (each passes its values through it: the same keys, the same results)."""
import inspect

import torch

import triton_layers
from triton_layers import functional as F


def test_the_record_is_the_routes_values_in_order():
    params = list(inspect.signature(F._norm_route).parameters)
    assert params[:4] == ["x", "weight", "bias", "residual"]
    assert params[4:] == list(F.NormOptions._fields)
    assert F.NormOptions() == F.NormOptions(None, None, None, None, None, False, False, False, False, True, False)


def test_the_public_norms_and_the_modules_key_their_calls_alike(device):
    """A module's call and the functional call it stands for share one plan (one key)."""
    x = torch.randn(5, 32, device=device)
    rms = triton_layers.TritonRMSNorm(32, eps=1e-6, device=device)
    ln = triton_layers.TritonLayerNorm(32, device=device)
    with torch.no_grad():
        rms.weight.normal_()
        ln.weight.normal_()
        ln.bias.normal_()
    torch.testing.assert_close(rms(x), F.rms_norm(x, rms.weight, 1e-6), rtol=0, atol=0)
    torch.testing.assert_close(ln(x), F.layer_norm(x, ln.weight, ln.bias, 1e-5), rtol=0, atol=0)
