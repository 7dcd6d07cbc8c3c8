"""What hasten cannot assume of a model it did not write: the LR its ResNet was tuned at (optim.lr unset is decided
by whose model it is), said at start and recorded in recipe.yaml."""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from torch import nn

import hasten
from hasten.recipe.schema import Recipe, load_recipe
from hasten.run.resolve import resolve_default_lr
from hasten.tune import rules


def test_an_unset_lr_is_hastens_tuned_one_on_its_resnet_and_the_suites_on_any_other_model():
    recipe, notes = resolve_default_lr(Recipe(), model_given=False)
    assert recipe.optim.lr == rules.OWN_MODEL_LR == 0.002 and "hasten's ResNet" in notes[0]
    recipe, notes = resolve_default_lr(Recipe(), model_given=True)
    assert recipe.optim.lr == rules.USER_MODEL_LR and "given to hasten.train" in notes[0]
    imported = load_recipe(None, ["model.name=import", "model.target=examples.models.mlp:MLP"])
    recipe, notes = resolve_default_lr(imported, model_given=False)
    assert recipe.optim.lr == rules.USER_MODEL_LR and "model.target=examples.models.mlp:MLP" in notes[0]
    layers = load_recipe(None, ["model.name=sequential", "model.layers=[{conv: 8}, {pool: avg}]"])
    assert resolve_default_lr(layers, model_given=False)[0].optim.lr == rules.USER_MODEL_LR
    muon = load_recipe(None, ["optim.name=muon"])
    assert resolve_default_lr(muon, model_given=False)[0].optim.lr == rules.OWN_MODEL_LR


def test_sgd_with_no_lr_runs_the_range_test_its_rule_was_measured_for_and_a_given_lr_is_kept():
    recipe, notes = resolve_default_lr(load_recipe(None, ["optim.name=sgd"]), model_given=True)
    assert recipe.optim.lr == "auto" and "range test" in notes[0]
    for given in ("0.01", "auto"):
        kept, notes = resolve_default_lr(load_recipe(None, [f"optim.lr={given}"]), model_given=True)
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
    assert recorded["optim"]["lr"] == rules.USER_MODEL_LR
    assert f"optim.lr unset -> {rules.USER_MODEL_LR:g} per 32" in capsys.readouterr().err
