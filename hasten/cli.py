"""The `hasten` command: the only module that knows about argv.

Options may stand before or after the recipe and the `key=value` overrides, as with git and torchrun.
Exit codes: 0 success; 2 usage, recipe, data or checkpoint error (message names the field or file);
130 after SIGINT.
"""

from __future__ import annotations

import argparse
import atexit
import difflib
import json
import os
import shlex
import sys
import time
from collections.abc import Sequence
from typing import Any, NoReturn

from rich.console import Console
from rich.markup import escape
from rich.table import Table

import hasten
from hasten.errors import HastenError

console = Console(stderr=True)


def _split_recipe(args: list[str]) -> tuple[str | None, list[str]]:
    """The first positional without '=' is the recipe; the rest are overrides."""
    if args and "=" not in args[0]:
        return args[0], args[1:]
    stray = [a for a in args if "=" not in a]
    if stray:
        raise HastenError(f"expected key=value overrides after the recipe, got {stray[0]!r}")
    return None, args


def _recipe(ns: argparse.Namespace) -> Any:
    """The command's recipe from its RECIPE and key=value arguments, validated: the prelude of every command that
    takes one, so recipe errors show before torch and the data are loaded."""
    from hasten.recipe.schema import load_recipe

    source, overrides = _split_recipe(ns.args)
    return load_recipe(source, overrides)


def _show(summary: dict[str, Any], as_table: bool, table: Any) -> None:
    """A finished run's summary: as a rich table with the progress bar on, else as JSON (for scripts)."""
    if as_table:
        Console().print(table(summary))
    else:
        print(json.dumps(summary, indent=2))


NEAR_MISS = 0.01  # a threshold above the run's best accuracy is still shown when the run came this close to it
OF_BEST = (0.9, 0.99)  # where no threshold is near: times to these fractions of the run's best accuracy


def results_table(summary: dict[str, Any]) -> Table:
    """A finished run's results, in 80 columns: accuracy, the wall clock (from the command's start) and where it
    went, throughput, memory, and the time to each accuracy threshold that means something for this run's data:
    those it reached or came within a point of; where there are none (other data than the thresholds were set for),
    the time to 90% and 99% of the run's own best accuracy. Times to accuracy are on the wall clock, the training
    seconds beside them."""
    from hasten.engine.memory import format_bytes
    from hasten.progress import WIDTH

    rows = [
        ("test accuracy", f"{summary['test_accuracy']:.4f}"),
        ("epochs", str(summary["epochs"])),
        ("wall time", f"{summary['wall_seconds']:.1f} s from the command's start"),
        ("  training", f"{summary['train_seconds']:.1f} s"),
    ]
    if summary.get("startup_seconds") is not None:
        rows.append(("  start-up", f"{summary['startup_seconds']:.1f} s (to the first training step)"))
    if summary.get("eval_seconds") is not None:
        rows.append(("  evaluation", f"{summary['eval_seconds']:.1f} s"))
    rows += [
        ("throughput", f"{summary['images_per_second']:,.0f} images/s"),
        ("peak memory", format_bytes(summary["peak_memory_bytes"])),
    ]
    rows += [(label, "not reached" if train is None else _two_clocks(wall, train))
             for label, wall, train in times_to_accuracy(summary)]  # fmt: skip
    rows.append(("run folder", summary.get("run_dir", "")))
    labels = max(len(label) for label, _ in rows)
    table = Table(title="results", show_header=False)
    table.add_column(no_wrap=True)
    table.add_column(overflow="fold", max_width=WIDTH - 7 - labels)  # 7: the borders and padding of two columns
    for label, value in rows:
        table.add_row(label, value)
    return table


def _two_clocks(wall: float | None, train: float) -> str:
    return f"{wall:.1f} s (training {train:.1f} s)" if wall is not None else f"training {train:.1f} s"


def times_to_accuracy(summary: dict[str, Any]) -> list[tuple[str, float | None, float | None]]:
    """(label, wall seconds, training seconds) of the results table's time-to-accuracy rows (see results_table)."""
    best = summary.get("best_test_accuracy") or summary["test_accuracy"]
    walls = summary.get("time_to_accuracy_wall") or {}
    rows = [
        (f"time to {float(key):.0%}", walls.get(key), train)
        for key, train in summary["time_to_accuracy"].items()
        if float(key) <= best + NEAR_MISS
    ]
    curve = summary.get("accuracy_curve") or []
    if rows or not curve or best <= 0:
        return rows
    for fraction in OF_BEST:
        target = fraction * best
        point = next((p for p in curve if p[2] >= target), None)  # the best is on the curve: one reaches it
        label = f"time to {fraction:.0%} of best ({target:.1%})"
        rows.append((label, None, None) if point is None else (label, point[3] if len(point) > 3 else None, point[0]))
    return rows


