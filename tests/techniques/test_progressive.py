"""Progressive resizing (train.progressive_resize, hasten/techniques/progressive.py): exact sides at given progress,
the batches a built run's model sees, a model that needs its full size named before training, a 2-step run, and
a run stopped mid-way and resumed equal to an unbroken one (the step count is checkpointed)."""

from __future__ import annotations

import pytest
import torch

import hasten
from hasten.errors import RecipeError
from hasten.recipe.schema import load_recipe
from hasten.run.build import build, trainer_for
from hasten.run.plan import Plan
from hasten.runfolder.checkpoint import load_checkpoint
from hasten.runfolder.log import RunLog
from hasten.techniques.progressive import progressive_side, resize_batch
from tests.resuming import final_weights, metrics, resume_into


def test_sides_at_given_progress():
    # 28 pixels from half size, full by half the run: 14 -> 16 (halves round up), 17.5 -> 16, 21 -> 20, 27.7 -> 28
    assert [progressive_side(p, 28, 0.5, 0.5) for p in (0, 0.125, 0.25, 0.49, 0.5, 0.9)] == [16, 16, 20, 28, 28, 28]
    # 32 pixels from a quarter, full at the end: 8, 20, 26 -> 28, 32
    assert [progressive_side(p, 32, 0.25, 1.0) for p in (0, 0.5, 0.75, 1.0)] == [8, 20, 28, 32]
    assert progressive_side(0, 8, 0.5, 0.5) == 8  # never below 8 pixels ...
    assert progressive_side(0, 6, 0.5, 0.5) == 6  # ... nor above the full side


def test_resize_batch_keeps_constant_images_and_the_full_size_untouched():
    images = torch.full((2, 3, 28, 28), 0.75)
    small = resize_batch(images, 16, 12)
    assert small.shape == (2, 3, 16, 12) and torch.allclose(small, torch.full_like(small, 0.75))
    assert resize_batch(images, 28, 28) is images


def overrides(tiny, *extra: str) -> list[str]:
    return [*tiny, "data.synthetic_size=128", "precision=fp32", "train.progressive_resize=0.5", *extra]


def test_the_model_sees_small_batches_growing_to_full_size(tiny_overrides):
    parts = build(load_recipe(None, overrides(tiny_overrides, "train.progressive_until=1.0")))
    shapes = []
    parts.model.register_forward_pre_hook(lambda _module, args: shapes.append(tuple(args[0].shape[-2:])))
    trainer = trainer_for(parts, Plan(epochs=2, num_classes=10, progress=False, measure_step_memory=False),
                          RunLog("", enabled=False))  # fmt: skip
    technique = parts.hooks.stateful["progressive_resize"]
    assert technique.total_steps == 16  # 128 images in batches of 16, 2 epochs
    images, labels = next(iter(parts.train_loader))
    for _ in range(12):
        trainer.train_step(images, labels)
    assert shapes[0] == (16, 16) and shapes[-1] == (24, 24) and technique.steps == 12  # 28 * (0.5 + 0.5 * 11/16)
    assert trainer.state_dict()["hooks"]["progressive_resize"] == {"steps": 12}
    trainer.evaluate()
    assert shapes[-1] == (28, 28)  # evaluation at full size


def test_a_model_that_needs_its_full_size_is_named_before_training(tiny_overrides):
    fixed = "model.layers=[{conv: 4}, relu, flatten, {dense: classes}]"
    with pytest.raises(RecipeError, match=r"train.progressive_resize: the model cannot take the 16x16 images"):
        build(load_recipe(None, overrides(tiny_overrides, "model.name=sequential", fixed)))
    build(load_recipe(None, [*tiny_overrides, "model.name=sequential", fixed]))  # fine at its full size


def test_two_step_run(tiny_overrides):
    summary = hasten.train(None, overrides(tiny_overrides, "data.synthetic_size=64", "train.batch_size=32",
                                           "train.epochs=1"))  # fmt: skip
    assert summary["steps"] == 2


def test_resumed_mid_run_equals_an_unbroken_run(tiny_overrides, tmp_path):
    common = overrides(tiny_overrides, "train.progressive_until=1.0", "run.save_every_steps=5", "run.keep=100")
    whole = tmp_path / "whole"
    hasten.train(None, [*common, f"run.dir={whole}"])
    middle = whole / "checkpoints" / "step-10.pt"  # epoch 2 of 2, mid-epoch (8 steps per epoch)
    assert load_checkpoint(middle)["hooks"]["progressive_resize"] == {"steps": 10}
    resumed = resume_into(tmp_path / "resumed", None, common, middle, metrics_from=whole)
    assert metrics(resumed) == metrics(whole)
    a, b = final_weights(whole), final_weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
