"""What hasten cannot assume of a model it did not write: the LR its batch-norm ResNet was tuned at (optim.lr unset is
decided by whether the model has batch norm), said at start and recorded in recipe.yaml."""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from torch import nn

import hasten
from hasten.models.resnet import ResNet
from hasten.recipe.schema import Recipe, load_recipe
from hasten.run.resolve import resolve_default_lr
from hasten.tune import rules


def mlp() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 2))


def batch_norm_net() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(8, 2))  # fmt: skip


def test_an_unset_lr_is_the_batch_norm_one_on_a_model_with_batch_norm_and_lower_on_one_without():
    hastens = ResNet(3, 10, width=8, blocks=[1])
    recipe, notes = resolve_default_lr(Recipe(), hastens)
    assert recipe.optim.lr == rules.BATCH_NORM_LR == 0.002 and "has batch norm" in notes[0]  # as tuned: unchanged
    recipe, notes = resolve_default_lr(Recipe(), batch_norm_net(), model_given=True)
    assert recipe.optim.lr == rules.BATCH_NORM_LR and "given to hasten.train (Sequential)" in notes[0]
    recipe, notes = resolve_default_lr(Recipe(), mlp(), model_given=True)
    assert recipe.optim.lr == rules.NO_BATCH_NORM_LR and "has no batch norm" in notes[0]
    imported = load_recipe(None, ["model.name=import", "model.target=examples.models.mlp:MLP"])
    recipe, notes = resolve_default_lr(imported, mlp())
    assert recipe.optim.lr == rules.NO_BATCH_NORM_LR and "model.target=examples.models.mlp:MLP" in notes[0]
    group_norm = nn.Sequential(nn.Conv2d(1, 8, 3), nn.GroupNorm(2, 8), nn.Flatten(), nn.LazyLinear(2))
    assert resolve_default_lr(Recipe(), group_norm, model_given=True)[0].optim.lr == rules.NO_BATCH_NORM_LR
    muon = load_recipe(None, ["optim.name=muon"])
    assert resolve_default_lr(muon, hastens)[0].optim.lr == rules.BATCH_NORM_LR


def test_sgd_with_no_lr_runs_the_range_test_its_rule_was_measured_for_and_a_given_lr_is_kept():
    recipe, notes = resolve_default_lr(load_recipe(None, ["optim.name=sgd"]), mlp(), model_given=True)
    assert recipe.optim.lr == "auto" and "range test" in notes[0]
    for given in ("0.01", "auto"):
        kept, notes = resolve_default_lr(load_recipe(None, [f"optim.lr={given}"]), mlp(), model_given=True)
        assert str(kept.optim.lr) == given and notes == []


def test_the_default_recipe_leaves_the_lr_to_the_rule():
    assert Recipe().optim.lr is None and load_recipe(None, []).optim.lr is None


class Net(nn.Module):
    def __init__(self, num_classes: int, in_channels: int = 1):
        super().__init__()
        self.layers = nn.Sequential(nn.Flatten(), nn.LazyLinear(32), nn.ReLU(), nn.Linear(32, num_classes))

    def forward(self, x):
        return self.layers(x)


@pytest.mark.parametrize("given", ["object", "import"])
def test_a_run_with_a_users_model_records_and_says_the_lr_it_chose(tmp_path, capsys, given):
    rng = np.random.default_rng(0)
    images, labels = rng.integers(0, 255, (64, 1, 8, 8), dtype=np.uint8), np.arange(64) % 2
    overrides = ["train.epochs=1", "train.batch_size=16", "precision=fp32", "run.progress=false",
                 "run.tensorboard=false", f"run.dir={tmp_path / 'run'}"]  # fmt: skip
    model = Net
    if given == "import":
        overrides += ["model.name=import", "model.target=tests.run.test_model_rules:Net"]
        model = None
    hasten.train(None, overrides, model=model, data=((images, labels), (images[:16], labels[:16]), ["a", "b"]))
    recorded = yaml.safe_load((tmp_path / "run" / "recipe.yaml").read_text())
    assert recorded["optim"]["lr"] == rules.NO_BATCH_NORM_LR
    assert f"optim.lr unset -> {rules.NO_BATCH_NORM_LR:g} per 32" in capsys.readouterr().err


