"""Schedules: every shape at its start, end and boundaries, exactly; warmup; momentum opposite to the LR;
the per-step scheduler and its state; the LR scaling rule; bad schedules as recipe errors naming the field."""

from __future__ import annotations

import math

import pytest
import torch

import hasten
from hasten.cli import main
from hasten.engine.schedules import (
    Scheduler,
    constant,
    cosine,
    cyclic,
    inverse_momentum,
    linear_decay,
    lr_and_momentum,
    one_cycle,
    one_cycle_momentum,
    rise_steps,
    scale_lr,
    scheduler,
    step_decay,
    trace,
    warmup_steps,
    warmup_then,
)
from hasten.errors import RecipeError
from hasten.recipe.schema import ScheduleConfig, load_recipe
from hasten.run.assemble import global_batch
from hasten.run.build import build
from hasten.run.plan import Hooks, Plan
from hasten.run.trainer import Trainer
from hasten.runfolder.checkpoint import checkpoints_in, load_checkpoint
from hasten.runfolder.log import RunLog

# the tests below are written for these, not the default recipe's schedule (a one-cycle from its peak with Adam's
# fixed beta1, its rise decided from the data): a constant LR with a 50-step rise; for one-cycle a start at 0.04 of
# the peak, the peak at a quarter of the run, momentum cycled 0.85-0.95. Each test's own keys are laid over these
CLASSIC = {"name": "constant", "start": 0.04, "peak": 0.25, "momentum": (0.85, 0.95), "min_warmup_steps": 50}


def schedule_config(**keys) -> ScheduleConfig:
    return ScheduleConfig(**(CLASSIC | keys))


def test_constant_is_one_everywhere():
    assert [constant(p) for p in (0.0, 0.5, 1.0)] == [1.0, 1.0, 1.0]


def test_step_decay_at_its_milestones():
    f = lambda p: step_decay(p, (0.5, 0.75), 0.1)  # noqa: E731
    assert f(0.0) == 1.0
    assert f(0.4999) == 1.0
    assert f(0.5) == 0.1
    assert f(0.7499) == 0.1
    assert f(0.75) == 0.1**2
    assert f(1.0) == 0.1**2


def test_cosine_start_middle_end():
    assert cosine(0.0, 0.1) == 1.0
    assert cosine(0.5, 0.1) == pytest.approx(0.55, abs=1e-15)
    assert cosine(1.0, 0.1) == 0.1
    assert cosine(1.0) == 0.0


def test_linear_decay_falls_in_a_straight_line_to_its_floor():
    assert linear_decay(0.0) == 1.0
    assert linear_decay(0.25) == 0.75
    assert linear_decay(1.0) == 0.0  # linear-to-zero by default
    assert linear_decay(0.5, 0.2) == 0.6
    assert linear_decay(1.0, 0.2) == 0.2


def test_linear_schedule_after_its_warmup_reaches_the_floor_at_the_end():
    config = schedule_config(name="linear", floor=0.2, warmup=0.25, min_warmup_steps=0)
    lrs, momenta = trace(config, total_steps=8)
    # 2 warm-up steps up to the peak, then 6 steps down to 0.2 x the peak
    assert lrs == pytest.approx([0.0, 0.5, 1.0, 1 - 0.8 / 6, 1 - 1.6 / 6, 0.6, 1 - 3.2 / 6, 1 - 4 / 6, 0.2], abs=1e-15)
    assert momenta is None  # like cosine, it leaves the optimizer's momentum fixed


def test_linear_schedule_in_a_two_step_run(tiny_overrides, tmp_path):
    two_steps = ["data.synthetic_size=32", "train.epochs=1", "schedule.min_warmup_steps=0", f"run.dir={tmp_path / 'r'}"]
    summary = hasten.train(None, [*tiny_overrides, *two_steps, "schedule.name=linear", "schedule.floor=0.5"])
    state = load_checkpoint(checkpoints_in(tmp_path / "r" / "checkpoints")[0])
    assert state["scheduler"] == {"step": 2}
    assert state["optimizer"]["param_groups"][0]["lr"] == pytest.approx(summary["lr"] * 0.5)  # the floor, at the end


def test_warmup_rises_linearly_to_where_the_schedule_starts():
    after = lambda p: one_cycle(p, 0.25, 0.04, 0.0)  # noqa: E731
    assert warmup_then(0.0, 0.2, after) == 0.0
    assert warmup_then(0.1, 0.2, after) == pytest.approx(0.02, abs=1e-15)  # half of after(0) = 0.04
    assert warmup_then(0.2, 0.2, after) == 0.04  # warmup end: the schedule's own start, no jump
    assert warmup_then(1.0, 0.2, after) == 0.0
    assert warmup_then(0.2, 0.2, lambda p: cosine(p)) == 1.0  # cosine starts at the peak


