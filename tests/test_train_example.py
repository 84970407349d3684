"""examples/colt5_lm.py and examples/train_colt5_lm.py: the two model impls agree, and a
short training run learns, checkpoints, reloads to identical outputs, samples and plots (the
README's first command, which also runs here as a script)."""
import os
import runpy
import sys

import pytest
import torch

from examples import colt5_lm as lm
from examples import train_colt5_lm as script
from triton_layers import _checks
from triton_layers._checks import use_kernels

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

# Odd sizes: 3 sequences of 23 tokens, 5 of them routed; two heads of width 12.
SMALL = lm.LMConfig(seq_len=23, dim=24, heads=2, depth=2, heavy_tokens=5, light_mult=1, heavy_mult=2)


def _batch(config, batch_size, device, seed=1):
    data = script.load_corpus()
    return script.get_batch(data, batch_size, config.seq_len, device, torch.Generator().manual_seed(seed))


def _randomize(model):
    """Move every parameter off its init (LayerNorm weights are ones at init)."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


def _grads(model, tokens, targets):
    model.zero_grad(set_to_none=True)
    lm.lm_loss(model, tokens, targets).backward()
    return {name: p.grad for name, p in model.named_parameters()}


def _compare(ours, theirs, tokens, targets, atol):
    assert list(ours.state_dict()) == list(theirs.state_dict())
    theirs.load_state_dict(ours.state_dict(), strict=True)
    logits = ours(tokens)
    assert logits.shape == (*tokens.shape, ours.config.vocab_size)
    torch.testing.assert_close(logits, theirs(tokens), rtol=0, atol=atol)
    g_ours, g_theirs = _grads(ours, tokens, targets), _grads(theirs, tokens, targets)
    for name, grad in g_ours.items():
        if "routing_token" in name:
            # The router's token learns only from tokens with a fractional soft top-k score
            # (a score of 1 has zero gradient), and is unused when every token is routed.
            if grad is None or g_theirs[name] is None:
                assert grad is None and g_theirs[name] is None and tokens.shape[1] <= 2, name
                continue
        else:
            assert grad is not None and grad.abs().sum() > 0, f"no gradient for {name}"
        torch.testing.assert_close(grad, g_theirs[name], rtol=1e-4, atol=atol, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("length", [23, 11, 4, 1])
def test_torch_impl_matches_reference_path(length):
    """Same state_dict -> same logits and gradients: triton_layers (reference path) vs plain torch."""
    ours = _randomize(lm.build_model(SMALL, "triton", use_triton=False))
    tokens, targets = _batch(SMALL, 3, "cpu")
    _compare(ours, lm.build_model(SMALL, "torch"), tokens[:, :length], targets[:, :length], atol=2e-5)


def test_kernel_path_matches_torch_impl(device):
    """The kernels (the Triton interpreter on CPU) in the model give the plain-torch logits and grads."""
    config = lm.LMConfig(seq_len=13, dim=16, heads=2, depth=2, heavy_tokens=3, light_mult=1, heavy_mult=1)
    ours = _randomize(lm.build_model(config, "triton").to(device))
    assert use_kernels(torch.empty(0, device=device), None)
    tokens, targets = _batch(config, 2, device)
    _compare(ours, lm.build_model(config, "torch").to(device), tokens, targets, atol=1e-4)


def test_torch_impl_compiles_fullgraph():
    """The plain-torch model traces without graph breaks (the benchmark compiles it)."""
    model = lm.build_model(SMALL, "torch")
    tokens, _ = _batch(SMALL, 2, "cpu")
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(tokens), model(tokens), rtol=0, atol=0)


def test_batches_and_split():
    data = script.load_corpus()
    assert data.dtype == torch.uint8 and len(data) == 1_115_394
    train, held_out = script.split_corpus(data)
    assert len(held_out) == len(data) - int(len(data) * 0.9) and torch.equal(held_out, data[-len(held_out):])
    x, y = script.get_batch(train, 5, 17, "cpu", torch.Generator().manual_seed(3))
    again, _ = script.get_batch(train, 5, 17, "cpu", torch.Generator().manual_seed(3))
    assert x.shape == y.shape == (5, 17) and x.dtype == torch.long and torch.equal(x, again)
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the next bytes


def test_bad_inputs():
    model = lm.build_model(SMALL, "torch")
    with pytest.raises(ValueError, match="seq_len"):
        model(torch.zeros(1, SMALL.seq_len + 1, dtype=torch.long))
    with pytest.raises(TypeError, match="LongTensor"):
        model(torch.zeros(1, 4))
    with pytest.raises(ValueError, match=r"\(batch, seq\)"):
        model(torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="impl"):
        lm.build_model(SMALL, "jax")


def test_training_run(tmp_path, monkeypatch, capsys):
    """main(): the loss falls, the checkpoint reloads to identical outputs, --compare runs both."""
    tiny = lm.LMConfig(seq_len=32, dim=32, heads=2, depth=1, heavy_tokens=8)
    monkeypatch.setitem(script.SIZES, "tiny", (tiny, {"batch_size": 8, "steps": 40, "lr": 3e-3}))
    summary = script.main(["--device", "cpu", "--use-triton", "false", "--size", "tiny", "--compare",
                       "--out", str(tmp_path), "--sample-len", "20", "--seed", "3"])
    out = capsys.readouterr().out
    losses = summary["losses"]
    assert len(losses) == 40 and summary["path"] == "pure-torch reference"
    # From ~ln(256) = 5.5 nats: the byte frequencies alone take it below 3.5.
    assert sum(losses[-5:]) / 5 < losses[0] - 1.5
    assert summary["eval_loss"] < losses[0] - 1.5 and summary["train_loss"] < losses[0] - 1.5
    assert summary["reload_identical"] and "outputs identical = True" in out
    assert "scored from its prefix only" in out and summary["probe_prefix_loss"] < losses[0] - 1.5
    state = torch.load(summary["checkpoint"], weights_only=True)
    assert lm.LMConfig(**state["config"]) == tiny
    assert summary["sample"].startswith("ROMEO:\n") and len(summary["sample"]) > len("ROMEO:\n")
    assert open(summary["sample_path"], encoding="utf-8").read() == summary["sample"]
    if summary["plot"] is not None:
        assert os.path.getsize(summary["plot"]) > 1000
    # Same weights, batches and layers' math: the torch model ends at about the same loss.
    both = summary["compare"]
    assert set(both) == {"triton_layers", "plain torch"} and "plain torch" in out
    assert abs(both["triton_layers"]["train_loss"] - both["plain torch"]["train_loss"]) < 0.05


def test_the_lookahead_check_can_be_skipped(tmp_path, monkeypatch, capsys):
    """--no-lookahead-check: no prefix runs (minutes in the interpreter), nothing printed of them."""
    tiny = lm.LMConfig(seq_len=16, dim=16, heads=2, depth=1, heavy_tokens=4)
    monkeypatch.setitem(script.SIZES, "tiny", (tiny, {"batch_size": 2, "steps": 2, "lr": 3e-3}))
    calls = []
    monkeypatch.setattr(script, "prefix_loss", lambda *a: calls.append(a) or 0.0)
    summary = script.main(["--device", "cpu", "--use-triton", "false", "--size", "tiny", "--out", str(tmp_path),
                           "--sample-len", "4", "--no-lookahead-check"])
    assert not calls and summary["probe_prefix_loss"] is None
    assert "look-ahead" not in capsys.readouterr().out


def test_script_runs_as_a_script(monkeypatch, capsys):
    """``python examples/train_colt5_lm.py`` (the README's command): run as a file, with neither the
    repo root on sys.path nor the examples package imported, it finds examples.colt5_lm itself."""
    root = os.path.abspath(ROOT)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if os.path.abspath(p or ".") != root])
    for name in [name for name in sys.modules if name == "examples" or name.startswith("examples.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "argv", ["train_colt5_lm.py", "--help"])
    with pytest.raises(SystemExit) as exc:
        runpy.run_path(os.path.join(root, "examples", "train_colt5_lm.py"), run_name="__main__")
    assert exc.value.code == 0
    assert "--use-triton" in capsys.readouterr().out and root in map(os.path.abspath, sys.path)


def test_auto_is_the_reference_on_cpu_even_under_interpret(monkeypatch, capsys):
    """--use-triton auto: the reference on the CPU although TRITON_INTERPRET=1 would let the layers'
    own auto take the interpreter; forcing the interpreter warns how long it takes first."""
    monkeypatch.setattr(_checks, "TRITON_INTERPRET", True)
    assert use_kernels(torch.empty(0), None)  # what the layers' auto would pick
    args = script._parse(["--device", "cpu"])
    assert args.use_triton is False and script._path_name(torch.device("cpu"), args.use_triton) == \
        "pure-torch reference"
    assert script.interpreter_warning(args) is None
    forced = script._parse(["--device", "cpu", "--use-triton", "true"])
    assert forced.use_triton is True and forced.steps == 600
    warning = script.interpreter_warning(forced)
    assert "90 s a step" in warning and "600 steps take about 15 h 0 min" in warning
    assert "--no-lookahead-check" in warning
    # (even one step takes more than a minute in the interpreter: it warns too)
    assert "1 steps take about 2 min" in script.interpreter_warning(
        script._parse(["--device", "cpu", "--use-triton", "true", "--steps", "1"]))
    monkeypatch.setattr(script, "_run", lambda args: {"use_triton": args.use_triton})
    assert script.main(["--device", "cpu", "--use-triton", "true"]) == {"use_triton": True}
    assert "warning: --use-triton true on the CPU" in capsys.readouterr().err
