"""The generalization benchmark (issue 13): does the default recipe hold on data, sizes and budgets it was not
tuned for? A default that only works on the data it was tuned on is a bug (docs/DESIGN: "Defaults are chosen and
measured on several datasets and budgets at once").

The recipe (default `fashion-fast`) runs with ONLY its data swapped (data.* overrides) and its epoch budget set,
over datasets {Fashion-MNIST full, its first 5,000 and 1,000 training images, scikit-learn digits, synthetic,
three generated image folders (hasten/data/toy.py: mirror-sensitive arrows, shape x colour, shapes)} x budgets
{1, 2, 5 epochs and the recipe's own}. Beside each cell, with the same data overrides:

- **plain**: the same model, Adam at 1e-3, constant LR without warm-up, batch 64, no label smoothing, mixup,
  cutmix or EMA, no weight decay, no augmentation, no flip TTA (`PLAIN`); precision, channels_last and threads
  stay as the recipe has them, since they are speed settings, not what is being judged;
- **naive**: the textbook loop `hasten bench` shows (hasten/experiments/naive.py: batch 32, Adam 1e-3, fp32).

Verdict per cell: OK when the default's test accuracy is at least the plain baseline's minus `--plain-margin`
(1 point) and at least chance (the test set's most frequent class) plus `--chance-margin` (5 points); else FAIL.
Accuracies are means over `--seeds`. Each run is its own process (`python -m hasten train ...`, the naive loop
through `python -m hasten.experiments.bench`, as `hasten bench` runs it), its folder under OUT/runs/; each
finished run is cached as OUT/cells/<cell>.json, reused when its overrides are the same, so an interrupted
benchmark continues where it stopped (`--fresh` runs everything again).

    .venv/bin/python benchmarks/generalization.py                  # everything (hours on 2 CPU cores)
    .venv/bin/python benchmarks/generalization.py --only digits,arrows,colours,shapes,fashion-1000
    .venv/bin/python benchmarks/generalization.py --budgets 1,2 --seeds 0,1
    .venv/bin/python benchmarks/generalization.py --quick          # a smoke run: tiny model and data, 1 epoch
    .venv/bin/python benchmarks/generalization.py --only synthetic --budgets 1 model.width=4   # extra overrides
    .venv/bin/python benchmarks/generalization.py --only digits --folder ~/data/letters   # and your own folder

Output in OUT (default bench/generalization/): report.md (the command, the table, the verdicts), results.json
(every run's overrides and summary) and default_vs_plain.png (the default's accuracy against the plain one's).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

import hasten
from hasten.build import dataset
from hasten.config import load_recipe
from hasten.data.imagefolder import ImageFolder
from hasten.data.toy import make_toy
from hasten.errors import HastenError
from hasten.experiments.naive import PLAIN_TRAINING
from hasten.runlog import environment, write_atomic

VARIANTS = ("default", "plain", "naive")
PLAIN = [*PLAIN_TRAINING, "train.batch_size=64", "train.min_steps_per_epoch=0"]  # batch 64 whatever the data
# machine settings for every run of every variant: not what is measured
QUIET = ["run.progress=false", "run.tensorboard=false", "run.overwrite=true"]  # a rerun replaces its own folder
TOY = ("arrows", "colours", "shapes")
BUDGETS = (1, 2, 5)  # epochs, plus the recipe's own
INTERRUPTED = {130, 143, -2, -9, -15}  # exit codes of a run stopped by SIGINT, SIGKILL or SIGTERM
QUICK = ["data.subset=256", "data.test_subset=256", "model.width=4", "model.blocks=[1]"]


def dataset_overrides(name: str, out: Path, folders: dict[str, str] | None = None) -> list[str]:
    """The data.* overrides that swap the recipe's data for dataset `name` (every data key that picks the data
    is set, so a recipe's own data.subset or data.root does not leak into another dataset); `folders` maps the
    names of the user's own image folders (--folder) to their paths."""
    if folders and name in folders:
        return ["data.name=imagefolder", f"data.root={folders[name]}", "data.subset=null"]
    fashion = ["data.name=fashion-mnist", "data.root=null"]
    table = {
        "fashion-full": fashion + ["data.subset=null"],
        "fashion-5000": fashion + ["data.subset=5000"],
        "fashion-1000": fashion + ["data.subset=1000"],
        "digits": ["data.name=digits", "data.root=null", "data.subset=null"],
        "synthetic": ["data.name=synthetic", "data.root=null", "data.subset=null"],
    }
    if name in TOY:  # small folders: decoded in the main process, no worker start-up per epoch
        return ["data.name=imagefolder", f"data.root={out / 'data' / name}", "data.subset=null", "data.workers=0"]
    return table[name]


