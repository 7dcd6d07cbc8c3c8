"""`hasten bench`: variants of a recipe trained side by side, with time-to-accuracy, throughput, peak memory
and arithmetic efficiency, median and spread over repeats, written as CSV, JSON, a markdown report and plots.

Discipline after airbench (Keller Jordan, 2024): a warm-up run first (not recorded); then every variant once
per repeat, interleaved, with the order rotated each repeat, so drift of the machine (clocks, other load)
hits all variants alike; the median and the range over repeats; the exact recipe, versions and machine saved
with the numbers. Each run is a fresh Python process by default (`isolate=True`): on a CPU the peak memory
is the process's resident high-water mark, which in one shared process would only ever grow from run to run,
and a variant's thread setting would leak into the next.

The built-in `naive` variant is the textbook loop (naive.py), so every report shows the speed-up over it.
`run_grid` is the public entry point for other experiments (the sweeps reuse it); `bench` adds the files.

Time to accuracy is reported on two clocks: the wall clock a user waits on, from the run's start (each isolated
run's process start: imports, data, the probe and every evaluation count; `--in-process`: the call), and the
training seconds alone, beside it.
"""

from __future__ import annotations

import csv
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from hasten.clock import Clock, command_started
from hasten.engine.distributed import resolve_device
from hasten.engine.precision import compute_dtype
from hasten.errors import HastenError
from hasten.experiments.flops import matmul_peak, train_step_flops
from hasten.experiments.interleave import rotated
from hasten.experiments.variants import (  # re-exported: the sweep and transfer experiments import them from here
    NAIVE,
    Variant,
    ablation_variants,
    grid_variants,
    parse_vary,
    plan_variants,
    slug,
    split_values,
    variant_recipe,
)
from hasten.machine import current as current_machine
from hasten.models import build_model
from hasten.progress import say
from hasten.recipe.schema import MAX_EPOCHS, Recipe, apply_overrides, validate
from hasten.run.build import dataset
from hasten.runfolder.folder import owned_output
from hasten.runfolder.log import environment, write_atomic
from hasten.tune import choices

__all__ = [
    "NAIVE",
    "Variant",
    "ablation_variants",
    "aggregate",
    "bench",
    "grid_variants",
    "machine",
    "parse_vary",
    "plan_variants",
    "run_grid",
    "run_in_process",
    "run_isolated",
    "split_values",
    "variant_recipe",
    "write_results",
]

# runs of each variant: a benchmark wants the median and spread of a few; 1,000 of even a seconds-long run is hours
MAX_REPEATS = 1_000

METRICS = ("test_accuracy", "train_seconds", "wall_seconds", "images_per_second", "peak_memory_bytes")
OPTIONAL_METRICS = ("peak_step_memory_bytes", "startup_seconds", "eval_seconds")  # not in every summary
# arithmetic (FLOP/s, fraction of the matmul peak) and overhead: the run's throughput over the bare step's
EFFICIENCY = (
    "achieved_flops_per_second",
    "peak_fraction",
    "bare_step_images_per_second",
    "train_of_bare",
    "wall_of_bare",
)

# ---- one run ---------------------------------------------------------------------------------------------


def flops_per_image(recipe: Recipe) -> float:
    """Forward + backward FLOPs of one training image through the recipe's model."""
    data = dataset(recipe)
    model = build_model(recipe.model, data.image_shape, data.num_classes)
    return train_step_flops(model, data.image_shape, data.num_classes)


def bare_step(recipe: Recipe, warmup: int = 3) -> tuple[Any, Tensor, Tensor, Callable[[], None]]:
    """The recipe's training step alone, ready to repeat: the loop's own trainer (its `train_step`: hooks,
    precision, optimizer, schedule), the first training batch already in memory, `warmup` steps taken, and the
    device's synchronisation (a no-op on a CPU) to call before reading a clock."""
    from hasten.run.build import build, trainer_for
    from hasten.run.plan import Plan
    from hasten.runfolder.log import RunLog

    parts = build(recipe)
    plan = Plan(recipe.train.epochs, len(parts.data.classes), measure_step_memory=False, progress=False)
    trainer = trainer_for(parts, plan, RunLog(".", enabled=False))
    images, labels = next(iter(parts.train_loader))
    parts.model.train()
    for _ in range(warmup):
        trainer.train_step(images, labels)
    sync = torch.cuda.synchronize if parts.device.type == "cuda" else lambda: None
    return trainer, images, labels, sync


