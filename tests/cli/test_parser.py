"""The command line's shape (hasten/cli/parser.py): every command declared once is listed, parsed and helped; what a
user mistypes (a command, an option, a recipe name, a recipe key, a folder) is answered with the closest name, exit 2
and no traceback; `hasten train --help` says what RECIPE may be; a stopped run says the command that resumes it.
Nothing here trains: each case ends before a model is built."""

from __future__ import annotations

import pytest

import hasten.experiments.gan
import hasten.run.build
from hasten.cli import main
from hasten.cli.parser import COMMANDS
from hasten.errors import HastenError
from hasten.progress import WIDTH
from hasten.recipe.schema import shipped_recipes


def help_of(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 0
    return capsys.readouterr().out


def test_every_command_is_listed_with_its_summary_and_has_its_own_help(capsys):
    listing = " ".join(help_of(["--help"], capsys).split())  # unwrapped
    assert [c.name for c in COMMANDS] == list(dict.fromkeys(c.name for c in COMMANDS))  # each declared once
    for command in COMMANDS:
        assert f"{command.name} {command.summary}" in listing, command.name
        text = help_of([command.name, "--help"], capsys)
        assert text.startswith(f"usage: hasten {command.name} ["), text[:200]
        assert " ".join(command.description.split()[:6]) in " ".join(text.split())


def test_train_help_lists_the_shipped_recipes_the_folder_form_and_resume_auto(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    text = help_of(["train", "--help"], capsys)
    for name in shipped_recipes():
        assert name in text.split("shipped recipes", 1)[1], name
    assert "hasten gan dcgan-fashion" in text  # the GAN's recipe, named with the command that takes it
    assert "hasten train path/to/folder" in text and "train/<class>/" in text and "val/<class>/" in text
    assert "hasten train fashion-fast resume=auto" in text and "interrupted run" in text
    assert max(len(line) for line in text.splitlines()) <= WIDTH


def test_the_listing_fits_the_terminal_and_wraps_under_the_summaries(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    text = help_of(["--help"], capsys)
    assert max(len(line) for line in text.splitlines()) <= WIDTH
    listing = text.split("commands:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    column = listing[0].index(COMMANDS[0].summary)
    names = {command.name for command in COMMANDS}
    wrapped = [line for line in listing if line.split()[0] not in names]
    assert wrapped and all(line.startswith(" " * column) and line[column] != " " for line in wrapped), listing


def test_help_formats_a_listing_without_breaking_names(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "50")  # narrow: the listing wraps, never inside a recipe's name
    text = help_of(["train", "--help"], capsys)
    recipes = text.split("shipped recipes", 1)[1].split("\n\n", 1)[0]
    assert all(name in recipes for name in shipped_recipes())


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["trian"], "unknown command 'trian'; did you mean 'hasten train'?"),
        (["bench", "--vray", "model.width=2,4"], "unknown option '--vray' of 'hasten bench'; did you mean --vary?"),
        (["train", "--devcies=2"], "unknown option '--devcies' of 'hasten train'; did you mean --devices?"),
        (["train", "--zzz"], "its options: -h, --help, --devices, --max-restarts"),
        (["--devices", "2", "train"], "unknown option '--devices' before the command"),
        (["train", "fashion-fats"], "did you mean fashion-fast?"),
        (["gan", "dcgan-fashon"], "did you mean dcgan-fashion?"),
        (["train", "fashion-fast", "optim.lrr=0.1"], "optim.lrr: unknown key (did you mean optim.lr?)"),
        (["schedule", "train.epoch=2"], "train.epoch: unknown key (did you mean train.epochs?)"),
        (["train", "phtos/"], "no such folder either: did you mean photos/?"),
        (["train", "phtos"], "did you mean the folder photos/?"),
    ],
)
def test_a_mistyped_name_gets_the_closest_one(argv, expected, tmp_path, monkeypatch, capsys):
    (tmp_path / "photos").mkdir()
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.replace("\n", " ")
    assert expected in err and "Traceback" not in err, err


def test_a_stray_word_is_argparse_s_usage_error(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["data", "info", "mnist", "out", "extra"])
    assert stop.value.code == 2
    assert "hasten data: error: unrecognized arguments: extra" in capsys.readouterr().err


def test_bare_hasten_shows_the_listing_and_what_to_type(capsys):
    assert main([]) == 2
    err = capsys.readouterr().err
    assert all(command.name in err for command in COMMANDS) and "give a COMMAND" in err


class Stopped(HastenError):
    resumable = True
    exit_code = 130


@pytest.mark.parametrize("command", ["train", "gan"])
def test_a_stopped_run_names_the_command_that_resumes_it(command, monkeypatch, tmp_path, capsys):
    def stopped(*args, **kwargs):
        raise Stopped("stopped by SIGINT at a step boundary")

    monkeypatch.setattr(hasten.run.build, "train", stopped)
    monkeypatch.setattr(hasten.experiments.gan, "train_gan", stopped)
    argv = [command, f"run.dir={tmp_path / 'run'}", "resume=never", "run.overwrite=true"]
    assert main(argv) == 130
    err = " ".join(capsys.readouterr().err.split())
    assert f"stopped: stopped by SIGINT at a step boundary; resume with: hasten {command} run.dir=" in err
    assert err.endswith("resume=auto") and "resume=never" not in err and "overwrite" not in err