def cmd_train(ns: argparse.Namespace) -> int:
    recipe = _recipe(ns)  # recipe errors show before torch and the data are loaded
    if ns.devices < 1 or ns.max_restarts < 0:
        raise HastenError("--devices must be at least 1 and --max-restarts at least 0")
    under_torchrun = "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_RANK" in os.environ
    if ns.devices > 1 or ns.max_restarts:
        if under_torchrun:
            raise HastenError("--devices/--max-restarts: this process was started by torchrun; give them to torchrun")
        return _launch(recipe.device, ns.devices, ["train", *ns.args], ns.max_restarts, ns.started)
    from hasten.clock import Clock
    from hasten.engine.distributed import is_main
    from hasten.run.build import train

    summary = train(recipe, clock=Clock(ns.started))  # wall-clock times count from the command's start
    if is_main():  # every rank has the same results; one prints them
        _show(summary, recipe.run.progress, results_table)
    return 0


def _launch(device: str, devices: int, args: list[str], max_restarts: int, started: float) -> int:
    """`devices` worker processes of `hasten ARGS` through torchrun's launcher, one per GPU on CUDA."""
    from hasten.clock import COMMAND_STARTED_ENV, started_epoch
    from hasten.engine.distributed import launch
    from hasten.machine import current

    machine = current()  # the GPUs and cores the ranks are laid on: this machine's, or HASTEN_MACHINE's profile's
    gpu = machine.gpu if machine.gpu is not None and machine.gpu.kind == "cuda" else None
    gpus = gpu.count if gpu is not None and (device in ("auto", "cuda") or device.startswith("cuda")) else 0
    if device.startswith("cuda") and devices > gpus:
        raise HastenError(f"--devices {devices}: this machine has {gpus} CUDA device(s)")
    if device == "auto" and 0 < gpus < devices:
        raise HastenError(f"--devices {devices}: this machine has {gpus} CUDA device(s); use device=cpu for CPU ranks")
    cpus = machine.cores
    if (device == "cpu" or (device == "auto" and gpus == 0)) and devices > cpus:  # each rank is a whole process
        raise HastenError(
            f"--devices {devices}: this machine has {cpus} CPU core(s) for this process; CPU ranks beyond that only "
            f"share them (and each takes its own memory): use at most --devices {cpus}"
        )
    previous = os.environ.get(COMMAND_STARTED_ENV)
    os.environ[COMMAND_STARTED_ENV] = repr(started_epoch(started))  # the workers' clocks start with this command
    try:
        return launch(devices, args, max_restarts=max_restarts)
    finally:  # a caller in this process (a test, a script) does not inherit it
        if previous is None:
            os.environ.pop(COMMAND_STARTED_ENV, None)
        else:
            os.environ[COMMAND_STARTED_ENV] = previous


def cmd_data(ns: argparse.Namespace) -> int:
    from hasten.data import fetch, info

    if ns.action != "make-folder" and (ns.out or ns.size or ns.rgb is not None or ns.limit):
        raise HastenError(f"data {ns.action}: OUT, --size, --rgb and --limit belong to 'data make-folder'")
    from hasten.data.preprocessing import MAX_IMAGE_SIDE

    if ns.size is not None and not 1 <= ns.size <= MAX_IMAGE_SIDE:
        raise HastenError(f"--size {ns.size}: a side of 1 to {MAX_IMAGE_SIDE} pixels")
    if ns.limit is not None and ns.limit < 1:
        raise HastenError(f"--limit {ns.limit}: at least 1 image of each split")
    if ns.action == "fetch":
        print(fetch(ns.name, ns.root))
    elif ns.action == "make-folder":
        from hasten.data.makefolder import make_folder

        if not ns.out:
            raise HastenError("data make-folder: give the output folder: hasten data make-folder fashion-mnist OUT")
        counts = make_folder(ns.name, ns.out, root=ns.root, size=ns.size, rgb=ns.rgb, limit=ns.limit)
        print(f"wrote {counts['train']} training and {counts['val']} validation images into {ns.out}/train and /val")
    else:
        print(json.dumps(info(ns.name, ns.root), indent=2, default=str))
    return 0


PLOT_SUFFIXES = (".png", ".pdf", ".svg", ".jpg", ".jpeg")  # what --plot may replace: a picture, by a picture


def _plot_path(given: str | None, default: Any) -> Any:
    """Where a command draws its plot: `--plot PATH` or the default in the run folder; never one of a run's own
    files, nor an existing file that is not a picture."""
    from pathlib import Path

    from hasten.runfolder.folder import check_output

    path = Path(given) if given else Path(default)
    return check_output(path, overwrite=path.suffix.lower() in PLOT_SUFFIXES, what="--plot")


