"""train.epochs=auto lengthens a run once when, where the LR's hold ends, its training accuracy is still at chance,
and shortens it once when its training images fit during the hold (hasten/run/extension.py): the rules on
hand-made numbers; the lengthened and the shortened schedules are the ones a run planned that long has; whole runs:
a model that cannot learn is lengthened (said, in recipe.yaml and summary.json), a model that learns is shortened
(said, recorded) where train.end_early=true asks, a run given its epochs is never changed, and a run stopped after
either change resumes as long, bitwise, without changing again."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from torch import nn

from hasten.cli import main
from hasten.engine.schedules import Scheduler, lr_and_momentum
from hasten.recipe.schema import load_recipe
from hasten.run.extension import FACTOR, FIT, FIT_EPOCHS, LATE, Extension, late_from, lengthened, replanned
from hasten.run.plan import Plan
from hasten.run.state import State
from hasten.runfolder.checkpoint import checkpoints_in, load_checkpoint
from hasten.tune import rules
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
    assert extension.decide(13, 27, 0.20, 10, learnt_from=5) is None  # learning since epoch 5: left alone
    assert extension.decide(12, 27, 0.10, 10) is None and extension.decide(14, 27, 0.10, 10) is None
    assert extension.decide(1, 1, 0.10, 10) is None  # the last epoch: nothing left to lengthen
    plan, state = Plan(epochs=27, num_classes=10, extension=extension), State(epoch=13)
    assert lengthened(plan, state, 0.11) == state.extended and plan.epochs == 54 and applied == [54]
    assert lengthened(plan, state, 0.11) is None and applied == [54]  # once
    assert lengthened(Plan(epochs=27, num_classes=10), State(epoch=13), 0.11) is None  # a plan without one


def test_a_run_that_left_chance_only_late_in_the_hold_is_lengthened_as_one_still_at_chance() -> None:
    assert LATE == 0.5
    extension = Extension(hold=0.5, apply=lambda epochs: None)  # 27 epochs: the check after epoch 13
    # late: more than 0.5 x 13 = 6.5 epochs wholly at chance, i.e. off chance first at epoch 8 or after
    for first, lengthens in ((1, False), (7, False), (8, True), (12, True), (13, True)):
        record = extension.decide(13, 27, 0.245, 10, learnt_from=first)
        assert (record is not None) == lengthens, first
        if lengthens:
            assert (record["to"], record["learnt_from"], record["train_accuracy"]) == (54, first, 0.245)
    for epochs in range(2, 61):  # the first late epoch `hasten schedule` names is the one the check uses
        check = extension.check_epoch(epochs)
        firsts = [first for first in range(1, check + 1) if extension.decide(check, epochs, 0.3, 10, learnt_from=first)]
        assert firsts == list(range(late_from(check), check + 1)), epochs
    assert extension.decide(13, 27, 0.245, 10)["learnt_from"] == 13  # none before: this epoch is the first
    assert "learnt_from" not in extension.decide(13, 27, 0.11, 10)  # still at chance: as before
    assert extension.decide(12, 27, 0.245, 10, learnt_from=12) is None  # only at the check's epoch
    short = Extension(hold=0.5, apply=lambda epochs: None)  # 5 epochs: the check after epoch 2; epoch 1 at chance
    assert short.decide(2, 5, 0.3, 10, learnt_from=2) is None  # one epoch of two is not more than half of them
    assert short.decide(3, 7, 0.3, 10, learnt_from=2) is None  # 7 epochs, the check after 3: 1 of 3 at chance
    assert short.decide(3, 7, 0.3, 10, learnt_from=3)["learnt_from"] == 3  # 2 of 3
    # the state keeps the first epoch off chance, epoch by epoch, and the check reads it
    plan, state = Plan(epochs=27, num_classes=10, extension=Extension(0.5, lambda epochs: None)), State()
    notes = []
    for epoch, accuracy in enumerate((0.10, 0.12, 0.15, 0.18, 0.21, 0.17, 0.30, 0.35, 0.40, 0.41, 0.45, 0.5, 0.52), 1):
        state.epoch = epoch
        notes.append(replanned(plan, state, accuracy))
    assert state.learnt_from == 5 and notes == [None] * 13 and plan.epochs == 27  # off chance at 5 of 13: learning
    plan, state = Plan(epochs=27, num_classes=10, extension=Extension(0.5, lambda epochs: None)), State()
    for epoch in range(1, 14):
        state.epoch = epoch
        note = replanned(plan, state, 0.12 if epoch < 11 else 0.25)
    assert state.learnt_from == 11 and plan.epochs == 54 and state.extended["learnt_from"] == 11
    assert "left chance (over 19.0%) only at epoch 11" in note and "train.epochs=auto -> 54" in note
    assert "at chance" not in note.replace("left chance", "")


def test_the_hold_ends_early_after_epochs_that_fit_and_only_during_the_hold() -> None:
    assert (FIT, FIT_EPOCHS) == (0.99, 3)
    extension = Extension(hold=0.5, apply=lambda epochs: None, end_early=True)
    records = [extension.shorten(epoch, 40, accuracy) for epoch, accuracy in enumerate((0.5, 0.995, 0.99, 1.0), 1)]
    assert records[:3] == [None, None, None]  # three epochs at 99% or more, in a row
    assert records[3] == {"at_epoch": 4, "from": 40, "to": 8, "train_accuracy": 0.99}  # the hold: epochs 1-4 of 8
    dip = Extension(hold=0.5, apply=lambda epochs: None, end_early=True)
    assert [dip.shorten(e, 40, a) for e, a in enumerate((1.0, 1.0, 0.98, 1.0, 1.0), 1)] == [None] * 5
    assert dip.shorten(6, 40, 1.0) == {"at_epoch": 6, "from": 40, "to": 12, "train_accuracy": 1.0}
    late = Extension(hold=0.5, apply=lambda epochs: None, end_early=True)  # the hold of 14 epochs ends at 7: too late
    assert [late.shorten(e, 14, 1.0) for e in range(5, 9)] == [None, None, None, None]
    third = Extension(hold=0.3, apply=lambda epochs: None, end_early=True)  # a hold of 30%: the run ends at epoch / 0.3
    assert [third.shorten(e, 60, 1.0) for e in (1, 2, 3)][-1]["to"] == 10
    off = Extension(hold=0.5, apply=lambda epochs: None)  # the default: asked for, not assumed
    assert [off.shorten(e, 40, 1.0) for e in range(1, 8)] == [None] * 7


def test_a_run_is_shortened_once_and_never_after_a_lengthening() -> None:
    applied: list[int] = []
    plan, state = Plan(epochs=40, num_classes=10, extension=Extension(0.5, applied.append, True)), State()
    notes = []
    for epoch in range(1, 9):
        state.epoch = epoch
        notes.append(replanned(plan, state, 1.0))
    assert notes[:2] == [None, None] and notes[3:] == [None] * 5 and applied == [6] and plan.epochs == 6
    assert state.shortened == {"at_epoch": 3, "from": 40, "to": 6, "train_accuracy": 1.0}
    assert "train.epochs=auto -> 6" in notes[2] and "the plan was 40" in notes[2]
    plan = Plan(epochs=40, num_classes=10, extension=Extension(0.5, applied.append, True))
    state = State(extended={"at_epoch": 1, "from": 20, "to": 40})  # lengthened already: the plan stays
    assert [replanned(plan, State(epoch=e, extended=state.extended), 1.0) for e in (1, 2, 3)] == [None] * 3


def _retargeted(first: int, then: int, at: int) -> tuple[list[float], list[float]]:
    """The LR of each of `then` steps of a schedule planned over `first` steps and retargeted to `then` steps before
    step `at`, and the LR of a schedule planned over `then` from the start."""
    config = load_recipe(None, ["schedule.min_warmup_steps=10"]).schedule
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    changed = Scheduler(opt, lr_and_momentum(config, first, 1.0)[0], first)
    lr, momentum = lr_and_momentum(config, then, 1.0)
    planned = Scheduler(torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0), lr, then, momentum)
    lrs, expected = [], []
    for step in range(then):
        if step == at:
            changed.retarget(lr, momentum, then)
        lrs.append(opt.param_groups[0]["lr"])
        expected.append(planned.optimizer.param_groups[0]["lr"])
        changed.step()
        planned.step()
    return lrs, expected


def test_the_lengthened_schedule_is_the_one_a_run_planned_that_long_has() -> None:
    lrs, expected = _retargeted(100, 100 * FACTOR, at=45)  # the check's epoch end, before the decay at step 50
    assert lrs == pytest.approx(expected)
    assert lrs[20:101] == [1.0] * 81 and lrs[110] < 1.0 and lrs[-1] < 0.02  # held past the old end, then the decay


def test_the_shortened_schedule_is_the_one_a_run_planned_that_long_has() -> None:
    lrs, expected = _retargeted(400, 120, at=60)  # shortened after step 60, the end of the shorter run's hold
    assert lrs == pytest.approx(expected)
    assert lrs[20:61] == [1.0] * 41 and lrs[90] < 0.6 and lrs[-1] < 0.02  # the hold ends at 60, then the decay


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


# 18 steps an epoch at batch 16: 56 epochs hold the budget's 1,000 steps; ending early asked for
FULL = ["data.args={n: 288}", "train.end_early=true"]


def test_a_model_that_learns_is_not_lengthened_but_shortened_once_it_fits(tmp_path, capsys) -> None:
    summary = _run(tmp_path, "learns", "model.target=tests.run.test_user:TinyNet", *FULL)
    shortened, steps = summary["shortened"], rules.steps_per_epoch(288, 16)
    assert summary["extended"] is None and shortened["from"] == 56 and summary["test_accuracy"] > 0.9
    assert shortened["to"] == 2 * shortened["at_epoch"] < 56 and summary["epochs"] == shortened["to"]
    assert summary["steps"] == steps * shortened["to"] and shortened["train_accuracy"] >= FIT
    metrics = (tmp_path / "learns" / "metrics.csv").read_text().splitlines()[1:]
    fits = [float(line.split(",")[4]) for line in metrics][: shortened["at_epoch"]]
    assert min(fits[-FIT_EPOCHS:]) >= FIT and not all(a >= FIT for a in fits[-FIT_EPOCHS - 1 : -1])  # the first
    assert yaml.safe_load((tmp_path / "learns" / "recipe.yaml").read_text())["train"]["epochs"] == shortened["to"]
    out = " ".join(" ".join(capsys.readouterr()).split())
    assert f"train.epochs=auto -> {shortened['to']}: the training accuracy was 99% or more" in out
    kept = _run(tmp_path, "kept", "model.target=tests.run.test_user:TinyNet", "data.args={n: 288}")  # the default
    assert kept["shortened"] is None and kept["epochs"] == 56 and kept["test_accuracy"] > 0.9


def test_a_set_whose_plan_is_short_of_its_budget_keeps_every_epoch(tmp_path, capsys) -> None:
    """64 images: 4 steps an epoch, 60 epochs hold 240 of the budget's 1,000 steps; such a set keeps them all, and
    is told that the rule's most epochs, not the user, left it short."""
    summary = _run(tmp_path, "capped", "model.target=tests.run.test_user:TinyNet", "train.end_early=true")
    assert summary["shortened"] is None and summary["extended"] is None and summary["epochs"] == 60
    assert summary["train_accuracy"] >= FIT  # it fit long before its end, and was not shortened
    said = " ".join(" ".join(capsys.readouterr()).split())
    assert "train.epochs=auto's 60, the most it plans, gives this run 240 optimizer steps" in said, said


