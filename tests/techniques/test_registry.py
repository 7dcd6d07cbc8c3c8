"""The registry of techniques (hasten/techniques/registry.py) against what the code does: every switch, on at its
example value and off, builds a tiny run that takes a training step, and "on" is seen in the run that was built
(its technique object among the hooks, or the setting's effect on the built parts, or for test-time augmentation
on the final evaluation); off and on are valid recipe values; the table holds every technique class of hasten;
and `hasten bench --ablate` switches off every technique a recipe has on."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor

import hasten.techniques
from hasten.data.loader import Augment
from hasten.engine import compiling
from hasten.experiments.variants import ABLATIONS, ablation_variants, lookup
from hasten.recipe.schema import Recipe, load_recipe, parse_value
from hasten.run import evaluation as evaluation_module
from hasten.run.assemble import Parts
from hasten.run.build import build, train, trainer_for
from hasten.run.plan import Plan
from hasten.runfolder.log import RunLog
from hasten.techniques import SWITCHES, TECHNIQUES, Switch, Technique, switch, technique_of
from hasten.techniques.registry import CLASSES

# the default recipe, made a tiny fp32 run on 64 synthetic images (tiny_overrides turns channels_last on and the
# flips and shifts off; each switch's off and on override it)
TINY = ["data.synthetic_size=64", "precision=fp32", "run.tensorboard=false"]


def conv_weights(parts: Parts) -> list[Tensor]:
    return [p for p in parts.model.parameters() if p.ndim == 4 and p.shape[1] > 1]  # C=1: either layout


def augment(parts: Parts) -> Augment:
    return parts.train_loader.augment or Augment()  # None: no augmentation


# the settings the run reads itself: how each shows in the built parts (a class's switch: its object in the hooks)
def several_lrs(parts: Parts) -> bool:
    """Whether the optimizer's param groups train at more than one LR (per-layer LRs)."""
    return len({group["lr"] for group in parts.optimizer.param_groups}) > 1


IN_PARTS: dict[str, Callable[[Parts], bool]] = {
    "precision": lambda parts: parts.precision.compute_dtype != torch.float32,
    "train.channels_last": lambda parts: all(
        w.is_contiguous(memory_format=torch.channels_last) and not w.is_contiguous() for w in conv_weights(parts)
    ),
    "data.augment.flip": lambda parts: bool(augment(parts).flip),
    "data.augment.translate": lambda parts: augment(parts).translate > 0,
    "schedule.name": lambda parts: parts.scheduler.lr(0.6) != parts.scheduler.lr(0.95),  # constant after warm-up
    "train.compile": lambda parts: parts.compiled,
    "train.checkpoint_activations": lambda parts: parts.model.checkpoint_activations,  # hasten's ResNet's own
    "optim.layer_lr_decay": several_lrs,
    "optim.fan_in_lr": several_lrs,
    "optim.layer_scale_lr": several_lrs,
}
# what a switch needs to show in the tiny run: a layer wider than the fan-in rule's reference (a dense layer over the
# flattened images, a sequential model of the layer list); a model with layer scales
WITH: dict[str, list[str]] = {
    "optim.fan_in_lr": ["model.name=sequential", "model.layers=[flatten, {dense: 16}, relu, {dense: classes}]",
                        "optim.name=adamw", "optim.lr=0.001"],
    "optim.layer_scale_lr": ["model.name=import", "model.target=tests.engine.test_layer_scale:ScaledNet",
                             "optim.name=adamw", "optim.lr=0.001"],
}  # fmt: skip
# read at evaluation, which a training step does not reach: what the final evaluation of a 1-epoch run did
IN_EVALUATION: dict[str, Callable[[tuple[bool, int]], bool]] = {
    "train.tta_flip": lambda views: views[0],
    "train.tta_translate": lambda views: views[1] > 0,
}


def recipe_with(tiny_overrides: list[str], *overrides: str) -> Recipe:
    return load_recipe(None, [*tiny_overrides, *TINY, *overrides])


def made(parts: Parts, cls: type[Technique]) -> bool:
    return any(isinstance(technique, cls) for technique in parts.hooks.techniques)


