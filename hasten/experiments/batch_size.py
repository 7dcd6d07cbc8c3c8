"""`hasten batch-size`: the largest batch that fits, and the recipe overrides that train with it.

The search is `hasten.engine.memory.search_batch_size` (doubling, then bisection) over a `fits(batch_size)`
that runs real training steps of the recipe (its model, precision, channels_last, activation checkpointing,
tricks) on random batches of the dataset's image shape:

- CUDA: a size fits when a step does not run out of memory (and, with a budget, when the allocator's peak
  stays within it); out-of-memory is caught, any other error propagates.
- CPU: a size fits when the bytes the run keeps (weights, optimizer state, fp32 masters) plus one step's peak
  (hasten.engine.memory.measure_peak) stay within the budget (default: 60% of the memory available now). A size whose
  linear extrapolation from the last two measurements exceeds the budget by over 25% is not run, so the search
  never allocates far past the budget. The dataset held in memory is not counted.

Then, as the user picks: `linear` or `sqrt` trains with the new batch and rescales the LR by that rule (Goyal
et al., 2017; Krizhevsky, 2014 / Hoffer et al., 2017), through `optim.base_batch`; `accumulate` keeps the global
batch, and so the LR, by splitting it into micro-batches that fit. torch.compile is left out of the measurement:
it would recompile for every size. Under torch.distributed every rank searches on its own, then all take the
smallest result.
"""

from __future__ import annotations

import gc
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from hasten.data.loader import in_layout
from hasten.engine.memory import (
    NothingFits,
    Search,
    agree_on_min,
    available_memory_bytes,
    format_bytes,
    measure_peak,
    search_batch_size,
    state_bytes,
)
from hasten.models.copying import copy_model
from hasten.recipe.schema import Recipe, apply_overrides, validate
from hasten.run.assemble import Parts, global_batch, scaled_lr, train_size
from hasten.run.build import build
from hasten.run.plan import Plan
from hasten.run.resolve import MIN_AUTO_BATCH
from hasten.run.trainer import Trainer
from hasten.runfolder.log import RunLog
from hasten.tune import rules

RULES = ("linear", "sqrt", "accumulate")
PREDICTION_MARGIN = 1.25  # CPU: skip sizes predicted to need more than this x the budget
TOLERANCE = 1 / 32  # bisection stops within ~3% of the largest size that fits
SMALLEST = 2  # the search's least batch: batch norm cannot train on one image where the last feature map is 1 x 1


@dataclass
class StepMemory:
    """`fits` for the search: runs one training step at the asked size and compares its memory to the budget."""

    trainer: Trainer
    image_shape: tuple[int, int, int]
    num_classes: int
    channels_last: bool
    budget: int | None  # bytes; None: CUDA only, up to out-of-memory
    measured: dict[int, int | None] = field(default_factory=dict)  # size -> bytes (None: out of memory / skipped)

    @property
    def device(self) -> torch.device:
        return self.trainer.device

    def step(self, batch_size: int) -> None:
        images = in_layout(torch.randn(batch_size, *self.image_shape, device=self.device), self.channels_last)
        labels = torch.randint(0, self.num_classes, (batch_size,), device=self.device)
        self.trainer.train_step(images, labels)

    def predicted(self, batch_size: int) -> float | None:
        points = sorted((b, m) for b, m in self.measured.items() if m is not None)
        if len(points) < 2:
            return None
        (b0, m0), (b1, m1) = points[-2:]
        return m1 + (m1 - m0) / (b1 - b0) * (batch_size - b1)

    def __call__(self, batch_size: int) -> bool:
        if self.device.type == "cuda":
            return self._fits_cuda(batch_size)
        guess = self.predicted(batch_size)
        if self.budget is not None and guess is not None and guess > PREDICTION_MARGIN * self.budget:
            self.measured[batch_size] = None
            return False
        with measure_peak(self.device) as peak:
            self.step(batch_size)
        self.trainer.optimizer.zero_grad(set_to_none=True)
        held = state_bytes(self.trainer.model, self.trainer.optimizer)
        self.measured[batch_size] = held + peak.bytes
        return self.budget is None or self.measured[batch_size] <= self.budget

    def _fits_cuda(self, batch_size: int) -> bool:
        try:
            torch.cuda.reset_peak_memory_stats(self.device)
            self.step(batch_size)
            torch.cuda.synchronize(self.device)
            used = int(torch.cuda.max_memory_allocated(self.device))
        except torch.cuda.OutOfMemoryError:
            used = None
        self.trainer.optimizer.zero_grad(set_to_none=True)
        self.trainer.model.zero_grad(set_to_none=True)
        gc.collect()
        torch.cuda.empty_cache()
        self.measured[batch_size] = used
        return used is not None and (self.budget is None or used <= self.budget)


