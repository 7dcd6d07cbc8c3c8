"""Recipes: loading, overrides with types, every error reported at once naming its field."""

from __future__ import annotations

import pytest

from hasten.cli import main
from hasten.errors import RecipeError
from hasten.recipe.schema import Recipe, apply_overrides, load_recipe, parse_value, shipped_recipes, validate


def test_shipped_default_recipe_loads():
    recipe = load_recipe()
    assert recipe.name == "default" and recipe.train.batch_size == recipe.train.epochs == "auto"
    assert {"default", "fashion-fast"} <= set(shipped_recipes())


def test_the_schemas_defaults_are_the_default_recipe(tmp_path):
    """One home for each default: Recipe() is what `hasten train` runs (its run folder aside, named by the data),
    and a recipe file of the user's own without `extends` starts from the same values."""
    default = load_recipe().model_dump()
    assert default["run"].pop("dir") == "runs/fashion-mnist"
    bare = Recipe().model_dump()
    assert bare["run"].pop("dir") is None
    assert bare == default
    assert (bare["precision"], bare["optim"]["name"], bare["train"]["batch_size"]) == ("auto", "adamw", "auto")
    own = tmp_path / "mine.yaml"
    own.write_text("data: {name: digits}\n")
    mine = load_recipe(str(own)).model_dump()
    assert mine["name"] == "mine" and mine["data"]["name"] == "digits"
    assert {key: mine[key] for key in ("precision", "optim", "schedule", "train", "tricks", "model")} == {
        key: default[key] for key in ("precision", "optim", "schedule", "train", "tricks", "model")
    }


@pytest.mark.parametrize(
    "text, value",
    [("0.2", 0.2), ("1e-3", 1e-3), ("true", True), ("null", None), ("[1, 2]", [1, 2]), ("bf16", "bf16"), ("3", 3)],
)
def test_parse_value_types(text, value):
    assert parse_value(text) == value
    assert type(parse_value(text)) is type(value)


def test_overrides_reach_nested_fields():
    recipe = load_recipe("fashion-fast", ["optim.lr=0.05", "train.batch_size=64", "data.augment.flip=false"])
    assert recipe.optim.lr == 0.05 and recipe.train.batch_size == 64 and recipe.data.augment.flip is False


def test_override_without_equals_is_named():
    with pytest.raises(RecipeError, match="optim.lr"):
        apply_overrides({}, ["optim.lr"])


def test_a_folder_after_a_recipe_is_named_with_the_keys_that_read_it(tmp_path):
    with pytest.raises(RecipeError, match=f"data.name=imagefolder data.root={tmp_path}"):
        apply_overrides({}, [str(tmp_path)])
    with pytest.raises(RecipeError) as raised:
        apply_overrides({}, ["optim.lr"])
    assert "imagefolder" not in str(raised.value)


def test_override_into_a_value_is_named():
    with pytest.raises(RecipeError, match="seed is a value"):
        apply_overrides({"seed": 1}, ["seed.x=2"])


def test_all_errors_at_once_each_naming_its_field():
    with pytest.raises(RecipeError) as info:
        validate({"optim": {"lr": -1, "lrr": 0.1}, "train": {"batch_size": 0, "epochs": "many"}, "precision": "fp8"})
    message = str(info.value)
    for field in ("optim.lr", "optim.lrr: unknown key", "train.batch_size", "train.epochs", "precision"):
        assert field in message
    assert "5 problem(s)" in message
    # a value no member of `int >= 1 | auto` takes is one problem, saying what each member takes
    assert message.count("train.epochs") == 1 and "train.epochs: 'many': should be a valid integer" in message
    assert "train.batch_size: 0: should be greater than or equal to 1, or auto" in message


def test_cli_reports_unknown_key_wrong_type_negative_lr_with_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("optim:\n  lr: -0.1\n  colour: red\ntrain:\n  epochs: lots\n")
    assert main(["train", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "optim.colour: unknown key" in err
    assert "train.epochs" in err and "lots" in err
    assert "optim.lr" in err and "greater than 0" in err


def test_missing_recipe_file_and_unknown_name(tmp_path):
    with pytest.raises(RecipeError, match="not found"):
        load_recipe(str(tmp_path / "nope.yaml"))
    with pytest.raises(RecipeError, match="unknown recipe 'nope'.*fashion-fast"):
        load_recipe("nope")


def test_extends_lays_keys_over_the_parent(tmp_path):
    child = tmp_path / "child.yaml"
    child.write_text("extends: fashion-fast\ntrain:\n  epochs: 1\n")
    recipe = load_recipe(str(child))
    assert recipe.name == "child" and recipe.train.epochs == 1
    assert recipe.train.batch_size == load_recipe("fashion-fast").train.batch_size


def test_invalid_yaml_names_the_file(tmp_path):
    bad = tmp_path / "broken.yaml"
    bad.write_text("optim: [1, 2\n")
    with pytest.raises(RecipeError, match="broken.yaml: not valid YAML"):
        load_recipe(str(bad))


def test_sequential_model_needs_layers():
    with pytest.raises(RecipeError, match="model.layers"):
        validate({"model": {"name": "sequential"}})


def test_every_shipped_recipe_validates_under_its_own_name():
    from hasten.recipe.gan import load_gan_recipe

    names = shipped_recipes()
    assert {"fashion-fast", "fashion-sprint", "fashion-94"} <= set(names)
    for name in names:
        recipe = load_gan_recipe(name) if name.startswith("dcgan") else load_recipe(name)
        assert recipe.name == name


def test_hasten_gan_refuses_the_default_recipe_and_recipes_that_extend_it(tmp_path, capsys):
    """The default recipe's file holds only its name (its values are the schema's defaults), which a GAN recipe
    would accept too: hasten gan says it is a classifier's recipe instead of training a GAN on Fashion-MNIST."""
    mine = tmp_path / "mine.yaml"
    mine.write_text("extends: default\ntrain: {epochs: 3}\n")
    for source in ("default", str(mine)):
        assert main(["gan", source, "data.name=synthetic", f"run.dir={tmp_path / 'run'}"]) == 2
        err = capsys.readouterr().err
        assert "is a classifier's recipe, for hasten train" in err and "extends" in err, err
    assert not (tmp_path / "run").exists()