DATASETS = ("fashion-full", "fashion-5000", "fashion-1000", "digits", "synthetic", *TOY)


def chance_level(recipe_name: str, overrides: list[str]) -> float:
    """Accuracy of always answering the test set's most frequent class."""
    data = dataset(load_recipe(recipe_name, overrides))
    labels = data.test.labels if isinstance(data, ImageFolder) else data.test_labels
    return float(torch.bincount(labels).max()) / len(labels)


def verdict(
    default: float | None, plain: float | None, chance: float, plain_margin: float, chance_margin: float
) -> tuple[str, str]:
    """("OK" | "FAIL", why): OK when `default` >= `plain` - `plain_margin` and >= `chance` + `chance_margin`."""
    if default is None:
        return "FAIL", "the default run failed"
    reasons = []
    if plain is not None and default < plain - plain_margin:
        reasons.append(f"{100 * (plain - default):.1f} points below plain")
    if default < chance + chance_margin:
        reasons.append(f"within {100 * chance_margin:.0f} points of chance")
    return ("FAIL" if reasons else "OK"), "; ".join(reasons)


def _env() -> dict[str, str]:
    root = str(Path(hasten.__file__).resolve().parents[1])  # this tree's hasten in the child too
    return os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}


def run_one(recipe_name: str, variant: str, overrides: list[str], epochs: int, run_dir: Path) -> dict[str, Any]:
    """One run in a fresh process; returns its summary fields (test accuracy, train loss, warnings, seconds) or,
    for a failed run, its exit code and the log's last line."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "summary.json").unlink(missing_ok=True)
    if variant == "naive":
        recipe = load_recipe(recipe_name, overrides + [f"run.dir={run_dir}"])
        spec = {"recipe": recipe.model_dump(mode="json"), "kind": "naive", "naive_epochs": epochs}
        write_atomic(run_dir / "bench-spec.json", json.dumps(spec, indent=2) + "\n")
        command = [sys.executable, "-m", "hasten.experiments.bench", str(run_dir / "bench-spec.json")]
        command.append(str(run_dir / "bench-result.json"))
    else:
        command = [sys.executable, "-m", "hasten", "train", recipe_name, *overrides, f"run.dir={run_dir}"]
    started = time.perf_counter()
    with open(run_dir / "log.txt", "w") as log:
        code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=_env()).returncode
    seconds = round(time.perf_counter() - started, 1)
    result: dict[str, Any] = {"exit_code": code, "seconds": seconds, "command": shlex.join(command)}
    if code in INTERRUPTED:  # stopped from outside, not a result: raise before anything is cached
        raise KeyboardInterrupt(f"{run_dir}: run stopped by a signal (exit {code}); rerun to resume")
    summary_path = run_dir / "summary.json"
    if code != 0 or not summary_path.is_file():
        lines = (run_dir / "log.txt").read_text(errors="replace").strip().splitlines() or ["no output"]
        return result | {"test_accuracy": None, "error": lines[-1]}
    summary = json.loads(summary_path.read_text())
    keep = ("test_accuracy", "train_loss", "train_accuracy", "test_loss", "train_seconds", "steps", "warnings")
    return result | {key: summary.get(key) for key in keep} | {"warnings": summary.get("warnings", [])}


def naive_view(resolved: dict[str, Any] | None) -> dict[str, Any] | None:
    """What of a resolved recipe the naive loop uses (its data, model, seed, budget): a naive cell runs again only
    when that changes, not when the recipe's own training settings do (hasten/experiments/naive.py)."""
    if not resolved:
        return None
    model = {k: resolved["model"].get(k) for k in ("name", "width", "blocks", "layers", "widths", "target", "args")}
    train = {k: resolved["train"].get(k) for k in ("epochs", "eval_batch_size", "threads")}
    return {"data": resolved["data"], "model": model, "train": train, "seed": resolved["seed"]}