@dataclass
class Advice:
    search: Search
    largest: int  # the largest micro-batch that fits, agreed by all ranks
    rule: str
    batch_size: int  # the micro-batch to train with
    accumulate: int
    global_batch_before: int
    global_batch_after: int
    lr_before: float
    lr_after: float
    overrides: list[str]
    measured: dict[int, int | None]  # bytes per size tried; None: out of memory (CUDA) or not run (CPU)
    budget: int | None
    device_type: str
    steps_per_epoch: int = 0  # optimizer steps an epoch at the advised batch
    step_cap: int | None = None  # the largest batch train.min_steps_per_epoch allows (None: no such limit)


def advise(recipe: Recipe, largest: int, rule: str) -> tuple[int, int, list[str]]:
    """(micro-batch, accumulation steps, overrides) that use the largest size that fits under `rule`.

    linear/sqrt: the largest size, one micro-batch per step, and the LR rescaled from the recipe's global batch by
    the rule (via optim.base_batch, set to the current global batch if the recipe has none). accumulate: the
    fewest micro-batches whose size divides the current global batch and fits, so the global batch stays.
    """
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    per_process = recipe.train.batch_size * recipe.train.accumulate
    if rule == "accumulate":
        steps = next(a for a in range(math.ceil(per_process / largest), per_process + 1) if per_process % a == 0)
        batch = per_process // steps
        return batch, steps, [f"train.batch_size={batch}", f"train.accumulate={steps}"]
    overrides = [f"train.batch_size={largest}", "train.accumulate=1", f"optim.scaling={rule}"]
    if recipe.optim.base_batch is None:
        overrides.insert(2, f"optim.base_batch={global_batch(recipe)}")
    return largest, 1, overrides


def find_batch_size(
    recipe: Recipe, budget: int | None, rule: str = "linear", *, model: Any = None, data: Any = None
) -> Advice:
    """Search the largest batch that fits `budget` bytes (None: CPU 60% of available memory; CUDA: the GPU).
    `model` and `data`: the user's own, as `hasten.train` takes them (a model object is measured on a copy)."""
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    measuring = validate(apply_overrides(recipe.model_dump(mode="json"), ["train.compile=false", "run.progress=false"]))
    if isinstance(model, torch.nn.Module):  # the search trains it at many sizes: leave the user's weights alone
        model = copy_model(model)
    parts: Parts = build(measuring, model=model, data=data)
    # the batch, epochs and LR the run would take (`auto` decided as `hasten train` decides it), the measuring
    # switches undone: what the advice starts from
    undone = [f"train.compile={recipe.train.compile}", f"run.progress={recipe.run.progress}"]
    recipe = validate(apply_overrides(parts.recipe.model_dump(mode="json"), undone))
    if budget is None and parts.device.type != "cuda":
        budget = int(0.6 * available_memory_bytes())
    plan = Plan(epochs=1, num_classes=len(parts.data.classes), progress=False, measure_step_memory=False)
    loaders = (parts.train_loader, parts.test_loader)
    log = RunLog("", enabled=False)
    trainer = Trainer(parts.model, parts.optimizer, parts.scheduler, parts.precision, loaders, plan, log, parts.hooks)
    fits = StepMemory(trainer, parts.data.image_shape, plan.num_classes, parts.recipe.train.channels_last, budget)
    # allocates the optimizer state, so every measurement holds it; 2 images, as batch norm cannot train on one
    # where the last feature map is 1x1 (8x8 digits)
    fits.step(2)
    # a batch so large that an epoch has a handful of steps trains worse whatever memory allows: the search stops
    # at the largest batch that keeps train.min_steps_per_epoch steps (each rank's share of the images)
    images, world = train_size(parts.data), parts.train_loader.world_size
    min_steps = recipe.train.min_steps_per_epoch
    step_cap = max(MIN_AUTO_BATCH, images // (min_steps * world)) if min_steps else None  # as training does
    limit = min(parts.train_loader.shard_size, step_cap or parts.train_loader.shard_size)
    try:
        search = search_batch_size(fits, start=2, limit=limit, tolerance=TOLERANCE, smallest=SMALLEST)
    except NothingFits:
        used = fits.measured.get(SMALLEST)
        where = f"the budget of {format_bytes(budget)}" if budget is not None else f"the memory of {parts.device}"
        needs = f" (it needs {format_bytes(used)})" if used is not None else ""
        raise NothingFits(f"even a batch of {SMALLEST} does not fit in {where}{needs}") from None
    largest = agree_on_min(search.batch_size)
    batch, steps, overrides = advise(recipe, largest, rule)
    after = validate(apply_overrides(recipe.model_dump(mode="json"), overrides))
    return Advice(
        search=search,
        largest=largest,
        rule=rule,
        batch_size=batch,
        accumulate=steps,
        global_batch_before=global_batch(recipe),
        global_batch_after=global_batch(after),
        lr_before=scaled_lr(recipe.optim, global_batch(recipe)),
        lr_after=scaled_lr(after.optim, global_batch(after)),
        overrides=overrides,
        measured=fits.measured,
        budget=budget,
        device_type=parts.device.type,
        steps_per_epoch=rules.steps_per_epoch(images, after.train.batch_size, world, after.train.accumulate),
        step_cap=step_cap if step_cap is not None and step_cap < parts.train_loader.shard_size else None,
    )
