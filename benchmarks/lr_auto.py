"""Calibrates `optim.lr=auto`: what an LR range test sees, against the peak LR that trains best, per dataset.

For each dataset (the default recipe with only the data swapped, at a short budget):
  1. the LR range test (hasten.tune.lr_find, as optim.lr=auto runs it) over several seeds and sweep
     lengths: `auto_statistic`, the LR at the minimum of the heavily smoothed loss;
  2. the default recipe trained at a grid of peak LRs (optim.lr per optim.base_batch): the best one;
  3. the default recipe with optim.lr=auto, end to end, on each seed.
The ratio best / statistic, per dataset, is what the rule `peak = statistic x AUTO_FACTOR` must get right.

    .venv/bin/python benchmarks/lr_auto.py --out bench/lr-auto         (about 15 minutes on 2 cores)

Writes results.json and report.md in --out. Cells are cached, so an interrupted run resumes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from hasten.recipe.schema import load_recipe
from hasten.run.build import build, train
from hasten.tune.lr_find import AUTO_FACTOR, AUTO_RULE, AUTO_START, auto_statistic, lr_find

DATASETS = {
    "fashion-5k-2ep": ["data.subset=5000", "train.epochs=2"],
    "digits-3ep": ["data.name=digits", "train.epochs=3"],
    "synthetic-1ep": ["data.name=synthetic", "data.synthetic_size=512", "train.epochs=1"],
}
GRID = [0.05, 0.1, 0.2, 0.4, 0.8]  # optim.lr per 256 images
QUIET = ["run.progress=false", "run.tensorboard=false", "train.threads=1"]


def range_stats(overrides: list[str], seed: int, steps: int) -> dict[str, float]:
    """The range test's statistics, as per-base-batch LRs (comparable to optim.lr)."""
    recipe = load_recipe(None, [*QUIET, *overrides, f"seed={seed}", "run.dir=unused"])
    parts = build(recipe)
    result = lr_find(parts, start=AUTO_START, steps=steps)
    per_base = recipe.optim.lr / parts.lr  # range-test LRs are raw; optim.lr is per optim.base_batch
    return {"statistic": auto_statistic(result) * per_base, "steps": steps}


def accuracy_at(overrides: list[str], lr: float | str, seed: int) -> float:
    with tempfile.TemporaryDirectory() as folder:
        recipe = load_recipe(None, [*QUIET, *overrides, f"optim.lr={lr}", f"seed={seed}", f"run.dir={folder}"])
        return train(recipe)["test_accuracy"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="bench/lr-auto")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--only", default=None, help="comma-separated dataset keys")
    ns = parser.parse_args(argv)
    torch.set_num_threads(1)
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    cache_path = out / "results.json"
    cache = json.loads(cache_path.read_text()) if cache_path.exists() else {}
    seeds = [int(s) for s in ns.seeds.split(",")]
    names = ns.only.split(",") if ns.only else list(DATASETS)
    for name in names:
        overrides = DATASETS[name]

        def measure(part: str, key: str, compute: Callable[[], object], name: str = name) -> None:
            """cache[name][part][key] = compute(), unless an earlier run measured it (the cache resumes)."""
            done = cache.setdefault(name, {}).setdefault(part, {})
            if key not in done:
                done[key] = compute()
                cache_path.write_text(json.dumps(cache, indent=1))
                print(name, part, key, done[key], file=sys.stderr, flush=True)

        for seed in seeds:
            for steps in (100, 200):
                measure("range", f"{seed}-{steps}", lambda: range_stats(overrides, seed, steps))  # noqa: B023
        for lr in GRID:
            for seed in seeds:
                measure("grid", f"{lr}-{seed}", lambda: accuracy_at(overrides, lr, seed))  # noqa: B023
        for seed in seeds:
            measure("auto", str(seed), lambda: accuracy_at(overrides, "auto", seed))  # noqa: B023
    (out / "report.md").write_text(report(cache, names, seeds))
    print((out / "report.md").read_text())
    return 0


def report(cache: dict, names: list[str], seeds: list[int]) -> str:
    lines = ["# optim.lr=auto calibration", "", "    .venv/bin/python benchmarks/lr_auto.py", "",
             f"Rule: peak LR = {AUTO_RULE}; every LR below is optim.lr, per 256 images (the batch rule's base).", "",
             "| dataset | best optim.lr of the grid (mean acc) | statistic: median (min-max, seeds x sweep lengths) "
             "| best / statistic | optim.lr=auto: acc per seed | default 0.2: mean acc |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for name in names:
        entry = cache[name]
        mean_acc = {lr: statistics.mean(entry["grid"][f"{lr}-{s}"] for s in seeds) for lr in GRID}
        best = max(mean_acc, key=mean_acc.get)
        values = [r["statistic"] for r in entry["range"].values()]
        median = statistics.median(values)
        auto = ", ".join(f"{entry['auto'][str(s)]:.2%}" for s in seeds if str(s) in entry.get("auto", {}))
        default = f"{mean_acc[0.2]:.2%}" if 0.2 in mean_acc else "-"
        lines.append(f"| {name} | {best:g} ({mean_acc[best]:.2%}) | {median:.3g} ({min(values):.3g}-{max(values):.3g}) "
                     f"| {best / median:.2f} | {auto} | {default} |")  # fmt: skip
    lines += ["", f"AUTO_FACTOR is {AUTO_FACTOR:g}.", "", "Accuracy per peak LR (mean over seeds):", ""]
    lines += ["| dataset | " + " | ".join(f"{lr:g}" for lr in GRID) + " |", "|---|" + "---|" * len(GRID)]
    for name in names:
        entry = cache[name]
        accs = [statistics.mean(entry["grid"][f"{lr}-{s}"] for s in seeds) for lr in GRID]
        lines.append(f"| {name} | " + " | ".join(f"{a:.2%}" for a in accs) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