def run_cells(args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    """Every (dataset, budget, variant, seed) run, from the cache where its overrides match."""
    recipe_epochs = load_recipe(args.recipe, args.overrides).train.epochs
    budgets = sorted(set(args.budgets) | ({recipe_epochs} if args.recipe_budget else set()))
    runs = []
    for name in args.only:
        if name in TOY and not (out / "data" / name / "train").is_dir():
            make_toy(name, out / "data" / name, seed=0)
        data = dataset_overrides(name, out, args.folders)
        for epochs in budgets:
            for seed in args.seeds:
                for variant in VARIANTS:
                    overrides = data + (PLAIN if variant == "plain" else []) + [f"train.epochs={epochs}"]
                    overrides += [f"seed={seed}", f"train.threads={args.threads}", *QUIET, *args.overrides]
                    key = f"{name}__e{epochs}__{variant}__s{seed}"
                    cache = out / "cells" / f"{key}.json"
                    # the resolved recipe, not just the overrides: a changed default in the recipe reruns the cell
                    resolved = load_recipe(args.recipe, overrides).model_dump(mode="json")
                    if cache.is_file() and not args.fresh:
                        cached = json.loads(cache.read_text())
                        same = (naive_view(cached.get("resolved")) == naive_view(resolved) if variant == "naive"
                                else cached.get("resolved") == resolved)  # fmt: skip
                        if same or args.report_only:
                            runs.append(cached)
                            continue
                    if args.report_only:
                        continue
                    print(f"{key}: running", flush=True)
                    result = run_one(args.recipe, variant, overrides, epochs, out / "runs" / key)
                    record = {"dataset": name, "epochs": epochs, "variant": variant, "seed": seed}
                    record |= {
                        "recipe_budget": epochs == recipe_epochs,
                        "overrides": overrides,
                        "resolved": resolved,
                    } | result
                    cache.parent.mkdir(parents=True, exist_ok=True)
                    write_atomic(cache, json.dumps(record, indent=2) + "\n")
                    print(f"{key}: accuracy {record['test_accuracy']} in {record['seconds']} s", flush=True)
                    runs.append(record)
    return runs


def _mean(values: list[float | None]) -> float | None:
    """Mean over seeds; None when any seed's run failed (a failed run is not averaged away)."""
    return None if not values or any(v is None for v in values) else statistics.fmean(values)


def table_rows(runs: list[dict[str, Any]], chances: dict[str, float], args: argparse.Namespace) -> list[dict]:
    """One row per (dataset, budget): each variant's mean accuracy and train loss, warnings, seconds, verdict."""
    rows = []
    for name in dict.fromkeys(r["dataset"] for r in runs):
        for epochs in sorted({r["epochs"] for r in runs if r["dataset"] == name}):
            cell = [r for r in runs if r["dataset"] == name and r["epochs"] == epochs]
            row: dict[str, Any] = {"dataset": name, "epochs": epochs, "chance": chances[name]}
            row["recipe_budget"] = cell[0]["recipe_budget"]
            for variant in VARIANTS:
                mine = [r for r in cell if r["variant"] == variant]
                row[f"{variant}_runs"] = len(mine)
                row[variant] = _mean([r["test_accuracy"] for r in mine])
                row[f"{variant}_train_loss"] = _mean([r.get("train_loss") for r in mine])
                row[f"{variant}_seconds"] = round(sum(r["seconds"] for r in mine), 1)
                row[f"{variant}_warnings"] = sorted({str(w) for r in mine for w in (r.get("warnings") or [])})
                row[f"{variant}_errors"] = [r["error"] for r in mine if r.get("error")]
            row["verdict"], row["why"] = verdict(
                row["default"], row["plain"], row["chance"], args.plain_margin, args.chance_margin
            )
            if not row["default_runs"]:  # --report-only over a partial cache
                row["verdict"], row["why"] = "not run", ""
            rows.append(row)
    return rows


def _pct(value: float | None) -> str:
    return "failed" if value is None else f"{100 * value:.1f}"


def _loss(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def write_report(rows: list[dict], results: dict[str, Any], out: Path) -> Path:
    """report.md: the command, the margins, the table (FAIL in bold capitals), the runs' warnings and errors."""
    judged = [r for r in rows if r["verdict"] != "not run"]
    failed = [r for r in judged if r["verdict"] == "FAIL"]

    def accuracy(row: dict, variant: str) -> str:
        return _pct(row[variant]) if row.get(f"{variant}_runs", 1) else "not run"

    lines = [
        "# Generalization benchmark",
        "",
        f"Command: `{results['command']}`",
        "",
        f"Recipe `{results['recipe']}` with only the data swapped, beside a plain baseline (same model, Adam 1e-3, "
        "constant LR, batch 64, no tricks, no augmentation, no TTA) and the naive loop (batch 32, Adam 1e-3, fp32). "
        f"Seeds {results['seeds']}, accuracies in percent (mean over seeds), train loss of the last epoch. "
        f"Verdict: OK when default >= plain - {100 * results['plain_margin']:.0f} point(s) and default >= "
        f"chance + {100 * results['chance_margin']:.0f} points; else FAIL.",
        "",
        f"**{len(failed)} of {len(judged)} cells FAIL.**" if failed else f"All {len(judged)} cells OK.",
        "",
        "| dataset | epochs | chance | default | plain | naive | train loss default / plain "
        "| seconds d / p / n (all seeds) | verdict |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- | --- | --- |",
    ]
    for r in rows:
        epochs = f"{r['epochs']} (recipe)" if r["recipe_budget"] else str(r["epochs"])
        verdict_text = f"**FAIL** ({r['why']})" if r["verdict"] == "FAIL" else r["verdict"]
        lines.append(
            f"| {r['dataset']} | {epochs} | {_pct(r['chance'])} | {accuracy(r, 'default')} | {accuracy(r, 'plain')} "
            f"| {accuracy(r, 'naive')} | {_loss(r['default_train_loss'])} / {_loss(r['plain_train_loss'])} "
            f"| {r['default_seconds']:.0f} / {r['plain_seconds']:.0f} / {r['naive_seconds']:.0f} | {verdict_text} |"
        )
    notes = [
        f"- {r['dataset']}, {r['epochs']} epochs, {variant}: {kind} {text}"
        for r in rows
        for variant in VARIANTS
        for kind, texts in (("warning", r[f"{variant}_warnings"]), ("error", r[f"{variant}_errors"]))
        for text in texts
    ]
    lines += ["", "## Warnings and errors from the runs", "", *(notes or ["none"]), ""]
    lines += ["![default vs plain](default_vs_plain.png)", ""]
    path = out / "report.md"
    write_atomic(path, "\n".join(lines))
    return path


def plot(rows: list[dict], out: Path) -> Path:
    """The default's accuracy against the plain baseline's, one point per cell; below the diagonal the
    default loses."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 6))
    ax.plot([0, 100], [0, 100], color="grey", lw=1, ls="--", label="default = plain")
    for r in rows:
        if r["plain"] is None:
            continue
        default = 100 * (r["default"] if r["default"] is not None else 0.0)
        ok = r["verdict"] == "OK"
        ax.scatter(100 * r["plain"], default, color="tab:green" if ok else "tab:red", marker="o" if ok else "x")
        ax.annotate(f"{r['dataset']}/{r['epochs']}", (100 * r["plain"], default), fontsize=7, alpha=0.8)
    ax.set_xlabel("plain baseline test accuracy (%)")
    ax.set_ylabel("default recipe test accuracy (%)")
    ax.set_title("Default recipe vs plain baseline per cell (red x: FAIL)")
    ax.set_xlim(0, 100)
    ax.set_ylim(0, 100)
    ax.legend(loc="upper left")
    path = out / "default_vs_plain.png"
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides for every run (e.g. model.width=4)")
    parser.add_argument("--recipe", default="fashion-fast")
    parser.add_argument("--only", default=",".join(DATASETS), help=f"datasets, comma-separated: {', '.join(DATASETS)}")
    parser.add_argument("--budgets", default=",".join(map(str, BUDGETS)), help="epoch budgets, comma-separated")
    parser.add_argument("--no-recipe-budget", dest="recipe_budget", action="store_false",
                        help="leave out the recipe's own epoch count")  # fmt: skip
    parser.add_argument("--seeds", default="0", help="seeds, comma-separated")
    parser.add_argument("--threads", type=int, default=1, help="train.threads of every run")
    parser.add_argument("--plain-margin", type=float, default=0.01, help="accuracy the default may lag plain by")
    parser.add_argument("--chance-margin", type=float, default=0.05, help="accuracy the default must beat chance by")
    parser.add_argument(
        "--folder",
        action="append",
        default=[],
        metavar="DIR",
        help="also an image folder of your own (DIR/train/<class>/, DIR/val/<class>/); repeatable",
    )
    parser.add_argument("--out", default="bench/generalization")
    parser.add_argument("--fresh", action="store_true", help="run every cell again instead of using the cache")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="run nothing: the report from the cached cells as they are (even of an older recipe)",
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: synthetic and shapes, 1 epoch, tiny model")
    args = parser.parse_args(argv)
    if args.quick:
        args.only, args.budgets, args.recipe_budget = "synthetic,shapes", "1", False
        args.overrides = QUICK + args.overrides
    args.folders = {Path(folder).name: str(Path(folder).resolve()) for folder in args.folder}
    missing = [folder for folder in args.folder if not (Path(folder) / "train").is_dir()]
    if missing:
        parser.error(f"--folder: no train/ folder in {', '.join(missing)} (expected train/<class>/*.png, val/...)")
    clashes = [name for name in args.folders if name in DATASETS]
    if clashes:
        parser.error(f"--folder: {', '.join(clashes)} is the name of a built-in dataset; rename the folder")
    args.only = [name for name in args.only.split(",") if name] + [n for n in args.folders if n not in args.only]
    unknown = [name for name in args.only if name not in DATASETS and name not in args.folders]
    if unknown:
        parser.error(f"--only: unknown dataset(s) {', '.join(unknown)}; choose from {', '.join(DATASETS)}")
    try:
        args.budgets = [int(b) for b in args.budgets.split(",") if b]
        args.seeds = [int(s) for s in args.seeds.split(",") if s]
    except ValueError as exc:
        parser.error(f"--budgets and --seeds take comma-separated integers ({exc})")
    if any(b < 1 for b in args.budgets):
        parser.error(f"--budgets: epochs must be at least 1, got {args.budgets}")
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except HastenError as error:  # a bad recipe, override or folder: the message names it
        print(f"error: {error}", file=sys.stderr)
        return error.exit_code


def _main(argv: list[str] | None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = run_cells(args, out)
    chances = {
        name: chance_level(args.recipe, dataset_overrides(name, out, args.folders) + args.overrides)
        for name in args.only
    }
    rows = table_rows(runs, chances, args)
    argv_text = shlex.join(sys.argv[1:] if argv is None else argv)
    results = {
        "command": f"python benchmarks/generalization.py {argv_text}".strip(),
        "recipe": args.recipe,
        "seeds": args.seeds,
        "plain_margin": args.plain_margin,
        "chance_margin": args.chance_margin,
        "plain_overrides": PLAIN,
        "environment": environment(),
        "cells": rows,
        "runs": runs,
    }
    write_atomic(out / "results.json", json.dumps(results, indent=2) + "\n")
    plot(rows, out)
    report = write_report(rows, results, out)
    print(report.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
