"""Exponential moving average of the weights, used for evaluation (Polyak & Juditsky, 1992; in the fast
CIFAR-10 records of Page's ResNet-9 and airbench; timm's ModelEmaV2).

After every optimizer step, `average = decay * average + (1 - decay) * weights`, over the parameters and
the buffers, so the BatchNorm running statistics the averaged model evaluates with are averaged too. The
first update copies the model. torch.optim.swa_utils.AveragedModel does the work.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from hasten.tricks.technique import Context, Technique

if TYPE_CHECKING:
    from hasten.config import Recipe


def ema_update(average: Tensor, value: Tensor, decay: float) -> Tensor:
    """One EMA step of a single tensor (the math AveragedModel applies to every parameter and buffer)."""
    return decay * average + (1 - decay) * value


class EMA(Technique):
    """After-step hook: keeps the moving average of `model`; `eval_model` hands the averaged copy to the
    evaluation. `state_dict()` holds the averaged weights and buffers and the update count (checkpointed as
    `state["hooks"]["ema"]`). Made from a recipe without a model, it copies the model at `on_optimizer`, once
    the model is on its device and in its precision."""

    name, hooks, order = "ema", frozenset({"on_optimizer", "after_step", "eval_model"}), 30
    stateful = True

    def __init__(self, model: nn.Module | None, decay: float):
        self.decay = decay
        self.averaged: AveragedModel | None = None
        if model is not None:
            self.on_optimizer(model)

    @classmethod
    def from_recipe(cls, recipe: Recipe, context: Context) -> EMA | None:
        return cls(None, recipe.tricks.ema) if recipe.tricks.ema else None

    def on_optimizer(self, model: nn.Module) -> None:
        self.averaged = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(self.decay), use_buffers=True)

    @torch.no_grad()
    def after_step(self, model: nn.Module) -> None:
        self.averaged.update_parameters(model)

    def eval_model(self, model: nn.Module) -> nn.Module:
        """The model to evaluate: the average once it has seen a step, the live model before that."""
        return self.averaged.module if int(self.averaged.n_averaged) > 0 else model

    def state_dict(self) -> dict[str, Any]:
        return self.averaged.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.averaged.load_state_dict(state)
