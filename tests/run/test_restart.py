"""A run whose model's outputs collapse (the same for every test image and class: no gradient left) restarts once
from its first weights at a larger batch and half the LR, when those settings were hasten's to choose
(hasten/run/build.py, train; hasten/run/verdicts.py, collapsed_outputs)."""

from __future__ import annotations

import csv
import math

import pytest
import torch
import yaml

import hasten
from hasten.recipe.schema import Recipe
from hasten.recipe.sections import replaced
from hasten.run.restart import discard_start, first_weights, may_restart, restart_settings
from hasten.run.verdicts import collapsed_outputs
from hasten.runfolder.checkpoint import DIGEST_SUFFIX, sha256_file
from hasten.tune import rules
from tests.run.test_chance import DeadEnd
from tests.run.test_user import quadrants

LN10 = math.log(10)


def test_collapsed_outputs_are_a_uniform_test_loss_unchanged_by_an_epoch_and_a_training_loss_there_too():
    dead = LN10 + 3.56e-7  # a SqueezeNet-like net's test loss at every epoch once its last ReLU stopped at 0
    assert collapsed_outputs([dead, dead], LN10 + 4e-5, 10)
    assert not collapsed_outputs([dead], LN10, 10)  # one evaluation: not yet
    assert not collapsed_outputs([LN10 + 2.2e-6, LN10 + 3.6e-7], LN10, 10)  # moved in the epoch: alive
    assert not collapsed_outputs([LN10 - 4.9e-5, LN10 - 4.9e-5], LN10, 10)  # not ln(10): outputs differ per image
    assert not collapsed_outputs([dead, dead], LN10 - 5e-3, 10)  # the training loss has left the guess's
    assert collapsed_outputs([math.log(4)] * 2, math.log(4) + 5e-4, 4)
    assert not collapsed_outputs([0.0, 0.0], 0.0, 1)


def test_the_restart_takes_half_the_lr_and_a_batch_of_64_where_the_data_holds_its_run():
    asked = replaced(Recipe(), {"train.batch_size": 16, "optim.lr": 0.0015})
    budget = rules.run_steps(batch_norm=False)
    assert restart_settings(asked, 1200, budget) == {"train.batch_size": 64, "optim.lr": 0.00075}
    # 300 images at 64: 5 steps an epoch, 300 in 60 epochs, under half the budget: the batch stays
    assert restart_settings(asked, 300, budget) == {"train.batch_size": 16, "optim.lr": 0.00075}
    at_128 = replaced(asked, {"train.batch_size": 128})
    assert restart_settings(at_128, 60000, budget) == {"train.batch_size": 128, "optim.lr": 0.00075}
    assert restart_settings(replaced(asked, {"optim.lr": "auto"}), 1200, budget) is None


def test_only_a_run_whose_batch_lr_and_epochs_are_hastens_may_restart():
    assert may_restart(Recipe())
    for change in ({"optim.lr": 0.001}, {"train.epochs": 5}, {"train.batch_size": 32}, {"train.accumulate": 2},
                   {"resume": "auto"}):  # fmt: skip
        assert not may_restart(replaced(Recipe(), change)), change


def test_the_first_weights_are_a_copy_of_a_model_objects_and_none_for_one_not_yet_made():
    model = torch.nn.Linear(3, 2)
    kept = first_weights(model)
    assert isinstance(kept, dict)
    with torch.no_grad():
        model.weight.add_(1.0)
    assert not torch.equal(kept["weight"], model.weight)  # a copy: training the model leaves it
    assert first_weights(DeadEnd()) is None  # a lazy layer has no weights to start again from
    import hasten.run.restart as restart_module

    with pytest.MonkeyPatch.context() as patch:  # a machine whose memory an eighth of would not hold the copy
        patch.setattr(restart_module, "available_memory_bytes", lambda: 8 * (model.weight.numel() * 4))
        assert first_weights(model) is None
    assert first_weights(DeadEnd) is True  # a class: made again from the same seed