def cmd_schedule(ns: argparse.Namespace) -> int:
    recipe = _recipe(ns)
    from hasten.experiments.schedule import plot_schedule, schedule_trace
    from hasten.run.resolve import run_dir

    result = schedule_trace(recipe)
    recipe = result.recipe  # as resolved: `auto` decided as `hasten train` decides it
    title = f"{recipe.name}: {recipe.schedule.name} schedule, {recipe.train.epochs} epochs"
    path = plot_schedule(result, _plot_path(ns.plot, run_dir(recipe) / "schedule.png"), title)
    print(f"{result.total_steps} optimizer steps ({result.steps_per_epoch} per epoch), warmup {result.warmup_steps}")
    print(f"LR: peak {max(result.lrs):.4g}, first step {result.lrs[0]:.4g}, last step {result.lrs[-2]:.4g}")
    print(f"momentum/beta1: {min(result.momenta):.3g} to {max(result.momenta):.3g}")
    print(f"plot: {path}")
    return 0


def cmd_batch_size(ns: argparse.Namespace) -> int:
    from hasten.engine.memory import format_bytes, parse_bytes

    recipe = _recipe(ns)
    budget = parse_bytes(ns.memory_budget) if ns.memory_budget else None
    from hasten.experiments.batch_size import find_batch_size

    advice = find_batch_size(recipe, budget, ns.rule)
    for size, fitted in advice.search.tried:
        used = advice.measured.get(size)
        if used is not None:
            how = format_bytes(used)
        else:
            how = "out of memory" if advice.device_type == "cuda" else "extrapolated over the budget, not run"
        console.print(f"  batch {size:>6}: {'fits' if fitted else 'too big':<8} {how}", highlight=False)
    limit = ""
    if advice.search.capped:
        limit = " (the whole training set)"
        if advice.step_cap is not None and advice.largest >= advice.step_cap:
            limit = f" (capped so an epoch keeps train.min_steps_per_epoch={recipe.train.min_steps_per_epoch} steps)"
    budget_text = f" in {format_bytes(advice.budget)}" if advice.budget else ""
    console.print(f"largest batch that fits{budget_text}: {advice.largest}{limit}", highlight=False)
    if ns.rule == "accumulate":
        console.print(
            f"global batch kept at {advice.global_batch_after}: {advice.accumulate} x {advice.batch_size} per step",
            highlight=False,
        )
    else:
        console.print(
            f"global batch {advice.global_batch_before} -> {advice.global_batch_after}, peak LR "
            f"{advice.lr_before:.4g} -> {advice.lr_after:.4g} ({ns.rule} rule), "
            f"{advice.steps_per_epoch} steps an epoch",
            highlight=False,
        )
    print(" ".join(advice.overrides))  # stdout: the overrides alone, for scripts
    return 0


MAX_LR_FIND_STEPS = 10_000  # a range test's steps; more sizes a list by the argument before anything is checked


def cmd_lr_find(ns: argparse.Namespace) -> int:
    recipe = _recipe(ns)
    if not 0 < ns.start < ns.end or not 5 <= ns.steps <= MAX_LR_FIND_STEPS:
        raise HastenError(
            f"lr-find: need 0 < --start < --end and --steps from 5 to {MAX_LR_FIND_STEPS:,} (a range test is a few "
            f"hundred steps; got --start {ns.start:g} --end {ns.end:g} --steps {ns.steps:,})"
        )
    import torch

    from hasten.run.assemble import lr_scale
    from hasten.run.build import build
    from hasten.run.resolve import run_dir
    from hasten.tune.lr_find import AUTO_RULE, auto_lr, lr_find, plot_lr_find

    parts = build(recipe)
    result = lr_find(parts, ns.start, ns.end, ns.steps)
    recipe, scale = parts.recipe, lr_scale(parts.recipe)
    if torch.distributed.is_available() and torch.distributed.is_initialized() and torch.distributed.get_rank():
        return 0  # rank 0 reports; every rank has the same result
    path = plot_lr_find(result, _plot_path(ns.plot, run_dir(recipe) / "lr-find.png"), f"{recipe.name}: LR range test")
    peak = auto_lr(result)
    base = f" per {recipe.optim.base_batch} examples" if recipe.optim.base_batch else ""
    print(f"peak LR for this recipe's {recipe.schedule.name} schedule: {peak:.4g} ({AUTO_RULE}, the rule of "
          f"optim.lr=auto); to use it: optim.lr={peak / scale:.4g}{base}")  # fmt: skip
    per_base = result.suggestion / scale  # undo the scaling rule for the recipe's optim.lr
    print(f"suggested LR (fastai's rule): {result.suggestion:.4g} ({result.rule})")
    stopped = ", stopped when the loss diverged" if result.diverged else ""
    print(f"LR at the smoothed loss's minimum: {result.min_loss_lr:.4g}; swept {len(result.lrs)} steps{stopped}")
    if result.steepest_lr is not None:
        print(f"steepest descent of the smoothed loss: {result.steepest_lr:.4g}")
    base = f" (per {recipe.optim.base_batch} examples, scaled to the batch)" if recipe.optim.base_batch else ""
    print(f"to use it: optim.lr={per_base:.4g}{base}")
    print(f"plot: {path}")
    return 0