def test_a_run_at_chance_at_its_budget_is_advised_longer_first_and_a_short_one_its_budget():
    from types import SimpleNamespace

    from hasten.run.trainer import Plan, Trainer
    from hasten.run.verdicts import LONGER

    said: list[str] = []
    plan = Plan(num_classes=10, epochs=8, divergence_advice=["optim.lr=0.00035", "train.batch_size=8"])
    ran = SimpleNamespace(
        plan=plan, warn=said.append, recent_losses=[2.1], constant_classes=()
    )  # a loss off ln(10): not collapsed
    Trainer.check_result(ran, 0.105)
    assert f"try train.epochs={LONGER * 8}, optim.lr=0.00035" in said[0]
    load_recipe(None, [f"train.epochs={LONGER * 8}"])  # the advice is a valid override
    plan.divergence_advice = ["train.epochs=75", "optim.lr=0.00035"]  # a short run: its budget's epochs, not 4x
    Trainer.check_result(ran, 0.105)
    assert "try train.epochs=75, optim.lr" in said[1] and f"train.epochs={LONGER * 8}" not in said[1]
    Trainer.check_result(ran, 0.5)  # learnt: nothing said
    assert len(said) == 2
    Trainer.check_result(ran, 0.105, 0.18)  # training at chance too
    assert "the model did not learn" in said[2]
    Trainer.check_result(ran, 0.105, 0.41)  # the training images learnt
    assert "while the training accuracy is 41.00%: the model learns the training images, but what it learns does " \
           "not carry over to the test images" in said[3] and "did not learn" not in said[3]  # fmt: skip
    assert "data.augment.translate=4" in said[3]
    load_recipe(None, ["data.augment.translate=4"])  # the advice is a valid override


def test_a_run_that_sat_at_chance_for_a_third_of_its_steps_before_it_learnt_is_told_to_train_longer():
    from types import SimpleNamespace

    from hasten.run.trainer import Plan, Trainer
    from hasten.run.verdicts import LATE_LONGER, learnt_late

    def curve(accuracies, steps_per_epoch=100):
        return [[epoch, epoch * steps_per_epoch, accuracy, epoch] for epoch, accuracy in enumerate(accuracies, 1)]

    # 10 classes: chance level is under 19%
    assert learnt_late(curve([0.10, 0.12, 0.18, 0.40, 0.50, 0.60]), 10) == (300, 600)  # half of it at chance
    assert learnt_late(curve([0.10, 0.18, 0.40, 0.50, 0.55, 0.60]), 10) == (200, 600)  # a third: on the line
    assert learnt_late(curve([0.10, 0.30, 0.40, 0.50, 0.55, 0.60]), 10) is None  # a sixth: a usual start
    assert learnt_late(curve([0.30, 0.12, 0.40, 0.45, 0.50, 0.55, 0.6, 0.6, 0.6]), 10) is None  # back at 2 of 9
    assert learnt_late(curve([0.20, 0.10, 0.12, 0.40, 0.50, 0.60]), 10) == (300, 600)  # off the line, then back
    assert learnt_late(curve([0.10, 0.10, 0.12, 0.12, 0.15, 0.18]), 10) is None  # ended at chance: the end's warning
    assert learnt_late(curve([0.40, 0.60]), 2) == (100, 200)  # 2 classes: chance level is under 55%
    assert learnt_late(curve([0.60]), 10) is None and learnt_late([], 10) is None
    said: list[str] = []
    plan = Plan(num_classes=10, epochs=27)
    late = SimpleNamespace(accuracy_curve=curve([0.1] * 12 + [0.3] * 15, steps_per_epoch=75))
    Trainer.check_start(SimpleNamespace(plan=plan, state=late, warn=said.append))
    assert said == [
        "the test accuracy was at chance level until step 900 of 2,025 (44% of the run) before the model learnt: a "
        f"longer run may end higher; try train.epochs={LATE_LONGER * 27}"
    ]
    load_recipe(None, [f"train.epochs={LATE_LONGER * 27}"])  # the advice is a valid override
    Trainer.check_start(
        SimpleNamespace(plan=plan, state=SimpleNamespace(accuracy_curve=curve([0.5] * 27)), warn=said.append)
    )
    assert len(said) == 1  # learnt from the start: nothing said


