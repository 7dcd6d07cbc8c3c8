"""Write only what is the run's own: hasten never writes over a user's file that it did not write (recognised by
its contents, not its name), nor through a symbolic link out of a run folder, nor prunes a file it did not save."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from torch import nn

from hasten.cli import main
from hasten.runfolder.checkpoint import checkpoints_in
from tests.tiny import tiny_recipe


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("writes") / "run"
    assert main(["train", *tiny_recipe(folder, "train.epochs=1", "run.tensorboard=false")]) == 0
    return folder


def _refused(argv: list[str], capsys, *needles: str) -> str:
    assert main(argv) == 2, argv
    err = capsys.readouterr().err
    assert "Traceback" not in err and all(needle in err for needle in needles), err
    return err


def test_evaluate_out_keeps_a_users_own_evaluation_files(run, tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "evaluation.json").write_text('{"my": "notes"}\n')
    (mine / "confusion.csv").write_text("mine\n")
    _refused(["evaluate", str(run), "--out", str(mine)], capsys, "no evaluation wrote")
    assert (mine / "evaluation.json").read_text() == '{"my": "notes"}\n' and (
        mine / "confusion.csv"
    ).read_text() == "mine\n"
    ours = tmp_path / "ours"
    assert main(["evaluate", str(run), "--out", str(ours)]) == 0
    assert main(["evaluate", str(run), "--out", str(ours)]) == 0  # its own earlier results it replaces
    assert json.loads((ours / "evaluation.json").read_text())["run_setting"]


def test_evaluate_out_refuses_a_run_folder_and_links(run, tmp_path, capsys):
    other = tmp_path / "other"
    assert main(["train", *tiny_recipe(other, "train.epochs=1", "run.tensorboard=false")]) == 0
    capsys.readouterr()
    before = sorted(p.name for p in other.iterdir())
    _refused(["evaluate", str(run), "--out", str(other)], capsys, "is a run folder")
    assert sorted(p.name for p in other.iterdir()) == before
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "confusion.csv").write_text("precious\n")
    link = tmp_path / "link"
    link.symlink_to(elsewhere)
    _refused(["evaluate", str(run), "--out", str(link)], capsys, "symbolic link")
    assert (elsewhere / "confusion.csv").read_text() == "precious\n"


def test_a_run_folder_whose_files_are_links_out_of_it_is_refused(tiny_overrides, tmp_path, capsys):
    folder = tmp_path / "run"
    assert main(["train", *tiny_overrides, f"run.dir={folder}", "train.epochs=1", "run.tensorboard=false"]) == 0
    capsys.readouterr()
    outside = tmp_path / "outside.csv"
    outside.write_text("a user's table\n")
    (folder / "metrics.csv").unlink()
    (folder / "metrics.csv").symlink_to(outside)
    resume = ["train", *tiny_overrides, f"run.dir={folder}", "train.epochs=2", "run.tensorboard=false", "resume=auto"]
    _refused(resume, capsys, "metrics.csv", "symbolic link")
    assert outside.read_text() == "a user's table\n"
    # the checkpoints folder a link elsewhere: nothing there is pruned or written
    (folder / "metrics.csv").unlink()
    store = tmp_path / "store"
    os.rename(folder / "checkpoints", store)
    (store / "step-1.pt").write_text("a user's file\n")
    (folder / "checkpoints").symlink_to(store)
    fresh = ["train", *tiny_overrides, f"run.dir={folder}", "train.epochs=2", "run.overwrite=true"]
    _refused(fresh, capsys, "checkpoints", "symbolic link")
    assert (store / "step-1.pt").read_text() == "a user's file\n"


def test_pruning_deletes_only_checkpoints_hasten_saved(tiny_overrides, tmp_path):
    folder = tmp_path / "run"
    base = [*tiny_overrides, f"run.dir={folder}", "run.tensorboard=false", "run.keep=1"]
    assert main(["train", *base, "train.epochs=1"]) == 0
    mine = folder / "checkpoints" / "step-1.pt"  # named like a checkpoint, older than any: first in line to prune
    mine.write_text("a user's file\n")
    assert main(["train", *base, "train.epochs=3", "resume=auto"]) == 0
    assert mine.read_text() == "a user's file\n"
    saved = [p for p in checkpoints_in(folder / "checkpoints") if p != mine]
    assert len(saved) <= 2  # the newest and the best: the run's own are still pruned


def test_plot_replaces_a_plot_it_drew_never_another_file(tiny_overrides, tmp_path, capsys):
    fake = tmp_path / "fake.png"
    fake.write_text("not a picture: a user's notes\n")
    schedule = ["schedule", *tiny_overrides, f"run.dir={tmp_path / 'run'}"]
    _refused([*schedule, "--plot", str(fake)], capsys, "fake.png", "not a plot")
    assert fake.read_text() == "not a picture: a user's notes\n"
    drawn = tmp_path / "drawn.png"
    assert main([*schedule, "--plot", str(drawn)]) == 0
    assert main([*schedule, "--plot", str(drawn)]) == 0  # a plot drawn before is replaced


def test_plot_named_without_a_suffix_is_checked_as_the_png_it_writes(tiny_overrides, tmp_path, capsys):
    """`--plot mine` draws mine.png (matplotlib adds the suffix): a user's mine.png is what must be kept, and the
    path printed is the file written; a format whose files hasten cannot recognise, or a folder, is refused."""
    mine = tmp_path / "mine.png"
    mine.write_bytes(b"\x89PNG a user's own picture")
    schedule = ["schedule", *tiny_overrides, f"run.dir={tmp_path / 'run'}"]
    _refused([*schedule, "--plot", str(tmp_path / "mine")], capsys, "mine.png", "not a plot")
    assert mine.read_bytes() == b"\x89PNG a user's own picture"
    assert main([*schedule, "--plot", str(tmp_path / "out")]) == 0
    assert f"plot: {tmp_path / 'out.png'}" in capsys.readouterr().out and (tmp_path / "out.png").is_file()
    assert not (tmp_path / "out").exists()
    _refused([*schedule, "--plot", str(tmp_path / "out.jpg")], capsys, "out.jpg", ".png, .pdf, .svg")
    _refused([*schedule, "--plot", str(tmp_path)], capsys, "is a folder", "schedule.png")


def test_class_names_that_look_like_markup_print_as_they_are(tmp_path, capsys):
    """Names from files are text, never terminal markup: class folders named like rich's tags ([red]a, [bold]b)
    print as they are in predict's and evaluate's tables (they were read as styles and vanished; a name holding a
    closing tag, as a file name can, was a MarkupError traceback)."""
    import numpy as np
    from PIL import Image

    root = tmp_path / "marked"
    rng = np.random.default_rng(0)
    for split, count in (("train", 24), ("val", 8)):
        for index, name in enumerate(("[red]a", "[bold]b")):
            (root / split / name).mkdir(parents=True)
            for i in range(count):
                pixels = rng.integers(0, 90, (12, 12), dtype=np.uint8) + 150 * index
                Image.fromarray(pixels.astype(np.uint8)).save(root / split / name / f"{i}.png")
    run = tmp_path / "run"
    assert main(["train", str(root), f"run.dir={run}", "train.epochs=1", "train.batch_size=16", "precision=fp32",
                 "train.channels_last=false", "run.progress=false", "run.tensorboard=false"]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["predict", str(run), str(root / "val" / "[bold]b" / "0.png")]) == 0
    out = capsys.readouterr().out
    assert "Traceback" not in out and ("│ [red]a " in out or "│ [bold]b " in out), out
    assert main(["evaluate", str(run), "--out", str(tmp_path / "ev")]) == 0
    out = capsys.readouterr().out
    assert "[red]a" in out and "[bold]b" in out


def test_a_run_that_fails_before_its_first_checkpoint_leaves_the_folder_as_it_was(tiny_overrides, tmp_path):
    """A fresh run that ends in an error at its first step (here a loss that is not one number) removes what it
    wrote, so the same command runs again without run.overwrite; a folder that held a checkpoint is kept whole."""
    import hasten
    from hasten.errors import HastenError

    folder = tmp_path / "run"
    overrides = [*tiny_overrides, f"run.dir={folder}", "train.epochs=1", "run.tensorboard=true"]
    with pytest.raises(HastenError, match="one number"):
        hasten.train(None, overrides, loss=lambda logits, targets: (logits - targets).pow(2).sum(1))
    assert not folder.exists() or sorted(p.name for p in folder.iterdir()) == []
    assert hasten.train(None, overrides)["epochs"] == 1  # the same command again, no run.overwrite needed
    kept = sorted(p.name for p in folder.iterdir())
    with pytest.raises(HastenError, match="one number"):  # resumed: its checkpoint and files stay
        hasten.train(None, [*overrides, "train.epochs=2", "resume=auto"], loss=lambda lo, ta: (lo - ta).sum(1))
    assert {"checkpoints", "recipe.yaml", "metrics.csv"} <= set(kept) <= {p.name for p in folder.iterdir()}


class FailsInTraining(nn.Module):
    """A user's model whose forward fails only in training mode: the start-up check (evaluation mode) passes."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.head = nn.Sequential(nn.Flatten(), nn.LazyLinear(num_classes))

    def forward(self, x):
        if self.training:
            raise ValueError("dropout mask has the wrong shape")
        return self.head(x)