def cmd_bench(ns: argparse.Namespace) -> int:
    recipe = _recipe(ns)
    if ns.repeats < 1 or (ns.naive_epochs is not None and ns.naive_epochs < 1):
        raise HastenError("bench: --repeats and --naive-epochs must be at least 1")
    from hasten.experiments.bench import bench, plan_variants
    from hasten.experiments.report import bench_table

    variants = plan_variants(recipe, ns.vary, ns.ablate, naive=not ns.no_naive, also=ns.also)
    results, files = bench(
        recipe,
        variants,
        ns.repeats,
        ns.out,
        warmup=not ns.no_warmup,
        isolate=not ns.in_process,
        naive_epochs=ns.naive_epochs,
        command=ns.command_line,
    )
    print(bench_table(results))
    print(f"\nwritten: {', '.join(str(f) for f in files)}")
    failed = [f"{v['name']} r{r['repeat']}" for v in results["variants"] for r in v["runs"] if "error" in r]
    if failed:
        raise HastenError(f"bench: {len(failed)} run(s) failed ({', '.join(failed)}); see report.md for why")
    return 0


def cmd_sweep(ns: argparse.Namespace) -> int:
    recipe = _recipe(ns)
    from hasten.experiments.sweep import sweep

    _, files = sweep(recipe, ns.vary, ns.out, isolate=not ns.in_process, command=ns.command_line)
    print(files[0].read_text())
    print(f"written: {', '.join(str(f) for f in files)}")
    return 0


def cmd_transfer(ns: argparse.Namespace) -> int:
    recipe = _recipe(ns)
    try:
        seeds = [int(s) for s in ns.seeds.split(",")] if ns.seeds else None
    except ValueError:
        raise HastenError(f"--seeds {ns.seeds!r}: whole numbers separated by commas, e.g. --seeds 0,1,2") from None
    from hasten.experiments.transfer import transfer

    _, files = transfer(recipe, ns.out, seeds=seeds, isolate=not ns.in_process, command=ns.command_line)
    print(files[0].read_text())
    print(f"written: {', '.join(str(f) for f in files)}")
    return 0


def cmd_gan(ns: argparse.Namespace) -> int:
    from hasten.recipe.gan import load_gan_recipe

    source, overrides = _split_recipe(ns.args)
    recipe = load_gan_recipe(source, overrides)  # recipe errors show before torch and the data are loaded
    from hasten.experiments.gan import train_gan
    from hasten.experiments.gan_report import results_table as gan_results_table

    _show(train_gan(recipe, trust_code=ns.trust_code), recipe.run.progress, gan_results_table)
    return 0


def cmd_export(ns: argparse.Namespace) -> int:
    from hasten.use.export import export

    print(export(ns.checkpoint, ns.out, ns.format, overwrite=ns.overwrite, trust_code=ns.trust_code)[1])
    return 0


def cmd_evaluate(ns: argparse.Namespace) -> int:
    from hasten.use.evaluate import evaluate

    stray = [a for a in ns.overrides if "=" not in a]
    if stray:
        raise HastenError(f"evaluate: expected key=value data overrides after the run, got {stray[0]!r}")
    if ns.top_k < 1:
        raise HastenError(f"--top-k {ns.top_k}: at least 1")
    result = evaluate(ns.source, ns.overrides, top_k=ns.top_k, out=ns.out, trust_code=ns.trust_code)
    table = Table(title=f"{result['source']} on {result['data']} {result['split']} ({result['images']} images)")
    table.add_column("class")
    for name in result["results"]:
        table.add_column(f"{name}{' (as the run)' if name == result['run_setting'] else ''}")
    first = next(iter(result["results"].values()))
    rows = [key for key in first if key.endswith("accuracy") and key != "per_class_accuracy"]
    for key in rows:
        table.add_row(key.replace("_", " "), *(f"{r[key]:.4f}" for r in result["results"].values()))
    for name in result["classes"]:
        table.add_row(f"  {name}", *(f"{r['per_class_accuracy'][name]:.4f}" for r in result["results"].values()))
    Console().print(table)
    recorded = result["recorded_test_accuracy"]
    print(f"accuracy {result['accuracy']!r}" + (f" (summary.json: {recorded!r})" if recorded is not None else ""))
    print(f"written: {', '.join(result['files'])}")
    return 0


