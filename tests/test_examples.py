"""examples/quickstart.py runs and round-trips its state_dict; its block on short sequences."""
import pytest
import torch

from examples import quickstart


def test_quickstart_runs(capsys):
    quickstart.main()
    out = capsys.readouterr().out
    assert "ran on" in out and ("Triton kernels" in out or "reference" in out)
    assert "outputs identical = True" in out
    assert "convert(): TritonLayerNorm" in out


@pytest.mark.parametrize("seq", [1, 5, 8])
def test_quickstart_block_on_short_sequences(device, seq):
    # With seq <= heavy_tokens the router routes every token and returns indices=None;
    # the block's route_back must take that: every token goes through the heavy branch.
    block = quickstart.TinyBlock(16, heavy_tokens=8).to(device)
    x = torch.randn(2, seq, 16, device=device, requires_grad=True)
    y = block(x)
    y.sum().backward()
    assert y.shape == x.shape and torch.isfinite(x.grad).all()
    with torch.no_grad():
        h = x + block.attn(block.norm1(x))
        torch.testing.assert_close(y, h + block.heavy(block.norm2(h)))
