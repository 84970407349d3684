"""The README's first command: examples/quickstart.py runs and round-trips its state_dict."""
import importlib.util
import os

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "quickstart.py")


def test_quickstart_runs(capsys):
    spec = importlib.util.spec_from_file_location("quickstart", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main()
    out = capsys.readouterr().out
    assert "ran on" in out and ("Triton kernels" in out or "reference" in out)
    assert "outputs identical = True" in out
    assert "convert(): TritonLayerNorm" in out