def test_a_run_whose_outputs_collapse_restarts_once_and_records_it(tmp_path):
    data = (quadrants(64, 0), quadrants(32, 1))
    quiet = ["run.progress=false", "run.tensorboard=false", "train.threads=1", "precision=fp32",
             "train.channels_last=false", f"run.dir={tmp_path}"]  # fmt: skip
    result = hasten.train(None, quiet, model=DeadEnd, data=data)
    restarted = result["restarted"]
    assert restarted["at_epoch"] == 2  # two evaluations, the same ln(4)
    assert restarted["from"] == {"train.batch_size": 16, "optim.lr": 0.0015}
    assert restarted["to"] == {"train.batch_size": 16, "optim.lr": 0.00075}  # 64 images hold no run at 64
    assert restarted["test_loss"] == pytest.approx(math.log(4), abs=1e-5)
    # once: the second start collapses too and ends at its end, told so
    assert any("its outputs became the same for every class" in text for text in result["warnings"])
    recipe = yaml.safe_load((tmp_path / "recipe.yaml").read_text())
    assert recipe["optim"]["lr"] == 0.00075 and recipe["train"]["batch_size"] == 16
    rows = list(csv.DictReader((tmp_path / "metrics.csv").open()))
    assert [int(row["epoch"]) for row in rows] == list(range(1, result["epochs"] + 1))  # the second start's alone
    peak = max(float(row["lr"]) for row in rows)  # the restart's LR, sqrt-scaled to the batch of 16
    assert peak == pytest.approx(0.00075 * math.sqrt(16 / 32), rel=1e-6)
    assert result["wall_seconds"] > restarted["wall_seconds"]  # the abandoned start's seconds are the user's too
    # and they are a phase of the start-up of their own, not the next start's data reading
    startup = result["startup"]
    assert startup["abandoned start"] > 0 and list(startup)[-1] == "abandoned start"  # the last phase first marked
    assert sum(startup.values()) == pytest.approx(result["startup_seconds"], abs=0.01)
    # the same command resumed from the restarted start's last checkpoint: its LR and batch, not the rule's again
    again = hasten.train(None, [*quiet, "resume=auto"], model=DeadEnd, data=data)
    assert again["test_accuracy"] == result["test_accuracy"] and again["epochs"] == result["epochs"]
    assert again["restarted"] == restarted  # kept in the checkpoint's position


def test_a_run_with_its_own_lr_is_not_restarted(tmp_path):
    data = (quadrants(64, 0), quadrants(32, 1))
    quiet = ["run.progress=false", "run.tensorboard=false", "train.threads=1", "precision=fp32",
             "train.channels_last=false", "optim.lr=0.002", "train.epochs=4", f"run.dir={tmp_path}"]  # fmt: skip
    result = hasten.train(None, quiet, model=DeadEnd, data=data)
    assert result["restarted"] is None and result["epochs"] == 4


