"""Exponential moving average of the weights, used for evaluation (Polyak & Juditsky, 1992; in the fast
CIFAR-10 records of Page's ResNet-9 and airbench; timm's ModelEmaV2).

After every optimizer step, `average = d_t * average + (1 - d_t) * weights`, over the parameters and the
buffers. The decay warms up, `d_t = min(decay, (1 + t) / (10 + t))` after t updates (TensorFlow's
ExponentialMovingAverage with num_updates, timm's EMA warm-up): a fixed 0.99 keeps 0.99**40 = 67% of the
initial random weights after a 40-step run, so a short run evaluated its initialisation. With the warm-up the
average's horizon grows with the run (about t/10 steps early on) up to 1 / (1 - decay).

Batch norm: averaged running statistics belong to no single set of weights. Before the average is evaluated
its statistics are recomputed for its own weights over a few training batches (`calibrate`, what SWA does with
torch.optim.swa_utils.update_bn, Izmailov et al., 2018), so the evaluated model is a consistent one.
torch.optim.swa_utils.AveragedModel keeps the average.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.optim.swa_utils import AveragedModel

from hasten.engine.norms import has_batch_norm
from hasten.models.copying import leaf_attributes
from hasten.techniques.technique import Context, Switch, Technique

if TYPE_CHECKING:
    from hasten.recipe.schema import Recipe


def ema_update(average: Tensor, value: Tensor, decay: float) -> Tensor:
    """One EMA step of a single tensor (the math AveragedModel applies to every parameter and buffer)."""
    return decay * average + (1 - decay) * value


def warmup_decay(decay: float, updates: int) -> float:
    """The decay used for update number `updates` (0-based): min(decay, (1 + t) / (10 + t))."""
    return min(decay, (1 + updates) / (10 + updates))


class EMA(Technique):
    """After-step hook: keeps the moving average of `model`; `eval_model` hands the averaged copy to the
    evaluation, its batch-norm statistics recomputed by `calibrate(module)` first when it has batch norm.
    `state_dict()` holds the averaged weights and buffers and the update count (checkpointed as
    `state["hooks"]["ema"]`). Made from a recipe without a model, it copies the model at `on_optimizer`, once
    the model is on its device and in its precision."""

    name, hooks, order = "ema", frozenset({"on_optimizer", "after_step", "eval_model"}), 30
    switches = (Switch("tricks.ema", "0", "0.99", "a moving average of the weights, evaluated instead of them"),)
    stateful = True

    def __init__(self, model: nn.Module | None, decay: float, calibrate: Callable[[nn.Module], None] | None = None):
        self.decay = decay
        self._calibrate = calibrate
        self.calibrate: Callable[[nn.Module], None] | None = None
        self.averaged: AveragedModel | None = None
        self.updates = 0  # updates made: sets the warmed-up decay (kept in n_averaged for checkpoints)
        self._calibrated_at = -1  # `updates` when the statistics were last recomputed
        if model is not None:
            self.on_optimizer(model)

    @classmethod
    def from_recipe(cls, recipe: Recipe, context: Context) -> EMA | None:
        if not recipe.tricks.ema:
            return None
        return cls(None, recipe.tricks.ema, context.calibrate if recipe.tricks.ema_bn_images else None)

    def on_optimizer(self, model: nn.Module) -> None:
        self.calibrate = self._calibrate if has_batch_norm(model) else None
        with leaf_attributes(model):  # AveragedModel deep-copies it (torch.nn.utils.weight_norm's weight: copying.py)
            self.averaged = AveragedModel(model, multi_avg_fn=self._average, use_buffers=True)

    def _average(self, averaged: list[Tensor], current: list[Tensor], num_averaged: Tensor) -> None:
        weight = 1 - warmup_decay(self.decay, self.updates)
        floats = [(a, c) for a, c in zip(averaged, current, strict=True) if a.is_floating_point()]
        if floats:
            torch._foreach_lerp_([a for a, _ in floats], [c for _, c in floats], weight)
        for a, c in zip(averaged, current, strict=True):  # integer buffers (BN's batch count): the latest value
            if not a.is_floating_point():
                a.copy_(c)

    @torch.no_grad()
    def after_step(self, model: nn.Module) -> None:
        self.averaged.update_parameters(model)
        self.updates += 1

    def eval_model(self, model: nn.Module) -> nn.Module:
        """The model to evaluate: the average once it has seen a step (batch-norm statistics recomputed for its
        weights), the live model before that."""
        if self.updates == 0:
            return model
        if self.calibrate is not None and self._calibrated_at != self.updates:
            self.calibrate(self.averaged.module)
            self._calibrated_at = self.updates
        return self.averaged.module

    def state_dict(self) -> dict[str, Any]:
        return self.averaged.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.averaged.load_state_dict(state)
        self.updates = int(self.averaged.n_averaged)
        self._calibrated_at = -1
