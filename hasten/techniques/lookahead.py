"""Lookahead (Zhang, Lucas, Hinton & Ba, "Lookahead Optimizer: k steps forward, 1 step back", 2019), the weight
average airbench (Keller Jordan's CIFAR-10 speed record) keeps beside its Nesterov SGD.

The optimizer moves the live ("fast") weights as usual; a second, "slow" copy waits. Every k optimizer steps the
slow weights move `alpha` of the way to the fast ones, `slow += alpha * (fast - slow)`, and the fast weights are
reset to them, so training continues from the interpolated point. The optimizer's own state (momentum) is kept,
as in the paper's default.

What it covers: the model's parameters, not its buffers. Batch-norm running statistics belong to the weights
that produced them; averaging them would pair the slow weights with statistics of no single model (the EMA
recomputes its statistics instead). Evaluation sees the live weights, which equal the slow ones right after
each synchronisation.

With the EMA (tricks.ema) both run after each step, the lookahead first (`order`), so the average follows the
weights training continues from. Under data parallelism every rank holds the same weights and takes the same
steps, so the slow copy is the same everywhere and is checkpointed once. fp16-master is refused in the recipe:
the optimizer steps fp32 master copies and writes them over the model's weights, which would undo the reset.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from hasten.techniques.technique import Context, Switch, Technique

if TYPE_CHECKING:
    from hasten.recipe.schema import Recipe


@torch.no_grad()
def lookahead_update(slow: Sequence[Tensor], fast: Sequence[Tensor], alpha: float) -> None:
    """One synchronisation, in place: each slow tensor moves `alpha` of the way to its fast one
    (`slow + alpha * (fast - slow)`, torch.lerp), then each fast tensor is set to its new slow value."""
    torch._foreach_lerp_(list(slow), list(fast), alpha)
    torch._foreach_copy_(list(fast), list(slow))


class Lookahead(Technique):
    """After-step hook: every `steps` optimizer steps, `lookahead_update` of the model's parameters with `alpha`.
    `on_optimizer` takes the slow copy once the model is on its device and in its precision; the slow weights
    and the step count are its checkpointed state (`state["hooks"]["lookahead"]`)."""

    name, hooks, order = "lookahead", frozenset({"on_optimizer", "after_step"}), 20  # before the EMA's 30
    switches = (Switch("tricks.lookahead_steps", "0", "5", "every k steps slow weights move towards the live ones"),)
    stateful = True

    def __init__(self, steps: int, alpha: float):
        self.steps, self.alpha = steps, alpha
        self.fast: list[Tensor] = []  # the model's parameters, as the optimizer steps them
        self.slow: list[Tensor] = []
        self.taken = 0  # optimizer steps since training began

    @classmethod
    def from_recipe(cls, recipe: Recipe, context: Context) -> Lookahead | None:
        if not recipe.tricks.lookahead_steps:
            return None
        return cls(recipe.tricks.lookahead_steps, recipe.tricks.lookahead_alpha)

    def on_optimizer(self, model: nn.Module) -> None:
        self.fast = list(model.parameters())
        self.slow = [p.detach().clone() for p in self.fast]

    def after_step(self, model: nn.Module) -> None:
        self.taken += 1
        if self.taken % self.steps == 0:
            lookahead_update(self.slow, [p.data for p in self.fast], self.alpha)

    def state_dict(self) -> dict[str, Any]:
        return {"taken": self.taken, "slow": [s.clone() for s in self.slow]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state["slow"]
        if len(saved) != len(self.slow):
            raise ValueError(f"lookahead state holds {len(saved)} slow tensors, the model has {len(self.slow)}")
        with torch.no_grad():
            for slow, value in zip(self.slow, saved, strict=True):
                slow.copy_(value)
        self.taken = int(state["taken"])
