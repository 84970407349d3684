"""PNG plots from a results folder's CSVs: ``python -m benchmarks.plots DIR``.

Writes into DIR, for each CSV found (the ops and how each is measured: what the bench files
declare, benchmarks/parts.py):
- ``<op>.png`` of each op measured by bandwidth: ``layernorm.png``, ``rmsnorm.png``,
  ``add_rmsnorm.png``, ``add_layernorm.png`` (the three from norms.csv), ``softmax.png``,
  ``weighted_sum.png``: GB/s (from the GPU time; from the eager time in CSVs from before gpu_us)
  against the row length, one panel per dtype (rows) and direction (columns; softmax: plain and
  causal), ours and every peer, with the copy bandwidth of the same run as a dashed ceiling;
- ``<op>.png`` of each op measured by time (``coor_descent.png``): forward and forward+backward
  time, and peak memory, per shape;
- ``<part>.png`` of a part whose ops are variants of one computation (``plot: "recipes"`` in its
  PART: ``fp8.png``): one panel per shape, each op's % of the copy bandwidth (from the GPU time)
  as grouped bars per implementation, the copy as a dashed ceiling at 100%;
- ``train_step.png``: tokens/s of each training-step mode and implementation, one panel per config;
- ``headline.png``: a 2x2 grid of the most telling panels (bf16 LayerNorm and WeightedSum
  forward, causal softmax forward, and the training step or else coor_descent).
Needs matplotlib (Agg backend), not torch or a GPU.
"""
from __future__ import annotations

import argparse
import math
import os
from typing import Optional

from benchmarks import parts
from benchmarks.report import copy_gbps, finite, impl_order, is_ours, load, train_rows, variant

# The ops by what their PART says they measure (benchmarks/parts.py): a GB/s figure, or a figure of times.
RECIPE_PARTS = tuple(p for p in parts.parts() if p.plot == "recipes")
_IN_RECIPES = {op.name for p in RECIPE_PARTS for op in p.ops}
BANDWIDTH_OPS = tuple(op.name for op in parts.ops() if op.measure == "bandwidth" and op.name not in _IN_RECIPES)
TIME_OPS = tuple(op.name for op in parts.ops() if op.measure == "time")
# One colour per implementation family, the same in every panel (ours stands out in red).
COLORS = {
    "triton_layers": "tab:red", "torch": "tab:blue", "compile": "tab:orange", "liger": "tab:green",
    "matmul": "tab:purple", "mul-sum": "tab:brown", "colt5-torch": "tab:blue", "colt5-compile": "tab:orange",
    "unfused": "tab:gray", "unfused_compiled_quant": "tab:olive",
    "colt5-triton": "tab:green",
}
DPI = 80  # keeps each PNG well under 100 KB


def _pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _color(impl: str) -> str:
    return COLORS.get(impl.removesuffix("-causal"), "tab:gray")


def row_length(shape: str) -> int:
    """The reduced (last) dimension of a shape written like 32768x1024 or 16x4096x4096."""
    return int(shape.split("x")[-1])


def _k(n: float) -> str:
    return f"{n / 1024:.0f}K" if n >= 1024 else f"{n:.0f}"


def bandwidth_panel(ax, rows: list[dict], dtype: str, direction: str, var: str, title: str) -> bool:
    """GB/s against row length of every impl of one variant, and the copy ceiling; False if no data."""
    rows = [r for r in rows if r["dtype"] == dtype and r["direction"] == direction and variant(r["impl"]) == var]
    if not rows:
        return False
    for impl in impl_order(rows):
        points = sorted((row_length(r["shape"]), r["gbps"]) for r in rows if r["impl"] == impl and finite(r["gbps"]))
        if points:
            ours = is_ours(impl)
            ax.plot(*zip(*points), marker="o", color=_color(impl), label=impl,
                    linewidth=2.5 if ours else 1.2, markersize=5 if ours else 3, zorder=3 if ours else 2)
    copy = copy_gbps(rows)
    if finite(copy):
        ax.axhline(copy, color="black", linestyle="--", linewidth=1, label=f"copy {copy:.0f} GB/s")
    lengths = sorted({row_length(r["shape"]) for r in rows})
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [_k(n) for n in lengths])
    ax.minorticks_off()
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("row length (elements)", fontsize=8)
    ax.set_ylabel("GB/s", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, loc="best")
    return True


