"""Freeze (`train.freeze_epochs`): only the head trains for the first epochs, then every layer does: the first step
of gradual unfreezing (Howard & Ruder, "Universal Language Model Fine-tuning for Text Classification", 2018), as
fastai's `fine_tune` does. A frozen parameter has requires_grad=False, so it gets no gradient, the optimizer
skips it (no update, no weight decay, no momentum), and the backward pass stops at the head, which makes the
frozen epochs cheap. BatchNorm running statistics still update.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from hasten.errors import RecipeError
from hasten.models.pretrained import classifier_head
from hasten.techniques.technique import Context, Switch, Technique


def frozen(step: int, freeze_steps: int) -> bool:
    """Whether the layers below the head are frozen for optimizer step `step` (counted from 0)."""
    return step < freeze_steps


class Freeze(Technique):
    """`after_step` hook (`train.freeze_epochs`): every parameter outside the classifier head is frozen
    (requires_grad=False) for the first `freeze_steps` optimizer steps, then trainable. It freezes at
    `on_optimizer`, after the optimizer is made, which thus holds them all."""

    name, hooks, order = "freeze", frozenset({"on_optimizer", "after_step"}), 40
    switches = (Switch("train.freeze_epochs", "0", "1", "only the classifier head trains for the first epochs"),)
    stateful = True

    def __init__(self, model: nn.Module | None, freeze_steps: int):
        self.freeze_steps, self.steps = freeze_steps, 0
        self.body: list[nn.Parameter] = []
        if model is not None:
            self.on_optimizer(model)

    @classmethod
    def from_recipe(cls, recipe: Any, context: Context) -> Freeze | None:
        if not recipe.train.freeze_epochs:
            return None
        if context.world_size > 1:
            raise RecipeError("train.freeze_epochs: not supported with several processes yet (DDP fixes its set)")
        return cls(None, recipe.train.freeze_epochs * context.steps_per_epoch)

    def on_optimizer(self, model: nn.Module) -> None:
        _, head = classifier_head(model)
        in_head = {id(p) for p in head.parameters()}
        self.body = [p for p in model.parameters() if id(p) not in in_head and p.requires_grad]
        self._apply()

    def _apply(self) -> None:
        trainable = not frozen(self.steps, self.freeze_steps)
        for param in self.body:
            param.requires_grad_(trainable)

    def after_step(self, model: nn.Module) -> None:
        self.steps += 1
        if self.steps == self.freeze_steps:
            self._apply()

    def state_dict(self) -> dict[str, int]:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.steps = int(state["steps"])
        self._apply()