@pytest.mark.parametrize("mode", ["triangular", "triangular2", "exp_range"])
def test_cyclic_starts_and_ends_at_the_lower_bound_and_peaks_mid_cycle(mode):
    low, cycles = 0.1, 4
    assert cyclic(0.0, cycles, low, mode, 0.5) == low
    assert cyclic(1.0, cycles, low, mode, 0.5) == pytest.approx(low, abs=1e-15)
    assert cyclic(0.25, cycles, low, mode, 0.5) == pytest.approx(low, abs=1e-15)  # end of the first cycle
    first_peak = cyclic(0.125, cycles, low, mode, 0.5)
    assert first_peak == pytest.approx({"triangular": 1.0, "triangular2": 1.0, "exp_range": low + 0.9 * 0.5**0.5}[mode])


def test_cyclic_peaks_of_later_cycles():
    low = 0.1
    second, fourth = 1.5 / 4, 3.5 / 4  # middles of the second and fourth cycles
    assert cyclic(second, 4, low, "triangular") == pytest.approx(1.0)
    assert cyclic(second, 4, low, "triangular2") == pytest.approx(low + 0.9 * 0.5)
    assert cyclic(fourth, 4, low, "triangular2") == pytest.approx(low + 0.9 * 0.125)
    assert cyclic(fourth, 4, low, "exp_range", 0.5) == pytest.approx(low + 0.9 * 0.5**3.5)


@pytest.mark.parametrize("anneal", ["linear", "cosine"])
def test_one_cycle_start_peak_end(anneal):
    assert one_cycle(0.0, 0.3, 0.04, 0.001, anneal) == 0.04
    assert one_cycle(0.3, 0.3, 0.04, 0.001, anneal) == 1.0
    assert one_cycle(1.0, 0.3, 0.04, 0.001, anneal) == pytest.approx(0.001, abs=1e-15)
    assert one_cycle(0.15, 0.3, 0.0, 0.0, anneal) == pytest.approx(0.5)  # half-way up, both shapes


def test_one_cycle_shapes_differ_between_linear_and_cosine():
    assert one_cycle(0.075, 0.3, 0.0, 0.0, "linear") == pytest.approx(0.25)
    assert one_cycle(0.075, 0.3, 0.0, 0.0, "cosine") == pytest.approx(0.5 * (1 - math.cos(math.pi / 4)))


def test_one_cycle_momentum_at_start_peak_end():
    assert one_cycle_momentum(0.0, 0.3, 0.85, 0.95) == 0.95
    assert one_cycle_momentum(0.3, 0.3, 0.85, 0.95) == 0.85
    assert one_cycle_momentum(1.0, 0.3, 0.85, 0.95) == 0.95


@pytest.mark.parametrize("name", ["one-cycle", "cyclic"])
@pytest.mark.parametrize("anneal", ["linear", "cosine"])
def test_momentum_moves_opposite_to_the_lr(name, anneal):
    config = schedule_config(name=name, anneal=anneal, warmup=0.0, min_warmup_steps=0)
    lr, momentum = lr_and_momentum(config, 1000)
    points = [i / 200 for i in range(201)]
    for a, b in zip(points, points[1:], strict=False):
        d_lr, d_momentum = lr(b) - lr(a), momentum(b) - momentum(a)
        assert d_lr * d_momentum <= 1e-15, (a, b)
        assert (abs(d_lr) > 1e-12) == (abs(d_momentum) > 1e-12)
    assert inverse_momentum(1.0, 0.1, 0.85, 0.95) == 0.85
    assert inverse_momentum(0.1, 0.1, 0.85, 0.95) == 0.95


def test_warmup_as_fraction_or_steps():
    assert warmup_steps(schedule_config(warmup=0.1), 200) == 20
    assert warmup_steps(schedule_config(warmup=30), 200) == 30
    assert warmup_steps(schedule_config(warmup=0), 200) == 0
    lr, _ = lr_and_momentum(schedule_config(name="cosine", warmup=50), 100)
    assert lr(0.0) == 0.0
    assert lr(0.25) == 0.5
    assert lr(0.5) == 1.0  # warmup end: the peak
    assert lr(0.75) == pytest.approx(0.5)  # half-way through the cosine
    assert lr(1.0) == 0.0


