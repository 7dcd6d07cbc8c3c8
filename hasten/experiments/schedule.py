"""`hasten schedule`: the LR and momentum of every optimizer step of a recipe's run, and their plot,
without training. The run is built as `hasten train` builds it (every `auto` decided: the batch by this machine's
timing, the epochs from the data, optim.lr=auto by its range test), so the step count comes from the real data
loader and warmup and cycles fall where they will."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hasten.engine.schedules import rise_steps, trace, warmup_steps
from hasten.recipe.schema import Recipe
from hasten.run.assemble import global_batch, lr_scale, optimizer_steps, scaled_lr, steps_per_epoch
from hasten.run.build import build


@dataclass
class ScheduleTrace:
    lrs: list[float]  # LR at each optimizer step 0..total (the last one is where the run ends)
    momenta: list[float]  # momentum (SGD) or beta1 (Adam-style) at each step
    steps_per_epoch: int
    total_steps: int
    warmup_steps: int
    momentum_scheduled: bool
    recipe: Recipe  # as resolved: the values the run would train with


def schedule_trace(recipe: Recipe) -> ScheduleTrace:
    """The recipe's per-step LR (after the scaling rule) and momentum over the whole run, as `hasten train` would
    resolve it (`build`: the same opening lines, nothing trained)."""
    parts = build(recipe)
    recipe, train_loader = parts.recipe, parts.train_loader
    total = optimizer_steps(recipe, train_loader)
    peak = scaled_lr(recipe.optim, global_batch(recipe))
    multipliers, momenta = trace(recipe.schedule, total, lr_scale(recipe))
    fixed = recipe.optim.momentum if recipe.optim.name in ("sgd", "muon") else recipe.optim.betas[0]
    return ScheduleTrace(
        lrs=[peak * m for m in multipliers],
        momenta=momenta if momenta is not None else [fixed] * len(multipliers),
        steps_per_epoch=steps_per_epoch(recipe, train_loader),  # optimizer steps, not batches (train.accumulate)
        total_steps=total,
        warmup_steps=run_warmup_steps(recipe, total),
        momentum_scheduled=momenta is not None,
        recipe=recipe,
    )


def run_warmup_steps(recipe: Recipe, total: int) -> int:
    """The warmup the run takes: schedule.warmup's steps, or the longer rise schedule.min_warmup_steps asks of a
    schedule without a rise of its own (every schedule but a one-cycle that starts below its peak, which lengthens
    its own rising phase instead: hasten/engine/schedules.py's lr_and_momentum)."""
    config, steps = recipe.schedule, warmup_steps(recipe.schedule, total)
    if config.name == "one-cycle" and config.start < 1:
        return steps
    return max(steps, rise_steps(config, total, lr_scale(recipe)))


def plot_schedule(result: ScheduleTrace, path: str | Path, title: str) -> Path:
    """LR (top) and momentum (bottom) against epochs, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = [step / result.steps_per_epoch for step in range(len(result.lrs))]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5), sharex=True, constrained_layout=True)
    top.plot(epochs, result.lrs, color="tab:blue")
    top.set_ylabel("learning rate")
    top.set_title(title)
    if result.warmup_steps:
        top.axvline(result.warmup_steps / result.steps_per_epoch, color="grey", linestyle=":", label="end of warmup")
        top.legend(loc="upper right")
    bottom.plot(epochs, result.momenta, color="tab:orange")
    bottom.set_ylabel("momentum / beta1" if result.momentum_scheduled else "momentum / beta1 (fixed)")
    bottom.set_xlabel(f"epoch ({result.steps_per_epoch} optimizer steps each)")
    for axis in (top, bottom):
        axis.grid(alpha=0.3)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