def test_a_collapsed_starts_files_are_removed_and_the_users_own_kept(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    saved = checkpoints / "step-8.pt"
    saved.write_bytes(b"weights of the start that collapsed")
    saved.with_name(saved.name + DIGEST_SUFFIX).write_text(sha256_file(saved))
    theirs = checkpoints / "step-9.pt"  # named like one, but not written by hasten (no digest beside it)
    theirs.write_bytes(b"the user's")
    for name in ("recipe.yaml", "metrics.csv"):
        (tmp_path / name).write_text("the collapsed start's")
    (tmp_path / "notes.txt").write_text("the user's")
    discard_start(tmp_path)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["checkpoints", "notes.txt", "step-9.pt"]


class DeadLinear(torch.nn.Module):
    """DeadEnd without a lazy layer: a model object whose first weights can be kept."""

    def __init__(self, num_classes: int = 4, in_channels: int = 3):
        super().__init__()
        self.head = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(in_channels * 12 * 12, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.head(x) - 1e3)

    @classmethod
    def alive(cls, num_classes: int = 4, in_channels: int = 3) -> torch.nn.Module:
        """The same head without the dead ReLU: a model that learns."""
        return cls(num_classes, in_channels).head


def test_a_model_object_restarts_from_the_weights_it_came_with(tmp_path, monkeypatch):
    from hasten.run import build as build_module

    data = (quadrants(64, 0), quadrants(32, 1))
    model = DeadLinear()
    came_with = {name: value.clone() for name, value in model.state_dict().items()}
    starts: list[dict[str, torch.Tensor]] = []  # the model's weights as each start is built
    real_build = build_module.build

    def watched(recipe, model=None, data=None, clock=None, loss_given=False):
        starts.append({name: value.clone() for name, value in model.state_dict().items()})
        return real_build(recipe, model, data, clock, loss_given)

    monkeypatch.setattr(build_module, "build", watched)
    quiet = ["run.progress=false", "run.tensorboard=false", "train.threads=1", "precision=fp32",
             "train.channels_last=false", f"run.dir={tmp_path}"]  # fmt: skip
    result = hasten.train(None, quiet, model=model, data=data)
    assert result["restarted"]["at_epoch"] == 2 and len(starts) == 2
    # weight decay moves even a dead model's weights (these, by the end): without the restore, the second start
    # would have begun from the first start's moved ones
    assert not torch.equal(model.state_dict()["head.1.weight"], came_with["head.1.weight"])
    for name, value in came_with.items():
        assert torch.equal(starts[1][name], value), name  # the second start began where the first did


class _Plan:
    """What `stuck` reads of hasten.run.plan.Plan: a 27-epoch run whose hold ends after epoch 13."""

    def __init__(self) -> None:
        from hasten.run.extension import Extension

        self.epochs, self.num_classes, self.train_chance = 27, 10, None
        self.extension = Extension(0.5, lambda epochs: None)


def test_a_run_still_at_chance_whose_loss_barely_moved_by_the_holds_end_is_stuck():
    from hasten.run.extension import due, stuck
    from hasten.run.state import State
    from hasten.run.verdicts import barely_moved

    assert barely_moved(LN10 - 0.0041, 10)  # the SqueezeNet-like net's seed 1 at epoch 13 (it ended at 11.5%)
    assert not barely_moved(LN10 - 0.0105, 10)  # a ConvNeXt-like net there, which learnt once lengthened (51%)
    assert not barely_moved(LN10 + 0.0069, 10)  # a VGG with lazy layers, still over ln(10), which learnt (59%)
    assert not barely_moved(0.0, 1)
    plan, state = _Plan(), State(epoch=13)
    row = {"train_loss": LN10 - 0.0041, "train_accuracy": 0.123}
    assert stuck(plan, state, row)
    assert not stuck(plan, State(epoch=12), row)  # not where the hold ends
    assert not stuck(plan, state, {**row, "train_accuracy": 0.25})  # off chance: it learns
    late = State(epoch=13, learnt_from=11)  # off chance only late: lengthened (the extension's rule), not restarted
    assert not stuck(plan, late, {**row, "train_accuracy": 0.25}) and due(plan, late, 0.25) is not None
    assert not stuck(plan, state, {**row, "train_loss": LN10 - 0.02})  # at chance, but its loss has moved
    assert not stuck(plan, State(epoch=13, extended={"at_epoch": 6}), row)  # lengthened once already
    plan.extension = None  # epochs given: never lengthened, so never stuck either
    assert not stuck(plan, state, row)


def test_a_stuck_run_restarts_at_the_holds_end_and_its_second_start_may_lengthen(tmp_path, monkeypatch):
    """`stuck` made to say yes at the first check: the run starts again there, once, records why, and the second
    start (no restart left in its plan) goes on as any run does."""
    from hasten.run import trainer as trainer_module

    calls: list[int] = []

    def stuck_once(plan, state, row):
        calls.append(state.epoch)
        return True

    monkeypatch.setattr(trainer_module, "stuck", stuck_once)
    data = (quadrants(64, 0), quadrants(32, 1))
    quiet = ["run.progress=false", "run.tensorboard=false", "train.threads=1", "precision=fp32",
             "train.channels_last=false", f"run.dir={tmp_path}"]  # fmt: skip
    result = hasten.train(None, quiet, model=DeadLinear.alive, data=data)
    restarted = result["restarted"]
    assert calls == [1] and restarted["why"] == "barely moved" and restarted["at_epoch"] == 1
    assert restarted["to"] == {"train.batch_size": 16, "optim.lr": 0.00075}
    assert set(restarted) >= {"train_loss", "train_accuracy", "test_loss", "step", "wall_seconds", "from"}
    rows = list(csv.DictReader((tmp_path / "metrics.csv").open()))
    assert [int(row["epoch"]) for row in rows] == list(range(1, result["epochs"] + 1))  # the second start's alone