@pytest.mark.parametrize("state", ["on", "off"])
@pytest.mark.parametrize("technique", SWITCHES, ids=lambda s: s.key)
def test_each_switch_builds_a_run_that_trains_and_shows_the_technique_on_or_off(
    technique: Switch, state: str, tiny_overrides, monkeypatch
):
    monkeypatch.setattr(compiling, "BACKEND", "eager")  # Dynamo without Inductor: the plumbing, in seconds
    on = state == "on"
    parts = build(
        recipe_with(
            tiny_overrides, *WITH.get(technique.key, []), technique.switched_on if on else technique.switched_off
        )
    )
    images, labels = next(iter(parts.train_loader))
    plan = Plan(epochs=1, num_classes=len(parts.data.classes), progress=False, measure_step_memory=False)
    loss, _ = trainer_for(parts, plan, RunLog("", enabled=False)).train_step(images, labels)
    assert torch.isfinite(loss)
    cls = technique_of(technique.key)
    if cls is not None:
        assert made(parts, cls) == on, f"{technique.switched_on if on else technique.switched_off}: {cls.__name__}"
    elif technique.key in IN_PARTS:
        assert IN_PARTS[technique.key](parts) == on
    else:  # a new setting of the registry needs a way here to see that the run reads it
        assert technique.key in IN_EVALUATION, f"{technique.key}: no technique class and no probe in this test"


@pytest.mark.parametrize("key", list(IN_EVALUATION))
def test_test_time_augmentation_switches_reach_the_final_evaluation(key: str, tiny_overrides, monkeypatch):
    asked: list[tuple[bool, int]] = []
    real = evaluation_module.tta_views

    def recorded(model: Any, images: Tensor, flip: bool, translate: int, fill: Any = 0.0) -> tuple[Tensor, Tensor]:
        asked.append((flip, translate))
        return real(model, images, flip, translate, fill)

    monkeypatch.setattr(evaluation_module, "tta_views", recorded)  # the run's evaluation loop
    technique = switch(key)
    for on, override in ((True, technique.switched_on), (False, technique.switched_off)):
        asked.clear()
        train(recipe_with(tiny_overrides, "train.epochs=1", "run.overwrite=true", override))
        assert asked and any(IN_EVALUATION[key](views) for views in asked) == on, override


def test_the_table_holds_every_technique_class_of_hasten_and_each_declares_its_switches():
    for module in pkgutil.iter_modules(hasten.techniques.__path__):  # a technique module the table forgot, too
        importlib.import_module(f"hasten.techniques.{module.name}")
    ours = {cls for cls in Technique.registry if cls.__module__.startswith("hasten.")}  # tests define their own
    assert ours == set(CLASSES)
    assert all(cls.switches for cls in CLASSES)
    keys = [s.key for s in SWITCHES]
    assert len(set(keys)) == len(keys)  # one home per key
    assert all(technique_of(s.key) is cls for cls in CLASSES for s in cls.switches)
    assert len(SWITCHES) == sum(len(item.switches) if isinstance(item, type) else 1 for item in TECHNIQUES)
    assert all(s.what and "\n" not in s.what for s in SWITCHES)
    with pytest.raises(KeyError, match="switches no technique"):
        switch("tricks.mixpu")


@pytest.mark.parametrize("technique", SWITCHES, ids=lambda s: s.key)
def test_off_and_on_are_valid_recipe_values_that_differ(technique: Switch):
    off, on = load_recipe(None, [technique.switched_off]), load_recipe(None, [technique.switched_on])
    assert lookup(off, technique.key) == parse_value(technique.off)
    assert lookup(on, technique.key) == parse_value(technique.on) != parse_value(technique.off)


def test_ablations_are_the_registrys_switches_off_in_its_order():
    assert ABLATIONS == [(s.key, s.off) for s in SWITCHES]
    assert ("tricks.cutout", "0") in ABLATIONS  # the one the hand-written list missed


def test_the_default_recipes_ablation_switches_off_every_technique_it_has_on():
    default = load_recipe(None)
    switched_on = {s.switched_off for s in SWITCHES if lookup(default, s.key) != parse_value(s.off)}
    assert switched_on  # precision, label smoothing, flips, the schedule...
    ablated = {o for v in ablation_variants(default, []) for o in v.overrides}
    assert ablated == switched_on


@pytest.mark.parametrize("technique", SWITCHES, ids=lambda s: s.key)
def test_ablate_switches_off_each_technique_a_recipe_turns_on(technique: Switch):
    recipe = load_recipe(None, [technique.switched_on])
    assert technique.switched_off in {o for v in ablation_variants(recipe, []) for o in v.overrides}


def test_the_docs_list_of_techniques_is_written_from_the_registry():
    from hasten.techniques import docs

    page = Path(__file__).resolve().parents[2] / "docs" / "techniques.md"
    assert page.read_text(encoding="utf-8") == docs.render(), (
        "docs/techniques.md is out of date with hasten/techniques/registry.py: regenerate it with make reference"
    )
    for item in SWITCHES:
        assert f"| `{item.key}` | `{item.off}` | `{item.on}` |" in docs.render()
