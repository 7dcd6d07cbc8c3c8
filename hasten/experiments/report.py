"""Plots (PNG) and markdown tables from run logs and benchmark results.

Everything here reads plain data (a run folder's metrics.csv, a bench's results.json as a dict), so a report
can be drawn again, or a README section generated, without training anything. matplotlib runs headless (Agg).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hasten.engine.memory import format_bytes  # re-exported: the tables and benchmarks format bytes from here
from hasten.runfolder.log import write_atomic

DASH = "—"  # a threshold never reached, a number not measured (as format_bytes writes it)


def format_seconds(seconds: float | None) -> str:
    if seconds is None:
        return DASH
    return f"{seconds:.2f} s" if seconds < 10 else f"{seconds:.1f} s" if seconds < 1000 else f"{seconds:,.0f} s"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]], align: str | None = None) -> str:
    """A GitHub markdown table; `align` has one letter per column, `l` or `r` (default: first left, rest right)."""
    align = align or "l" + "r" * (len(headers) - 1)
    rule = ["---:" if a == "r" else ":---" for a in align]
    lines = [headers, rule, *rows]
    return "\n".join("| " + " | ".join(str(cell).replace("|", "\\|") for cell in line) + " |" for line in lines)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    _pyplot().close(fig)
    return path


def plot_curves(
    series: Mapping[str, Sequence[Sequence[Sequence[float]]]],
    path: str | Path,
    *,
    xlabel: str,
    ylabel: str,
    title: str,
    hlines: Sequence[float] = (),
) -> Path:
    """One colour per series, one line per run of it (points [x, y]); dotted grey horizontal lines at `hlines`.
    The x axis turns logarithmic when the series end more than 8x apart."""
    plt = _pyplot()
    fig, axis = plt.subplots(figsize=(8, 5), constrained_layout=True)
    colours = plt.get_cmap("tab10")
    ends, ys = [], []
    for i, (name, runs) in enumerate(series.items()):
        for j, points in enumerate(runs):
            if not points:
                continue
            x, y = zip(*points, strict=True)
            axis.plot(x, y, marker="o", markersize=3, color=colours(i % 10), alpha=0.9, label=name if j == 0 else None)
            ends.append(x[-1])
            ys.extend(y)
    if ys:
        low, high = min(ys), max([*ys, *hlines])
        for level in hlines:
            if level >= low:
                axis.axhline(level, color="grey", linestyle=":", linewidth=0.8)
        axis.set_ylim(max(0.0, low - 0.01), min(1.0, high + 0.01))
    if ends and min(ends) > 0 and max(ends) / min(ends) > 8:
        axis.set_xscale("log")
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

        axis.xaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
        axis.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        axis.xaxis.set_minor_formatter(NullFormatter())
    axis.set_xlabel(xlabel)
    axis.set_ylabel(ylabel)
    axis.set_title(title)
    axis.grid(alpha=0.3, which="both")
    if axis.get_legend_handles_labels()[1]:
        axis.legend(fontsize=8)
    return _save(fig, path)


def plot_bars(
    values: Mapping[str, Mapping[str, float] | None], path: str | Path, *, ylabel: str, title: str, scale: float = 1.0
) -> Path:
    """Horizontal bars at each median, with the min-max range as error bars; values divided by `scale`."""
    plt = _pyplot()
    names = list(values)
    fig, axis = plt.subplots(figsize=(8, 1.2 + 0.45 * len(names)), constrained_layout=True)
    medians = [(v or {}).get("median", math.nan) / scale for v in values.values()]
    lows = [m - (v or {}).get("min", math.nan) / scale for m, v in zip(medians, values.values(), strict=True)]
    highs = [(v or {}).get("max", math.nan) / scale - m for m, v in zip(medians, values.values(), strict=True)]
    axis.barh(names, medians, xerr=[lows, highs], color="tab:blue", alpha=0.8, capsize=3)
    for y, median in enumerate(medians):
        if not math.isnan(median):
            axis.annotate(
                f" {median:,.0f}" if median >= 100 else f" {median:.3g}", (median, y), va="center", fontsize=8
            )
    axis.invert_yaxis()  # first variant on top, as in the table
    axis.margins(x=0.12)  # room for the labels right of the bars
    axis.set_xlabel(ylabel)
    axis.set_title(title)
    axis.grid(alpha=0.3, axis="x")
    return _save(fig, path)


# ---- the bench report ------------------------------------------------------------------------------------

PLOTS = {
    "accuracy": "accuracy_vs_time.png",  # on the wall clock, where the results have it; else training seconds
    "accuracy_training": "accuracy_vs_training_time.png",  # training seconds, beside the wall clock's
    "throughput": "images_per_second.png",
    "memory": "peak_memory.png",
}
CLOCKS = {"wall": "time_to_accuracy_wall", "train": "time_to_accuracy"}  # the stats behind each clock's columns


def _median(stats: Mapping[str, Any], key: str) -> float | None:
    value = stats.get(key)
    return value["median"] if value else None


def _range(value: Mapping[str, Any] | None, fmt: str) -> str:
    if not value or value.get("min") is None or value.get("max") is None:
        return DASH
    return f"{value['min']:{fmt}}–{value['max']:{fmt}}"


def has_wall_clock(results: Mapping[str, Any]) -> bool:
    """Whether the results hold time to accuracy on the wall clock (results of hasten before it do not)."""
    return any(v["stats"].get("time_to_accuracy_wall") for v in results["variants"])


def bench_table(results: Mapping[str, Any], clock: str | None = None) -> str:
    """The headline table: one row per variant, medians over repeats, speed-up over the naive loop. Time to
    accuracy on `clock`: "wall" (from the run's start) or "train" (training seconds); default: the wall clock
    where the results have it."""
    clock = clock or ("wall" if has_wall_clock(results) else "train")
    key, speedup_key = CLOCKS[clock], "speedup_vs_naive" + ("_wall" if clock == "wall" else "")
    thresholds = results["thresholds"]
    headers = ["variant", "test acc.", *[f"to {float(t):.0%}" for t in thresholds]]
    step_memory = any(v["stats"].get("peak_step_memory_bytes") for v in results["variants"])
    headers += ["images/s", "peak memory", *["step memory"] * step_memory, "GFLOP/s", "of peak"]
    headers += ["of bare step", "wall time"]
    rows = []
    for variant in results["variants"]:
        stats = variant["stats"]
        if not stats["runs"]:
            rows.append([variant["name"], "failed", *[DASH] * (len(headers) - 2)])
            continue
        cells = [variant["name"], f"{_median(stats, 'test_accuracy'):.4f}"]
        for t in thresholds:
            seconds = (stats.get(key) or {}).get(t, {}).get("median")
            speedup = (variant.get(speedup_key) or {}).get(t)
            extra = f" ({speedup:.1f}x)" if speedup and variant["kind"] != "naive" else ""
            cells.append(format_seconds(seconds) + extra)
        achieved, fraction = _median(stats, "achieved_flops_per_second"), _median(stats, "peak_fraction")
        cells += [
            f"{_median(stats, 'images_per_second'):,.0f}",
            format_bytes(_median(stats, "peak_memory_bytes")),
            *[format_bytes(_median(stats, "peak_step_memory_bytes"))] * step_memory,
            DASH if achieved is None else f"{achieved / 1e9:,.1f}",
            DASH if fraction is None else f"{fraction:.0%}",
            _of_bare(stats),
            format_seconds(_median(stats, "wall_seconds")),
        ]
        rows.append(cells)
    return markdown_table(headers, rows)


def _of_bare(stats: Mapping[str, Any]) -> str:
    """The run's throughput as a fraction of its bare training step's: training alone / with evaluation."""
    train, wall = _median(stats, "train_of_bare"), _median(stats, "wall_of_bare")
    return DASH if train is None else f"{train:.0%} / {wall:.0%}"


def spread_table(results: Mapping[str, Any], clock: str | None = None) -> str:
    """Min-max over repeats of the time to each threshold (on `clock`, as bench_table) and of images/s."""
    key = CLOCKS[clock or ("wall" if has_wall_clock(results) else "train")]
    thresholds = results["thresholds"]
    headers = ["variant", "runs", *[f"to {float(t):.0%} (s)" for t in thresholds], "images/s"]
    rows = []
    for variant in results["variants"]:
        stats = variant["stats"]
        cells = [variant["name"], f"{stats['runs']}" + (f" ({stats['failed']} failed)" if stats["failed"] else "")]
        for t in thresholds:
            tta = (stats.get(key) or {}).get(t) or {"min": None, "max": None, "reached": 0}
            cells.append(_range(tta, ".1f") if tta["reached"] == stats["runs"] else f"{tta['reached']}/{stats['runs']}")
        cells.append(_range(stats.get("images_per_second"), ",.0f"))
        rows.append(cells)
    return markdown_table(headers, rows)


def _describe(variant: Mapping[str, Any], results: Mapping[str, Any]) -> str:
    if variant["kind"] == "naive":
        return (
            "the textbook loop: per-sample Dataset, DataLoader(batch_size=32, shuffle=True), Adam 1e-3, fp32, "
            f"no augmentation, same model and data, {variant['epochs']} epochs"
        )
    changes = " ".join(f"`{o}`" for o in variant["overrides"]) or f"the recipe `{results['name']}` as is"
    precision = variant["precision"]
    if precision == "auto" or any(run.get("summary", {}).get("channels_last") is not None for run in variant["runs"]):
        # what precision/channels_last=auto chose in each run (the probe decides per run, on the machine)
        taken = sorted({_layout(run["summary"]) for run in variant["runs"] if "summary" in run})
        precision = "; ".join(taken) or precision
    return f"{changes} ({precision}, {variant['epochs']} epochs)"


def _layout(summary: Mapping[str, Any]) -> str:
    return f"{summary.get('precision')}{', channels_last' if summary.get('channels_last') else ''}"


def _times_text(wall: bool) -> str:
    checked = (
        "checked after every epoch (and every train.eval_every_steps optimizer steps where a recipe sets it; the "
        "evaluations before the last as train.mid_eval says)"
    )
    if wall:
        return (
            "Times are wall-clock seconds from the run's start (its process's: imports, data, the start-up probe, "
            f"training and every evaluation count) until the test accuracy, {checked}, first reached the threshold: "
            "the median over repeats, where a run that never reached it counts as slowest;"
        )
    return (
        f"Times are training seconds (evaluation excluded) until the test accuracy, {checked}, first reached the "
        "threshold: the median over repeats, where a run that never reached it counts as slowest;"
    )


def bench_markdown(results: Mapping[str, Any]) -> str:
    """report.md: what ran where, the headline table (time to accuracy on the wall clock, where the results have
    it), the same in training seconds, the spread, the variants, the plots."""
    env, peaks = results["machine"], results.get("matmul_peak", {})
    wall = has_wall_clock(results)
    device = env.get("cuda_device") or env.get("cpu_model") or env.get("machine")
    peak_text = ", ".join(
        f"{name}{' (as TF32)' * bool(p.get('tf32'))} {p['flops_per_second'] / 1e9:,.1f} GFLOP/s ({p['size']}²)"
        for name, p in peaks.items()
    )
    lines = [
        f"# hasten bench: {results['name']}",
        "",
        f"`{results['command']}`" if results.get("command") else "",
        "",
        f"{results['repeats']} repeat(s)"
        + (" after a warm-up run" if results["warmup"] else "")
        + ", variants interleaved, order rotated each repeat"
        + ("; each run in its own process" if results["isolated"] else "; all runs in one process")
        + f". {results['started']} to {results['finished']}.",
        "",
        f"Machine: {device}, {env.get('cpu_count')} CPUs ({env.get('torch_threads')} torch threads), "
        f"{env.get('memory_gib')} GiB; torch {env.get('torch_version')}, hasten {env.get('hasten_version')} "
        f"(git {(env.get('git_commit') or 'unknown')[:10]}), Python {env.get('python_version')}.",
        "",
        f"Matmul peak, measured in this run: {peak_text}." if peak_text else "",
        "",
        bench_table(results),
        "",
        _times_text(wall) + f" {DASH}: not reached by most runs. (Nx): speed-up over the naive loop. images/s: "
        "training images per training second. Peak memory: CUDA allocator peak on a GPU, the process's resident "
        "high-water mark on a CPU (data, model and interpreter included); step memory: the tensors of one "
        "training step (hasten.engine.memory.measure_peak). GFLOP/s: forward+backward FLOPs "
        "per image (torch.utils.flop_counter) x images/s; of peak: that over the matmul peak for the "
        "variant's dtype. Of bare step: the run's images/s over those of its training step alone (the "
        "loop's own step repeated on one batch in memory: no data slicing, augmentation, evaluation or "
        "logging), counting training time / wall time; what is missing to 100% is the loop's overhead. "
        "Wall time: the whole run" + (", from its start to its summary" if wall else ", evaluation included") + ".",
        "",
        f"![test accuracy against {'the wall clock' if wall else 'training time'}]({PLOTS['accuracy']})",
        "",
    ]
    if wall:
        lines += [
            "## Time to accuracy in training seconds",
            "",
            "The same runs, the clock counting the training steps alone (start-up and evaluations left out).",
            "",
            bench_table(results, "train"),
            "",
            f"![test accuracy against training time]({PLOTS['accuracy_training']})",
            "",
        ]
    if results["repeats"] > 1:
        lines += ["## Spread over repeats (min–max)", "", spread_table(results), ""]
    lines += ["## Variants", ""]
    lines += [f"- **{v['name']}**: {_describe(v, results)}" for v in results["variants"]]
    failures = [(v["name"], r) for v in results["variants"] for r in v["runs"] if "error" in r]
    if failures:
        lines += ["", "## Failed runs", ""]
        lines += [f"- {name} r{run['repeat']}: {run['error'].splitlines()[0]}" for name, run in failures]
    lines += ["", f"![images per second]({PLOTS['throughput']})", "", f"![peak memory]({PLOTS['memory']})", ""]
    return "\n".join(lines)


def write_bench_report(results: Mapping[str, Any], out: str | Path) -> list[Path]:
    """report.md and the plots of a bench's results, in `out`: accuracy against the wall clock (where the results
    have it) and against training time, throughput, peak memory."""
    out = Path(out)
    variants = results["variants"]
    wall = has_wall_clock(results)

    def curves(key: str) -> dict[str, list[Any]]:
        return {v["name"]: [run.get(key, []) for run in v["runs"] if "error" not in run] for v in variants}

    thresholds = [float(t) for t in results["thresholds"]]
    title = f"{results['name']}: test accuracy at each evaluation (dotted: thresholds)"
    training = dict(xlabel="training time (s; start-up and evaluation excluded)", ylabel="test accuracy", title=title,
                    hlines=thresholds)  # fmt: skip
    written = [
        plot_curves(
            curves("curve_wall"),
            out / PLOTS["accuracy"],
            xlabel="wall clock (s from the run's start)",
            ylabel="test accuracy",
            title=title,
            hlines=thresholds,
        )  # fmt: skip
        if wall
        else plot_curves(curves("curve"), out / PLOTS["accuracy"], **training),
        *([plot_curves(curves("curve"), out / PLOTS["accuracy_training"], **training)] if wall else []),
        plot_bars(
            {v["name"]: v["stats"]["images_per_second"] for v in variants},
            out / PLOTS["throughput"],
            ylabel="training images per second (median, min-max)",
            title=f"{results['name']}: throughput",
        ),
        plot_bars(
            {v["name"]: v["stats"]["peak_memory_bytes"] for v in variants},
            out / PLOTS["memory"],
            ylabel="peak memory, MiB (median, min-max)",
            title=f"{results['name']}: peak memory",
            scale=2**20,
        ),
    ]
    write_atomic(out / "report.md", bench_markdown(results))
    return [out / "report.md", *written]