def bare_step_images_per_second(recipe: Recipe, steps: int = 20, warmup: int = 3) -> float:
    """Images/s of the recipe's training step alone (`bare_step`) repeated on one batch already in memory; no data
    slicing, augmentation, evaluation or logging. What the whole run's throughput is measured against: the gap is
    the loop's overhead."""
    trainer, images, labels, sync = bare_step(recipe, warmup)
    sync()
    started = time.perf_counter()
    for _ in range(steps):
        trainer.train_step(images, labels)
    sync()
    return steps * len(labels) / (time.perf_counter() - started)


def run_in_process(
    recipe: Recipe, kind: str, naive_epochs: int | None = None, clock: Clock | None = None
) -> dict[str, Any]:
    """One run in this process: its summary, plus `flops_per_image` and (hasten runs) the bare step's speed. Its
    wall-clock times count from `clock`'s start (default: this call)."""
    if kind == "naive":
        from hasten.experiments.naive import train_naive

        summary = train_naive(recipe, naive_epochs, clock)
        return summary | {"flops_per_image": flops_per_image(recipe)}
    from hasten.run.build import train

    summary = train(recipe, clock=clock)
    # the bare step as the run took it: what precision/channels_last=auto chose, not a second probe's choice
    chosen = [f"precision={summary['precision']}", f"train.channels_last={str(summary['channels_last']).lower()}"]
    bare = bare_step_images_per_second(validate(apply_overrides(recipe.model_dump(mode="json"), chosen)))
    return summary | {"flops_per_image": flops_per_image(recipe), "bare_step_images_per_second": bare}


def run_isolated(recipe: Recipe, kind: str, naive_epochs: int | None, run_dir: Path) -> dict[str, Any]:
    """One run in a fresh Python process (`python -m hasten.experiments.bench SPEC`); its output goes to
    `run_dir/worker.log`. A failed run raises HastenError with the error's first line from the log."""
    run_dir.mkdir(parents=True, exist_ok=True)
    spec, result = run_dir / "bench-spec.json", run_dir / "bench-result.json"
    result.unlink(missing_ok=True)
    spec_data = {"recipe": recipe.model_dump(mode="json"), "kind": kind, "naive_epochs": naive_epochs}
    write_atomic(spec, json.dumps(spec_data, indent=2) + "\n")
    package_root = str(Path(__file__).resolve().parents[2])  # the folder that holds hasten/
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
    with open(run_dir / "worker.log", "w") as worker_log:
        code = subprocess.run(
            [sys.executable, "-m", "hasten.experiments.bench", str(spec), str(result)],
            stdout=worker_log,
            stderr=subprocess.STDOUT,
            env=env,
        ).returncode
    if code != 0 or not result.is_file():
        lines = (run_dir / "worker.log").read_text(errors="replace").strip().splitlines() or ["no output"]
        cause = next((line for line in lines if line.startswith("error: ")), lines[-1])  # else a traceback's end
        raise HastenError(f"{cause.removeprefix('error: ')} (exit {code}; the whole log: {run_dir / 'worker.log'})")
    return json.loads(result.read_text())


