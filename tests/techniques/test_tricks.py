"""The bag of tricks: each pure function against hand-computed values, each adapter in a 2-step training run,
and bad trick settings as recipe errors naming the field."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.optim.swa_utils import update_bn

import hasten
from hasten.models import ResNet, build_model
from hasten.recipe.schema import ModelConfig, load_recipe
from hasten.run.build import build
from hasten.run.plan import Plan
from hasten.run.trainer import Trainer
from hasten.runfolder.checkpoint import load_checkpoint
from hasten.runfolder.log import RunLog
from hasten.techniques import (
    EMA,
    BatchMixing,
    LabelSmoothing,
    cutmix,
    cutmix_box,
    ema_update,
    mixup,
    one_hot,
    param_groups,
    smooth,
    soft_cross_entropy,
    warmup_decay,
    zero_init_residual,
)
from hasten.techniques.zero_init import ZeroInitResidual


def test_label_smoothing_gives_exact_targets():
    y = one_hot(torch.tensor([1, 3]), 4)
    expected = torch.tensor([[0.025, 0.925, 0.025, 0.025], [0.025, 0.025, 0.025, 0.925]])
    assert torch.allclose(smooth(y, 0.1), expected, atol=1e-7, rtol=0)
    images = torch.randn(2, 1, 3, 3)
    out_images, out_y = LabelSmoothing(0.1).on_batch(images, y)
    assert out_images is images and torch.equal(out_y, smooth(y, 0.1))


def test_soft_cross_entropy_equals_the_hard_one():
    logits, labels = torch.randn(6, 5), torch.tensor([0, 4, 2, 2, 1, 3])
    hard = nn.functional.cross_entropy(logits, labels)
    assert torch.allclose(soft_cross_entropy(logits, one_hot(labels, 5)), hard, atol=1e-6)
    smoothed = nn.functional.cross_entropy(logits, labels, label_smoothing=0.2)
    assert torch.allclose(soft_cross_entropy(logits, smooth(one_hot(labels, 5), 0.2)), smoothed, atol=1e-6)


def test_mixup_with_pinned_lambda_and_permutation():
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    y = torch.eye(3)
    mixed_x, mixed_y = mixup(x, y, 0.75, torch.tensor([2, 0, 1]))
    assert torch.equal(mixed_x, torch.tensor([[2.0, 3.0], [2.5, 3.5], [4.5, 5.5]]))
    assert torch.equal(mixed_y, torch.tensor([[0.75, 0.0, 0.25], [0.25, 0.75, 0.0], [0.0, 0.25, 0.75]]))


def test_cutmix_with_pinned_box_and_permutation():
    x = torch.stack([torch.zeros(1, 4, 4), torch.ones(1, 4, 4)])
    y = torch.eye(2)
    mixed_x, mixed_y = cutmix(x, y, (1, 3, 0, 2), torch.tensor([1, 0]))  # rows 1-2, columns 0-1: 4 of 16 pixels
    expected = torch.zeros(1, 4, 4)
    expected[:, 1:3, 0:2] = 1
    assert torch.equal(mixed_x[0], expected)
    assert torch.equal(mixed_x[1], 1 - expected)
    assert torch.equal(mixed_y, torch.tensor([[0.75, 0.25], [0.25, 0.75]]))
    assert torch.equal(x[0], torch.zeros(1, 4, 4))  # the input is not changed in place


def test_cutmix_box_has_the_area_lambda_asks_for_and_is_clipped_at_the_edge():
    assert cutmix_box(0.75, 8, 8, (0.5, 0.5)) == (2, 6, 2, 6)  # a quarter of the area, centred
    assert cutmix_box(0.75, 8, 8, (0.0, 1.0)) == (0, 2, 6, 8)  # clipped: the targets follow the real area
    assert cutmix_box(1.0, 8, 8, (0.5, 0.5)) == (4, 4, 4, 4)  # lambda 1: an empty box


@pytest.mark.parametrize("mixup_alpha, cutmix_alpha", [(0.4, 0.0), (0.0, 1.0), (0.4, 1.0)])
def test_batch_mixing_is_seeded_and_keeps_targets_distributions(mixup_alpha, cutmix_alpha):
    images, y = torch.randn(8, 1, 6, 6), one_hot(torch.arange(8) % 3, 3)
    first = BatchMixing(mixup_alpha, cutmix_alpha, np.random.default_rng(5))
    state = first.state_dict()
    a = first.on_batch(images, y)
    second = BatchMixing(mixup_alpha, cutmix_alpha, np.random.default_rng(99))
    second.load_state_dict(state)
    b = second.on_batch(images, y)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert torch.allclose(a[1].sum(1), torch.ones(8))
    assert not torch.equal(a[0], images)


def test_no_bias_decay_puts_exactly_the_1d_parameters_in_the_no_decay_group():
    model = ResNet(1, 10, width=4, blocks=[1, 1])
    decay, no_decay = param_groups(model, 5e-4, no_bias_decay=True)
    one_d = {id(p) for p in model.parameters() if p.ndim == 1}
    assert {id(p) for p in no_decay["params"]} == one_d and no_decay["weight_decay"] == 0.0
    assert {id(p) for p in decay["params"]} == {id(p) for p in model.parameters()} - one_d
    assert decay["weight_decay"] == 5e-4
    assert one_d >= {id(model.head.bias), id(model.stem[1].weight), id(model.stem[1].bias)}
    (only,) = param_groups(model, 5e-4, no_bias_decay=False)
    assert len(only["params"]) == len(list(model.parameters())) and only["weight_decay"] == 5e-4


def test_zero_init_leaves_the_named_gammas_at_zero():
    torch.manual_seed(0)
    model = ResNet(1, 10, width=4, blocks=[1, 2])
    zeroed = zero_init_residual(model)
    assert zeroed == ["stages.0.2.second.1.weight", "stages.1.2.second.1.weight", "stages.1.3.second.1.weight"]
    params = dict(model.named_parameters())
    for name in zeroed:
        assert torch.count_nonzero(params[name]) == 0
    other_gammas = [n for n, p in params.items() if n.endswith("1.weight") and p.ndim == 1 and n not in zeroed]
    assert other_gammas and all(torch.all(params[n] == 1) for n in other_gammas)
    built = build_model(ModelConfig(width=4, blocks=[1, 2], zero_init_residual=True), (1, 28, 28), 10)
    assert all(torch.count_nonzero(dict(built.named_parameters())[n]) > 0 for n in zeroed)  # torch's init
    ZeroInitResidual().on_model(built)  # the technique, as build applies it
    assert all(torch.count_nonzero(dict(built.named_parameters())[n]) == 0 for n in zeroed)


def test_ema_decay_warms_up_to_its_ceiling():
    assert [warmup_decay(0.99, t) for t in (0, 1, 10)] == pytest.approx([0.1, 2 / 11, 11 / 20])
    assert warmup_decay(0.99, 10_000) == 0.99  # the ceiling, once (1 + t) / (10 + t) passes it
    assert warmup_decay(0.5, 8) == 0.5  # (1 + 8) / (10 + 8) reaches 0.5


@pytest.mark.numerics
def test_ema_after_known_updates_equals_the_hand_computed_average():
    model = nn.Sequential(nn.Linear(2, 1), nn.BatchNorm1d(1))
    decay = 0.9
    ema = EMA(model, decay)  # no calibration: the averaged BN statistics are what it evaluates
    assert ema.eval_model(model) is model  # nothing averaged yet: evaluate the live model
    values = [1.0, 3.0, -2.0]
    for value in values:
        with torch.no_grad():
            for tensor in (*model.parameters(), model[1].running_mean):
                tensor.fill_(value)
        ema.after_step(model)
    expected = values[0]  # the first update copies
    for t, value in enumerate(values[1:], start=1):  # update t uses the warmed-up decay
        expected = ema_update(torch.tensor(expected), torch.tensor(value), warmup_decay(decay, t)).item()
    d1, d2 = 2 / 11, 3 / 12
    assert expected == pytest.approx(d2 * (d1 * 1.0 + (1 - d1) * 3.0) + (1 - d2) * -2.0)
    averaged = ema.eval_model(model)
    assert averaged is not model
    for tensor in (*averaged.parameters(), averaged[1].running_mean):  # buffers (BN statistics) too
        assert torch.allclose(tensor, torch.full_like(tensor, expected))
    restored = EMA(model, decay)
    restored.load_state_dict(ema.state_dict())
    assert restored.updates == 3
    assert torch.allclose(restored.eval_model(model)[0].weight, torch.full((1, 2), expected))


def test_ema_batch_norm_statistics_are_recomputed_for_its_weights():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    batches = [torch.randn(8, 3) * 2 + 1 for _ in range(3)]
    calls = []

    def calibrate(module: nn.Module) -> None:
        calls.append(module)
        update_bn(batches, module)

    ema = EMA(model, 0.9, calibrate)
    for _ in range(2):
        with torch.no_grad():
            model[0].weight.add_(0.5)
        ema.after_step(model)
    averaged = ema.eval_model(model)
    assert calls == [averaged]
    with torch.no_grad():  # the statistics of the averaged weights' own activations, not averaged ones
        activations = averaged[0](torch.cat(batches))
    assert torch.allclose(averaged[1].running_mean, activations.mean(0), atol=1e-5)
    ema.eval_model(model)
    assert len(calls) == 1  # no new step: not recomputed
    assert EMA(nn.Linear(3, 4), 0.9, calibrate).calibrate is None  # nothing to recompute without batch norm


def test_ema_model_is_the_one_evaluated(tiny_overrides):
    recipe = load_recipe("fashion-fast", [*tiny_overrides, "data.synthetic_size=64", "tricks.ema=0.5"])
    parts = build(recipe)

    def trainer(model: nn.Module, hooks=None) -> Trainer:
        plan = Plan(epochs=1, num_classes=10, progress=False)
        loaders = (parts.train_loader, parts.test_loader)
        log = RunLog("unused", enabled=False)
        return Trainer(model, parts.optimizer, parts.scheduler, parts.precision, loaders, plan, log, hooks)

    with_ema = trainer(parts.model, parts.hooks)
    with_ema.fit()
    averaged = parts.hooks.stateful["ema"].averaged.module
    assert with_ema.evaluate() == trainer(averaged).evaluate()
    assert with_ema.evaluate() != trainer(parts.model).evaluate()


@pytest.mark.parametrize(
    "override, field",
    [
        ("tricks.mixup=-0.2", "tricks.mixup"),
        ("tricks.cutmix=-1", "tricks.cutmix"),
        ("tricks.ema=1.5", "tricks.ema: the decay must be in \\(0, 1\\)"),
        ("tricks.ema=1", "tricks.ema"),
        ("tricks.ema=-0.5", "tricks.ema"),
        ("tricks.label_smoothing=1", "tricks.label_smoothing"),
        ("train.label_smoothing=0.1", "moved to tricks.label_smoothing"),
    ],
)
def test_bad_tricks_are_recipe_errors_naming_the_field(override, field):
    with pytest.raises(hasten.errors.RecipeError, match=field):
        load_recipe("fashion-fast", [override])


def last_checkpoint(run: Path) -> dict:
    newest = max((run / "checkpoints").glob("step-*.pt"), key=lambda p: int(p.stem.removeprefix("step-")))
    return load_checkpoint(newest)


@pytest.mark.parametrize(
    "overrides, shared_state, rank_state",
    [
        (["tricks.label_smoothing=0.2"], set(), set()),
        (["tricks.mixup=0.2"], set(), {"mixing"}),
        (["tricks.cutmix=1.0"], set(), {"mixing"}),
        (["tricks.mixup=0.2", "tricks.cutmix=1.0", "tricks.label_smoothing=0.1"], set(), {"mixing"}),
        (["tricks.ema=0.9"], {"ema"}, set()),
        (["model.zero_init_residual=true"], set(), set()),
        (["optim.no_bias_decay=false", "optim.weight_decay=0.01"], set(), set()),
        (["train.freeze_epochs=1"], {"freeze"}, set()),
    ],
)
def test_each_trick_in_a_two_step_run(tiny_overrides, tmp_path, overrides, shared_state, rank_state):
    """Each trick changes what a 2-step run computes (so its hook ran), and its state is in the checkpoint."""
    base = [*tiny_overrides, "data.synthetic_size=32", "train.epochs=1", "tricks.label_smoothing=0"]

    def run(name: str, *extra: str) -> dict:
        return hasten.train("fashion-fast", [*base, *extra, f"run.dir={tmp_path / name}"])

    plain, tricked = run("plain"), run("trick", *overrides)
    assert tricked["steps"] == plain["steps"] == 2
    assert math.isfinite(tricked["train_loss"]) and math.isfinite(tricked["test_loss"])
    assert (tricked["train_loss"], tricked["test_loss"]) != (plain["train_loss"], plain["test_loss"])
    state = last_checkpoint(tmp_path / "trick")
    assert set(state["hooks"]) == shared_state and set(state["ranks"][0]["hooks"]) == rank_state


def test_mixup_draws_repeat_with_the_seed(tiny_overrides, tmp_path):
    def run(seed: int, name: str, mixup: float = 0.4) -> tuple[float, dict]:
        overrides = [
            *tiny_overrides,
            "data.synthetic_size=32",
            "train.epochs=1",
            f"tricks.mixup={mixup}",
            f"seed={seed}",
        ]
        loss = hasten.train("fashion-fast", [*overrides, f"run.dir={tmp_path / name}"])["train_loss"]
        return loss, last_checkpoint(tmp_path / name)["ranks"][0]["hooks"]

    (first, first_state), (again, again_state) = run(1, "a"), run(1, "b")
    assert first == again and first_state == again_state  # the same draws
    other_seed = run(2, "c")[1]
    assert other_seed["mixing"] != first_state["mixing"]  # the mixing stream follows the seed
    without, without_state = run(1, "d", mixup=0)
    assert without != first and without_state == {}  # mixup was on above: it changed the loss
