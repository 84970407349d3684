"""The README's first command: examples/quickstart.py runs and round-trips its state_dict."""
from examples import quickstart


def test_quickstart_runs(capsys):
    quickstart.main()
    out = capsys.readouterr().out
    assert "ran on" in out and ("Triton kernels" in out or "reference" in out)
    assert "outputs identical = True" in out
    assert "convert(): TritonLayerNorm" in out