def cmd_predict(ns: argparse.Namespace) -> int:
    import csv

    from hasten.use.load import image_files, load

    if ns.json and ns.csv:
        raise HastenError("predict: --json or --csv, not both")
    if ns.top_k < 1:
        raise HastenError(f"--top-k {ns.top_k}: at least 1")
    model = load(ns.source, trust_code=ns.trust_code)
    files = image_files(ns.images)
    predictions = model.predict(files, top_k=ns.top_k)
    if ns.json:
        print(json.dumps([p.as_dict() for p in predictions], indent=2))
    elif ns.csv:
        k = len(predictions[0].top)
        writer = csv.writer(sys.stdout)
        writer.writerow(["image", *(f"{c}_{i}" for i in range(1, k + 1) for c in ("class", "probability"))])
        for p in predictions:
            writer.writerow([p.source, *(v for name, prob in p.top for v in (name, f"{prob:.6f}"))])
    else:
        table = Table(title=f"{ns.source}: {len(predictions)} image(s)")
        for column in ("image", "class", "probability", *(["top k"] * (ns.top_k > 1))):
            table.add_column(column)
        for p in predictions:
            top = ", ".join(f"{name} {prob:.3f}" for name, prob in p.top)
            table.add_row(p.source, p.label, f"{p.probability:.4f}", *([top] * (ns.top_k > 1)))
        Console().print(table)
    return 0


TRUST_HELP = (
    "import and run the model.target/data.target the source's recipe names (a run folder, checkpoint or export is "
    "data: without this flag hasten refuses to import code it names); only for files whose author you trust"
)


SUMMARIES = {
    "train": "train a recipe",
    "data": "fetch a dataset, show what is on disk, or write it as an image folder",
    "schedule": "plot a recipe's LR and momentum over the run, without training",
    "lr-find": "LR range test: sweep the LR, suggest one, plot the loss",
    "batch-size": "largest batch that fits in memory, with the LR rescaled or accumulation steps",
    "bench": "train variants of a recipe side by side (and the naive loop): time-to-accuracy, speed, memory",
    "sweep": "train a recipe over a grid of values (model width, ...): train and test error table and plots",
    "transfer": "pretrain, then fine-tune on N images per class beside training from scratch: table and plot",
    "export": "write the evaluated model with its preprocessing and classes: safetensors or ONNX",
    "evaluate": "a run's model on its test data or other data: accuracy, top-k, per class, confusion matrix",
    "predict": "class names and probabilities for image files, from a run folder or an export",
    "gan": "train a DCGAN (fp32, bf16, fp16): sample grids, Fréchet distance on hasten classifier features",
}


