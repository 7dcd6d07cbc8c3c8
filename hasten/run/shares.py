"""Per-parameter shares of Adam's LR, decided at start from the model and said: wide layers slowed by their fan-in
(`optim.fan_in_lr`, hasten/engine/fan_in.py) and layer scales sped up (`optim.layer_scale_lr`,
hasten/engine/layer_scale.py)."""

from __future__ import annotations

from torch import nn

from hasten.engine.fan_in import FAN_IN_REFERENCE, scaled_weights
from hasten.engine.layer_scale import layer_scales, start_value
from hasten.recipe.schema import Recipe, replaced
from hasten.text import listed
from hasten.tune import rules


def resolve_lr_shares(recipe: Recipe, model: nn.Module) -> tuple[Recipe, list[str]]:
    """Both keys decided on `model` as it starts, recorded, with what the run says of them."""
    recipe, fan_in = resolve_fan_in_lr(recipe, model)
    recipe, scales = resolve_layer_scale_lr(recipe, model)
    return recipe, fan_in + scales


def resolve_fan_in_lr(recipe: Recipe, model: nn.Module) -> tuple[Recipe, list[str]]:
    """`optim.fan_in_lr: auto` decided from the optimizer (hasten/tune/rules.py's default_fan_in_lr), recorded; said
    when the model has a weight it would slow (a fan-in over FAN_IN_REFERENCE, not feeding a batch norm), with those
    weights."""
    if recipe.optim.fan_in_lr != "auto":
        return recipe, []
    on = rules.default_fan_in_lr(recipe.optim.name)
    recipe = replaced(recipe, {"optim.fan_in_lr": on})
    wide = scaled_weights(model)
    if not wide:
        return recipe, []
    if not on:
        return recipe, [f"optim.fan_in_lr=auto -> false: optim.name={recipe.optim.name} (adam and adamw only); "
                        "one LR for every layer"]  # fmt: skip
    shown = listed([f"{name} (fan-in {fan_in:,}: {share:.2g}x)" for name, (fan_in, share) in wide.items()])
    return recipe, [
        f"optim.fan_in_lr=auto -> true: weights with a fan-in over {FAN_IN_REFERENCE} take optim.lr x "
        f"{FAN_IN_REFERENCE} / fan-in (Adam moves each weight by about the LR): {shown}"
    ]


def resolve_layer_scale_lr(recipe: Recipe, model: nn.Module) -> tuple[Recipe, list[str]]:
    """`optim.layer_scale_lr: auto` decided from the optimizer and the model's layer scales (hasten/tune/rules.py's
    default_layer_scale_lr), recorded; said when the model has one, with those parameters."""
    if recipe.optim.layer_scale_lr != "auto":
        return recipe, []
    scales = layer_scales(model)
    factor = rules.default_layer_scale_lr(recipe.optim.name, bool(scales))
    recipe = replaced(recipe, {"optim.layer_scale_lr": factor})
    if not scales:
        return recipe, []
    shown = listed(list(scales))
    if factor == 1:
        return recipe, [f"optim.layer_scale_lr=auto -> 1: optim.name={recipe.optim.name} (adam and adamw only); the "
                        f"layer scales ({shown}) take optim.lr"]  # fmt: skip
    return recipe, [
        f"optim.layer_scale_lr=auto -> {factor:g}: {len(scales)} layer scale(s) starting at {start_value(scales)} "
        f"({shown}) take {factor:g}x optim.lr: Adam moves a parameter by about the LR a step, and a scale must grow "
        "to about 1 before its branch counts (docs/defaults.md)"
    ]
