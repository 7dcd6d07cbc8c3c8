"""The LR range test: the sweep, the smoothing and the suggestion rule exactly; on a tiny problem it suggests an
LR where the loss falls and leaves the run as it was; with 2 processes (gloo) every rank gets rank 0's answer;
`hasten lr-find` and `hasten schedule` write their plots."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from hasten.cli import main
from hasten.recipe.schema import load_recipe
from hasten.run.build import build
from hasten.run.plan import Plan
from hasten.run.trainer import Trainer
from hasten.runfolder.log import RunLog
from hasten.tune.lr_find import RULE, lr_find, range_test, smooth_losses, steepest, suggest, sweep_lrs


def test_sweep_is_geometric_between_its_ends():
    lrs = sweep_lrs(1e-4, 1.0, 5)
    assert lrs[0] == 1e-4 and lrs[-1] == pytest.approx(1.0)
    assert lrs == pytest.approx([1e-4, 1e-3, 1e-2, 1e-1, 1.0])


def test_smoothing_is_bias_corrected():
    assert smooth_losses([2.0, 2.0, 2.0], beta=0.9) == pytest.approx([2.0, 2.0, 2.0])
    assert smooth_losses([1.0, 3.0], beta=0.5) == pytest.approx([1.0, (0.25 + 1.5) / 0.75])


def test_suggestion_is_the_minimum_over_10_and_steepest_is_reported():
    lrs = sweep_lrs(1e-5, 1.0, 51)
    # a loss that falls fastest at 1e-3 (a logistic step in log10 LR), bottoms out at 1e-1 and then rises
    losses = [2 - 1 / (1 + math.exp(-4 * (math.log10(lr) + 3))) + max(0.0, math.log10(lr) + 1) for lr in lrs]
    assert suggest(lrs, losses) == pytest.approx(1e-2)
    assert steepest(lrs, losses) == pytest.approx(1e-3)


def test_suggestion_stays_inside_the_sweep_when_the_loss_only_rises():
    lrs = sweep_lrs(1e-3, 1.0, 20)
    assert suggest(lrs, [float(i) for i in range(20)]) == 1e-3  # the minimum / 10, clamped to the start
    assert steepest(lrs, [float(i) for i in range(20)]) is None


def test_range_test_stops_when_the_loss_diverges():
    lrs = sweep_lrs(1e-4, 10.0, 30)
    result = range_test(lambda lr: 1.0 if lr < 1.0 else 100.0 * lr, lrs)
    assert result.diverged and result.lrs == lrs[: len(result.lrs)] and result.lrs[-1] >= 1.0
    assert len(result.lrs) < len(lrs)


def _tiny(tiny_overrides) -> list[str]:
    return [*tiny_overrides, "data.synthetic_size=256", "precision=fp32", "schedule.name=constant"]


def test_lr_find_suggests_an_lr_where_the_loss_falls_and_restores_the_run(tiny_overrides):
    parts = build(load_recipe("fashion-fast", _tiny(tiny_overrides)))
    weights = {k: v.clone() for k, v in parts.model.state_dict().items()}
    lr_before = [g["lr"] for g in parts.optimizer.param_groups]
    result = lr_find(parts, start=1e-4, end=1.0, steps=30)  # past 1 the diverging steps are slow on CPU

    assert result.rule == RULE
    assert result.lrs[0] <= result.suggestion < result.min_loss_lr <= result.lrs[-1]
    i = next(i for i, lr in enumerate(result.lrs) if lr >= result.suggestion)
    lowest = result.smoothed.index(min(result.smoothed))
    assert result.smoothed[i] > result.smoothed[lowest] and i < lowest  # the loss still falls after the suggestion
    assert min(result.smoothed) < result.smoothed[0]
    for key, value in parts.model.state_dict().items():
        assert torch.equal(value, weights[key]), key
    assert [g["lr"] for g in parts.optimizer.param_groups] == lr_before
    assert parts.optimizer.state_dict()["state"] == {}  # no momentum buffers left behind


def test_a_training_run_after_lr_find_is_the_run_without_it(tiny_overrides):
    def fit(with_lr_find: bool) -> dict:
        parts = build(load_recipe("fashion-fast", [*_tiny(tiny_overrides), "train.epochs=1", "tricks.mixup=0.2"]))
        if with_lr_find:
            lr_find(parts, start=1e-3, end=1.0, steps=10)
        plan = Plan(epochs=1, num_classes=10, progress=False)
        loaders = (parts.train_loader, parts.test_loader)
        log = RunLog("unused", enabled=False)
        trainer = Trainer(
            parts.model, parts.optimizer, parts.scheduler, parts.precision, loaders, plan, log, parts.hooks
        )
        summary = trainer.fit()
        return {k: summary[k] for k in ("train_loss", "test_loss", "test_accuracy")}

    assert fit(True) == fit(False)


def _rank_sweep(rank: int, world_size: int, folder: str) -> None:
    init = f"file://{folder}/init"
    torch.distributed.init_process_group("gloo", init_method=init, rank=rank, world_size=world_size)
    try:
        # each rank sees a different loss; rank 1's alone would diverge early, the average diverges later
        def step(lr: float) -> float:
            return 1.0 + (50.0 * lr if rank == 1 else 0.0) - 0.1 * math.log10(lr)

        result = range_test(step, sweep_lrs(1e-3, 10.0, 30))
        answer = {"lrs": result.lrs, "losses": result.losses, "suggestion": result.suggestion}
        (Path(folder) / f"rank{rank}.json").write_text(json.dumps(answer))
    finally:
        torch.distributed.destroy_process_group()


def test_all_ranks_share_one_decision(tmp_path):
    mp.spawn(_rank_sweep, args=(2, str(tmp_path)), nprocs=2, join=True)  # spawn, not fork: OpenMP and fork
    first, second = (json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1))
    assert first == second
    expected = [1.0 + 25.0 * lr - 0.1 * math.log10(lr) for lr in first["lrs"]]  # the average over the two ranks
    assert first["losses"] == pytest.approx(expected)
    assert len(first["lrs"]) < 30  # the averaged loss diverged and rank 0 stopped the sweep for both


def test_cli_lr_find_and_schedule_write_their_plots(tiny_overrides, tmp_path, capsys):
    plot = tmp_path / "lr.png"
    assert main(["lr-find", "fashion-fast", *_tiny(tiny_overrides), "--plot", str(plot), "--steps", "20"]) == 0
    out = capsys.readouterr().out
    assert "suggested LR" in out and "optim.lr=" in out
    assert plot.read_bytes().startswith(b"\x89PNG")

    plot = tmp_path / "schedule.png"
    overrides = [*tiny_overrides, "schedule.name=one-cycle", "schedule.warmup=0.1"]
    assert main(["schedule", "--plot", str(plot), "fashion-fast", *overrides]) == 0
    out = capsys.readouterr().out
    assert "48 optimizer steps (24 per epoch), warmup 5" in out
    assert plot.read_bytes().startswith(b"\x89PNG")


def test_cli_lr_find_rejects_a_reversed_sweep(tiny_overrides, capsys):
    assert main(["lr-find", *tiny_overrides, "--start", "1", "--end", "0.1"]) == 2
    assert "--start" in capsys.readouterr().err


@pytest.mark.parametrize("end", ["inf", "nan"])
def test_cli_lr_find_rejects_an_end_that_is_no_number(tiny_overrides, capsys, end):
    """`--end inf` ran the sweep and suggested optim.lr=inf."""
    assert main(["lr-find", *tiny_overrides, "--end", end]) == 2
    assert "(finite)" in capsys.readouterr().err
