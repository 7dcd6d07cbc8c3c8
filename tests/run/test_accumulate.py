"""Gradient accumulation: k micro-batches of b are one batch of k*b; schedules and the LR rule see the global
batch; the epoch's short last group is stepped, weighted by what it holds."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import hasten
from hasten.data.loader import InMemoryLoader
from hasten.engine.precision import Precision
from hasten.recipe.schema import load_recipe
from hasten.run.assemble import global_batch, optimizer_steps
from hasten.run.build import build
from hasten.run.plan import Plan
from hasten.run.trainer import Trainer
from hasten.runfolder.log import RunLog


class ToDouble(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.double()


def train_one_epoch(batch_size: int, accumulate: int, images: int = 72) -> tuple[nn.Module, Trainer]:
    """A BatchNorm-free model trained one epoch on `images` random images, with SGD + momentum."""
    torch.manual_seed(0)
    # float64, so that only the order of summation differs between the runs
    model = nn.Sequential(ToDouble(), nn.Flatten(), nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4)).double()
    data = torch.randint(0, 256, (images, 1, 4, 4), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    labels = torch.arange(images) % 4
    stats = dict(mean=torch.tensor([0.5]), std=torch.tensor([0.25]))
    train = InMemoryLoader(data, labels, batch_size, shuffle=True, seed=3, **stats)
    test = InMemoryLoader(data, labels, 64, **stats)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9, weight_decay=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5**step)
    plan = Plan(epochs=1, num_classes=4, progress=False, accumulate=accumulate, measure_step_memory=False)
    trainer = Trainer(
        model, optimizer, scheduler, Precision(torch.device("cpu")), (train, test), plan, RunLog("", enabled=False)
    )
    trainer.fit()
    return model, trainer


def test_k_micro_batches_equal_one_batch_of_k_times_b():
    # 72 images: 32 + 32 + 8 per epoch, the last step short in both runs
    big, big_trainer = train_one_epoch(batch_size=32, accumulate=1)
    small, small_trainer = train_one_epoch(batch_size=8, accumulate=4)
    assert big_trainer.state.step == small_trainer.state.step == 3
    assert small_trainer.scheduler.last_epoch == 3  # the schedule counts optimizer steps, not micro-batches
    for a, b in zip(big.parameters(), small.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_a_short_last_group_is_weighted_by_what_it_holds():
    # 72 images in micro-batches of 16: groups of 3 hold 48, then 24 (16 + a last micro-batch of 8)
    reference, _ = train_one_epoch(batch_size=48, accumulate=1)
    accumulated, trainer = train_one_epoch(batch_size=16, accumulate=3)
    assert trainer.state.step == 2
    assert [trainer._group_examples(g) for g in range(2)] == [48, 24]
    for a, b in zip(reference.parameters(), accumulated.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_schedule_and_lr_rule_see_the_global_batch(tiny_overrides):
    recipe = load_recipe("fashion-fast", [*tiny_overrides, "train.accumulate=4", "train.epochs=3"])
    parts = build(recipe)
    assert global_batch(recipe) == 16 * 4
    assert parts.lr == pytest.approx(recipe.optim.lr * 64 / recipe.optim.base_batch)
    assert len(parts.train_loader) == 384 // 16
    assert optimizer_steps(recipe, parts.train_loader) == 3 * 6  # 24 micro-batches per epoch -> 6 steps


def test_accumulation_in_a_two_step_run(tiny_overrides):
    # 48 images, micro-batches of 16, 2 per step: 1.5 groups -> 2 steps (the last of one micro-batch)
    run = ["data.subset=48", "data.test_subset=64", "train.epochs=1", "train.accumulate=2", "precision=fp32"]
    summary = hasten.train("fashion-fast", [*tiny_overrides, *run])
    assert summary["steps"] == 2 and summary["peak_step_memory_bytes"] > 0


def test_schedule_command_counts_optimizer_steps_with_accumulation(tiny_overrides, tmp_path):
    """`hasten schedule` with train.accumulate=4 over 2 epochs: 24 batches an epoch make 6 steps, 12 in all (it
    reported 24 an epoch and drew the run as a twelfth of one)."""
    from hasten.experiments.schedule import schedule_trace

    recipe = load_recipe("fashion-fast", [*tiny_overrides, "train.accumulate=4"])  # 384 images, batch 16
    trace = schedule_trace(recipe)
    assert trace.steps_per_epoch == 6 and trace.total_steps == 12 and len(trace.lrs) == 13
