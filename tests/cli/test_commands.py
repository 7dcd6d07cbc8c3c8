"""Every command that takes a recipe, on every shipped recipe and on a folder with the default recipe: it runs
the recipe as `hasten train` would resolve it (`auto` decided) and ends in exit 0, or exit 2 with a message,
never a traceback."""

from __future__ import annotations

import pytest

from hasten.cli import main
from hasten.data.makefolder import make_folder
from hasten.recipe.schema import shipped_recipes
from tests.tiny import TINY_OVERRIDES

# the tiny data and model, with the default recipe's `auto` left in place for the keys the commands must resolve
AUTO = [o for o in TINY_OVERRIDES if not o.startswith(("precision=", "train.channels_last=", "train.batch_size=",
                                                           "train.epochs=", "train.eval_batch_size="))]  # fmt: skip
COMMANDS = {
    "schedule": [],
    "lr-find": ["--steps", "6"],
    "batch-size": ["--memory-budget", "256MiB"],
}
CLASSIFIERS = sorted(name for name in shipped_recipes() if name != "dcgan-fashion")


@pytest.mark.parametrize("recipe", CLASSIFIERS)
@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_runs_every_shipped_recipe(command, recipe, tmp_path, capsys):
    code = main([command, recipe, *COMMANDS[command], *AUTO, "train.epochs=1", f"run.dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert code == 0, err[-2000:]


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_runs_the_default_recipe_on_a_folder(command, tmp_path, capsys):
    """The default recipe as a new user runs it: batch, epochs, precision and layout all `auto`."""
    folder = tmp_path / "photos"
    make_folder("synthetic", folder, limit=60, size=20)
    code = main([command, str(folder), *COMMANDS[command], "run.progress=false", f"run.dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert code == 0, err[-2000:]


@pytest.mark.parametrize("command", list(COMMANDS))
def test_the_gan_recipe_is_refused_by_the_classifier_commands(command, tmp_path, capsys):
    code = main([command, "dcgan-fashion", *COMMANDS[command], f"run.dir={tmp_path / 'run'}"])
    assert code == 2 and "Traceback" not in capsys.readouterr().err


def test_a_mistyped_command_recipe_or_folder_gets_the_closest_name(tmp_path, monkeypatch, capsys):
    (tmp_path / "photos").mkdir()
    monkeypatch.chdir(tmp_path)
    cases = {
        ("trian",): "unknown command 'trian'; did you mean 'hasten train'?",
        ("train", "fashion-fats"): "did you mean fashion-fast?",
        ("train", "phtos/"): "no such folder either: did you mean photos/?",
        ("schedule", "./nowhere-near"): "no such folder either",
    }
    for argv, expected in cases.items():
        assert main(list(argv)) == 2, argv
        err = capsys.readouterr().err.replace("\n", " ")
        assert expected in err and "Traceback" not in err, (argv, err)


def test_lr_find_refuses_a_sweep_no_one_means_before_building_anything(capsys):
    assert main(["lr-find", "--steps", "1000000000000"]) == 2  # (no list of a trillion LRs is made first)
    err = capsys.readouterr().err
    assert "--steps from 5 to 10,000" in err and "run folder" not in err  # refused before the run is built


def test_schedule_reports_the_rise_the_run_takes(tmp_path, capsys):
    """The default recipe's one-cycle starts at its peak, and its LR rises over schedule.min_warmup_steps (auto: a
    step a class, at least 10): what `hasten schedule` calls the warmup is that rise."""
    assert main(["schedule", *AUTO, "train.epochs=2", f"run.dir={tmp_path / 'run'}"]) == 0
    out = capsys.readouterr().out
    assert "warmup 10" in out and "first step 0," in out