def commands() -> dict[str, argparse.ArgumentParser]:
    """One parser per command; each parses its own arguments intermixed, so options may come anywhere."""
    train = argparse.ArgumentParser(
        prog="hasten train",
        description="Train RECIPE (a YAML path or a shipped recipe name) with dotted "
        "key=value overrides, e.g. 'hasten train fashion-fast precision=bf16 optim.lr=0.2'.",
    )
    train.add_argument("args", nargs="*", metavar="[RECIPE] [key=value ...]")
    train.add_argument(
        "--devices",
        type=int,
        default=1,
        metavar="N",
        help="data-parallel over N processes on this machine (one per GPU; gloo on CPU), started through "
        "torchrun's launcher; for several machines run torchrun yourself (docs/guide/distributed.md)",
    )
    train.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        metavar="K",
        help="with --devices: restart the workers up to K times after a failure, resuming from the last checkpoint",
    )
    train.set_defaults(run=cmd_train)

    data = argparse.ArgumentParser(
        prog="hasten data",
        description="Fetch a dataset, show what is on disk, or write it as an image folder "
        "(make-folder: OUT/train/<class>/*.png and OUT/val/<class>/*.png).",
    )
    data.add_argument("action", choices=["fetch", "info", "make-folder"])
    data.add_argument("name", help="dataset name, e.g. fashion-mnist")
    data.add_argument("out", nargs="?", help="make-folder: the folder to write")
    data.add_argument("--root", help="folder that holds (or will hold) the dataset's files")
    data.add_argument("--size", type=int, help="make-folder: resize images to SIZE x SIZE pixels")
    data.add_argument(
        "--rgb", action=argparse.BooleanOptionalAction, help="make-folder: 3 channels (--no-rgb: 1); default: as stored"
    )
    data.add_argument("--limit", type=int, help="make-folder: at most the first N images of each split")
    data.set_defaults(run=cmd_data)

    schedule = argparse.ArgumentParser(
        prog="hasten schedule",
        description="Draw the LR and momentum of every optimizer step of RECIPE's run, without training.",
    )
    schedule.add_argument("args", nargs="*", metavar="[RECIPE] [key=value ...]")
    schedule.add_argument("--plot", metavar="PATH", help="PNG to write (default: RUN_DIR/schedule.png)")
    schedule.set_defaults(run=cmd_schedule)

    lr_find = argparse.ArgumentParser(
        prog="hasten lr-find",
        description="LR range test: train briefly with the LR growing exponentially, stop when the loss "
        "diverges, suggest an LR and plot the loss; the model and optimizer are restored afterwards.",
    )
    lr_find.add_argument("args", nargs="*", metavar="[RECIPE] [key=value ...]")
    lr_find.add_argument("--plot", metavar="PATH", help="PNG to write (default: RUN_DIR/lr-find.png)")
    lr_find.add_argument(
        "--start", type=float, default=1e-5, help="first LR of the sweep (default 1e-5, as optim.lr=auto)"
    )
    lr_find.add_argument("--end", type=float, default=10.0, help="last LR of the sweep (default 10)")
    lr_find.add_argument("--steps", type=int, default=100, help="optimizer steps in the sweep (default 100)")
    lr_find.set_defaults(run=cmd_lr_find)

    batch_size = argparse.ArgumentParser(
        prog="hasten batch-size",
        description="Find the largest batch of RECIPE that fits (doubling, then bisection; real training steps: "
        "CUDA up to out-of-memory, CPU against --memory-budget with the measured peak), then print the "
        "overrides that train with it: the LR rescaled by --rule linear or sqrt, or --rule accumulate to keep "
        "the global batch with gradient accumulation.",
    )
    batch_size.add_argument("args", nargs="*", metavar="[RECIPE] [key=value ...]")
    batch_size.add_argument(
        "--memory-budget", metavar="SIZE", help="e.g. 4GiB or 512MiB (default: CPU 60%% of available; CUDA the GPU)"
    )
    batch_size.add_argument(
        "--rule", choices=["linear", "sqrt", "accumulate"], default="linear", help="how to use it (default linear)"
    )
    batch_size.set_defaults(run=cmd_batch_size)

    bench = argparse.ArgumentParser(
        prog="hasten bench",
        description="Train variants of RECIPE side by side, after a warm-up, interleaved over --repeats, each "
        "in its own process, beside the naive textbook loop; write results.csv, results.json, report.md and "
        "plots to --out. E.g. 'hasten bench fashion-fast --vary precision=fp32,bf16 --repeats 3'.",
    )
    bench.add_argument("args", nargs="*", metavar="[RECIPE] [key=value ...]")
    bench.add_argument(
        "--vary",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="values to compare (repeatable): every combination is run, or one change at a time with --ablate",
    )
    bench.add_argument(
        "--ablate",
        action="store_true",
        help="the recipe, then one change at a time: the --vary values, or else each technique switched off",
    )
    bench.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="RECIPE",
        help="another recipe (name or YAML) to run beside, e.g. --also fashion-94 (repeatable)",
    )
    bench.add_argument("--repeats", type=int, default=3, help="runs of each variant (default 3)")
    bench.add_argument("--out", metavar="DIR", help="output folder (default: bench/<recipe name>)")
    bench.add_argument("--naive-epochs", type=int, metavar="N", help="epochs of the naive loop (default: the recipe's)")
    bench.add_argument("--no-naive", action="store_true", help="leave out the naive loop")
    bench.add_argument("--no-warmup", action="store_true", help="skip the warm-up run")
    bench.add_argument(
        "--in-process",
        action="store_true",
        help="run everything in this process: faster to start, but CPU peak memory only grows from run to run",
    )
    bench.set_defaults(run=cmd_bench)

    sweep = argparse.ArgumentParser(
        prog="hasten sweep",
        description="Train RECIPE once per point of a grid and write sweep.md (table), results.json/csv and "
        "plots of train and test error against the first varied key and against epochs to --out. E.g. "
        "'hasten sweep double-descent --vary model.width=1,2,4,8,16,32,64' (Nakkiran et al., 2019).",
    )
    sweep.add_argument("args", nargs="*", metavar="[RECIPE] [key=value ...]")
    sweep.add_argument(
        "--vary", action="append", default=[], metavar="KEY=V1,V2", help="values to sweep (repeatable: a grid)"
    )
    sweep.add_argument("--out", metavar="DIR", help="output folder (default: the recipe's run folder)")
    sweep.add_argument("--in-process", action="store_true", help="run everything in this process (faster to start)")
    sweep.set_defaults(run=cmd_sweep)

    transfer = argparse.ArgumentParser(
        prog="hasten transfer",
        description="Pretrain with RECIPE's transfer.pretrain overrides (or take its model.pretrained), then "
        "fine-tune on each size of transfer.per_class beside training from scratch on the same budget; write "
        "transfer.md, transfer.png and results.json/csv to --out. E.g. 'hasten transfer transfer-digits'.",
    )
    transfer.add_argument("args", nargs="*", metavar="[RECIPE] [key=value ...]")
    transfer.add_argument("--seeds", metavar="S1,S2", help="seeds to repeat each run with (default: the recipe's)")
    transfer.add_argument("--out", metavar="DIR", help="output folder (default: the recipe's run folder)")
    transfer.add_argument("--in-process", action="store_true", help="run everything in this process")
    transfer.set_defaults(run=cmd_transfer)

    gan = argparse.ArgumentParser(
        prog="hasten gan",
        description="Train the DCGAN of RECIPE (default: dcgan-fashion) with dotted key=value overrides, e.g. "
        "'hasten gan dcgan-fashion precision=fp16 train.epochs=2'. Writes a sample grid per epoch, metrics.csv, "
        "TensorBoard events, checkpoints (resume=auto continues) and a Fréchet distance on features of a "
        "hasten classifier (not Inception FID).",
    )
    gan.add_argument("args", nargs="*", metavar="[RECIPE] [key=value ...]")
    gan.add_argument("--trust-code", action="store_true", help="quality.classifier: " + TRUST_HELP)
    gan.set_defaults(run=cmd_gan)

    export = argparse.ArgumentParser(
        prog="hasten export",
        description="Write the model a run evaluated (the EMA weights where tricks.ema was on) with its class names "
        "and preprocessing: safetensors (metadata in the header) or ONNX (uint8 pixels in, normalisation and flip "
        "TTA inside, dynamic batch; checked against PyTorch with onnxruntime).",
    )
    export.add_argument("checkpoint", help="a run folder (its newest checkpoint) or a checkpoint (.pt)")
    export.add_argument("out", help="the file to write (.safetensors or .onnx)")
    export.add_argument(
        "--format", choices=["safetensors", "onnx"], help="default: from OUT's suffix (.safetensors or .onnx)"
    )
    export.add_argument("--overwrite", action="store_true", help="replace OUT when it exists (never a run's own files)")
    export.add_argument("--trust-code", action="store_true", help=TRUST_HELP)
    export.set_defaults(run=cmd_export)

    evaluate = argparse.ArgumentParser(
        prog="hasten evaluate",
        description="Evaluate the model a run evaluated, on its own test data (the accuracy equals summary.json's) "
        "or on other data given as data.* overrides (e.g. data.name=imagefolder data.root=DIR): accuracy, top-k, "
        "per-class accuracy, with and without flip TTA; writes confusion.csv/.png and evaluation.json.",
    )
    evaluate.add_argument("source", metavar="RUN_DIR|CHECKPOINT")
    evaluate.add_argument("overrides", nargs="*", metavar="key=value")
    evaluate.add_argument("--top-k", type=int, default=5, help="k of the top-k accuracy (default 5)")
    evaluate.add_argument("--out", metavar="DIR", help="folder to write to (default: RUN_DIR/evaluation)")
    evaluate.add_argument("--trust-code", action="store_true", help=TRUST_HELP)
    evaluate.set_defaults(run=cmd_evaluate)

    predict = argparse.ArgumentParser(
        prog="hasten predict",
        description="Class names and probabilities of image files (any size and mode: converted as training did), "
        "from a run folder, a checkpoint, or a hasten .safetensors or .onnx export.",
    )
    predict.add_argument("source", metavar="RUN_DIR|EXPORT")
    predict.add_argument("images", nargs="+", metavar="IMAGE_OR_FOLDER")
    predict.add_argument("--top-k", type=int, default=1, help="classes shown per image (default 1)")
    predict.add_argument("--json", action="store_true", help="print JSON instead of a table")
    predict.add_argument("--csv", action="store_true", help="print CSV instead of a table")
    predict.add_argument("--trust-code", action="store_true", help=TRUST_HELP)
    predict.set_defaults(run=cmd_predict)
    return {
        "train": train,
        "data": data,
        "schedule": schedule,
        "lr-find": lr_find,
        "batch-size": batch_size,
        "bench": bench,
        "sweep": sweep,
        "transfer": transfer,
        "gan": gan,
        "export": export,
        "evaluate": evaluate,
        "predict": predict,
    }


