"""``python -m benchmarks`` without a GPU: its CLI, the report and plots from CSVs, and a dry run.

The timings themselves need a GPU; here the tables, the "below a peer / below 90% of copy"
lists and the plots are checked on CSVs with known answers, and the whole run (every op
and the training step) is dry-run on CPU at tiny shapes with the timer patched out.
"""
import csv
import json
import math
import os
import subprocess
import sys

import pytest
import torch

from benchmarks import harness, report, run_all
from benchmarks.bench_train_step import StepResult

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
COPY = 1000.0  # GB/s of the fake runs
EXAMPLE = os.path.join(ROOT, "examples", "colt5_lm.py")


def test_help_needs_no_gpu():
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    out = subprocess.run([sys.executable, "-m", "benchmarks", "--help"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for option in ("--quick", "--out", "--ops", "--no-compile"):
        assert option in out.stdout


def test_unknown_op_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        run_all.parse_args(["--ops", "layernorm,nope"])
    assert exc.value.code == 2
    assert "nope" in capsys.readouterr().err


def test_plain_progress_lines_without_tqdm(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import fails: the plain fallback
    bar = run_all.ProgressBar(3)
    bar("first")
    bar("second")
    bar.reach(3)
    bar.close()
    out = capsys.readouterr().out
    assert "[1/3" in out and "first" in out and "[2/3" in out and "second" in out
    assert bar.done == 3


def _result(op, shape, dtype, direction, impl, us, nbytes, peak=math.nan):
    gbps = nbytes / us / 1e3
    return harness.Result(op, shape, dtype, direction, impl, us, gbps, 100 * gbps / COPY, peak)


def _fake_results(folder):
    """CSVs where the answers are known: see the comments on each row."""
    mb = 100_000_000  # bytes: 100 us -> 1000 GB/s = 100% of COPY
    layernorm = [
        _result("layernorm", "64x1024", "bfloat16", "fwd", "triton_layers", 105.0, mb),  # 95%, fastest
        _result("layernorm", "64x1024", "bfloat16", "fwd", "torch", 200.0, mb),
        _result("layernorm", "16x4096", "bfloat16", "fwd", "triton_layers", 160.0, mb),  # slower than torch
        _result("layernorm", "16x4096", "bfloat16", "fwd", "torch", 130.0, mb),
        _result("layernorm", "4x16384", "bfloat16", "fwd", "triton_layers", 250.0, mb),  # 40%, fastest
        _result("layernorm", "4x16384", "bfloat16", "fwd", "torch", float("nan"), mb),  # peer failed
        _result("layernorm", "4x16384", "bfloat16", "fwd", "liger", 300.0, mb),
    ]
    softmax = [
        # plain is compared with plain peers only, causal with causal peers only
        _result("softmax", "8x512x512", "float32", "fwd", "triton_layers", 100.0, mb),  # 100%, fastest plain
        _result("softmax", "8x512x512", "float32", "fwd", "triton_layers-causal", 90.0, mb),  # slower than causal peer
        _result("softmax", "8x512x512", "float32", "fwd", "compile", 110.0, mb),
        _result("softmax", "8x512x512", "float32", "fwd", "compile-causal", 60.0, mb),
    ]
    coor = [
        _result("coor_descent", "8x256", "float32", "fwd+bwd", "triton_layers", 50.0, 1000, peak=0.5),  # fastest
        _result("coor_descent", "8x256", "float32", "fwd+bwd", "colt5-torch", 900.0, 1000, peak=9.0),
    ]
    harness.write_csv(layernorm, os.path.join(folder, "layernorm.csv"))
    harness.write_csv(softmax, os.path.join(folder, "softmax.csv"))
    harness.write_csv(coor, os.path.join(folder, "coor_descent.csv"))
    steps = [StepResult("B2 T16", "triton_layers", 2, 16, 10.0, 3200.0, 500.0, 5.5),
             StepResult("B2 T16", "torch", 2, 16, 20.0, 1600.0, 700.0, 5.5),
             StepResult("B2 T16", "torch-compile", 2, 16, math.nan, math.nan, math.nan, math.nan)]
    harness.write_csv(steps, os.path.join(folder, "train_step.csv"))
    with open(os.path.join(folder, "env.json"), "w") as f:
        json.dump({"gpu": "Fake GPU 9000", "torch": "9.9", "triton": "9.9", "date": "2099-01-01",
                   "peers": {"liger-kernel": "1.0"}}, f)


def _section(text, start, stop):
    return text[text.index(start):text.index(stop, text.index(start))]


def test_report_lists_exactly_the_rows_below_a_peer_or_90_percent(tmp_path):
    _fake_results(tmp_path)
    data = report.load(str(tmp_path))
    assert report.copy_gbps(data["layernorm"]) == pytest.approx(COPY)
    text = open(report.write_summary(str(tmp_path))).read()
    assert "Fake GPU 9000" in text and "2099-01-01" in text and "liger-kernel 1.0" in text
    assert "1000 GB/s" in text
    slower = _section(text, "Slower than the fastest peer", "At least as fast")
    low = text[text.index("At least as fast"):]
    rows = lambda part: [line for line in part.splitlines() if line.startswith("| ") and "---" not in line][1:]  # noqa: E731
    assert len(rows(slower)) == 2
    assert "| layernorm | 16x4096 | bfloat16 | fwd | 160 us | 62% | torch 130 us | 0.81x |" in slower
    assert "| softmax | 8x512x512 | float32 | fwd | 90 us (causal) | 111% | compile-causal 60 us | 0.67x |" in slower
    assert len(rows(low)) == 1
    assert "| layernorm | 4x16384 | bfloat16 | fwd | 250 us | 40% | liger 300 us | 1.20x |" in low
    # the per-op tables: the failed peer is an empty cell, the ratio column is the best peer / ours
    assert "| 64x1024 | bfloat16 | fwd | 105 us (95%) | 200 us (50%) |  | 1.90x |" in text
    assert "| 4x16384 | bfloat16 | fwd | 250 us (40%) |  | 300 us (33%) | 1.20x |" in text
    assert "| 8x256 | fwd+bwd | 0.5 | 9.0 |" in text  # coor_descent peak memory
    assert "| torch-compile | failed |" in text and "| torch | 20.0 ms | 1,600 | 0.50x | 700 MiB |" in text


def test_update_keeps_the_hand_written_text(tmp_path):
    _fake_results(tmp_path / "run")
    (tmp_path / "run" / "headline.png").write_bytes(b"not drawn here")
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text("# Benchmarks\n\nhand-written intro\n")
    report.update(str(doc), str(tmp_path / "run"))
    doc.write_text(doc.read_text() + "\n## Why\n\nhand-written reasons\n")
    first = doc.read_text()
    report.update(str(doc), str(tmp_path / "run"))
    assert doc.read_text() == first  # regenerating is idempotent and keeps both hand-written parts
    assert first.startswith("# Benchmarks\n\nhand-written intro\n") and first.endswith("hand-written reasons\n")
    assert first.count(report.END) == 1 and "python -m benchmarks.report run --update BENCHMARKS.md" in first
    assert "](run/headline.png)" in first  # image links relative to the document


def test_plots_from_csvs(tmp_path):
    pytest.importorskip("matplotlib")
    from benchmarks import plots

    _fake_results(tmp_path)
    written = plots.plot_all(str(tmp_path))
    names = sorted(os.path.basename(p) for p in written)
    assert names == ["coor_descent.png", "headline.png", "layernorm.png", "softmax.png", "train_step.png"]
    for path in written:
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    text = open(report.write_summary(str(tmp_path))).read()
    assert "![headline" in text and "(layernorm.png)" in text


def test_benchmarks_md_matches_its_csvs():
    """The generated part of BENCHMARKS.md is what the report makes of the CSVs it names."""
    path = os.path.join(ROOT, "BENCHMARKS.md")
    if not os.path.exists(path):
        pytest.skip("no BENCHMARKS.md")
    text = open(path).read()
    start = text.index("<!-- BEGIN GENERATED by `python -m benchmarks.report ")
    source = text[start:].split("`")[1].split()[3]
    assert report.render(os.path.join(ROOT, source), ROOT) in text, \
        f"regenerate: python -m benchmarks.report {source} --update BENCHMARKS.md"


def _dry_run(monkeypatch):
    """Make harness and the benchmarks run on CPU at tiny shapes, with a fake timer."""
    from benchmarks import bench_coor_descent, bench_layernorm, bench_softmax, bench_train_step, bench_weighted_sum

    monkeypatch.setattr(harness, "require_cuda", lambda: torch.device("cpu"))
    monkeypatch.setattr(harness, "device", lambda: torch.device("cpu"))
    monkeypatch.setattr(harness, "copy_bandwidth_gbps", lambda device: COPY)
    monkeypatch.setattr(harness, "time_us", lambda fn, grad_to_none=None, quick=False: (fn(), 100.0)[1])
    monkeypatch.setattr(harness, "peak_memory_mib", lambda fn: (fn(), 1.0)[1])
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)
    monkeypatch.setattr(bench_layernorm, "QUICK_SHAPES", [(3, 40)])
    monkeypatch.setattr(bench_softmax, "QUICK_SHAPES", [(2, 33)])
    monkeypatch.setattr(bench_weighted_sum, "QUICK_SHAPES", [(5, 70)])
    monkeypatch.setattr(bench_coor_descent, "QUICK_SHAPES", [(3, 50)])
    monkeypatch.setattr(bench_train_step, "CONFIG", dict(seq_len=16, dim=32, heads=2, depth=1, heavy_tokens=4))
    monkeypatch.setattr(bench_train_step, "BATCH", 2)
    monkeypatch.setattr(bench_train_step, "STEPS", {True: (1, 1), False: (1, 1)})


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU dry run; on a GPU run python -m benchmarks")
def test_dry_run_of_every_part_on_cpu(tmp_path, monkeypatch):
    _dry_run(monkeypatch)
    parts = ["layernorm", "softmax", "weighted_sum", "coor_descent"]
    if os.path.exists(EXAMPLE):
        parts.append("train_step")
    # split over two commands into one folder, as a short GPU session may need
    options = ["--quick", "--no-compile", "--no-plots", "--out", str(tmp_path), "--ops"]
    assert run_all.main(options + ["layernorm"]) == 0
    rc = run_all.main(options + [",".join(parts[1:])])
    env = json.load(open(tmp_path / "env.json"))
    assert rc == 0 and env["errors"] == {}, env["errors"]
    assert set(env["wall_s"]) == set(parts)  # the first command's part is kept
    assert env["command"].count("python -m benchmarks") == 2
    for op in parts[:4]:
        with open(tmp_path / f"{op}.csv") as f:
            rows = list(csv.DictReader(f))
        ours = [r for r in rows if r["impl"].startswith("triton_layers")]
        # every case of ours ran (a kernel failure would be a nan time: try_peer swallows it)
        assert ours and all(math.isfinite(float(r["us"])) for r in ours), op
        assert any(not r["impl"].startswith("triton_layers") for r in rows), op  # peers in the same run
    if "train_step" in parts:
        rows = report.read_csv(str(tmp_path / "train_step.csv"))
        assert [r["impl"] for r in rows] == ["triton_layers", "torch"]
        # the same weights and batch: both implementations start from the same loss
        assert all(math.isfinite(r["step_ms"]) for r in rows)
        assert rows[0]["loss"] == pytest.approx(rows[1]["loss"], rel=1e-2)
    assert "## Where we are below" in open(tmp_path / "summary.md").read()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU dry run")
def test_single_scripts_on_cpu(tmp_path, monkeypatch, capsys):
    """A bench file run alone (its tables on stdout), and the weighted-sum launch sweep through the
    same loop, restoring the launch settings."""
    from benchmarks import bench_softmax, bench_weighted_sum
    from triton_layers.kernels import _launch

    _dry_run(monkeypatch)
    harness.run_alone(bench_softmax, bench_softmax._targets, argv=["--quick", "--no-compile", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "## softmax on cpu" in out and "| 2x33x33 | bfloat16 | fwd | 100 us, " in out
    assert "## softmax targets" in out and "| 2x33x33 | float32 | bwd |" in out
    rows = report.read_csv(str(tmp_path / "softmax.csv"))
    assert len(rows) == 2 * 2 * len({r["impl"] for r in rows}) >= 2 * 2 * 4  # dtypes x dirs x impls

    monkeypatch.setattr(bench_weighted_sum, "SWEEP", [(8192, 16, 8, 4), (32768, 32, 8, 16)])
    before = {knob: getattr(_launch, knob) for knob in bench_weighted_sum.SWEEP_KNOBS}
    harness.run_alone(bench_weighted_sum.Sweep, argv=["--quick", "--dtypes", "float32", "--out", str(tmp_path)])
    rows = report.read_csv(str(tmp_path / "weighted_sum_sweep.csv"))
    assert [r["shape"] for r in rows[::2]] == ["5x70 tile=8192 ept=16 bwd/sm=4", "5x70 tile=32768 ept=32 bwd/sm=16"]
    assert {knob: getattr(_launch, knob) for knob in bench_weighted_sum.SWEEP_KNOBS} == before