def test_a_model_without_batch_norm_gets_the_longer_budget_and_the_batch_candidates_keep_it():
    assert rules.run_steps(batch_norm=True) == rules.RUN_STEPS == 600  # hasten's ResNet: as tuned
    assert rules.run_steps(batch_norm=False) == rules.NO_BATCH_NORM_RUN_STEPS == 1200
    assert rules.auto_epochs(1200, 32) == 16 and rules.auto_epochs(1200, 32, budget=1200) == 32  # 38 steps an epoch
    assert rules.auto_epochs(60_000, 32, budget=1200) == rules.MIN_EPOCHS  # a large set: its minimum passes, as before
    # 1,200 images: at batch 64 the longer budget would take 64 epochs, past MAX_EPOCHS: not a candidate
    assert rules.batch_candidates(1200, None) == [16, 32, 64, 128]
    assert rules.batch_candidates(1200, None, budget=1200) == [16, 32]
    for batch in rules.batch_candidates(5000, None, budget=1200):
        planned = rules.budget_steps(1200, batch)
        assert rules.auto_epochs(5000, batch, budget=1200) * rules.steps_per_epoch(5000, batch) >= planned


def test_a_smaller_batch_is_planned_the_steps_the_batch_rule_says_it_needs_a_larger_one_no_fewer():
    # S(B) = S_min (1 + 64/B): batch 16 needs (1 + 4) / (1 + 2) = 5/3 of batch 32's steps, so whichever of the two
    # the time rule picks sees about as many images (1,000 x 16 against 600 x 32) and takes the time it predicted
    assert [rules.budget_steps(600, b) for b in (16, 32, 64, 512)] == [1000, 600, 600, 600]
    assert rules.budget_steps(1200, 16) == 2000 and rules.budget_steps(600, 8, world=2) == 1000  # the global batch
    assert rules.budget_steps(600, 8, accumulate=4) == 600
    assert rules.auto_epochs(1200, 16) == 14 and rules.auto_epochs(1200, 32) == 16  # 75 and 38 steps an epoch
    assert rules.auto_epochs(60_000, 16) == rules.MIN_EPOCHS  # a large set: unchanged


@pytest.mark.parametrize("batch_norm", [True, False])
def test_train_epochs_auto_plans_the_models_budget_says_why_and_a_short_run_is_told_its_own(
    tmp_path, capsys, batch_norm
):
    class Small(nn.Module):
        def __init__(self, num_classes: int, in_channels: int = 1):
            super().__init__()
            norm = nn.BatchNorm2d(4) if batch_norm else nn.GroupNorm(2, 4)
            self.layers = nn.Sequential(nn.Conv2d(in_channels, 4, 3), norm, nn.ReLU(), nn.Flatten(),
                                        nn.Linear(4 * 6 * 6, num_classes))  # fmt: skip

        def forward(self, x):
            return self.layers(x)

    rng = np.random.default_rng(0)
    images, labels = rng.integers(0, 255, (1600, 1, 8, 8), dtype=np.uint8), np.arange(1600) % 2
    data = ((images, labels), (images[:32], labels[:32]), ["a", "b"])
    base = ["train.batch_size=16", "precision=fp32", "train.channels_last=false", "run.progress=false",
            "run.tensorboard=false"]  # fmt: skip
    summary = hasten.train(None, [*base, f"run.dir={tmp_path / 'auto'}"], model=Small, data=data).summary
    budget = rules.budget_steps(rules.run_steps(batch_norm), 16)  # at batch 16: 5/3 of the steps at 32
    epochs = -(-budget // 100)  # 1,600 images at batch 16: 100 optimizer steps an epoch
    recorded = yaml.safe_load((tmp_path / "auto" / "recipe.yaml").read_text())
    assert recorded["train"]["epochs"] == summary["epochs"] == epochs == (10 if batch_norm else 20)
    said = " ".join(capsys.readouterr().err.split())
    planned = f"train.epochs=auto -> {epochs}: {epochs * 100:,} optimizer steps over 1,600 images"
    assert f"{planned} (at least {budget:,} steps" in said
    assert ("a model without batch norm learns more slowly" in said) is (not batch_norm)
    hasten.train(None, [*base, "train.epochs=1", f"run.dir={tmp_path / 'short'}"], model=Small, data=data)
    said = " ".join(capsys.readouterr().err.split())
    assert f"under the {budget:,} that train.epochs=auto plans for a small set at this batch" in said
    assert f"train.epochs={epochs} gives it {budget:,}" in said
