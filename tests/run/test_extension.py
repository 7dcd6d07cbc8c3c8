"""train.epochs=auto lengthens a run once when, where the LR's hold ends, its training accuracy is still at chance
(hasten/run/extension.py): the rule on hand-made numbers; the lengthened schedule is the one a run planned that
long has; whole runs: a model that cannot learn is lengthened (said, in recipe.yaml and summary.json), a model that
learns is not, a run given its epochs never is, and a run stopped after its lengthening resumes as long, bitwise,
without lengthening again."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from torch import nn

from hasten.cli import main
from hasten.engine.schedules import Scheduler, lr_and_momentum
from hasten.recipe.schema import load_recipe
from hasten.run.extension import FACTOR, Extension, lengthened
from hasten.run.plan import Plan
from hasten.run.state import State
from hasten.runfolder.checkpoint import checkpoints_in, load_checkpoint
from tests.run.test_user import sigterm_when_due

QUIET = ["run.progress=false", "run.tensorboard=false", "train.threads=1", "train.batch_size=16", "precision=fp32",
         "train.channels_last=false", "data.name=import", "data.target=tests.run.test_user:quadrant_split",
         "data.args={n: 64}"]  # fmt: skip


class Blind(nn.Module):
    """A model that never sees its input: its logits are one learnt bias (and a 1x1 conv's output times zero, so
    the input is used), so its training accuracy stays at chance, however long it trains."""

    def __init__(self, num_classes: int, in_channels: int = 3):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, num_classes, 1)
        self.bias = nn.Parameter(torch.zeros(num_classes))
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sigterm_when_due(self)  # $HASTEN_TEST_SIGTERM_AT: the resume test's stop
        return self.conv(x).mean((2, 3)) * 0 + self.bias


def test_the_check_is_at_the_last_epoch_before_the_decay_and_only_at_chance() -> None:
    applied: list[int] = []
    extension = Extension(hold=0.5, apply=applied.append)
    assert extension.check_epoch(27) == 13 and extension.check_epoch(26) == 13 and extension.check_epoch(1) == 1
    record = extension.decide(13, 27, 0.12, 10)  # 10 classes: at chance under 19%
    assert record is not None and (record["from"], record["to"], record["at_epoch"]) == (27, 27 * FACTOR, 13)
    assert record["chance_line"] == pytest.approx(0.19)
    assert extension.decide(13, 27, 0.20, 10) is None  # learning: left alone
    assert extension.decide(12, 27, 0.10, 10) is None and extension.decide(14, 27, 0.10, 10) is None
    assert extension.decide(1, 1, 0.10, 10) is None  # the last epoch: nothing left to lengthen
    plan, state = Plan(epochs=27, num_classes=10, extension=extension), State(epoch=13)
    assert lengthened(plan, state, 0.11) == state.extended and plan.epochs == 54 and applied == [54]
    assert lengthened(plan, state, 0.11) is None and applied == [54]  # once
    assert lengthened(Plan(epochs=27, num_classes=10), State(epoch=13), 0.11) is None  # a plan without one


def test_the_lengthened_schedule_is_the_one_a_run_planned_that_long_has() -> None:
    config = load_recipe(None, ["schedule.min_warmup_steps=10"]).schedule
    short, long_ = 100, 100 * FACTOR
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    lengthened_run = Scheduler(opt, lr_and_momentum(config, short, 1.0)[0], short)
    lr, momentum = lr_and_momentum(config, long_, 1.0)
    planned = Scheduler(torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0), lr, long_, momentum)
    lrs, expected = [], []
    for step in range(long_):
        if step == 45:  # the check's epoch end, before the decay at step 50
            lengthened_run.retarget(lr, momentum, long_)
        lrs.append(opt.param_groups[0]["lr"])
        expected.append(planned.optimizer.param_groups[0]["lr"])
        lengthened_run.step()
        planned.step()
    assert lrs == pytest.approx(expected)
    assert lrs[20:101] == [1.0] * 81 and lrs[110] < 1.0 and lrs[-1] < 0.02  # held past the old end, then the decay


def _run(tmp_path, name: str, *extra: str) -> dict:
    target = f"model.target={__name__}:Blind"
    assert main(["train", *QUIET, "model.name=import", target, *extra, f"run.dir={tmp_path / name}"]) == 0
    return json.loads((tmp_path / name / "summary.json").read_text())


def test_a_model_still_at_chance_is_lengthened_once_said_and_recorded(tmp_path, capsys) -> None:
    summary = _run(tmp_path, "blind")
    # 64 images at batch 16: 4 steps an epoch; the budget's 2,000 steps cap at 60 epochs; the check after epoch 30
    extended = summary["extended"]
    assert (extended["at_epoch"], extended["from"], extended["to"]) == (30, 60, 120)
    assert summary["epochs"] == 120 and summary["steps"] == 480
    assert yaml.safe_load((tmp_path / "blind" / "recipe.yaml").read_text())["train"]["epochs"] == 120
    out = " ".join(capsys.readouterr())  # the decisions' lines, however the display wraps them
    out = " ".join(out.split())
    assert "train.epochs=auto -> 120: after epoch 30 of 60" in out and "at chance" in out
    given = _run(tmp_path, "given", "train.epochs=8")
    assert given["extended"] is None and given["epochs"] == 8  # a given train.epochs is never changed


def test_a_model_that_learns_is_not_lengthened(tmp_path) -> None:
    summary = _run(tmp_path, "learns", "model.target=tests.run.test_user:TinyNet")
    assert summary["extended"] is None and summary["epochs"] == 60 and summary["test_accuracy"] > 0.9


def test_a_run_stopped_after_its_lengthening_resumes_as_long_and_bitwise(tmp_path, monkeypatch) -> None:
    keep = ["run.save_every_steps=40", "run.keep=100"]
    whole = _run(tmp_path, "whole", *keep)
    monkeypatch.setenv("HASTEN_TEST_SIGTERM_AT", "150")  # epoch 38, after the lengthening at step 120
    target = f"model.target={__name__}:Blind"
    stopped = tmp_path / "stopped"
    assert main(["train", *QUIET, "model.name=import", target, *keep, f"run.dir={stopped}"]) == 143
    monkeypatch.delenv("HASTEN_TEST_SIGTERM_AT")
    assert main(["train", *QUIET, "model.name=import", target, *keep, f"run.dir={stopped}", "resume=auto"]) == 0
    resumed = json.loads((stopped / "summary.json").read_text())
    assert resumed["epochs"] == whole["epochs"] == 120 and resumed["extended"] == whole["extended"]
    a = load_checkpoint(checkpoints_in(tmp_path / "whole" / "checkpoints")[0])
    b = load_checkpoint(checkpoints_in(stopped / "checkpoints")[0])
    assert a["trainer"]["step"] == b["trainer"]["step"] == 480
    assert all(torch.equal(a["model"][key], b["model"][key]) for key in a["model"])