def test_a_users_model_that_fails_in_training_is_reported_as_theirs(tiny_overrides, tmp_path, capsys):
    import hasten
    from hasten.errors import RecipeError

    folder = tmp_path / "run"
    with pytest.raises(RecipeError, match="training your model raised ValueError: dropout mask") as raised:
        hasten.train(None, [*tiny_overrides, f"run.dir={folder}", "train.epochs=1"], model=FailsInTraining)
    assert "test_writes.py" in str(raised.value) and "in forward" in str(raised.value)  # where in their code
    assert not folder.exists() or list(folder.iterdir()) == []  # and the folder as it was


def test_resume_auto_starts_afresh_where_a_killed_run_saved_no_checkpoint(tiny_overrides, tmp_path, capsys):
    """A run killed outright (SIGKILL, the OOM killer) before its first checkpoint leaves its recipe.yaml and
    metrics.csv: resume=auto starts afresh there, moving them aside (never deleted); a finished run's folder is
    still refused."""
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "recipe.yaml").write_text("name: default\n")
    (folder / "metrics.csv").write_text("epoch,step\n")
    resume = ["train", *tiny_overrides, f"run.dir={folder}", "train.epochs=1", "resume=auto"]
    assert main(resume) == 0
    said = "".join(capsys.readouterr())
    assert "saved no checkpoint" in said and "starting afresh" in said
    (aside,) = folder.glob("replaced-*")
    assert (aside / "metrics.csv").read_text() == "epoch,step\n"  # kept, aside
    done = tmp_path / "done"
    done.mkdir()
    (done / "summary.json").write_text("{}\n")
    assert main(["train", *tiny_overrides, f"run.dir={done}", "resume=auto"]) == 2


def test_export_into_a_folder_is_refused_with_a_file_name_that_export_takes(run, tmp_path, capsys):
    """The example named a file without a suffix (dir.safetensors/model), which export then refused in turn."""
    folder = tmp_path / "dir.safetensors"
    folder.mkdir()
    err = _refused(["export", str(run), str(folder)], capsys, "is a folder")
    assert str(folder / "model.safetensors") in err