def bandwidth_figure(plt, op: str, rows: list[dict], path: str) -> None:
    """One panel per dtype (row) and variant x direction (column)."""
    dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
    columns = [(var, d) for var in dict.fromkeys(variant(i) for i in impl_order(rows))
               for d in dict.fromkeys(r["direction"] for r in rows)]
    fig, axes = plt.subplots(len(dtypes), len(columns), figsize=(4 * len(columns), 3.2 * len(dtypes)),
                             squeeze=False)
    for i, dtype in enumerate(dtypes):
        for j, (var, direction) in enumerate(columns):
            name = f"{op} {var}".strip()
            if not bandwidth_panel(axes[i][j], rows, dtype, direction, var, f"{name} {dtype} {direction}"):
                axes[i][j].set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def bars_panel(ax, rows: list[dict], value: str, title: str, ylabel: str, log: bool = True) -> bool:
    """Grouped bars: one group per shape, one bar per impl, height = the ``value`` column."""
    rows = [r for r in rows if finite(r.get(value))]
    if not rows:
        return False
    shapes, impls = list(dict.fromkeys(r["shape"] for r in rows)), impl_order(rows)
    width = 0.8 / len(impls)
    for k, impl in enumerate(impls):
        xs, ys = [], []
        for s, shape in enumerate(shapes):
            match = [r[value] for r in rows if r["shape"] == shape and r["impl"] == impl]
            if match:
                xs.append(s + (k - (len(impls) - 1) / 2) * width)
                ys.append(match[0])
        ax.bar(xs, ys, width, color=_color(impl), label=impl, edgecolor="black" if is_ours(impl) else "none")
    ax.set_xticks(range(len(shapes)), shapes, fontsize=7)
    if log:
        ax.set_yscale("log")
    ax.set_title(title, fontsize=10)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=6)
    return True


def recipes_figure(plt, part: parts.Part, data: dict[str, list[dict]], path: str) -> bool:
    """A "recipes" part (the top): one panel per shape, a group of bars per op (its % of copy
    at that shape, one bar per implementation). False where no row has a % of copy."""
    rows = [dict(r, recipe=op.name) for op in part.ops for r in data.get(op.name, [])
            if finite(r.get("pct_copy"))]
    if not rows:
        return False
    # (the shapes that move bytes enough for % of copy to mean something: a sixteenth of the
    # largest's elements or more; the decode shapes' times are in the tables)
    size = {r["shape"]: math.prod(int(n) for n in r["shape"].split("x")) for r in rows}
    shapes = [s for s in dict.fromkeys(r["shape"] for r in rows) if 16 * size[s] >= max(size.values())]
    fig, axes = plt.subplots(len(shapes), 1, figsize=(12, 3.2 * len(shapes)), squeeze=False)
    for ax, shape in zip(axes[:, 0], shapes):
        at = [dict(r, shape=r["recipe"].removeprefix(part.name + "_")) for r in rows if r["shape"] == shape]
        bars_panel(ax, at, "pct_copy", f"{part.name}: {shape} {at[0]['dtype']} {at[0]['direction']}, % of copy "
                   "(higher is better)", "% of copy", log=False)
        ax.axhline(100, color="black", linestyle="--", linewidth=0.8)
        ax.tick_params(axis="x", labelrotation=15)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return True


