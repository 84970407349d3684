"""examples/generate_decode.py on the CPU: a tiny Llama, converted and not, generates the same
greedy tokens eagerly, and each batch gets its row of tokens/s with the ratio and its range."""
import pytest

pytest.importorskip("transformers")


def test_generate_decode_runs_on_cpu(tmp_path):
    import json

    from examples import generate_decode

    out = tmp_path / "generate.json"
    rows = generate_decode.main(["--device", "cpu", "--tiny", "--compile", "none", "--dtype", "float32",
                                 "--batch", "2", "--new-tokens", "3", "--rounds", "1", "--warmup", "1",
                                 "--out", str(out)])
    assert [r["batch"] for r in rows] == [2] and rows[0]["same_tokens"] is True
    assert rows[0]["converted_tps"] > 0 and rows[0]["unconverted_tps"] > 0
    assert json.loads(out.read_text()) == rows
