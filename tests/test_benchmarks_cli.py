"""``python -m benchmarks`` without a GPU: its CLI, the report and plots from CSVs, and a dry run.

The timings themselves need a GPU; here the tables, the "below a peer / below 90% of copy"
lists and the plots are checked on CSVs with known answers, and the whole run (every op
and the training step) is dry-run on CPU at tiny shapes with the timer patched out.
"""
import importlib
import json
import math
import os
import subprocess
import sys

import pytest
import torch

from benchmarks import harness, parts, report, run_all
from benchmarks.train_loop import StepResult

from .fake_timer import COPY

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def test_help_needs_no_gpu():
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    out = subprocess.run([sys.executable, "-m", "benchmarks", "--help"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for option in ("--quick", "--out", "--ops", "--no-compile", "--train-configs", "--llama-modes"):
        assert option in out.stdout
    # what it needs and how long it takes, before anyone starts it
    text = " ".join(out.stdout.split())
    assert "Needs: a CUDA GPU" in text and "16-20 minutes for a full pass" in text


def test_unknown_op_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        run_all.parse_args(["--ops", "layernorm,nope"])
    assert exc.value.code == 2
    assert "nope" in capsys.readouterr().err


def test_parts_come_from_the_bench_files():
    """One list: the parts of python -m benchmarks are the bench files that declare a PART, and
    run_all's --ops, the report's ops and their targets, the plots' figures and the registers
    tool's names are all derived from them."""
    from benchmarks import plots
    from benchmarks.dev import registers
    from triton_layers.kernels import ops as kernel_ops

    names = parts.names()
    # (no list written here: a new bench_<op>.py joins by its PART alone, and this test with it)
    folder = os.path.dirname(parts.__file__)
    declaring = {f[len("bench_"):-len(".py")] for f in os.listdir(folder) if f.startswith("bench_") and f.endswith(".py")
                 and parts.declared(os.path.join(folder, f)) is not None}
    assert set(names) == declaring and len(names) == len(declaring) and names
    assert run_all.PARTS == names
    assert report.OPS == tuple(op.name for op in parts.ops()) and set(names) & set(report.OPS)
    in_recipes = {op.name for p in plots.RECIPE_PARTS for op in p.ops}
    assert set(plots.BANDWIDTH_OPS) | set(plots.TIME_OPS) | in_recipes == set(report.OPS)
    assert not in_recipes & set(plots.BANDWIDTH_OPS)  # (a recipes part's ops have its figure, not their own)
    assert report.TARGETS == {(op.name, d): pct for op in parts.ops() for d, pct in op.targets}
    assert all(op in report.OPS and d in ("fwd", "bwd") and 0 < pct <= 100 for (op, d), pct in report.TARGETS.items())
    for part in parts.parts():
        module = importlib.import_module(part.module)
        assert module.PART == parts.declared(module.__file__)  # the literal read without importing is the module's
        assert set(part.kernel_ops) <= set(kernel_ops.__all__) and part.kernel_ops, part.name
        if part.ops:  # an op part runs on the harness: its cases, implementations and builder
            assert all(callable(getattr(module, f)) for f in ("cases", "implementations", "build")), part.name
            assert part.cpu_shapes and module.OP == part.name
        else:  # a training step runs its own loop
            assert callable(module.run), part.name
    # every name python -m benchmarks takes, and every op of its rows, is one the registers tool takes
    for name in (*names, *parts.op_names()):
        assert registers.op_names(name) == list(parts.kernel_ops(name)), name
    assert set(registers.kernel_ops()) == set(kernel_ops.__all__)  # (every kernel op's forms, from the bench files)


def test_a_new_bench_file_joins_by_its_part(tmp_path):
    """A bench file's PART is all it takes: found in its folder, in its order, its ops' CSV its own
    name; a PART that is not a literal (it would need an import to read) is refused."""
    (tmp_path / "bench_layernorm.py").write_text(open(os.path.join(ROOT, "benchmarks", "bench_layernorm.py")).read())
    (tmp_path / "bench_newop.py").write_text(
        "import torch\nOP = 'newop'\nPART = {'order': 5, 'ops': {'newop': {'title': 'New op', 'note': 'bytes: MDs',"
        " 'measure': 'bandwidth', 'kernel_ops': ('softmax',), 'targets': {'fwd': 70.0}}}, 'cpu_shapes': [(2, 8)]}\n")
    (tmp_path / "bench_helper.py").write_text("X = 1\n")  # no PART: not a part
    found = parts.parts(str(tmp_path))
    assert [p.name for p in found] == ["newop", "layernorm"]
    assert found[0].ops[0].targets == (("fwd", 70.0),) and found[0].kernel_ops == ("softmax",)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "bench_bad.py").write_text("SHAPES = [(1, 2)]\nPART = {'order': 1, 'cpu_shapes': SHAPES}\n")
    with pytest.raises(ValueError, match="PART must be a literal"):
        parts.parts(str(tmp_path / "bad"))
    (tmp_path / "bad" / "bench_bad.py").write_text("PART = {'order': 1, 'plot': 'pie', 'ops': {}}\n")
    parts.parts.cache_clear()
    with pytest.raises(ValueError, match="plot must be one of"):
        parts.parts(str(tmp_path / "bad"))


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


def _result(op, shape, dtype, direction, impl, gpu_us, nbytes, peak=math.nan, method="graph"):
    """A Result whose GPU time is ``gpu_us`` and eager time 40 us more (the host's share)."""
    gbps = nbytes / gpu_us / 1e3
    return harness.Result(op, shape, dtype, direction, impl, gpu_us + 40, gpu_us, method, gbps,
                          100 * gbps / COPY, peak)


def _steps(config="B2 T16"):
    """Train-step rows: eager ours 2x torch's speed, compile a tie, cudagraphs torch failed."""
    row = lambda mode, impl, ms, low, high: StepResult(  # noqa: E731
        config, mode, impl, 2, 16, 5, 3, ms, low, high, 32 / (ms / 1e3), 500.0, 80.0, 900.0, 900.0, 5.5)
    return [row("eager", "torch", 20.0, 19.0, 21.0), row("eager", "triton_layers", 10.0, 9.5, 10.5),
            row("compile", "torch", 8.0, 7.8, 8.4), row("compile", "triton_layers", 8.1, 7.9, 8.3),
            row("cudagraphs", "torch", math.nan, math.nan, math.nan), row("cudagraphs", "triton_layers", 5.0, 4.9, 5.1)]


def _fake_results(folder, gpu="Fake GPU 9000"):
    """CSVs where the answers are known: see the comments on each row."""
    mb = 100_000_000  # bytes: 100 us -> 1000 GB/s = 100% of COPY
    layernorm = [
        _result("layernorm", "64x1024", "bfloat16", "fwd", "triton_layers", 105.0, mb),  # 95%, fastest
        _result("layernorm", "64x1024", "bfloat16", "fwd", "torch", 200.0, mb),
        _result("layernorm", "16x4096", "bfloat16", "fwd", "triton_layers", 160.0, mb),  # slower than torch
        _result("layernorm", "16x4096", "bfloat16", "fwd", "torch", 130.0, mb),
        _result("layernorm", "4x16384", "bfloat16", "fwd", "triton_layers", 250.0, mb),  # 40%, fastest
        _result("layernorm", "4x16384", "bfloat16", "fwd", "torch", float("nan"), mb),  # peer failed
        _result("layernorm", "4x16384", "bfloat16", "fwd", "liger", 300.0, mb, method="profiler"),  # not captured
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
    harness.write_csv(_steps(), os.path.join(folder, "train_step.csv"))
    with open(os.path.join(folder, "env.json"), "w") as f:
        json.dump({"gpu": gpu, "torch": "9.9", "triton": "9.9", "date": "2099-01-01",
                   "peers": {"liger-kernel": "1.0"}}, f)


def _fake_norms(folder):
    """norms.csv, three ops in one CSV, each against its own % of copy target: see the comments."""
    mb = 100_000_000
    rows = [
        _result("rmsnorm", "64x1024", "bfloat16", "fwd", "triton_layers", 112.0, mb),  # 89% < 90%: listed
        _result("rmsnorm", "64x1024", "bfloat16", "fwd", "torch", 200.0, mb),
        _result("rmsnorm", "64x1024", "bfloat16", "bwd", "triton_layers", 118.0, mb),  # 85% >= its 80%
        _result("rmsnorm", "64x1024", "bfloat16", "bwd", "compile", 130.0, mb),
        _result("add_rmsnorm", "64x1024", "bfloat16", "fwd", "triton_layers", 115.0, mb),  # 87% >= its 85%
        _result("add_rmsnorm", "64x1024", "bfloat16", "fwd", "liger", 150.0, mb),
        _result("add_rmsnorm", "64x1024", "bfloat16", "bwd", "triton_layers", 115.0, mb),  # 87% < 90%: listed
        _result("add_rmsnorm", "64x1024", "bfloat16", "bwd", "liger", 150.0, mb),
        _result("add_layernorm", "64x1024", "bfloat16", "fwd", "triton_layers", 100.0, mb),  # slower than compile
        _result("add_layernorm", "64x1024", "bfloat16", "fwd", "compile", 90.0, mb),
    ]
    harness.write_csv(rows, os.path.join(folder, "norms.csv"))


def test_norms_csv_renders_three_ops_with_their_own_targets(tmp_path):
    _fake_norms(tmp_path)
    data = report.load(str(tmp_path))
    assert list(data) == ["rmsnorm", "add_rmsnorm", "add_layernorm"]
    assert all(r["op"] == op for op, rows in data.items() for r in rows)
    text = report.render(str(tmp_path), str(tmp_path))
    titles = [line for line in text.splitlines() if line.startswith("### ")]
    assert titles[1:4] == ["### " + parts.op_info(op).title for op in data]
    assert "| 64x1024 | bfloat16 | fwd | 100 us (100%) / 140 us | 90 us (111%) / 130 us | 0.90x |" in text
    assert "### Where we are below a peer or below the copy target" in text
    slower = _section(text, "Slower than the fastest peer", "At least as fast")
    assert _rows(slower) == ["| add_layernorm | 64x1024 | bfloat16 | fwd | 100 us / 140 us | 100% | compile 90 us "
                             "| 0.90x |"]
    low = text[text.index("At least as fast"):]
    assert "(or the op's own target: rmsnorm bwd 80%, add_rmsnorm fwd 85%, add_layernorm fwd 85%)" in low
    assert [row.split(" | ")[:4] for row in _rows(low)] == [["| rmsnorm", "64x1024", "bfloat16", "fwd"],
                                                           ["| add_rmsnorm", "64x1024", "bfloat16", "bwd"]]


def _section(text, start, stop):
    return text[text.index(start):text.index(stop, text.index(start))]


def _rows(part):
    return [line for line in part.splitlines() if line.startswith("| ") and "---" not in line][1:]


def test_report_lists_exactly_the_rows_below_a_peer_or_90_percent(tmp_path):
    _fake_results(tmp_path)
    data = report.load(str(tmp_path))
    assert report.copy_gbps(data["layernorm"]) == pytest.approx(COPY)
    text = open(report.write_summary(str(tmp_path))).read()
    assert "Fake GPU 9000" in text and "2099-01-01" in text and "liger-kernel 1.0" in text
    assert "1000 GB/s" in text and "Old method" not in text
    slower = _section(text, "Slower than the fastest peer", "At least as fast")
    low = _section(text, "At least as fast", "Causal softmax over")
    causal = text[text.index("Causal softmax over"):]
    assert "compared by GPU times" in text
    assert len(_rows(slower)) == 2
    assert "| layernorm | 16x4096 | bfloat16 | fwd | 160 us / 200 us | 62% | torch 130 us | 0.81x |" in slower
    assert ("| softmax | 8x512x512 | float32 | fwd | 90 us / 130 us (causal) | 111% | compile-causal 60 us | 0.67x |"
            in slower)
    assert len(_rows(low)) == 1
    assert "| layernorm | 4x16384 | bfloat16 | fwd | 250 us / 290 us | 40% | liger 300 us | 1.20x |" in low
    # the causal softmax's time over the plain one's, against 0.75 (fwd) and 0.67 (bwd)
    assert _rows(causal) == ["| 8x512x512 | float32 | fwd | 90 us | 100 us | 0.90 | 0.75 |"]
    # the per-op tables: GPU time (% of copy) / eager time; a failed peer is an empty cell; the
    # profiler's kernel sum is starred; the ratio column is the best peer's GPU time / ours
    assert "| 64x1024 | bfloat16 | fwd | 105 us (95%) / 145 us | 200 us (50%) / 240 us |  | 1.90x |" in text
    assert "| 4x16384 | bfloat16 | fwd | 250 us (40%) / 290 us |  | 300* us (33%) / 340 us | 1.20x |" in text
    assert "| 8x256 | fwd+bwd | 0.5 | 9.0 |" in text  # coor_descent peak memory
    # training step: ours against torch in the same mode; a spread across 1.0 is a tie
    assert "| eager | triton_layers | 10.0 ms (9.5-10.5) | 3,200 | 2.00x | 500 MiB | 80% | 900 | 900 | 5.5000 |" in text
    assert "| compile | triton_layers | 8.1 ms (7.9-8.3) | 3,951 | tie (0.94-1.06x) |" in text
    assert "| cudagraphs | torch | failed |" in text and "| cudagraphs | triton_layers | 5.0 ms (4.9-5.1) | 6,400 |  |" in text


def test_report_row_limits_table(tmp_path):
    """norms_row_limits.csv renders each choice beside the default at its shape: the default's
    GPU time over the choice's, and no ratio where the choice gave no result."""
    (tmp_path / "norms_row_limits.csv").write_text(
        "op,shape,dtype,direction,impl,us,gpu_us,gpu_method,gbps,pct_copy,peak_mib\n"
        "add_rmsnorm,2048x32768 default,bfloat16,fwd,triton_layers,282,280,graph,1900,63,nan\n"
        "add_rmsnorm,2048x32768 res-fwd<=32768,bfloat16,fwd,triton_layers,185,185,graph,2900,97,nan\n"
        "rmsnorm,4096x16384 bwd<=16384,float32,bwd,triton_layers,nan,nan,,nan,nan,nan\n")
    text = report.render(str(tmp_path), str(tmp_path))
    assert "### The norms' row limits, swept (bench_norms --sweep-row-limits)" in text
    assert "| add_rmsnorm | 2048x32768 | bfloat16 | fwd | default | 280 us (63%) |  |" in text
    assert "| add_rmsnorm | 2048x32768 | bfloat16 | fwd | res-fwd<=32768 | 185 us (97%) | 1.51x |" in text
    assert "| rmsnorm | 4096x16384 | float32 | bwd | bwd<=16384 | — |  |" in text


def test_report_host_table_from_host_csvs(tmp_path):
    """host.csv renders one row per (op, call): both host times, their ratio, the ratio with
    backward on the caller from host_caller.csv, and each side's CUDA-graph time ('—' if none)."""
    header = "op,mode,impl,host_us,host_us_min,host_us_max,graph_us\n"
    (tmp_path / "host.csv").write_text(header + "ln 8x256,fwd,triton_layers,40,38,45,6.5\n"
                                       "ln 8x256,fwd,torch,10,9,12,6.0\n"
                                       "cd 4x1024,fwd,triton_layers,50,48,52,15\ncd 4x1024,fwd,torch,200,190,210,nan\n")
    (tmp_path / "host_caller.csv").write_text(header + "ln 8x256,fwd,triton_layers,30,29,31,6.5\n"
                                              "ln 8x256,fwd,torch,12,11,13,6.0\n")
    text = report.render(str(tmp_path), str(tmp_path))
    assert "| ln 8x256 | fwd | 40 us (38-45) | 10 us (9-12) | 4.00x | 30 / 12 us = 2.50x | 6.5 us | 6.0 us |" in text
    assert "| cd 4x1024 | fwd | 50 us (48-52) | 200 us (190-210) | 0.25x | — | 15.0 us | — |" in text
    assert "median of 7 interleaved rounds of 300 calls" in text  # a CSV without the rounds, calls columns
    (tmp_path / "host.csv").write_text("op,mode,impl,rounds,calls,host_us,host_us_min,host_us_max,graph_us\n"
                                       "ln 8x256,fwd,triton_layers,3,50,40,38,45,6.5\nln 8x256,fwd,torch,3,50,10,9,12,6\n")
    assert "median of 3 interleaved rounds of 50 calls" in report.render(str(tmp_path), str(tmp_path))


def test_report_tp_tables(tmp_path):
    """tp_step.csv renders per run and mode with torch's step over ours (a tie by the spread) and
    the config read off the rows; tp_call_ab.csv, ours over torch's per run and their median per code."""
    (tmp_path / "tp_step.csv").write_text(
        "run,config,mode,impl,world,batch,seq_len,rounds,steps_per_round,step_ms,step_ms_min,step_ms_max,"
        "tokens_per_s,peak_mib,norm_us,comm_counts,comm_bytes,loss\n"
        "1,tiny,eager,torch,2,3,64,7,4,100,90,110,1920,10,80,all_gather_into_tensor=2,1048576,1.0\n"
        "1,tiny,eager,triton_layers,2,3,64,7,4,80,78,82,2400,9,50,all_gather_into_tensor=2,1048576,1.0\n"
        "1,tiny,compile,torch,2,3,64,7,4,50,45,60,3840,8,70,,nan,1.0\n"
        "1,tiny,compile,triton_layers,2,3,64,7,4,50,48,52,3840,8,40,,nan,1.0\n")
    (tmp_path / "tp_call_ab.csv").write_text(
        "call,order,code,config,case,impl,world,rounds,calls,host_us,host_us_min,host_us_max\n"
        "1,before1,old,tiny,rmsnorm,torch,2,7,300,100,90,110\n1,before1,old,tiny,rmsnorm,triton_layers,2,7,300,150,140,160\n"
        "1,after1,new,tiny,rmsnorm,torch,2,7,300,100,90,110\n1,after1,new,tiny,rmsnorm,triton_layers,2,7,300,110,100,120\n"
        "1,after2,new,tiny,rmsnorm,torch,2,7,300,200,190,210\n1,after2,new,tiny,rmsnorm,triton_layers,2,7,300,200,190,210\n")
    text = report.render(str(tmp_path), str(tmp_path))
    assert "A Llama-style decoder, tiny (batch 3 x 64 tokens)" in text
    assert ("| 1 | eager | triton_layers | 2 | 80.0 ms (78.0-82.0) | 2,400 | 1.25x | 50 us | 9 MiB | "
            "all_gather_into_tensor=2 | 1 MiB |") in text
    assert "| 1 | compile | triton_layers | 2 | 50.0 ms (48.0-52.0) | 3,840 | tie (0.87-1.25x) | 40 us | 8 MiB |  |  |" in text
    assert "| rmsnorm | old | 1.50 | 1.50x | 150 us |" in text
    assert "| rmsnorm | new | 1.10, 1.00 | 1.05x | 155 us |" in text
    # a run with the ratio paired within each round: its median and spread, not the medians'
    (tmp_path / "tp_step.csv").write_text(
        "run,config,mode,impl,world,batch,seq_len,rounds,steps_per_round,step_ms,step_ms_min,step_ms_max,"
        "tokens_per_s,peak_mib,norm_us,comm_counts,comm_bytes,loss,paired_ratio,paired_ratio_min,paired_ratio_max\n"
        "1,tiny,eager,torch,2,3,64,7,4,100,80,120,1920,10,80,,nan,1.0,,,\n"
        "1,tiny,eager,triton_layers,2,3,64,7,4,99,79,121,1939,9,50,,nan,1.0,1.02,1.01,1.04\n")
    assert "| 1 | eager | triton_layers | 2 | 99.0 ms (79.0-121.0) | 1,939 | 1.02x |" in \
        report.render(str(tmp_path), str(tmp_path))


def test_rounds_run_abba_and_pair_their_ratios():
    """train_loop.time_interleaved reverses the order every other round; paired_ratios takes
    their step over ours within each round (median, min, max)."""
    from benchmarks import train_loop

    order = []
    built = [train_loop.Variant("eager", impl, lambda impl=impl: order.append(impl)) for impl in ("torch", "ours")]
    train_loop.time_interleaved(built, 4, 1, False, "t")
    assert order == ["torch", "ours", "ours", "torch"] * 2
    built[0].times_ms, built[1].times_ms = [10.0, 12.0, 30.0], [10.0, 10.0, 31.0]
    assert train_loop.paired_ratios(*built) == (1.0, 30.0 / 31.0, 1.2)
    built[1].times_ms = [10.0]
    assert all(r != r for r in train_loop.paired_ratios(*built))  # a missing round: nan


def test_step_ratio_tie():
    ours = dict(step_ms=10.0, step_ms_min=9.0, step_ms_max=11.0)
    assert report.ratio_text(*report.step_ratio(dict(step_ms=20.0, step_ms_min=19.0, step_ms_max=21.0), ours)) == \
        "2.00x"
    assert report.ratio_text(*report.step_ratio(dict(step_ms=10.5, step_ms_min=10.0, step_ms_max=12.0), ours)) == \
        "tie (0.91-1.33x)"
    assert report.ratio_text(*report.step_ratio(dict(step_ms=20.0), dict(step_ms=10.0))) == "2.00x"  # no spread


def test_train_step_split_over_commands_keeps_both_configs(tmp_path):
    from benchmarks import train_loop

    harness.write_csv(_steps("B2 T16") + _steps("B4 T32"), str(tmp_path / "train_step.csv"))
    kept = train_loop.earlier_rows(str(tmp_path / "train_step.csv"), {"B2 T16"})
    assert list(map(repr, kept)) == list(map(repr, _steps("B4 T32")))  # (nan != nan: compared as text)
    assert train_loop.earlier_rows(str(tmp_path / "none.csv"), {"B2 T16"}) == []
    # a CSV from before the swapped column: its rows are kept, swapped takes its default
    text = (tmp_path / "train_step.csv").read_text().splitlines()
    (tmp_path / "old.csv").write_text("\n".join(line.rsplit(",", 1)[0] for line in text) + "\n")
    assert list(map(repr, train_loop.earlier_rows(str(tmp_path / "old.csv"), {"B2 T16"}))) == \
        list(map(repr, _steps("B4 T32")))


def test_old_csvs_render_a_dash_and_say_so(tmp_path):
    """Results from before gpu_us (eager times only, the train step without modes) still render."""
    with open(tmp_path / "layernorm.csv", "w") as f:
        f.write("op,shape,dtype,direction,impl,us,gbps,pct_copy,peak_mib\n"
                "layernorm,64x1024,bfloat16,fwd,triton_layers,50.0,2000.0,200.0,nan\n"
                "layernorm,64x1024,bfloat16,fwd,torch,40.0,2500.0,250.0,nan\n")
    with open(tmp_path / "train_step.csv", "w") as f:
        f.write("config,impl,batch,seq_len,step_ms,tokens_per_s,peak_mib,loss\n"
                "B2 T16,triton_layers,2,16,10.0,3200.0,500.0,5.5\n"
                "B2 T16,torch,2,16,20.0,1600.0,700.0,5.5\n"
                "B2 T16,torch-compile,2,16,8.0,4000.0,600.0,5.5\n")
    text = report.render(str(tmp_path), str(tmp_path))
    assert "Old method" in text and "compared by eager times (old method) for layernorm" in text
    assert "| 64x1024 | bfloat16 | fwd | — / 50 us (200%) | — / 40 us (250%) | 0.80x |" in text
    assert "| layernorm | 64x1024 | bfloat16 | fwd | — / 50 us | 200% | torch 40 us | 0.80x |" in text
    assert "| eager | triton_layers | 10.0 ms | 3,200 | 2.00x | 500 MiB | — | — | — | 5.5000 |" in text
    assert "| compile | torch | 8.0 ms | 4,000 |  | 600 MiB |" in text


@pytest.mark.parametrize("name, folder", [("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"),
                                          ("NVIDIA A100-SXM4-80GB", "a100"), ("NVIDIA GeForce RTX 4090",
                                                                            "geforce-rtx-4090")])
def test_gpu_folder(name, folder):
    assert report.gpu_folder(name) == folder


def test_results_default_to_a_folder_per_gpu(monkeypatch):
    opts = harness.parse_args("", [])
    monkeypatch.setattr(harness, "device_name", lambda: "NVIDIA H100 80GB HBM3")
    assert harness.results_dir(opts) == os.path.join(os.path.abspath(os.path.join(ROOT, "benchmarks")), "results",
                                                     "h100")
    assert harness.results_dir(harness.parse_args("", ["--out", "/x/y"])) == "/x/y"


def test_update_keeps_one_section_per_gpu_and_the_hand_written_text(tmp_path):
    results = tmp_path / "results"
    for gpu, name in (("h200", "NVIDIA H200"), ("h100", "NVIDIA H100 80GB HBM3")):
        (results / gpu).mkdir(parents=True)
        _fake_results(results / gpu, gpu=name)
    (results / "h200" / "headline.png").write_bytes(b"not drawn here")
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text("# Benchmarks\n\nhand-written intro\n")
    report.update(str(doc), str(results / "h200"))  # first one GPU, with its reasons below it
    doc.write_text(doc.read_text() + "\n### Why (H200)\n\nhand-written H200 reasons\n")
    assert report.update(str(doc), str(results)) == ["results/h100", "results/h200"]  # then every GPU
    first = doc.read_text()
    assert first.count(report.END) == 2 and first.startswith("# Benchmarks\n\nhand-written intro\n")
    h100, h200 = first.index("## H100: NVIDIA H100 80GB HBM3"), first.index("## H200: NVIDIA H200")
    assert h100 < h200 < first.index("hand-written H200 reasons")  # the new GPU's block went before
    assert first.endswith("hand-written H200 reasons\n")
    assert "python -m benchmarks.report results/h100 --update BENCHMARKS.md" in first
    assert "](results/h200/headline.png)" in first  # image links relative to the document
    doc.write_text(first.replace("## H200: NVIDIA H200\n", "## H200: NVIDIA H200\n\nstale\n"))
    report.update(str(doc), str(results))
    assert doc.read_text() == first  # regenerating rewrites the blocks only, and is idempotent


def test_plots_from_csvs(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from benchmarks import plots

    _fake_results(tmp_path)
    _fake_norms(tmp_path)
    # a recipes part (fp8): one figure of its ops, of the shapes that move bytes (the tiny one left out)
    (tmp_path / "fp8.csv").write_text(
        "op,shape,dtype,direction,impl,us,gpu_us,gpu_method,gbps,pct_copy,peak_mib\n"
        "rmsnorm_fp8_per_token,1024x4096,bfloat16,fwd,triton_layers,60,20,graph,600,60,nan\n"
        "rmsnorm_fp8_per_token,1024x4096,bfloat16,fwd,compile,70,30,graph,400,40,nan\n"
        "layernorm_fp8_per_token,1024x4096,bfloat16,fwd,triton_layers,60,25,graph,500,50,nan\n"
        "rmsnorm_fp8_per_token,1x4096,bfloat16,fwd,triton_layers,50,5,graph,2,0.2,nan\n")
    drawn = []
    real = plots.bars_panel
    monkeypatch.setattr(plots, "bars_panel", lambda ax, rows, *a, **k: (drawn.append(rows), real(ax, rows, *a, **k))[1])
    written = plots.plot_all(str(tmp_path))
    names = sorted(os.path.basename(p) for p in written)
    assert names == ["add_layernorm.png", "add_rmsnorm.png", "coor_descent.png", "fp8.png", "headline.png",
                     "layernorm.png", "rmsnorm.png", "softmax.png", "train_step.png"]
    fp8_bars = [rows for rows in drawn if rows and "recipe" in rows[0]]
    assert len(fp8_bars) == 1 and {(r["shape"], r["impl"]) for r in fp8_bars[0]} == \
        {("rmsnorm_fp8_per_token", "triton_layers"), ("rmsnorm_fp8_per_token", "compile"),
         ("layernorm_fp8_per_token", "triton_layers")}
    for path in written:
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    text = open(report.write_summary(str(tmp_path))).read()
    assert "![headline" in text and "(layernorm.png)" in text


def test_benchmarks_md_matches_its_csvs():
    """Each generated block of BENCHMARKS.md (one per GPU) is what the report makes of the CSVs it names."""
    path = os.path.join(ROOT, "BENCHMARKS.md")
    if not os.path.exists(path):
        pytest.skip("no BENCHMARKS.md")
    text = open(path).read()
    sources = [source for _, _, source in report._blocks(text)]
    assert sources and "benchmarks/results/h200" in sources
    for source in sources:
        assert report.render(os.path.join(ROOT, source), ROOT) in text, \
            f"regenerate: python -m benchmarks.report {source} --update BENCHMARKS.md"


class FakeEvent:
    """The parts of a torch.profiler FunctionEvent that harness.device_activity reads."""

    def __init__(self, name, device, us=0.0, kind=None, annotation=False, device_total=0.0):
        self.name, self.device_type, self.activity_type = name, device, kind
        self.is_user_annotation, self.device_time_total = annotation, device_total
        self.time_range = type("Range", (), {"elapsed_us": lambda self: us})()


def test_device_activity_sums_gpu_work_less_the_flush():
    cpu, cuda = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA
    events = [
        FakeEvent(harness.FLUSH_LABEL, cpu, device_total=30.0),  # the L2 flush's kernels: left out
        FakeEvent(harness.FLUSH_LABEL, cuda, 31.0, "gpu_user_annotation", annotation=True),
        FakeEvent("cudaLaunchKernel", cpu), FakeEvent("cudaLaunchKernel", cpu), FakeEvent("cudaGraphLaunch", cpu),
        FakeEvent("fill_kernel", cuda, 30.0, "kernel"), FakeEvent("ln_fwd", cuda, 12.0, "kernel"),
        FakeEvent("Memcpy DtoD", cuda, 3.0, "gpu_memcpy"), FakeEvent("aten::add", cpu),
        FakeEvent("old_torch_kernel", cuda, 5.0),  # no activity type (older torch): counted as a kernel
    ]
    assert harness.device_activity(events, exclude=harness.FLUSH_LABEL) == (20.0, 3, 3)
    # real profiler events (CPU only here: no GPU work) have the attributes it reads
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with torch.profiler.record_function(harness.FLUSH_LABEL):
            torch.ones(8).add_(1)
    assert harness.device_activity(prof.events(), exclude=harness.FLUSH_LABEL) == (0.0, 0, 0)


def test_gpu_time_takes_the_profiler_where_the_graph_capture_fails(monkeypatch, capsys):
    monkeypatch.setattr(harness, "gpu_timeline", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)
    monkeypatch.setattr(harness, "graph_replay_us", lambda make, grads=None, quick=False: 50.0)
    monkeypatch.setattr(harness, "profiled_kernel_us", lambda make, grads=None, quick=False: 70.0)
    assert harness.gpu_time_us(lambda: (lambda: None)) == (50.0, "graph")

    def uncapturable(make, grads=None, quick=False):
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    monkeypatch.setattr(harness, "graph_replay_us", uncapturable)
    assert harness.gpu_time_us(lambda: (lambda: None)) == (70.0, "profiler")
    assert "not capturable in a CUDA graph" in capsys.readouterr().err
    monkeypatch.setattr(harness, "profiled_kernel_us", uncapturable)
    us, method = harness.gpu_time_us(lambda: (lambda: None))
    assert math.isnan(us) and method == ""
    monkeypatch.setattr(harness, "gpu_timeline", lambda: False)  # the CPU: no GPU time at all
    us, method = harness.gpu_time_us(lambda: (lambda: None))
    assert math.isnan(us) and method == ""


def _dry_run(monkeypatch):
    """Make harness and the benchmarks run on CPU at tiny shapes: fake timers, a fake CUDA-graph
    time (the profiler's is a fallback of it), compile peers eager, a tiny training step."""
    from benchmarks import bench_train_step, train_loop

    monkeypatch.setattr(harness, "require_cuda", lambda: torch.device("cpu"))
    monkeypatch.setattr(harness, "device", lambda: torch.device("cpu"))
    monkeypatch.setattr(harness, "copy_bandwidth_gbps", lambda device: COPY)
    monkeypatch.setattr(harness, "time_us", lambda fn, grad_to_none=None, quick=False: (fn(), 100.0)[1])
    monkeypatch.setattr(harness, "peak_memory_mib", lambda fn: (fn(), 1.0)[1])
    monkeypatch.setattr(harness, "gpu_timeline", lambda: True)
    monkeypatch.setattr(harness, "graph_replay_us", lambda make, grad_to_none=None, quick=False: (make(), 50.0)[1])
    monkeypatch.setattr(harness, "compiled", lambda fn: fn)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)
    for part in parts.parts():  # each op part at the tiny shapes its PART declares for this run
        if part.ops:
            monkeypatch.setattr(importlib.import_module(part.module), "QUICK_SHAPES", list(part.cpu_shapes))
    tiny = bench_train_step.TrainConfig(2, dict(seq_len=16, dim=32, heads=2, depth=1, heavy_tokens=4), 1)
    monkeypatch.setattr(bench_train_step, "CONFIGS", {"small": tiny, "large": tiny})
    # the training-step loop (train_loop, shared with bench_llama_step): no compile, one warm-up step
    monkeypatch.setattr(train_loop, "compile_model", lambda model, mode: model)
    monkeypatch.setattr(train_loop, "WARMUP", dict.fromkeys(train_loop.MODES, 1))
    measure = train_loop.measure
    measured = []  # the names of the configs the shared loop measured

    def recording(setup, variants, rounds, profiled_steps, name, progress=harness.no_progress):
        measured.append(name)
        return measure(setup, variants, rounds, profiled_steps, name, progress)

    monkeypatch.setattr(train_loop, "measure", recording)
    # the model's kernel path is tested in test_train_example (the interpreter takes ~0.5 s a step):
    # here our layers take the reference path, and fewer rounds
    monkeypatch.setattr(bench_train_step, "USE_TRITON", False)
    monkeypatch.setattr(bench_train_step, "ROUNDS", {True: 2, False: 2})
    return measured


TRAIN_COLUMNS = ["config", "mode", "impl", "step_ms", "step_ms_min", "step_ms_max", "tokens_per_s", "peak_mib",
                 "gpu_busy_pct", "launches_per_step"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU dry run; on a GPU run python -m benchmarks")
def test_dry_run_of_every_part_on_cpu(tmp_path, monkeypatch):
    measured = _dry_run(monkeypatch)
    names = [name for name in run_all.PARTS if name != "llama_step"]  # llama_step: a test of its own
    # split over two commands into one folder, as a short GPU session may need
    options = ["--quick", "--dtypes", "float32", "--no-plots", "--out", str(tmp_path), "--ops"]
    assert run_all.main(options + [names[0]]) == 0
    rc = run_all.main(options + [",".join(names[1:])])
    env = json.load(open(tmp_path / "env.json"))
    assert rc == 0 and env["errors"] == {}, env["errors"]
    assert set(env["wall_s"]) == set(names)  # the first command's part is kept
    assert env["command"].count("python -m benchmarks") == 2
    for op in (name for name in names if parts.part(name).ops):
        rows = report.read_csv(str(tmp_path / f"{op}.csv"))
        ours = [r for r in rows if r["impl"].startswith("triton_layers")]
        # every case of ours ran (a kernel failure would be a nan time: try_peer swallows it)
        assert ours and all(math.isfinite(r["us"]) for r in ours), op
        assert any(not r["impl"].startswith("triton_layers") for r in rows), op  # peers in the same run
        # the GPU time of the same call beside the eager one, and the bandwidth from it
        assert all(r["gpu_us"] == 50.0 and r["gpu_method"] == "graph" for r in rows if math.isfinite(r["us"])), op
    for r in report.read_csv(str(tmp_path / "layernorm.csv")):  # bytes model over the GPU time
        nbytes = {"fwd": 2, "bwd": 3}[r["direction"]] * 3 * 40 * {"bfloat16": 2, "float32": 4}[r["dtype"]]
        assert r["gbps"] == pytest.approx(nbytes / 50.0 / 1e3) and r["pct_copy"] == pytest.approx(100 * r["gbps"] / COPY)
    rows = report.read_csv(str(tmp_path / "train_step.csv"))
    assert measured == ["train_step small"]  # through the loop shared with llama_step
    assert list(rows[0])[:3] == TRAIN_COLUMNS[:3] and set(TRAIN_COLUMNS) <= set(rows[0])
    assert [(r["mode"], r["impl"]) for r in rows] == [
        (mode, impl) for mode in ("eager", "compile", "cudagraphs") for impl in ("torch", "triton_layers")]
    assert all(r["rounds"] == 2 and math.isfinite(r["step_ms"]) and r["step_ms_min"] <= r["step_ms"] <= r["step_ms_max"]
               for r in rows)
    # no GPU: no memory or profile figures, and nothing pretends otherwise
    assert all(math.isnan(r["peak_mib"]) and math.isnan(r["gpu_busy_pct"]) for r in rows)
    # the same weights and batch: every variant starts from the same loss
    assert all(r["loss"] == pytest.approx(rows[0]["loss"], rel=1e-2) for r in rows)
    summary = open(tmp_path / "summary.md").read()
    assert "### Where we are below" in summary and "| cudagraphs | triton_layers |" in summary
    for op in ("rmsnorm", "add_rmsnorm", "add_layernorm"):  # norms.csv: an op of its own each
        assert f"### {parts.op_info(op).title}" in summary and f"| {op} | 3x40 | float32 |" in summary
    for op in parts.ops():  # every op of every part: its section, under its declared title
        assert f"### {op.title}" in summary, op.name


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU dry run")
def test_single_scripts_on_cpu(tmp_path, monkeypatch, capsys):
    """A bench file run alone (its tables on stdout), restoring the launch settings."""
    from benchmarks import bench_softmax
    from triton_layers import launch_config

    _dry_run(monkeypatch)
    harness.run_alone(bench_softmax, bench_softmax._targets, argv=["--quick", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "## softmax on cpu" in out and "| 2x33x33 | bfloat16 | fwd | 50 us, " in out
    assert "## softmax targets (GPU time)" in out and "| 2x33x33 | float32 | bwd |" in out
    rows = report.read_csv(str(tmp_path / "softmax.csv"))
    assert len(rows) == 2 * 2 * len({r["impl"] for r in rows}) >= 2 * 2 * 6  # dtypes x dirs x impls

    assert launch_config.current() is launch_config.DEFAULT


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU dry run")
def test_norms_alone_and_its_row_limits_sweep_on_cpu(tmp_path, monkeypatch, capsys):
    """bench_norms alone: a table per op, each op's peers only; --sweep-row-limits: ours under the
    default and each row limit, at the shapes it moves to another path only, the default restored after."""
    from benchmarks import bench_norms
    from triton_layers import launch_config

    _dry_run(monkeypatch)
    options = ["--quick", "--dtypes", "float32", "--out", str(tmp_path)]
    bench_norms.main(options)
    out = capsys.readouterr().out
    for op in ("rmsnorm", "add_rmsnorm", "add_layernorm"):
        assert f"## {op} on cpu" in out and "| 3x40 | float32 | bwd | 50 us, " in out
    rows = report.read_csv(str(tmp_path / "norms.csv"))
    impls = {op: [r["impl"] for r in rows if r["op"] == op and r["direction"] == "fwd"]
             for op in ("rmsnorm", "add_rmsnorm", "add_layernorm")}
    liger = ["liger"] if bench_norms._liger() is not None else []
    assert impls == {"rmsnorm": ["triton_layers", "torch", "compile"] + liger,
                     "add_rmsnorm": ["triton_layers", "torch", "compile"] + liger,
                     "add_layernorm": ["triton_layers", "torch", "compile"]}  # Liger has no fused add + LayerNorm
    assert all(math.isfinite(r["us"]) for r in rows)
    for r in rows:  # the bytes models over the GPU time
        nbytes = {("rmsnorm", "fwd"): 2, ("rmsnorm", "bwd"): 3}.get((r["op"], r["direction"]), 4) * 3 * 40 * 4
        assert r["gbps"] == pytest.approx(nbytes / 50.0 / 1e3), (r["op"], r["direction"])

    seen = []  # (op, the row limits) that each call of ours ran under
    for op in ("rmsnorm", "add_rmsnorm"):
        def recording(*args, op=op, ours=bench_norms.OURS_BY_OP[op]):
            limits = launch_config.current().layer_norm
            seen.append((op, limits.bwd_rms_max_fused_cols, limits.fwd_residual_max_fused_cols))
            return ours(*args)

        monkeypatch.setitem(bench_norms.OURS_BY_OP, op, recording)
    # limits that move rows of 40 columns (not of 8) to the other path, at full shapes even with --quick
    monkeypatch.setattr(bench_norms, "SHAPES", [(3, 8), (3, 40)])
    monkeypatch.setattr(bench_norms, "ROW_LIMITS", {"bwd<=32": ("rmsnorm", "bwd_rms_max_fused_cols", 32),
                                                    "res-fwd<=32": ("add_rmsnorm", "fwd_residual_max_fused_cols", 32)})
    bench_norms.main(["--sweep-row-limits"] + options)
    rows = report.read_csv(str(tmp_path / "norms_row_limits.csv"))
    assert [(r["op"], r["shape"], r["direction"], r["impl"]) for r in rows] == [
        (op, f"3x40 {name}", direction, "triton_layers")
        for op, names in (("rmsnorm", ("default", "bwd<=32")), ("add_rmsnorm", ("default", "res-fwd<=32")))
        for name in names for direction in ("fwd", "bwd")]
    assert all(math.isfinite(r["us"]) for r in rows)
    assert set(seen) == {("rmsnorm", 16384, 32768), ("rmsnorm", 32, 32768),
                         ("add_rmsnorm", 16384, 32768), ("add_rmsnorm", 16384, 32)}
    assert launch_config.current() is launch_config.DEFAULT


class StandInLigerRMSNorm(torch.nn.Module):
    """LigerRMSNorm's constructor and the Llama RMSNorm's math in torch: the liger variant's swap,
    rows and report on a machine where liger_kernel is not installed (or has no GPU to run on)."""

    def __init__(self, hidden_size, eps=1e-6, casting_mode="llama"):
        super().__init__()
        self.weight, self.variance_epsilon = torch.nn.Parameter(torch.ones(hidden_size)), eps

    def forward(self, x):
        h = x.float()
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)).to(x.dtype)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU dry run; on a GPU run python -m benchmarks")
def test_llama_step_dry_run_on_cpu(tmp_path, monkeypatch, capsys):
    """The Hugging Face Llama's training step through python -m benchmarks: a tiny config (--quick),
    fp32 on the CPU, compile modes run eagerly, a stand-in for Liger's RMSNorm."""
    pytest.importorskip("transformers")
    from benchmarks import bench_llama_step

    measured = _dry_run(monkeypatch)
    monkeypatch.setattr(bench_llama_step, "USE_TRITON", False)  # our layers' kernels: their own tests
    monkeypatch.setattr(bench_llama_step, "KERNELS_USE_TRITON", False)
    monkeypatch.setattr(bench_llama_step, "liger_rms_norm", lambda: StandInLigerRMSNorm)
    assert run_all.main(["--quick", "--no-plots", "--out", str(tmp_path), "--ops", "llama_step"]) == 0
    assert measured == ["llama_step tiny"]  # the loop bench_train_step uses
    assert "triton_layers.convert() replaced" in capsys.readouterr().out  # said, whatever convert() swaps
    rows = report.read_csv(str(tmp_path / "llama_step.csv"))
    assert list(rows[0])[:3] == TRAIN_COLUMNS[:3] and set(TRAIN_COLUMNS) <= set(rows[0])
    assert [(r["mode"], r["impl"]) for r in rows] == [
        ("eager", "hf"), ("eager", "triton_layers"), ("eager", "liger"),
        ("compile", "hf"), ("compile", "triton_layers"), ("compile", "liger"), ("compile", "triton_layers-kernels")]
    assert {r["config"] for r in rows} == {"B2 T32 d64 L2 h4 kv2 ffn176 V512 float32"}
    assert all(r["rounds"] == 2 and r["step_ms_min"] <= r["step_ms"] <= r["step_ms_max"] for r in rows)
    assert all(r["tokens_per_s"] == pytest.approx(64 / (r["step_ms"] / 1e3)) for r in rows)
    assert all(math.isnan(r["peak_mib"]) and math.isnan(r["gpu_busy_pct"]) for r in rows)  # no GPU: none
    # hf swaps nothing, Liger all 2 * layers + 1 RMSNorms; convert() what it knows (none before the norms)
    swapped = {r["impl"]: r["swapped"] for r in rows}
    assert swapped["hf"] == 0 and swapped["liger"] == 5 and 0 <= swapped["triton_layers"] <= 5
    assert swapped["triton_layers-kernels"] == swapped["triton_layers"]
    # one state_dict and one batch: every variant starts from the same loss
    assert all(r["loss"] == pytest.approx(rows[0]["loss"], rel=1e-5) for r in rows)
    summary = open(tmp_path / "summary.md").read()
    assert "of a Hugging Face Llama" in summary and "| mode | impl | step | tokens/s | hf / this |" in summary
    assert "| compile | liger |" in summary and "| hf / this |" in summary
    assert "our kernels kept under compile" in summary and "| compile | triton_layers-kernels |" in summary


def test_llama_step_options_and_missing_transformers(monkeypatch, capsys):
    from benchmarks import bench_llama_step

    opts = run_all.parse_args(["--ops", "llama_step", "--llama-modes", "eager,cudagraphs"])
    assert bench_llama_step.modes(opts) == ["eager", "cudagraphs"]
    assert bench_llama_step.modes(run_all.parse_args(["--ops", "llama_step", "--no-compile"])) == ["eager"]
    assert bench_llama_step.modes(run_all.parse_args(["--ops", "llama_step"])) == ["eager", "compile"]
    with pytest.raises(SystemExit):
        run_all.parse_args(["--ops", "llama_step", "--llama-modes", "eager,turbo"])
    assert "turbo" in capsys.readouterr().err
    # the liger rows only where liger_kernel imports
    assert bench_llama_step.impls()[:2] == ["hf", "triton_layers"]
    assert ("liger" in bench_llama_step.impls()) == (bench_llama_step.liger_rms_norm() is not None)
    monkeypatch.setitem(sys.modules, "transformers", None)  # import fails
    monkeypatch.setattr(harness, "require_cuda", lambda: torch.device("cpu"))
    with pytest.raises(SystemExit, match="needs Hugging Face transformers"):
        bench_llama_step.main(["--quick"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU dry run")
def test_bench_host_dry_run(monkeypatch, capsys):
    """bench_host's loop on the CPU: every op, ours and torch's, forward and forward + backward,
    interleaved rounds, and the GPU time through the harness (faked here as in _dry_run)."""
    from benchmarks import bench_host

    _dry_run(monkeypatch)
    monkeypatch.setattr(bench_host, "CALLS", 1)
    monkeypatch.setattr(bench_host, "ROUNDS", 2)
    monkeypatch.setattr(bench_host, "WARMUP", 1)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)
    rows = bench_host.measure(torch.device("cpu"))
    assert len(rows) == 5 * 3 * 2  # ops x (fwd, fwd+bwd, fwd no_grad) x (ours, torch's)
    assert [r["mode"] for r in rows[:6]] == ["fwd", "fwd", "fwd+bwd", "fwd+bwd", "fwd no_grad", "fwd no_grad"]
    assert {r["impl"] for r in rows} == {"triton_layers", "torch"}
    assert all(r["host_us_min"] <= r["host_us"] <= r["host_us_max"] for r in rows)
    assert all(r["graph_us"] == 50.0 for r in rows)  # _dry_run's CUDA-graph time
    bench_host.print_table(rows)
    assert "coor_descent 4x1024, 20 iters" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU dry run")
def test_bench_host_parts_dry_run(monkeypatch):
    """bench_host --parts on the CPU (the launches through the interpreter): every part of PARTS
    but the C launcher's (a GPU's), interleaved rounds, in PARTS' order."""
    from benchmarks import bench_host

    monkeypatch.setattr(bench_host, "CALLS", 1)
    monkeypatch.setattr(bench_host, "ROUNDS", 2)
    monkeypatch.setattr(bench_host, "WARMUP", 1)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)
    rows = bench_host.measure_parts(torch.device("cpu"))
    names = [name for name, _, _ in bench_host.PARTS]
    assert [r["part"] for r in rows] == [n for n in names if n != "launch, C launcher alone"]
    assert all(r["host_us_min"] <= r["host_us"] <= r["host_us_max"] and r["rounds"] == 2 for r in rows)


def test_host_parts_table_subtracts_the_next_layer():
    """report's host_parts table: each nested layer adds its time less the next measured layer's
    (a missing layer skipped), fixed costs add nothing, every row over torch's whole op."""
    def row(part, us, nested=1.0):
        return dict(part=part, what="w", nested=nested, rounds=7.0, calls=300.0, host_us=us, host_us_min=us,
                    host_us_max=us)

    rows = [row("torch F.layer_norm", 20.0, 0.0), row("functional.layer_norm", 70.0),
            row("kernel op (KERNELS.norm)", 55.0), row("forward launcher", 35.0),
            row("launch, cached (_FastLaunch)", 15.0), row("launch, C launcher alone", 6.0),
            row("torch.empty_like", 4.0, 0.0)]
    cells = {line.split(" | ")[0][2:]: line.split(" | ") for line in report.host_parts_table(rows) if line.startswith("| ")}
    assert cells["functional.layer_norm"][3] == "15.0 us" and cells["functional.layer_norm"][4] == "3.50x |"
    assert cells["kernel op (KERNELS.norm)"][3] == "20.0 us"  # down to the launcher: the Function's row is absent
    assert cells["launch, C launcher alone"][3] == "6.0 us"
    assert cells["torch.empty_like"][3] == report.DASH


def test_cast_kernels_counts_only_pure_casts():
    """cast_kernels' pattern: Inductor's cast-only kernels, not kernels that fuse a cast into other work."""
    from benchmarks.dev import cast_kernels
    pure = ["triton_poi_fused__to_copy_0", "triton_poi_fused__to_copy_view_4", "triton_poi_fused__to_copy"]
    fused = ["triton_poi_fused__to_copy_add_mul_3", "triton_poi_fused__to_copy_t_1", "triton_red_fused__to_copy_sum_2"]
    assert all(cast_kernels.CAST.fullmatch(name) for name in pure)
    assert not any(cast_kernels.CAST.fullmatch(name) for name in fused)


def test_registers_tool_builds_the_benchmark_forms_offline():
    """benchmarks.dev.registers on one small case of every kernel op, in a process without the
    interpreter: each kernel form planned for the forward and the backward gets a row with its
    registers and spills (built for sm_90 on this machine, GPU or not)."""
    from triton_layers.kernels import ops as kernel_ops

    code = ("from benchmarks.dev import registers as r\n"
            "for op in r.kernel_ops(): print('## ' + op, flush=True); "
            "r.main(['--ops', op, '--shapes', '64x256', '--dtypes', 'float32'])")
    env = dict(os.environ, TRITON_INTERPRET="0")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    kernels = {}  # kernel op -> the kernels of its rows
    for line in proc.stdout.splitlines():
        if line.startswith("## "):
            op = line[3:]
            kernels[op] = set()
        elif line.startswith("| ") and not line.startswith(("| case", "|---")):
            row = line.split(" | ")
            assert "failed" not in line and int(row[3]) > 0, line
            kernels[op].add(row[2])
    assert set(kernels) == set(kernel_ops.__all__)
    for op, names in kernels.items():  # its forward and its backward planned and built
        assert any("_fwd" in k for k in names) and any("_bwd" in k for k in names), (op, names)


def test_every_tuning_script_has_a_cpu_dry_run():
    """Each ``benchmarks/dev/tune_<op>.py`` is run with the timers patched out (tests/fake_timer.py)
    by a test of its op's own file, which checks that each combination of its grids runs under
    its knobs: a tuning script no test runs fails here."""
    folder = os.path.join(ROOT, "benchmarks", "dev")
    scripts = [f[:-len(".py")] for f in os.listdir(folder) if f.startswith("tune_") and f.endswith(".py")]
    tests = "".join(open(os.path.join(ROOT, "tests", f)).read() for f in os.listdir(os.path.join(ROOT, "tests"))
                    if f.startswith("test_") and f.endswith(".py"))
    missing = [s for s in scripts if f"{s}.main(" not in tests]
    assert scripts and not missing, f"tuning scripts no test runs: {missing}"


def test_host_ab_compares_ours_over_torch_in_abba_pairs(monkeypatch, tmp_path):
    """``bench_host --against``: runs alternate which checkout goes first, and each call's change
    is (ours/torch after) over (ours/torch before), per pair: a host that drifts by the same
    factor for both implementations in a run changes nothing."""
    from benchmarks import bench_host

    order = []
    drift = iter([1.0, 1.3, 0.9, 1.1])  # each run's host speed, whatever the checkout

    def fake_run(checkout, out):
        order.append(checkout)
        d = next(drift)
        ours = 20.0 if checkout == "old" else 22.0  # the change: 10% more host time than before
        return {("ln", "fwd", "triton_layers"): ours * d, ("ln", "fwd", "torch"): 10.0 * d}

    monkeypatch.setattr(bench_host, "_run_in", fake_run)
    rows = bench_host.compare("old", "new", 2, str(tmp_path))
    assert order == ["old", "new", "new", "old"]
    (row,) = rows
    assert row["pairs"] == 2 and abs(row["change"] - 1.1) < 1e-9
    assert abs(row["change_min"] - 1.1) < 1e-9 and abs(row["change_max"] - 1.1) < 1e-9


def test_registers_takes_the_benchmarks_op_names():
    """``benchmarks.dev.registers --ops layernorm`` (python -m benchmarks's name) means the norm
    kernel op; an unknown name is a usage error naming the known ones (a KeyError before)."""
    from benchmarks.dev import registers

    assert registers.op_names("layernorm,softmax,norms") == ["norm", "softmax", "residual_norm"]
    with pytest.raises(KeyError, match="unknown op 'layer_norm'.*known: norm"):
        registers.op_names("layer_norm")
    with pytest.raises(SystemExit):
        registers.main(["--ops", "nope"])


def test_decode_bench_dry_run(tmp_path, monkeypatch, capsys):
    """benchmarks/bench_decode.py at tiny shapes on the CPU: ours and the peers, forward only,
    every case with its GPU-time column."""
    from benchmarks import bench_decode

    _dry_run(monkeypatch)
    monkeypatch.setattr(bench_decode, "QUICK_SHAPES", [(3, 40), (4, 16)])
    monkeypatch.setattr(bench_decode, "HIDDEN_SHAPES", [(3, 40)])
    monkeypatch.setattr(bench_decode, "QUICK_CHAIN_SHAPES", [(2, 32)])
    monkeypatch.setattr(bench_decode, "QUICK_QK_STRIDED_SHAPES", [(3, 6, 16)])
    bench_decode.main(["--quick", "--dtypes", "float32", "--out", str(tmp_path)])
    rows = report.read_csv(str(tmp_path / "decode_norms.csv"))
    assert {r["op"] for r in rows} == {"rmsnorm", "add_rmsnorm", "layernorm", "chain", "norm_chain",
                                       "qk_rmsnorm_strided"}
    assert {r["shape"] for r in rows if r["op"] == "qk_rmsnorm_strided"} == {"3x6x16 strided"}
    chain = {r["impl"] for r in rows if r["op"] == "chain"}
    assert {"triton_layers", "triton_layers_no_pdl", "torch", "matmul_only"} <= chain
    # the chain's per-call figure: (chain - matmul_only) / (layers + 1), every implementation but the base
    out = capsys.readouterr().out
    assert "a norm call adds to the chain" in out and "2x32 triton_layers_no_pdl: 0.00" in out
    assert {r["direction"] for r in rows} == {"fwd"}
    assert {"triton_layers", "torch"} <= {r["impl"] for r in rows}
    assert {r["shape"] for r in rows if r["op"] == "add_rmsnorm"} == {"3x40"}  # QK-norm shapes: no residual
    assert {r["shape"] for r in rows if r["op"] == "layernorm"} == {"3x40"}  # (nor LayerNorm)
    assert {"triton_layers", "torch", "compile"} <= {r["impl"] for r in rows if r["op"] == "layernorm"}
    # every case that ran has its GPU time (a peer that needs a GPU, Liger where installed,
    # fails here: a nan time)
    assert all(r["gpu_us"] == 50.0 for r in rows if math.isfinite(r["us"]))
    assert all(math.isfinite(r["us"]) for r in rows if r["impl"] in ("triton_layers", "torch"))


def test_fp8_bench_dry_run(tmp_path, monkeypatch, capsys):
    """benchmarks/bench_fp8.py at its tiny shape on the CPU: every recipe's op, ours and the peers
    side by side in fp8.csv (FlashInfer on the static ops only, where it imports), bf16 alone by
    default, each op's bytes model, and no output that the case's check finds wrong."""
    from benchmarks import bench_fp8

    _dry_run(monkeypatch)  # QUICK_SHAPES: the PART's cpu_shapes, (3, 256)
    bench_fp8.main(["--quick", "--out", str(tmp_path)])
    assert "WARNING" not in capsys.readouterr().err
    rows = report.read_csv(str(tmp_path / "fp8.csv"))
    assert list(dict.fromkeys(r["op"] for r in rows)) == list(bench_fp8.OPS) == [op.name for op in parts.part("fp8").ops]
    assert {(r["shape"], r["dtype"], r["direction"]) for r in rows} == {("3x256", "bfloat16", "fwd")}
    flashinfer = ["flashinfer"] if bench_fp8._flashinfer() is not None else []
    for op in bench_fp8.OPS:
        assert [r["impl"] for r in rows if r["op"] == op] == [
            "triton_layers", "unfused", "unfused_compiled_quant", "compile"] + (flashinfer if "static" in op else []), op
    assert all(math.isfinite(r["us"]) and r["gpu_us"] == 50.0 for r in rows if r["impl"] != "flashinfer")
    # M=3, D=256, s=2: x (768 elements: 1536 bytes; with the residual x, r, h: 4608), the FP8 data (768),
    # the fp32 scales (a row: 12; a 128-column group: 24; the tensor: 4), the weight (512; and the bias: 1024)
    expected = {"rmsnorm_fp8_per_token": 1536 + 768 + 12 + 512, "rmsnorm_fp8_per_tensor": 1536 + 768 + 4 + 512,
                "rmsnorm_fp8_static": 1536 + 768 + 4 + 512, "rmsnorm_fp8_per_group": 1536 + 768 + 24 + 512,
                "rmsnorm_fp8_per_group_colmajor": 1536 + 768 + 24 + 512,
                # + the transposed copy: its data (768) and a scale per column and 128-row block (256 * 4)
                "rmsnorm_fp8_per_group_transposed": 1536 + 768 + 24 + 512 + 768 + 1024,
                "add_rmsnorm_fp8_per_token": 4608 + 768 + 12 + 512, "add_rmsnorm_fp8_static": 4608 + 768 + 4 + 512,
                "layernorm_fp8_per_token": 1536 + 768 + 12 + 1024}
    for r in rows:
        assert r["gbps"] == pytest.approx(expected[r["op"]] / 50.0 / 1e3), (r["op"], r["impl"])
    # a full run: the training and decode shapes, every op, bf16 unless --dtypes names others
    keys = bench_fp8.cases(harness.parse_args("", []))
    decode = {(m, d) for d in (4096, 8192) for m in (1, 8, 64, 512)}
    assert {shape for _, _, shape in keys} == {(16384, 4096), (4096, 8192)} | decode
    assert len(keys) == len(bench_fp8.OPS) * 10 and {dtype for _, dtype, _ in keys} == {torch.bfloat16}
    assert {dtype for _, dtype, _ in bench_fp8.cases(harness.parse_args("", ["--dtypes", "float32"]))} == {
        torch.float32}


def test_only_times_the_named_tables(tmp_path, monkeypatch):
    """``--only``: a part too long for one sitting runs in pieces, each CSV holding the named ops alone."""
    from benchmarks import bench_fp8

    _dry_run(monkeypatch)
    bench_fp8.main(["--quick", "--no-compile", "--out", str(tmp_path), "--only",
                    "rmsnorm_fp8_static,layernorm_fp8_per_token"])
    rows = report.read_csv(str(tmp_path / "fp8.csv"))
    assert list(dict.fromkeys(r["op"] for r in rows)) == ["rmsnorm_fp8_static", "layernorm_fp8_per_token"]


def test_fp8_bench_help_needs_no_gpu():
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    out = subprocess.run([sys.executable, "-m", "benchmarks.bench_fp8", "--help"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert all(option in out.stdout for option in ("--quick", "--dtypes", "--out", "--no-compile"))
    assert "Bytes model" in out.stdout and "rmsnorm_fp8_per_token" in out.stdout


def test_host_ab_compare_gives_both_changes(monkeypatch, tmp_path):
    """bench_host --against: per call the change of ours/torch and of ours alone, over ABBA pairs
    (a "before" process twice as slow at everything leaves ours/torch at 1 and ours alone at 0.5)."""
    from benchmarks import bench_host

    runs = {"old": {("ln", "fwd", "triton_layers"): 20.0, ("ln", "fwd", "torch"): 10.0},
            "new": {("ln", "fwd", "triton_layers"): 10.0, ("ln", "fwd", "torch"): 5.0}}
    order = []
    monkeypatch.setattr(bench_host, "_run_in", lambda path, out: order.append(path) or runs[path])
    (row,) = bench_host.compare("old", "new", 2, str(tmp_path))
    assert order == ["old", "new", "new", "old"]  # ABBA
    assert row["change"] == row["change_min"] == row["change_max"] == 1.0
    assert row["ours_change"] == row["ours_change_min"] == row["ours_change_max"] == 0.5


def test_repeats_take_turns_and_keep_the_median_and_spread(tmp_path, monkeypatch):
    """``--repeats 3``: each cell timed three times, the rounds over a case's cells in A B, B A,
    A B order; the CSV keeps the median GPU time with its min and max, and % of copy follows the
    median. The report calls a ratio whose spread crosses 1 a tie, in the op's table and in the
    list below it (not among the rows slower than a peer)."""
    from benchmarks import bench_decode, bench_norms

    _dry_run(monkeypatch)
    order, times = [], {"triton_layers": iter([50.0, 40.0, 70.0]), "torch": iter([45.0, 60.0, 44.0])}
    called = []

    def named(name, fn):  # (an implementation that says which one ran)
        return lambda *args: (called.append(name), fn(*args))[1]

    def timed(make, grad_to_none=None, quick=False):
        make()()
        order.append(called[-1])
        return next(times[called[-1]]), "graph"

    monkeypatch.setattr(harness, "gpu_time_us", timed)
    monkeypatch.setattr(bench_decode, "cases", lambda opts: [("rmsnorm", torch.float32, (3, 40))])
    monkeypatch.setattr(bench_decode, "implementations", lambda opts: {
        impl: {"rmsnorm": named(impl, fns["rmsnorm"])}
        for impl, fns in (("triton_layers", bench_norms.OURS_BY_OP), ("torch", bench_norms.TORCH))})
    bench_decode.main(["--dtypes", "float32", "--out", str(tmp_path), "--repeats", "3"])
    assert order == ["triton_layers", "torch", "torch", "triton_layers", "triton_layers", "torch"]
    rows = {r["impl"]: r for r in report.read_csv(str(tmp_path / "decode_norms.csv"))}
    ours, theirs = rows["triton_layers"], rows["torch"]
    assert (ours["gpu_us"], ours["gpu_us_min"], ours["gpu_us_max"]) == (50.0, 40.0, 70.0)
    assert (theirs["gpu_us"], theirs["gpu_us_min"], theirs["gpu_us_max"]) == (45.0, 44.0, 60.0)
    assert ours["pct_copy"] == pytest.approx(100 * 2 * 3 * 40 * 4 / 50.0 / 1e3 / COPY)
    text = "\n".join(report.op_tables("decode_norms", list(rows.values())))
    assert "tie (0.63-1.50x)" in text  # 45/50 by the medians; 44/70 to 60/40
    below = "\n".join(report.below({"rmsnorm": list(rows.values())}))
    assert "Ties, the fastest peer ahead by the median (1 rows" in below
    assert "Slower than the fastest peer (0 rows" in below