def top_parser(parsers: dict[str, argparse.ArgumentParser]) -> argparse.ArgumentParser:
    listing = "\n".join(f"  {name:<12}{SUMMARIES[name]}" for name in parsers)
    top = argparse.ArgumentParser(
        prog="hasten",
        description="Train neural networks fast and memory-efficiently, and measure what each technique buys.",
        epilog=f"commands:\n{listing}\n\nRun 'hasten COMMAND --help' for a command's options.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    top.add_argument("--version", action="version", version=f"hasten {hasten.__version__}")
    top.add_argument("command", choices=list(parsers), metavar="COMMAND")
    top.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return top


def main(argv: Sequence[str] | None = None, started: float | None = None) -> int:
    """The command with `argv`; its wall-clock times count from `started` (a perf_counter reading; by default
    this call)."""
    started = time.perf_counter() if started is None else started
    from hasten.progress import quiet_third_party

    quiet_third_party()  # torch's notices about its own internals are not the user's business
    argv = list(sys.argv[1:] if argv is None else argv)
    for stream in (sys.stdout, sys.stderr):  # a name that is not UTF-8 (a file, a class folder) prints escaped
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    parsers = commands()
    if not (sys.argv[1:] if argv is None else list(argv)):  # bare `hasten`: what to type, not argparse's internals
        top_parser(parsers).print_help(sys.stderr)
        console.print("[red]error:[/red] give a COMMAND, e.g. 'hasten train fashion-fast'", highlight=False)
        return 2
    if argv[0] not in parsers and not argv[0].startswith("-"):  # a mistyped command: the closest, not a list
        close = difflib.get_close_matches(argv[0], list(parsers), n=1, cutoff=0.5)
        hint = f"; did you mean 'hasten {close[0]}'?" if close else f"; the commands: {', '.join(parsers)}"
        console.print(f"[red]error:[/red] unknown command {escape(repr(argv[0]))}{hint}", highlight=False,
                      soft_wrap=True)  # fmt: skip
        return 2
    top = top_parser(parsers).parse_args(argv)
    ns = parsers[top.command].parse_intermixed_args(top.rest)
    # the command line as given, which reports record: rebuilt from parsed options it would drop any new one
    ns.command_line = shlex.join(["hasten", *argv])
    ns.started = started
    # a worker of a job with several processes names its rank in what it prints on the way out
    who = f"rank {os.environ.get('RANK', '?')}: " if _world_size() > 1 else ""
    if os.environ.get("HASTEN_LAUNCHER_PID", "").isdigit() and _world_size() > 1:  # a worker of --devices N
        from hasten.engine.distributed import die_with_launcher

        die_with_launcher(int(os.environ["HASTEN_LAUNCHER_PID"]))
    try:
        from hasten.machine import current

        current()  # a HASTEN_MACHINE that names no profile is refused before any work, whatever the command
        return ns.run(ns)
    except HastenError as error:
        if getattr(error, "resumable", False):  # a signal stopped a run after its checkpoint: no error
            again = resume_command(ns.command_line) if top.command in ("train", "gan") else ""
            told = f"; resume with: {again}" if again else ""
            console.print(f"[yellow]{who}stopped:[/yellow] {escape(str(error))}{escape(told)}", highlight=False,
                          soft_wrap=True)  # fmt: skip
            return error.exit_code
        console.print(f"[red]{who}error:[/red] {escape(str(error))}", highlight=False, soft_wrap=True)
        return error.exit_code
    except OSError as error:
        if not error.filename:
            raise
        # a file or folder the user named that the system refuses (permissions, a vanished disk): exit 2 naming it
        message = escape(f"{error.filename}: {error.strerror or error}")
        console.print(f"[red]{who}error:[/red] {message}", highlight=False, soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        console.print(f"[yellow]{who}interrupted[/yellow]")
        return 130
    except (MemoryError, RuntimeError) as error:
        return _resource_failure(error, who)
    finally:
        if "hasten.engine.distributed" in sys.modules:  # leave the process group cleanly (no-op when none is up)
            sys.modules["hasten.engine.distributed"].shutdown()


def resume_command(command_line: str) -> str:
    """The command that continues a stopped run: `command_line` with resume=auto in place of any resume=... (and
    without run.overwrite, which would move the stopped run's files aside)."""
    words = [w for w in shlex.split(command_line) if not w.startswith(("resume=", "run.overwrite="))]
    return shlex.join([*words, "resume=auto"])


def _world_size() -> int:
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


# what torch's allocators say when a request cannot be met (CPU, CUDA, MPS)
OUT_OF_MEMORY = ("can't allocate memory", "out of memory", "not enough memory", "Cannot allocate memory")


def _resource_failure(error: BaseException, who: str) -> int:
    """The one line for a failure that is not hasten's input check but the machine's: memory that cannot be had, or
    (in a worker of several) another rank that vanished. Anything else is a bug, raised with its traceback."""
    from hasten.engine.distributed import PEER_LOST_EXIT, lost_peer

    first = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
    if isinstance(error, MemoryError) or any(marker in str(error) for marker in OUT_OF_MEMORY):
        console.print(
            f"[red]{who}error:[/red] out of memory ({escape(first)}): the sizes asked for are too large for this "
            "machine (in a recipe: train.batch_size, train.eval_batch_size, model.width, data.size), or free memory",
            highlight=False,
            soft_wrap=True,
        )
        return 2
    if lost_peer(error):
        if not os.environ.get("HASTEN_LAUNCHER_PID"):  # under hasten's launcher, its one line says it all
            console.print(
                f"[red]{who}error:[/red] another rank of this job vanished ({escape(first)}); the launcher names it",
                highlight=False,
                soft_wrap=True,
            )
        return PEER_LOST_EXIT
    raise error


def run() -> NoReturn:
    """The `hasten` command's process: `main`, then exit at once. Everything is written and closed by then, and
    the interpreter's teardown of torch alone takes seconds (3-6 s measured on a busy 2-core machine) after a
    run's last line; so exit handlers run, output is flushed, and the process ends without the teardown."""
    from hasten.clock import command_started

    code = main(started=command_started())  # the process's start (or the launching command's): imports count
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