def _worker(spec_path: str, result_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    try:
        recipe = Recipe.model_validate(spec["recipe"])
        # the process's start: the worker's imports count, as a `hasten train` command's do
        result = run_in_process(recipe, spec["kind"], spec["naive_epochs"], Clock(command_started()))
    except HastenError as error:
        print(f"error: {error}", file=sys.stderr)
        return error.exit_code
    write_atomic(Path(result_path), json.dumps(result, indent=2) + "\n")
    return 0


# ---- the grid --------------------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    """Versions and machine (hasten.runfolder.log.environment) plus CPU model, threads, memory and platform."""
    cpu_model = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        memory_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        memory_gib = None
    return environment() | {
        "cpu_model": cpu_model or platform.processor() or None,
        "torch_threads": torch.get_num_threads(),
        "memory_gib": memory_gib,
        "platform": platform.platform(),
    }


def spread(values: Sequence[float]) -> dict[str, float] | None:
    """Median, min and max of `values`; None when there are none."""
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def aggregate(runs: list[dict[str, Any]], thresholds: Sequence[str]) -> dict[str, Any]:
    """A variant's statistics over its successful runs. Time to a threshold: its median counts a run that
    never got there as infinitely slow, so it is null unless more than half the runs reached it."""
    done = [run for run in runs if "error" not in run]
    stats: dict[str, Any] = {"runs": len(done), "failed": len(runs) - len(done)}
    for key in METRICS + OPTIONAL_METRICS:
        stats[key] = spread([run["summary"][key] for run in done if run["summary"].get(key) is not None])
    for key in EFFICIENCY:
        stats[key] = spread([run[key] for run in done if run.get(key) is not None])
    for clock in ("time_to_accuracy", "time_to_accuracy_wall"):  # training seconds; wall clock
        stats[clock] = {}
        for threshold in thresholds:
            times = [(run["summary"].get(clock) or {}).get(threshold) for run in done]
            reached = sorted(t for t in times if t is not None)
            ordered = reached + [float("inf")] * (len(times) - len(reached))
            median = statistics.median(ordered) if ordered else float("inf")
            stats[clock][threshold] = {
                "median": None if median == float("inf") else median,
                "min": reached[0] if reached else None,
                "max": reached[-1] if len(reached) == len(times) and reached else None,
                "reached": len(reached),
            }
    return stats


def speedups(variants: list[dict[str, Any]], thresholds: Sequence[str]) -> None:
    """Adds `speedup_vs_naive` (naive's median training time / the variant's, per threshold) and
    `speedup_vs_naive_wall` (the same on the wall clock) to each variant."""
    naive = next((v for v in variants if v["kind"] == "naive"), None)
    for variant in variants:
        for clock in ("time_to_accuracy", "time_to_accuracy_wall"):
            key = "speedup_vs_naive" + ("_wall" if clock.endswith("_wall") else "")
            variant[key] = {}
            for threshold in thresholds:
                mine = variant["stats"][clock][threshold]["median"]
                theirs = naive and naive["stats"][clock][threshold]["median"]
                variant[key][threshold] = theirs / mine if theirs and mine else None


def run_grid(
    recipe: Recipe,
    variants: Sequence[Variant],
    repeats: int = 3,
    out: str | Path | None = None,
    *,
    warmup: bool = True,
    isolate: bool = True,
    naive_epochs: int | None = None,
    measure_peak: bool = True,
    peak_seconds: float = 1.0,
    command: str | None = None,
    log: Callable[[str], None] = say,  # stderr, wrapped to 80 columns
) -> dict[str, Any]:
    """Train every variant `repeats` times (after one warm-up run), interleaved, and return the results
    (what results.json holds). Run folders go to `out/runs/<variant>/r<k>`. Every variant's recipe is
    validated before anything runs. A failed run is recorded with its error and the rest go on."""
    if not 1 <= repeats <= MAX_REPEATS:
        raise HastenError(f"--repeats {repeats:,}: from 1 to {MAX_REPEATS:,} (the spread of a few runs is the point)")
    if naive_epochs is not None and not 1 <= naive_epochs <= MAX_EPOCHS:
        raise HastenError(f"--naive-epochs {naive_epochs:,}: from 1 to {MAX_EPOCHS:,}, as train.epochs")
    out = Path(out or Path("bench") / recipe.name)
    folders = {v: out / "runs" / f"{i:02d}-{slug(v.name)}" for i, v in enumerate(variants, 1)}
    recipes = {v: variant_recipe(recipe, v) for v in variants}  # all validated before anything runs
    precisions = {v: "fp32" if v.kind == "naive" else recipes[v].precision for v in variants}  # may be "auto"
    thresholds = [f"{t:.2f}" for t in recipe.run.thresholds]

    def one_run(variant: Variant, run_dir: Path, epochs: int | None = None) -> dict[str, Any]:
        # the bench owns its run folders: a rerun moves the earlier runs aside (run.overwrite never deletes)
        changes = [f"run.dir={run_dir}", "run.overwrite=true"] + ([f"train.epochs={epochs}"] if epochs else [])
        run_recipe = validate(apply_overrides(recipes[variant].model_dump(mode="json"), changes))
        naive_run_epochs = epochs or naive_epochs
        if isolate:
            return run_isolated(run_recipe, variant.kind, naive_run_epochs, run_dir)
        return run_in_process(run_recipe, variant.kind, naive_run_epochs)

    started = datetime.datetime.now(datetime.timezone.utc)
    if warmup and variants:
        first = next((v for v in variants if v.kind != "naive"), variants[0])
        log(f"warm-up: {first.name}, 1 epoch (not recorded)")
        try:
            one_run(first, out / "runs" / "warmup", epochs=1)
        except HastenError as error:  # the variant's own runs will record it
            log(f"warm-up failed: {error}")

    peaks: dict[str, dict[str, Any]] = {}
    if measure_peak:
        if recipe.train.threads:
            torch.set_num_threads(recipe.train.threads)
        described = current_machine()
        device = resolve_device(recipe.device, described)
        asked = set(precisions.values())
        if "auto" in asked:  # the probe's candidates: the runs say which one they took
            asked = (asked - {"auto"}) | set(choices.precision_candidates(described, device.type))
        for precision in sorted(asked):
            flops, size = matmul_peak(compute_dtype(precision), device, min_seconds=peak_seconds)
            tf32 = device.type == "cuda" and precision == "fp32" and torch.backends.cudnn.allow_tf32
            peaks[precision] = {"flops_per_second": flops, "size": size, "tf32": tf32}
            log(f"matmul peak {precision}: {flops / 1e9:.1f} GFLOP/s ({size}x{size}, {device.type})")

    runs: dict[Variant, list[dict[str, Any]]] = {v: [] for v in variants}
    total, count = repeats * len(variants), 0
    for repeat in range(repeats):
        for variant in rotated(variants, repeat):
            count += 1
            run_dir = folders[variant] / f"r{repeat + 1}"
            record: dict[str, Any] = {"repeat": repeat + 1, "order": count, "run_dir": str(run_dir)}
            try:
                result = one_run(variant, run_dir)
            except HastenError as error:
                record["error"] = str(error)
                log(f"[{count}/{total}] {variant.name} r{repeat + 1}: FAILED: {error}")
            else:
                record |= _efficiency(result, peaks.get(result.get("precision", precisions[variant])))
                dropped = ("flops_per_image", "run_dir", "bare_step_images_per_second")
                record["summary"] = {k: v for k, v in result.items() if k not in dropped}
                record["curve"] = _curve(run_dir, result)
                record["curve_wall"] = _curve(run_dir, result, wall=True)
                log(f"[{count}/{total}] {variant.name} r{repeat + 1}: {_one_line(result, thresholds)}")
            runs[variant].append(record)

    results_variants = [
        {
            "name": v.name,
            "kind": v.kind,
            "overrides": list(v.overrides),
            "precision": precisions[v],
            "epochs": (naive_epochs if v.kind == "naive" else None) or recipes[v].train.epochs,
            "runs": runs[v],
            "stats": aggregate(runs[v], thresholds),
        }
        for v in variants
    ]
    speedups(results_variants, thresholds)
    return {
        "name": recipe.name,
        "command": command,
        "started": started.isoformat(timespec="seconds"),
        "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "repeats": repeats,
        "warmup": warmup,
        "isolated": isolate,
        "thresholds": thresholds,
        "machine": machine(),
        "matmul_peak": peaks,
        "recipe": recipe.model_dump(mode="json"),
        "variants": results_variants,
    }


def _efficiency(result: dict[str, Any], peak: dict[str, Any] | None) -> dict[str, Any]:
    flops = result.get("flops_per_image")
    achieved = flops * result["images_per_second"] if flops else None
    fraction = achieved / peak["flops_per_second"] if achieved and peak else None
    bare = result.get("bare_step_images_per_second")
    images = result["images_per_second"] * result["train_seconds"]  # every training image of the run
    return {
        "flops_per_image": flops,
        "achieved_flops_per_second": achieved,
        "peak_fraction": fraction,
        "bare_step_images_per_second": bare,
        "train_of_bare": result["images_per_second"] / bare if bare else None,  # data + augmentation + loop
        "wall_of_bare": images / result["wall_seconds"] / bare if bare and result["wall_seconds"] else None,  # + eval
    }


def _curve(run_dir: Path, summary: dict[str, Any], wall: bool = False) -> list[list[float]]:
    """[[training seconds (or with `wall`, wall seconds), test accuracy]] at every evaluation (train.eval_every_steps
    too) from the summary's accuracy curve, or (training seconds) at the end of each epoch from the run's
    metrics.csv (a summary without one)."""
    from hasten.runfolder.log import read_metrics

    if summary.get("accuracy_curve"):
        points = summary["accuracy_curve"]
        return [[p[3] if wall else p[0], p[2]] for p in points if not wall or len(p) > 3]
    return [] if wall else [[row["train_seconds"], row["test_accuracy"]] for row in read_metrics(run_dir)]


def _one_line(result: dict[str, Any], thresholds: Sequence[str]) -> str:
    walls = result.get("time_to_accuracy_wall") or {}

    def reached(t: str, s: float) -> str:
        wall = f"{walls[t]:.1f}s ({s:.1f}s training)" if walls.get(t) else f"{s:.1f}s"
        return f"{float(t):.0%} in {wall}"

    times = [reached(t, s) for t in thresholds if (s := result["time_to_accuracy"].get(t))]
    return (
        f"accuracy {result['test_accuracy']:.4f}, {result['images_per_second']:,.0f} images/s, "
        f"{result['wall_seconds']:.1f}s wall, {result['train_seconds']:.1f}s training"
        + (f"; {', '.join(times)}" if times else "")
    )


# ---- files -----------------------------------------------------------------------------------------------

CSV_FIELDS = [
    "variant",
    "kind",
    "repeat",
    "order",
    "overrides",
    "precision",
    *METRICS,
    *OPTIONAL_METRICS,
    "epochs",
    "flops_per_image",
    *EFFICIENCY,
    "error",
    "run_dir",
]


def write_results(results: dict[str, Any], out: str | Path) -> list[Path]:
    """results.json (everything) and results.csv (one row per run, time to each threshold as `time_to_X`)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "results.json", json.dumps(results, indent=2) + "\n")
    fields = CSV_FIELDS + [f"time_to_{t}" for t in results["thresholds"]]
    fields += [f"wall_time_to_{t}" for t in results["thresholds"]]
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fields)
        writer.writeheader()
        for variant in results["variants"]:
            for run in variant["runs"]:
                summary = run.get("summary", {})
                row = {
                    "variant": variant["name"],
                    "kind": variant["kind"],
                    "overrides": " ".join(variant["overrides"]),
                    "precision": variant["precision"],
                    **{k: run.get(k) for k in ("repeat", "order", "error", "run_dir", "flops_per_image", *EFFICIENCY)},
                    **{k: summary.get(k) for k in (*METRICS, *OPTIONAL_METRICS, "epochs")},
                    **{f"time_to_{t}": summary.get("time_to_accuracy", {}).get(t) for t in results["thresholds"]},
                    **{
                        f"wall_time_to_{t}": (summary.get("time_to_accuracy_wall") or {}).get(t)
                        for t in results["thresholds"]
                    },  # fmt: skip
                }
                writer.writerow(row)
    return [out / "results.json", out / "results.csv"]


def bench(
    recipe: Recipe,
    variants: Sequence[Variant],
    repeats: int = 3,
    out: str | Path | None = None,
    **options: Any,
) -> tuple[dict[str, Any], list[Path]]:
    """`run_grid`, then results.json, results.csv, report.md and the plots in `out` (default bench/<name>/).
    Returns the results and the files written."""
    from hasten.experiments.report import write_bench_report

    out = Path(out or Path("bench") / recipe.name)
    with owned_output(out, recipe.run.overwrite, "bench"):  # locked, and never a training run's folder
        results = run_grid(recipe, variants, repeats, out, **options)
        return results, write_results(results, out) + write_bench_report(results, out)


if __name__ == "__main__":
    sys.exit(_worker(*sys.argv[1:]))
