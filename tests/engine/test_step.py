"""The one training step (hasten/engine/step.py): gradient-norm clipping in every precision, the per-step training loss
in TensorBoard, and accumulated micro-batches weighted by their share of the examples."""

from __future__ import annotations

import csv

import pytest
import torch
from torch import nn

import hasten
from hasten.engine.precision import make_precision
from hasten.engine.step import TrainStep
from hasten.errors import RecipeError
from hasten.recipe.schema import load_recipe


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 12), nn.ReLU(), nn.Linear(12, 3))


def batch(seed: int, size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    images = torch.randn(size, 1, 4, 4, generator=torch.Generator().manual_seed(seed))
    return images * 10, torch.arange(size) % 3  # large inputs: gradients far above the clipping norm


def sgd_step(mode: str, clip: float | None) -> tuple[torch.Tensor, torch.Tensor, float | None]:
    """The update of one plain SGD step (lr 1) of the tiny model, and the norm the precision saw."""
    precision = make_precision(mode, torch.device("cpu"), init_scale=2.0**8)
    model = precision.prepare(tiny_model())
    optimizer = torch.optim.SGD(precision.optimizer_groups([{"params": list(model.parameters())}]), lr=1.0)
    before = torch.cat([p.detach().float().flatten() for p in optimizer.param_groups[0]["params"]]).clone()
    result = TrainStep(model, optimizer, precision, 3, clip_grad_norm=clip)([batch(0)])
    assert not result.nonfinite
    after = torch.cat([p.detach().float().flatten() for p in optimizer.param_groups[0]["params"]])
    norm = None if precision.grad_norm is None else float(precision.grad_norm)
    return after - before, torch.tensor(result.loss), norm


@pytest.mark.numerics
@pytest.mark.parametrize("mode", ["fp32", "bf16", "fp16", "fp16-master"])
def test_clipping_bounds_the_update_to_the_global_norm(mode):
    unclipped, _, no_norm = sgd_step(mode, None)
    assert no_norm is None and unclipped.norm() > 1.0  # off: nothing measured, a big step
    update, _, norm = sgd_step(mode, 0.5)
    assert norm is not None and norm == pytest.approx(float(unclipped.norm()), rel=0.05)  # the unscaled norm
    assert float(update.norm()) == pytest.approx(0.5, rel=0.01)  # lr 1: the update is the clipped gradient
    cosine = torch.nn.functional.cosine_similarity(update, unclipped, dim=0)
    assert cosine > 0.999  # the direction is kept: one global scale, not per tensor


def test_accumulated_micro_batches_equal_one_batch_of_their_union():
    images, labels = batch(3, size=12)
    grads = []
    for parts in ([slice(0, 12)], [slice(0, 8), slice(8, 12)]):  # one batch; 8 + 4 accumulated
        model = tiny_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        step = TrainStep(model, optimizer, make_precision("fp32", torch.device("cpu")), 3)
        result = step([(images[s], labels[s]) for s in parts])
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
        assert result.examples == 12
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


def test_nonfinite_loss_drops_the_gradients_and_skips_the_update():
    model = tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    images, labels = batch(0)
    images[0, 0, 0, 0] = float("nan")
    result = TrainStep(model, optimizer, make_precision("fp32", torch.device("cpu")), 3)([(images, labels)])
    assert result.nonfinite and all(p.grad is None for p in model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_clip_grad_norm_in_the_recipe(tiny_overrides, tmp_path):
    assert load_recipe("fashion-fast", ["train.clip_grad_norm=1.5"]).train.clip_grad_norm == 1.5
    assert load_recipe("fashion-fast").train.clip_grad_norm is None
    with pytest.raises(RecipeError, match="train.clip_grad_norm"):
        load_recipe("fashion-fast", ["train.clip_grad_norm=-1"])
    runs = {}
    for clip in ("null", "0.01"):
        overrides = [*tiny_overrides, "data.synthetic_size=64", "train.epochs=1", f"train.clip_grad_norm={clip}"]
        runs[clip] = hasten.train("fashion-fast", [*overrides, f"run.dir={tmp_path / clip}"])
    assert runs["0.01"]["train_loss"] != runs["null"]["train_loss"]  # the run's steps were clipped


@pytest.mark.numerics
def test_training_loss_per_step_in_tensorboard(tiny_overrides, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    overrides = [*tiny_overrides, "data.synthetic_size=64", "train.epochs=2", "train.clip_grad_norm=1.0"]
    summary = hasten.train("fashion-fast", [*overrides, f"run.dir={tmp_path / 'run'}", "run.tensorboard=true"])
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    events.Reload()
    points = events.Scalars("train_loss_per_step")
    assert [p.step for p in points] == list(range(1, summary["steps"] + 1))  # one per optimizer step
    with open(tmp_path / "run" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    per_epoch = summary["steps"] // 2  # 64 images, batch 16: equal batches, so the epoch loss is their mean
    for epoch, row in enumerate(rows):
        mean = sum(p.value for p in points[epoch * per_epoch : (epoch + 1) * per_epoch]) / per_epoch
        assert mean == pytest.approx(float(row["train_loss"]), rel=1e-5)
    norms = events.Scalars("grad_norm_per_step")
    assert norms and all(p.value > 0 for p in norms)