def time_figure(plt, op: str, rows: list[dict], path: str) -> None:
    """An op measured by time (coor_descent): forward time, forward+backward time and
    forward+backward peak memory, per shape."""
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.4))
    fwd = [r for r in rows if r["direction"] == "fwd"]
    both = [r for r in rows if r["direction"] != "fwd"]
    bars_panel(axes[0], fwd, "us", f"{op} fwd: time (lower is better)", "us")
    bars_panel(axes[1], both, "us", f"{op} fwd+bwd: time", "us")
    if not bars_panel(axes[2], both, "peak_mib", f"{op} fwd+bwd: peak extra memory", "MiB"):
        axes[2].set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def train_panel(ax, rows: list[dict]) -> bool:
    """Horizontal bars of tokens/s per (mode, impl) of one config, the min-max of the step time as
    error bars, labelled with the median step time and peak memory."""
    rows = [r for r in train_rows(rows) if finite(r["tokens_per_s"])]
    if not rows:
        return False
    names = [f"{r['mode']} {r['impl']}" for r in rows]
    tokens = [r["tokens_per_s"] for r in rows]
    ax.barh(names, tokens, color=[_color(r["impl"]) for r in rows])
    for k, r in enumerate(rows):
        low, high = r.get("step_ms_min", float("nan")), r.get("step_ms_max", float("nan"))
        end = tokens[k]
        if finite(low) and finite(high):  # tokens/s at the slowest and fastest round
            end = tokens[k] * r["step_ms"] / low
            ax.errorbar(tokens[k], k, xerr=[[tokens[k] - tokens[k] * r["step_ms"] / high], [end - tokens[k]]],
                        color="black", capsize=2, linewidth=0.8)
        mem = f", {r['peak_mib'] / 1024:.1f} GiB" if finite(r.get("peak_mib")) else ""
        ax.text(end, k, f"  {r['step_ms']:.1f} ms{mem}", va="center", fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(right=max(tokens) * 1.4)
    ax.set_title(f"training step, tokens/s\n{rows[0]['config']}", fontsize=9)
    ax.set_xlabel("tokens/s (higher is better)", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3, axis="x")
    return True


def train_figure(plt, rows: list[dict], path: str) -> bool:
    """One train_panel per config, stacked."""
    configs = list(dict.fromkeys(r["config"] for r in rows))
    heights = [1.2 + 0.35 * sum(r["config"] == c for r in rows) for c in configs]
    fig, axes = plt.subplots(len(configs), 1, figsize=(7, sum(heights)), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    drawn = [train_panel(ax, [r for r in rows if r["config"] == c]) for ax, c in zip(axes[:, 0], configs)]
    if any(drawn):
        fig.tight_layout()
        fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return any(drawn)


def headline_figure(plt, data: dict[str, list[dict]], path: str) -> bool:
    """2x2 grid: bf16 (else the first dtype) LayerNorm fwd, causal softmax fwd, WeightedSum fwd,
    and the training step (coor_descent fwd+bwd time if there is no training-step CSV)."""
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    drawn = 0
    for ax, (op, var) in zip(axes.flat, [("layernorm", ""), ("softmax", "causal"), ("weighted_sum", "")]):
        rows = data.get(op, [])
        dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
        dtype = "bfloat16" if "bfloat16" in dtypes else (dtypes[0] if dtypes else "")
        title = " ".join(part for part in (op, var, dtype, "forward") if part)
        if bandwidth_panel(ax, rows, dtype, "fwd", var, title):
            drawn += 1
        else:
            ax.set_visible(False)
    last = axes[1][1]
    steps = data.get("train_step", [])
    first_config = [r for r in steps if r["config"] == steps[0]["config"]]
    if first_config and train_panel(last, first_config):
        drawn += 1
    elif bars_panel(last, [r for r in data.get("coor_descent", []) if r["direction"] != "fwd"], "us",
                    "coor_descent fwd+bwd time", "us"):
        drawn += 1
    else:
        last.set_visible(False)
    if drawn:
        fig.tight_layout()
        fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return bool(drawn)


def plot_all(results_dir: str) -> list[str]:
    """Draw every plot the folder's CSVs allow; returns the paths written."""
    plt = _pyplot()
    data = load(results_dir)
    path = lambda name: os.path.join(results_dir, f"{name}.png")  # noqa: E731
    written = []
    for op in BANDWIDTH_OPS:
        if data.get(op):
            bandwidth_figure(plt, op, data[op], path(op))
            written.append(path(op))
    for op in TIME_OPS:
        if data.get(op):
            time_figure(plt, op, data[op], path(op))
            written.append(path(op))
    for part in RECIPE_PARTS:
        if recipes_figure(plt, part, data, path(part.name)):
            written.append(path(part.name))
    if data.get("train_step") and train_figure(plt, data["train_step"], path("train_step")):
        written.append(path("train_step"))
    if headline_figure(plt, data, path("headline")):
        written.append(path("headline"))
    return written


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.plots", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results_dir", help="a folder of CSVs written by python -m benchmarks")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.results_dir):
        parser.error(f"not a folder: {args.results_dir}")
    for path in plot_all(args.results_dir):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
