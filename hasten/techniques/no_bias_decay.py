"""No weight decay on biases and normalisation parameters (He et al., "Bag of Tricks", 2019; Goyal et al.,
2017 apply decay to weights only): decaying a BN gamma or a bias only fights the normalisation, it does not
regularise. The split is by shape: every 1-D parameter (bias, BN/LayerNorm scale and shift) goes without.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import nn

from hasten.techniques.technique import Context, Switch, Technique

if TYPE_CHECKING:
    from hasten.recipe.schema import Recipe


def param_groups(model: nn.Module, weight_decay: float, no_bias_decay: bool) -> list[dict[str, Any]]:
    """Optimizer param groups: with `no_bias_decay`, the 1-D parameters in a second group with no decay."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not no_bias_decay:
        return [{"params": params, "weight_decay": weight_decay}]
    decay = [p for p in params if p.ndim > 1]
    no_decay = [p for p in params if p.ndim <= 1]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def split_no_decay(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each group split in two, in place of it: its >1-D parameters as they were, its 1-D ones without weight
    decay. A group with one parameter kind stays one group (plus an empty no-decay group when it is the only
    group, as `param_groups` gives, so checkpoints of earlier runs still fit)."""
    split = []
    for group in groups:
        decay = [p for p in group["params"] if p.ndim > 1]
        no_decay = [p for p in group["params"] if p.ndim <= 1]
        halves = [{**group, "params": decay}, {**group, "params": no_decay, "weight_decay": 0.0}]
        split += halves if len(groups) == 1 else [h for h in halves if h["params"]]
    return split


class NoBiasDecay(Technique):
    """Optimizer hook (`optim.no_bias_decay`): biases and normalisation parameters without weight decay, in
    whatever groups the run made (one, or one per layer for discriminative fine-tuning)."""

    name, hooks, order = "no_bias_decay", frozenset({"param_groups"}), 0
    switches = (Switch("optim.no_bias_decay", "false", "true", "no weight decay on biases and norm parameters"),)

    @classmethod
    def from_recipe(cls, recipe: Recipe, context: Context) -> NoBiasDecay | None:
        return cls() if recipe.optim.no_bias_decay else None

    def param_groups(self, groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return split_no_decay(groups)
