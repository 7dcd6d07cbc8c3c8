"""The commands that show what a recipe's run would do, without training it: `hasten schedule` (its LR and momentum
over every step), `hasten lr-find` (an LR range test) and `hasten batch-size` (the largest batch that fits)."""

from __future__ import annotations

import argparse
import math

from hasten.cli.command import RECIPE_ARGUMENTS, Command, arg, console, plot_path, recipe_of
from hasten.errors import HastenError


def cmd_schedule(ns: argparse.Namespace) -> int:
    recipe = asked = recipe_of(ns)
    from hasten.experiments.schedule import plot_schedule, schedule_trace
    from hasten.run.extension import FACTOR, FIT, FIT_EPOCHS, check_epoch, holds_peak, late_from
    from hasten.run.resolve import run_dir

    plot = plot_path(ns.plot, run_dir(recipe) / "schedule.png")  # refused before `auto` is decided, not after
    result = schedule_trace(recipe)
    recipe = result.recipe  # as resolved: `auto` decided as `hasten train` decides it
    title = f"{recipe.name}: {recipe.schedule.name} schedule, {recipe.train.epochs} epochs"
    path = plot_schedule(result, plot, title)
    print(f"{result.total_steps} optimizer steps ({result.steps_per_epoch} per epoch), warmup {result.warmup_steps}")
    print(f"LR: peak {max(result.lrs):.4g}, first step {result.lrs[0]:.4g}, last step {result.lrs[-2]:.4g}")
    print(f"momentum/beta1: {min(result.momenta):.3g} to {max(result.momenta):.3g}")
    if asked.train.epochs == "auto" and holds_peak(recipe.schedule):  # as `hasten train` may, at the hold's end
        check, epochs = check_epoch(recipe.schedule.peak, recipe.train.epochs), recipe.train.epochs
        late = late_from(check)
        also = f", or first left it at epoch {late} or later," if late <= check else ""
        print(f"train.epochs=auto: a run whose training accuracy is still at chance after epoch {check}{also} goes "
              f"on at the peak LR to {FACTOR * epochs} epochs (once)")  # fmt: skip
        if recipe.train.end_early:
            print(f"train.epochs=auto: a run whose training accuracy is {FIT:.0%} or more for {FIT_EPOCHS} epochs in a "
                  f"row before epoch {check} ends the LR's hold there and falls over as many epochs (train.end_early; "
                  "once)")  # fmt: skip
    print(f"plot: {path}")
    return 0


SCHEDULE = Command(
    name="schedule",
    summary="plot a recipe's LR and momentum over the run, without training",
    description="Draw the LR and momentum of every optimizer step of RECIPE's run, without training.",
    arguments=(RECIPE_ARGUMENTS, arg("--plot", metavar="PATH", help="PNG to write (default: RUN_DIR/schedule.png)")),
    run=cmd_schedule,
)


def cmd_batch_size(ns: argparse.Namespace) -> int:
    from hasten.engine.memory import format_bytes, parse_bytes

    recipe = recipe_of(ns)
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


BATCH_SIZE = Command(
    name="batch-size",
    summary="largest batch that fits in memory, with the LR rescaled or accumulation steps",
    description="Find the largest batch of RECIPE that fits (doubling, then bisection; real training steps: "
    "CUDA up to out-of-memory, CPU against --memory-budget with the measured peak), then print the "
    "overrides that train with it: the LR rescaled by --rule linear or sqrt, or --rule accumulate to keep "
    "the global batch with gradient accumulation.",
    arguments=(
        RECIPE_ARGUMENTS,
        arg(
            "--memory-budget",
            metavar="SIZE",
            help="e.g. 4GiB or 512MiB (default: CPU 60%% of available; CUDA the GPU)",
        ),
        arg(
            "--rule", choices=["linear", "sqrt", "accumulate"], default="linear", help="how to use it (default linear)"
        ),
    ),
    run=cmd_batch_size,
)


MAX_LR_FIND_STEPS = 10_000  # a range test's steps; more sizes a list by the argument before anything is checked


def cmd_lr_find(ns: argparse.Namespace) -> int:
    recipe = recipe_of(ns)
    if not 0 < ns.start < ns.end < math.inf or not 5 <= ns.steps <= MAX_LR_FIND_STEPS:
        raise HastenError(
            f"lr-find: need 0 < --start < --end (finite) and --steps from 5 to {MAX_LR_FIND_STEPS:,} (a range test is "
            f"a few hundred steps; got --start {ns.start:g} --end {ns.end:g} --steps {ns.steps:,})"
        )
    import torch

    from hasten.run.assemble import lr_scale
    from hasten.run.build import build
    from hasten.run.resolve import run_dir
    from hasten.tune.lr_find import AUTO_RULE, auto_lr, lr_find, plot_lr_find

    plot = plot_path(ns.plot, run_dir(recipe) / "lr-find.png")  # refused before the test's steps, not after
    parts = build(recipe)
    result = lr_find(parts, ns.start, ns.end, ns.steps)
    recipe, scale = parts.recipe, lr_scale(parts.recipe)
    if torch.distributed.is_available() and torch.distributed.is_initialized() and torch.distributed.get_rank():
        return 0  # rank 0 reports; every rank has the same result
    path = plot_lr_find(result, plot, f"{recipe.name}: LR range test")
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
    print(f"to use fastai's suggestion instead: optim.lr={per_base:.4g}{base}")
    print(f"plot: {path}")
    return 0


LR_FIND = Command(
    name="lr-find",
    summary="LR range test: sweep the LR, suggest one, plot the loss",
    description="LR range test: train briefly with the LR growing exponentially, stop when the loss "
    "diverges, suggest an LR and plot the loss; the model and optimizer are restored afterwards.",
    arguments=(
        RECIPE_ARGUMENTS,
        arg("--plot", metavar="PATH", help="PNG to write (default: RUN_DIR/lr-find.png)"),
        arg("--start", type=float, default=1e-5, help="first LR of the sweep (default 1e-5, as optim.lr=auto)"),
        arg("--end", type=float, default=10.0, help="last LR of the sweep (default 10)"),
        arg("--steps", type=int, default=100, help="optimizer steps in the sweep (default 100)"),
    ),
    run=cmd_lr_find,
)