def _stopped_and_resumed(tmp_path, monkeypatch, keep: list[str], at: int) -> tuple[dict, dict, dict]:
    """The run `_run` makes with `keep`, stopped by SIGTERM at its `at`-th training forward pass and resumed: its
    summary, then the newest checkpoints of the run "whole" (made before) and of it."""
    stopped = tmp_path / "stopped"
    args = ["train", *QUIET, "model.name=import", f"model.target={__name__}:Blind", *keep, f"run.dir={stopped}"]
    monkeypatch.setenv("HASTEN_TEST_SIGTERM_AT", str(at))
    assert main(args) == 143
    monkeypatch.delenv("HASTEN_TEST_SIGTERM_AT")
    assert main([*args, "resume=auto"]) == 0
    resumed = json.loads((stopped / "summary.json").read_text())
    a = load_checkpoint(checkpoints_in(tmp_path / "whole" / "checkpoints")[0])
    return resumed, a, load_checkpoint(checkpoints_in(stopped / "checkpoints")[0])


def test_a_run_stopped_after_its_lengthening_resumes_as_long_and_bitwise(tmp_path, monkeypatch) -> None:
    keep = ["run.save_every_steps=40", "run.keep=100"]
    whole = _run(tmp_path, "whole", *keep)
    resumed, a, b = _stopped_and_resumed(tmp_path, monkeypatch, keep, 150)  # epoch 38, after the lengthening at 120
    assert resumed["epochs"] == whole["epochs"] == 120 and resumed["extended"] == whole["extended"]
    assert a["trainer"]["step"] == b["trainer"]["step"] == 480
    assert all(torch.equal(a["model"][key], b["model"][key]) for key in a["model"])