def test_warmup_longer_than_the_run_is_named():
    with pytest.raises(RecipeError, match="schedule.warmup: 300 means 300 warmup steps.*200 optimizer steps"):
        warmup_steps(schedule_config(warmup=300), 200)
    with pytest.raises(RecipeError, match="schedule.warmup"):
        warmup_steps(schedule_config(warmup=200), 200)


def test_scheduler_sets_lr_and_momentum_every_step_and_keeps_only_the_step():
    params = [torch.nn.Parameter(torch.zeros(2))]
    sgd = torch.optim.SGD([{"params": params}, {"params": [torch.nn.Parameter(torch.zeros(1))]}], lr=0.4, momentum=0.9)
    config = schedule_config(name="one-cycle", peak=0.5, start=0.0, end=0.0, momentum=(0.8, 0.9))
    schedule = scheduler(sgd, config, total_steps=10)
    expected_lr = [0.4 * m for m in trace(config, 10)[0]]
    seen = []
    for _ in range(10):
        seen.append((sgd.param_groups[0]["lr"], sgd.param_groups[1]["lr"], sgd.param_groups[0]["momentum"]))
        schedule.step()
    assert [s[0] for s in seen] == pytest.approx(expected_lr[:10])
    assert [s[1] for s in seen] == [s[0] for s in seen]
    assert seen[0][2] == 0.9 and seen[5][2] == pytest.approx(0.8)  # momentum low at the LR peak
    assert seen[5][0] == pytest.approx(0.4)
    assert schedule.state_dict() == {"step": 10}
    assert sgd.param_groups[0]["lr"] == 0.0  # progress 1: the end of the one-cycle

    # resume: a new scheduler on an optimizer loaded from the old one's state continues at the same LR
    state = sgd.state_dict()
    fresh = torch.optim.SGD([{"params": params}, {"params": [torch.nn.Parameter(torch.zeros(1))]}], lr=99.0)
    fresh.load_state_dict(state)
    resumed = scheduler(fresh, config, total_steps=10)
    resumed.load_state_dict({"step": 5})
    assert fresh.param_groups[0]["lr"] == pytest.approx(0.4)
    assert fresh.param_groups[0]["momentum"] == pytest.approx(0.8)


def test_scheduler_cycles_beta1_for_adam():
    adam = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-3, betas=(0.9, 0.99))
    schedule = Scheduler(adam, lambda p: 1.0, 4, momentum=lambda p: 0.95 - 0.1 * p)
    assert adam.param_groups[0]["betas"] == (0.95, 0.99)
    schedule.step()
    schedule.step()
    assert adam.param_groups[0]["betas"] == pytest.approx((0.9, 0.99))


def test_no_momentum_schedule_keeps_the_optimizers_momentum():
    sgd = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1, momentum=0.7)
    scheduler(sgd, schedule_config(name="one-cycle", momentum=None), 10).step()
    scheduler(sgd, schedule_config(name="cosine"), 10).step()
    assert sgd.param_groups[0]["momentum"] == 0.7


@pytest.mark.parametrize(
    "global_batch_size, rule, expected",
    [(256, "linear", 0.1), (128, "linear", 0.05), (1024, "linear", 0.4), (8192, "linear", 3.2), (1024, "sqrt", 0.2)],
)
def test_scaling_rule(global_batch_size, rule, expected):
    assert scale_lr(0.1, 256, global_batch_size, rule) == pytest.approx(expected)
    assert scale_lr(0.1, None, global_batch_size, rule) == 0.1


def test_global_batch_and_scaled_lr_in_build(tiny_overrides):
    recipe = load_recipe("fashion-fast", [*tiny_overrides, "optim.base_batch=64", "optim.lr=0.4"])
    assert global_batch(recipe) == 16  # one process: the per-process batch
    assert build(recipe).lr == pytest.approx(0.1)


@pytest.mark.parametrize(
    "override, field",
    [
        ("schedule.low=1.5", "schedule.low: cyclic bounds reversed"),
        ("schedule.momentum=[0.95, 0.85]", "schedule.momentum: bounds reversed"),
        ("schedule.warmup=2.5", "schedule.warmup"),
        ("schedule.milestones=[0.8, 0.5]", "schedule.milestones"),
        ("optim.lr=0", "optim.lr"),
        ("optim.lr=-0.1", "optim.lr"),
        ("schedule.name=triangle", "schedule.name"),
    ],
)
def test_bad_schedules_are_recipe_errors_naming_the_field(override, field):
    with pytest.raises(RecipeError, match=field):
        load_recipe("fashion-fast", [override])


