"""examples/train_hf_trainer.py at a tiny size on the CPU: the Trainer trains the model as
transformers builds it and converted, from one set of weights, and they follow one curve."""
import json
import os

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")


def test_trainer_example_runs_converted_and_not(tmp_path, capsys):
    from examples import train_hf_trainer

    results = train_hf_trainer.main(["--tiny", "--steps", "3", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    # a line a step here (3 steps: every tenth is every step) and no Trainer dict lines, no nan
    assert out.count("hf: step ") == 3 and "{'loss'" not in out and "nan" not in out, out
    assert results["hf"]["peak_mib"] is None or results["hf"]["peak_mib"] > 0
    hf, ours = results["hf"], results["triton_layers"]
    assert [s for s, _ in hf["losses"]] == [s for s, _ in ours["losses"]] == [1, 2, 3]
    # the same weights and batches: the same first loss; the norms agree to a few ulps after
    for (_, a), (_, b) in zip(hf["losses"], ours["losses"]):
        assert abs(a - b) <= 1e-3 * abs(a), (hf["losses"], ours["losses"])
    assert ours["tokens_per_s"] > 0
    with open(tmp_path / "hf_trainer.json") as f:
        saved = json.load(f)
    assert "LlamaRMSNorm (llama)" in saved["convert"]
    plotted = os.path.exists(tmp_path / "hf_trainer_loss.png")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        plotted = True
    assert plotted
