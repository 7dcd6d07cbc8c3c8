"""Schedules and the bag of tricks, side by side on Fashion-MNIST: same data, model, epoch budget and seeds.

The baseline is He et al.'s ("Bag of Tricks", 2019): step decay (x0.1 at 50% and 75% of the run), every trick
off. Then each other schedule in its place (constant, cosine + warmup, cyclic, one-cycle) and each trick
switched on alone over the baseline, then the best schedule with every trick that helped, together.
Each variant runs once per seed; the order is rotated per seed so drift of a shared machine hits all variants
alike; one warm-up run first (not recorded). Reports test accuracy (mean, sample std, min-max over seeds), the
difference to the baseline paired by seed (the seed moves every variant's accuracy by several points at this
budget, so the paired difference is the fair comparison) and training time (median), as a markdown table,
results.json (with the exact recipes and the machine) and an accuracy-vs-epoch plot.

    .venv/bin/python benchmarks/tricks.py            # the full run (~15 min on 2 busy cores)
    .venv/bin/python benchmarks/tricks.py --quick    # a smoke run: tiny subset, 1 seed, 1 epoch

A variant "helps" when it beats the baseline on every seed. A finished run whose saved recipe equals the one
asked for is read back instead of trained again (`--fresh` retrains everything), so an interrupted benchmark
continues where it stopped.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

import hasten
from hasten.experiments.interleave import rotated
from hasten.recipe.schema import Recipe, load_recipe, to_yaml
from hasten.run.build import train
from hasten.runfolder.log import environment
from hasten.techniques.registry import switch

# The baseline: the shipped fashion-fast recipe (bf16, channels_last, flip+translate, Nesterov SGD) made
# small enough for 2 CPU cores, with step decay and every trick off.
BASE = [
    "model.width=8",  # channels 8-16-32: a ResNet small enough for ~36 runs in ~15 minutes
    "optim.lr=0.05",  # per 256 examples, the peak of every variant; `hasten lr-find` puts the minimum near 0.07
    "train.threads=1",  # on 2 cores shared with other jobs, 2 threads spin-wait on each other: 1 is ~20x faster
    "schedule.name=step",
    "schedule.milestones=[0.5,0.75]",
    "schedule.gamma=0.1",
    switch("tricks.label_smoothing").switched_off,
    switch("optim.no_bias_decay").switched_off,
    switch("model.zero_init_residual").switched_off,
    "run.progress=false",
    "run.tensorboard=false",
]

SCHEDULES = {
    "constant": ["schedule.name=constant"],
    "cosine+warmup": ["schedule.name=cosine", "schedule.warmup=0.1"],
    "cyclic": ["schedule.name=cyclic", "schedule.mode=triangular2", "schedule.cycles=3"],
    "one-cycle": ["schedule.name=one-cycle", "schedule.peak=0.25"],
}

# each switched on alone over the baseline, named by its switch in hasten/techniques/registry.py (a misspelt key
# fails at import), at the switch's example value unless given
TRICKS = {
    "label smoothing": [switch("tricks.label_smoothing").switched_on],
    "mixup": [switch("tricks.mixup").switched_on],
    "cutmix": [switch("tricks.cutmix").switched_on],
    "EMA": [switch("tricks.ema").override("0.95")],  # averages over ~20 steps: a run here is ~190 steps
    "no-bias-decay": [switch("optim.no_bias_decay").switched_on],
    "zero-init residual": [switch("model.zero_init_residual").switched_on],
}


def finished_run(recipe: Recipe, run_dir: Path) -> dict[str, Any] | None:
    """The summary of a finished run of exactly `recipe` in `run_dir`, or None."""
    try:
        saved = yaml.safe_load((run_dir / "recipe.yaml").read_text())
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError, yaml.YAMLError):
        return None
    same = saved == recipe.model_dump(mode="json") and summary.get("epochs") == recipe.train.epochs
    return summary if same else None


def run_variant(overrides: list[str], seed: int, run_dir: Path, reuse: bool = True) -> dict[str, Any]:
    recipe = load_recipe("fashion-fast", [*overrides, f"seed={seed}", f"run.dir={run_dir}"])
    summary = finished_run(recipe, run_dir) if reuse else None
    reused = summary is not None
    summary = summary or train(recipe)
    with open(run_dir / "metrics.csv", newline="") as f:
        curve = [float(row["test_accuracy"]) for row in csv.DictReader(f)]
    return {
        "seed": seed,
        "test_accuracy": summary["test_accuracy"],
        "train_seconds": summary["train_seconds"],
        "wall_seconds": summary["wall_seconds"],
        "curve": curve,
        "reused": reused,
    }


def stats(runs: list[dict[str, Any]], baseline: list[dict[str, Any]]) -> dict[str, Any]:
    """Accuracy over seeds, and the difference to the baseline run of the same seed."""
    accuracy = [r["test_accuracy"] for r in runs]
    base_by_seed = {r["seed"]: r["test_accuracy"] for r in baseline}
    paired = [r["test_accuracy"] - base_by_seed[r["seed"]] for r in runs]
    return {
        "mean": statistics.mean(accuracy),
        "std": statistics.stdev(accuracy) if len(accuracy) > 1 else 0.0,
        "min": min(accuracy),
        "max": max(accuracy),
        "paired_mean": statistics.mean(paired),
        "paired_std": statistics.stdev(paired) if len(paired) > 1 else 0.0,
        "wins": sum(d > 0 for d in paired),
        "train_seconds": statistics.median(r["train_seconds"] for r in runs),
    }


def run_all(
    variants: dict[str, list[str]], seeds: list[int], out: Path, log: Callable[[str], None], reuse: bool
) -> dict[str, list[dict[str, Any]]]:
    """Every variant once per seed, the order rotated per seed."""
    names = list(variants)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    total, done = len(names) * len(seeds), 0
    for i, seed in enumerate(seeds):
        for name in rotated(names, i):
            done += 1
            run = run_variant(variants[name], seed, out / "runs" / slug(name) / f"seed{seed}", reuse)
            runs[name].append(run)
            log(
                f"[{done}/{total}] {name:<20} seed {seed}: accuracy {run['test_accuracy']:.4f}, "
                f"{run['train_seconds']:.1f} s training" + (" (finished earlier, read back)" if run["reused"] else "")
            )
    return runs


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")


def table(results: dict[str, dict[str, Any]], baseline: str) -> str:
    lines = [
        "| variant | test accuracy, mean ± std | min - max | vs baseline, same seed | better on | "
        "training time (median) | helps? |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, result in results.items():
        s = result["stats"]
        seeds = len(result["runs"])
        if name == baseline:
            versus, wins, verdict = "", "", ""
        else:
            versus = f"{s['paired_mean'] * 100:+.2f} ± {s['paired_std'] * 100:.2f} pts"
            wins, verdict = f"{s['wins']} of {seeds} seeds", "yes" if result["helps"] else "no"
        lines.append(
            f"| {name} | {s['mean']:.4f} ± {s['std']:.4f} | {s['min']:.4f} - {s['max']:.4f} | {versus} | {wins} | "
            f"{s['train_seconds']:.1f} s | {verdict} |"
        )
    return "\n".join(lines)


def plot(results: dict[str, dict[str, Any]], path: Path, title: str) -> None:
    """Mean test accuracy per epoch: schedules on the left, tricks on the right, baseline and together on both."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8), sharey=True, constrained_layout=True)
    for axis, group, heading in ((axes[0], SCHEDULES, "schedules"), (axes[1], TRICKS, "tricks (over the baseline)")):
        palette = iter(["C0", "C1", "C2", "C4", "C5", "C6", "C8", "C9"])  # no red, no black: those are bold
        for name in ["baseline", *group, "together"]:
            curves = [run["curve"] for run in results[name]["runs"]]
            mean = [statistics.mean(values) for values in zip(*curves, strict=True)]
            if name in ("baseline", "together"):  # together drawn wide and pale, so a variant equal to it shows
                style = {"color": "black", "linewidth": 2} if name == "baseline" else {"color": "tab:red", "alpha": 0.5}
                axis.plot(range(1, len(mean) + 1), mean, "-", marker="o", label=name, **{"linewidth": 4, **style})
            else:
                axis.plot(range(1, len(mean) + 1), mean, "--", marker="o", color=next(palette), label=name)
        axis.set_title(heading, fontsize=10)
        axis.set_xlabel("epoch")
        axis.set_xticks(range(1, len(mean) + 1))
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    axes[0].set_ylabel("test accuracy (mean over seeds)")
    fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 1,000 images, 1 epoch, 1 seed")
    parser.add_argument("--subset", type=int, default=12000, help="first N training images (default 12000)")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", default="bench/tricks")
    parser.add_argument("--fresh", action="store_true", help="retrain runs that finished before")
    ns = parser.parse_args(argv)
    if ns.quick:
        ns.subset, ns.epochs, ns.seeds = 1000, 1, 1
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    base = [*BASE, f"data.subset={ns.subset}", f"train.epochs={ns.epochs}"] + (
        ["data.test_subset=1000"] if ns.quick else []
    )
    seeds = list(range(ns.seeds))

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    started = time.perf_counter()
    log("warm-up run (not recorded)")
    run_variant([*base, "train.epochs=1"], 0, out / "runs" / "warmup", reuse=False)

    variants = {"baseline": base}
    variants |= {name: [*base, *extra] for name, extra in SCHEDULES.items()}
    variants |= {name: [*base, *extra] for name, extra in TRICKS.items()}
    runs = run_all(variants, seeds, out, log, reuse=not ns.fresh)

    def result(name: str, overrides: list[str], its_runs: list[dict[str, Any]]) -> dict[str, Any]:
        summary = stats(its_runs, runs["baseline"])
        helps = name != "baseline" and summary["wins"] == len(its_runs)  # better than the baseline on every seed
        return {"overrides": overrides, "runs": its_runs, "stats": summary, "helps": helps}

    results = {name: result(name, variants[name], runs[name]) for name in variants}
    # together: the best schedule that beat the baseline, with every trick that beat it
    helping_schedules = [n for n in SCHEDULES if results[n]["helps"]]
    best_schedule = max(helping_schedules, key=lambda n: results[n]["stats"]["mean"], default=None)
    helping_tricks = [n for n in TRICKS if results[n]["helps"]]
    together = [*base, *(SCHEDULES[best_schedule] if best_schedule else [])]
    together += [o for n in helping_tricks for o in TRICKS[n]]
    log(f"together: schedule {best_schedule or 'step'}, tricks {', '.join(helping_tricks) or 'none'}")
    runs["together"] = run_all({"together": together}, seeds, out, log, reuse=not ns.fresh)["together"]
    results["together"] = result("together", together, runs["together"])
    compute = sum(run["wall_seconds"] for r in results.values() for run in r["runs"])

    command = "python benchmarks/tricks.py" + " ".join([""] + (argv if argv is not None else sys.argv[1:]))
    subset = f"first {ns.subset} training images" + (", first 1000 test images" if ns.quick else ", full test set")
    title = f"Fashion-MNIST ({subset}), ResNet width 8, {ns.epochs} epochs, {len(seeds)} seeds"
    markdown = (
        f"# Schedules and tricks on Fashion-MNIST\n\n{title}. Command: `{command}`\n\n"
        f"{table(results, 'baseline')}\n\n"
        f"Together: schedule {best_schedule or 'step'}; tricks: {', '.join(helping_tricks) or 'none'}.\n"
        "'helps' = better than the baseline on every seed (the same seed gives the same initial weights, data "
        "order and augmentation).\n"
        f"Wall time of the runs (training and evaluation): {compute:.0f} s; this invocation: "
        f"{time.perf_counter() - started:.0f} s.\n"
    )
    (out / "results.md").write_text(markdown)
    (out / "baseline-recipe.yaml").write_text(to_yaml(load_recipe("fashion-fast", base)))
    payload = {
        "command": command,
        "hasten_version": hasten.__version__,
        "environment": environment(),
        "subset": ns.subset,
        "epochs": ns.epochs,
        "seeds": seeds,
        "together": {"schedule": best_schedule, "tricks": helping_tricks},
        "results": results,
    }
    (out / "results.json").write_text(json.dumps(payload, indent=2) + "\n")
    plot(results, out / "accuracy-vs-epoch.png", title)
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