def test_a_run_stopped_after_its_shortening_resumes_as_short_and_bitwise(tmp_path, monkeypatch) -> None:
    keep = ["run.save_every_steps=18", "run.keep=100", "model.target=tests.run.test_user:StopAt", *FULL]
    whole = _run(tmp_path, "whole", *keep)
    at, to = whole["shortened"]["at_epoch"], whole["shortened"]["to"]
    resumed, a, b = _stopped_and_resumed(tmp_path, monkeypatch, keep, 18 * at + 7)  # in the decay, after it
    assert resumed["epochs"] == whole["epochs"] == to and resumed["shortened"] == whole["shortened"]
    assert a["trainer"]["step"] == b["trainer"]["step"] == 18 * to
    assert all(torch.equal(a["model"][key], b["model"][key]) for key in a["model"])


def test_the_first_epoch_off_chance_is_kept_in_the_checkpoint_and_absent_from_older_ones() -> None:
    import dataclasses

    from hasten.errors import CheckpointError
    from hasten.run.state import trainer_position

    saved = dataclasses.asdict(State(epoch=9, learnt_from=8))  # what a checkpoint's trainer section holds
    assert trainer_position(saved, "step-9.pt").learnt_from == 8
    del saved["learnt_from"]  # a checkpoint written before the field: none known, so the check reads this epoch's
    assert trainer_position(saved, "step-9.pt").learnt_from is None
    with pytest.raises(CheckpointError, match="trainer.learnt_from"):
        trainer_position({**saved, "learnt_from": "eight"}, "step-9.pt")