def test_warmup_longer_than_the_run_stops_before_training(tiny_overrides, tmp_path, capsys):
    assert main(["train", *tiny_overrides, "schedule.warmup=100000"]) == 2
    assert "schedule.warmup" in capsys.readouterr().err
    assert not (tmp_path / "run" / "metrics.csv").exists()


def test_schedule_is_stepped_every_optimizer_step_in_training(tiny_overrides):
    overrides = [*tiny_overrides, "data.synthetic_size=96", "schedule.name=cosine", "schedule.warmup=5"]
    recipe = load_recipe("fashion-fast", overrides)
    parts = build(recipe)
    total = recipe.train.epochs * len(parts.train_loader)
    seen: list[float] = []
    hooks = Hooks(after_step=[lambda model: seen.append(parts.optimizer.param_groups[0]["lr"])])
    trainer = Trainer(
        parts.model,
        parts.optimizer,
        parts.scheduler,
        parts.precision,
        (parts.train_loader, parts.test_loader),
        Plan(epochs=recipe.train.epochs, num_classes=10, progress=False),
        RunLog("unused", enabled=False),
        hooks,
    )
    trainer.fit()
    expected = [parts.lr * m for m in trace(recipe.schedule, total)[0]]
    assert seen == pytest.approx(expected[1:])  # after step k the LR for step k+1 is set
    assert parts.scheduler.state_dict() == {"step": total}


@pytest.mark.parametrize(
    "overrides",
    [
        ["schedule.name=constant"],
        ["schedule.name=step", "schedule.warmup=0.2"],
        ["schedule.name=cosine", "schedule.warmup=1", "schedule.floor=0.1"],
        ["schedule.name=cyclic", "schedule.mode=triangular2", "schedule.cycles=2"],
        ["schedule.name=cyclic", "schedule.mode=exp_range", "schedule.gamma=0.5", "optim.name=adamw"],
        ["schedule.name=one-cycle", "schedule.anneal=cosine", "optim.name=adam", "optim.lr=0.003"],
    ],
)
def test_each_schedule_in_a_two_step_run(tiny_overrides, overrides):
    summary = hasten.train("fashion-fast", [*tiny_overrides, "data.synthetic_size=32", "train.epochs=1", *overrides])
    assert summary["steps"] == 2 and math.isfinite(summary["train_loss"])


def test_the_lr_rises_over_at_least_min_warmup_steps_scaled_with_the_batch_rule():
    one_cycle = schedule_config(name="one-cycle", peak=0.25, min_warmup_steps=50)
    assert rise_steps(one_cycle, 1000) == 50
    assert rise_steps(one_cycle, 1000, lr_scale=4.0) == 200  # 4x the LR from the linear rule: 4x the rise
    assert rise_steps(one_cycle, 60) == 30  # never more than half the run
    assert rise_steps(one_cycle, 1000, lr_scale=0.5) == 50  # a smaller LR keeps the floor
    # one-cycle: the peak moves later when the floor is longer than its own rise (25% of 80 steps = 20 < 50)
    lr, _ = lr_and_momentum(one_cycle, 80)
    peak_step = max(range(81), key=lambda s: lr(s / 80))
    assert peak_step == 40  # capped at half the run
    lr, _ = lr_and_momentum(one_cycle, 1000)
    assert max(range(1001), key=lambda s: lr(s / 1000)) == 250  # a long run keeps its own shape
    # other schedules get a linear warmup of the floor's length
    lr, _ = lr_and_momentum(schedule_config(name="constant", min_warmup_steps=50), 1000)
    assert lr(25 / 1000) == pytest.approx(0.5) and lr(50 / 1000) == pytest.approx(1.0)
    lr, _ = lr_and_momentum(schedule_config(name="constant", min_warmup_steps=0), 1000)
    assert lr(0.0) == 1.0
    # a one-cycle that starts at its peak (the default recipe's hold-then-decay) has no rise of its own: it gets
    # the warm-up, then holds the peak to half the run and falls to zero; in a run of 8 steps the rise is 4
    held = schedule_config(name="one-cycle", start=1.0, peak=0.5, end=0.0, momentum=None, min_warmup_steps=10)
    lr, _ = lr_and_momentum(held, 1000)
    assert lr(0.0) == 0.0 and lr(5 / 1000) == pytest.approx(0.5) and lr(10 / 1000) == pytest.approx(1.0)
    assert lr(0.5) == pytest.approx(1.0) and lr(0.75) == pytest.approx(0.5, abs=0.01) and lr(1.0) == 0.0
    assert rise_steps(held, 8) == 4
