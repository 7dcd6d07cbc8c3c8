"""Every command on every shipped recipe and on an image folder with the default recipe, at the scale of the tiny
recipe (tests/tiny.py): each cell ends in exit 0 with what the command makes (a file, a line), or in exit 2 with one
error saying why the command does not apply, never a traceback. Recipes run as `hasten train` would resolve them
(`auto` decided), for one epoch; the commands that read a run (evaluate, predict, export) read one trained once per
module (`runs`), whose training is also the `train` cell (the `gan` cell for the GAN recipe). All in this process,
through `hasten.cli.main`, as the commands' options allow (bench, sweep and transfer: --in-process)."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from hasten.cli import main
from hasten.data.makefolder import make_folder
from hasten.recipe.schema import shipped_recipes
from tests.tiny import TINY_GAN_OVERRIDES, TINY_OVERRIDES

# the tiny data and model, with the default recipe's `auto` left in place for the keys the commands must resolve
AUTO = [o for o in TINY_OVERRIDES if not o.startswith(("precision=", "train.channels_last=", "train.batch_size=",
                                                           "train.epochs=", "train.eval_batch_size="))]  # fmt: skip
GAN = "dcgan-fashion"
FOLDER = "folder"  # the default recipe on an image folder, as a new user runs it: `hasten train photos/`
CLASSIFIERS = sorted(name for name in shipped_recipes() if name != GAN)
COLUMNS = [*shipped_recipes(), FOLDER]
TRAINING = ("train", "bench", "sweep", "transfer")  # the commands that train: one epoch each
RUN_READERS = ("evaluate", "predict", "export")  # the commands that read a trained run
COMMANDS = ["train", "schedule", "lr-find", "batch-size", "bench", "sweep", "transfer", "gan", *RUN_READERS]

# transfer-digits' pretraining and fine-tuning sizes at the tiny scale (tests/models/test_transfer.py)
TINY_TRANSFER = [
    "transfer.pretrain=[data.name=synthetic, data.synthetic_size=64, data.subset=null, train.epochs=1]",
    "transfer.per_class=[3]",
]

NO_PRETRAINING = "the recipe names no model.pretrained weights and no transfer.pretrain run"

# the cells where the command does not apply, and what their error must say
REFUSED = {
    # the GAN recipe's keys (model.latent, quality, run.grid) are not a classifier's: it is named for what it is
    **{
        (command, GAN): "is a GAN recipe (it has model.latent, quality), for hasten gan"
        for command in (*TRAINING, "schedule", "lr-find", "batch-size")
    },
    # only transfer-digits names a pretraining run (transfer.pretrain) or weights (model.pretrained)
    **{("transfer", column): NO_PRETRAINING for column in [*CLASSIFIERS, FOLDER] if column != "transfer-digits"},
    **{("gan", recipe): f"'{recipe}' is a classifier's recipe, for hasten train" for recipe in CLASSIFIERS},
    ("gan", FOLDER): "is a folder: hasten gan trains on a dataset of the registry",
    # a GAN run holds a generator and a discriminator, no classifier to evaluate, predict with or export
    **{(command, GAN): "is a `hasten gan` checkpoint" for command in RUN_READERS},
}


@dataclass
class Result:
    code: int
    out: str
    err: str


def hasten(*argv: str) -> Result:
    """`hasten ARGV` in this process, its stdout and stderr captured (also inside a module-scoped fixture); what main
    raises, a traceback, fails the cell."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return Result(code, out.getvalue(), err.getvalue())


def recipe_args(command: str, column: str, folder: Path) -> list[str]:
    """RECIPE and overrides of `command` in `column`: the tiny recipe for one epoch; the folder's own `auto` epochs
    where the command does not train (schedule, lr-find and batch-size show the run a new user would get)."""
    epochs = ["train.epochs=1"] if command in TRAINING else []
    if column == FOLDER:  # everything else `auto`, as a new user runs it
        return [str(folder), "run.progress=false", *epochs]
    if column == GAN:  # as a user types it: the GAN recipe's own tiny scale only where it is the GAN's command
        return [GAN, *TINY_GAN_OVERRIDES] if command == "gan" else [GAN]
    if command == "gan":
        return [column]
    return [column, *AUTO, "train.epochs=1"]


class Runs:
    """Each column's run, made on first use and kept for the module: `hasten train` (`hasten gan` for the GAN
    recipe), which is that column's train (gan) cell and what its evaluate, predict and export cells read."""

    def __init__(self, root: Path, folder: Path):
        self.root, self.folder, self.made = root, folder, {}

    def of(self, column: str) -> tuple[Result, Path]:
        if column not in self.made:
            command, run = "gan" if column == GAN else "train", self.root / column
            self.made[column] = hasten(command, *recipe_args(command, column, self.folder), f"run.dir={run}"), run
        return self.made[column]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    photos = tmp_path_factory.mktemp("data") / "photos"
    make_folder("synthetic", photos, limit=60, size=20)
    return photos


@pytest.fixture(scope="module")
def runs(tmp_path_factory, folder) -> Runs:
    return Runs(tmp_path_factory.mktemp("runs"), folder)


def measure_briefly(monkeypatch) -> None:
    """bench, sweep and transfer time each run's bare training step (23 steps at the recipe's batch, 8 s of a
    fashion-* cell) and bench the matmul peak of each precision (1 s each): the same measurements, made shorter."""
    from hasten.experiments import bench

    real_peak, real_bare = bench.matmul_peak, bench.bare_step_images_per_second
    monkeypatch.setattr(bench, "matmul_peak", lambda dtype, device, size=None, min_seconds=1.0: real_peak(
        dtype, device, 128, 0.02))  # fmt: skip
    monkeypatch.setattr(bench, "bare_step_images_per_second", lambda recipe, steps=20, warmup=3: real_bare(
        recipe, 2, 1))  # fmt: skip


def run_cell(command: str, column: str, runs: Runs, folder: Path, out: Path) -> tuple[Result, Path]:
    """The cell's result, and the folder where what it made is (its run folder, or --out); predict's: the run's."""
    if command in RUN_READERS or (command == "train" and column != GAN) or (command == "gan" and column == GAN):
        made, run = runs.of(column)
        if command in ("train", "gan"):
            return made, run
        assert made.code == 0, f"the run {command} reads did not train: {made.err[-2000:]}"
        argv = {
            "evaluate": [str(run), "--out", str(out)],
            "predict": [str(run), str(folder / "val"), "--json"],
            "export": [str(run), str(out / "model.onnx")],
        }[command]
        return hasten(command, *argv), run if command == "predict" else out  # predict writes nothing
    options = {
        "train": [],
        "schedule": [],
        "lr-find": ["--steps", "6"],
        "batch-size": ["--memory-budget", "256MiB"],
        "bench": ["--in-process", "--repeats", "1", "--no-warmup", "--naive-epochs", "1", "--out", str(out)],
        "sweep": ["--in-process", "--out", str(out)],
        "transfer": ["--in-process", "--out", str(out)],
        "gan": [],
    }[command]
    if command == "sweep":  # double-descent's own grid (sweep.vary), made small; the others' on the command line
        options += ["sweep.vary=['model.width=1,2']"] if column == "double-descent" else ["--vary", "seed=0,1"]
    if command == "transfer" and column == "transfer-digits":
        options += TINY_TRANSFER
    run = out / "run"
    result = hasten(command, *recipe_args(command, column, folder), *options, f"run.dir={run}")
    return result, out if command in ("bench", "sweep", "transfer") else run


def plotted(result: Result) -> Path:
    """The picture a command's `plot: PATH` line names, checked to be there."""
    (line,) = [line for line in result.out.splitlines() if line.startswith("plot: ")]
    path = Path(line.removeprefix("plot: "))
    assert path.stat().st_size > 0
    return path


def trained(result: Result, run: Path, column: str) -> None:
    summary = json.loads((run / "summary.json").read_text())
    assert summary["epochs"] == 1 and 0 <= summary["test_accuracy"] <= 1
    assert json.loads(result.out)["test_accuracy"] == summary["test_accuracy"]  # run.progress=false: JSON
    assert len((run / "metrics.csv").read_text().splitlines()) == 2  # the header and the one epoch
    assert list((run / "checkpoints").glob("step-*.pt"))


def scheduled(result: Result, run: Path, column: str) -> None:
    assert "optimizer steps" in result.out and "LR: peak" in result.out
    assert plotted(result) == run / "schedule.png"


def lr_found(result: Result, run: Path, column: str) -> None:
    assert "suggested LR" in result.out and "to use it: optim.lr=" in result.out
    assert plotted(result) == run / "lr-find.png"


def batch_found(result: Result, run: Path, column: str) -> None:
    assert "largest batch that fits in 256.0 MiB" in result.err.replace("\n", "")
    assert result.out.splitlines()[-1].startswith("train.batch_size=")  # the overrides alone, for scripts


def variants_ran(out: Path, count: int) -> list[dict]:
    """results.json's variants, each of whose `count` runs finished (a failed run is recorded, not raised)."""
    variants = json.loads((out / "results.json").read_text())["variants"]
    assert len(variants) == count
    assert all(run.get("summary") and "error" not in run for v in variants for run in v["runs"]), variants
    return variants


def benched(result: Result, out: Path, column: str) -> None:
    names = [v["name"] for v in variants_ran(out, 1 if column == FOLDER else 2)]
    if column != FOLDER:  # the naive loop runs beside datasets held in memory, not image folders
        assert names[0] == "naive"
    assert (out / "report.md").is_file() and f"| {names[-1]} |" in result.out


def swept(result: Result, out: Path, column: str) -> None:
    grid = ["model.width=1", "model.width=2"] if column == "double-descent" else ["seed=0", "seed=1"]
    assert [v["overrides"] for v in variants_ran(out, 2)] == [[point] for point in grid]
    table = (out / "sweep.md").read_text()
    assert "failed" not in table and table in result.out and (out / "test_error_vs_epoch.png").is_file()


def transferred(result: Result, out: Path, column: str) -> None:
    names = [v["name"] for v in variants_ran(out, 2)]
    assert names == ["per_class=3 scratch seed=0", "per_class=3 pretrained seed=0"]
    table = (out / "transfer.md").read_text()
    assert "| 3 | 30 |" in table and "failed" not in table and (out / "transfer.png").is_file()


def gan_trained(result: Result, run: Path, column: str) -> None:
    summary = json.loads((run / "summary.json").read_text())
    assert summary["epochs"] == 1 and json.loads(result.out)["steps"] == summary["steps"] > 0
    assert (run / "samples" / "epoch-001.png").stat().st_size > 0


def evaluated(result: Result, out: Path, column: str) -> None:
    evaluation = json.loads((out / "evaluation.json").read_text())
    run = Path(evaluation["source"]).parents[1]  # the run folder's newest checkpoint: RUN/checkpoints/step-N.pt
    recorded = json.loads((run / "summary.json").read_text())["test_accuracy"]
    assert evaluation["accuracy"] == evaluation["recorded_test_accuracy"] == recorded  # the run's own test data
    assert f"accuracy {recorded!r} (summary.json: {recorded!r})" in result.out and (out / "confusion.csv").is_file()


def predicted(result: Result, run: Path, column: str) -> None:
    predictions = json.loads(result.out)
    classes = json.loads((run / "summary.json").read_text())["classes"]
    assert len(predictions) == 60  # every image of the folder's val/ (make_folder's limit)
    assert all(0 < p["probability"] <= 1 and p["class"] == p["top"][0]["class"] in classes for p in predictions)


def exported(result: Result, out: Path, column: str) -> None:
    model = out / "model.onnx"
    assert model.stat().st_size > 0 and result.out.startswith(f"{model} (onnxruntime matches PyTorch")


PRODUCED: dict[str, Callable[[Result, Path, str], None]] = {
    "train": trained,
    "schedule": scheduled,
    "lr-find": lr_found,
    "batch-size": batch_found,
    "bench": benched,
    "sweep": swept,
    "transfer": transferred,
    "gan": gan_trained,
    "evaluate": evaluated,
    "predict": predicted,
    "export": exported,
}


@pytest.mark.parametrize("column", COLUMNS)
@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_on_every_shipped_recipe_and_a_folder(command, column, runs, folder, tmp_path, monkeypatch):
    measure_briefly(monkeypatch)
    result, where = run_cell(command, column, runs, folder, tmp_path)
    assert "Traceback" not in result.out + result.err
    refused = REFUSED.get((command, column))
    if refused is None:
        assert result.code == 0, result.err[-3000:]
        PRODUCED[command](result, where, column)
    else:
        assert result.code == 2, result.err[-3000:]
        errors = [line for line in result.err.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and refused in result.err and not result.out, result.err  # refused before any work


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


def test_schedule_says_when_train_epochs_auto_may_lengthen_or_shorten_the_run(tmp_path, capsys):
    """With train.epochs=auto and the default's held peak, `hasten schedule` says what `hasten train` may do during
    the hold (hasten/run/extension.py): ending it early only with train.end_early=true; with given epochs it says
    nothing of it."""
    fixed = ["precision=fp32", "train.channels_last=false", "train.batch_size=32"]
    assert main(["schedule", *AUTO, *fixed, f"run.dir={tmp_path / 'auto'}"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    # 384 synthetic images at batch 32: 12 steps an epoch; 600 steps for hasten's batch-norm ResNet: 50 epochs
    said = "still at chance after epoch 25, or first left it at epoch 14 or later, goes on at the peak LR to 100 epochs"
    assert f"{said} (once)" in out, out
    assert "ends the LR's hold" not in out  # train.end_early is asked for
    assert main(["schedule", *AUTO, *fixed, "train.end_early=true", f"run.dir={tmp_path / 'early'}"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "99% or more for 3 epochs in a row before epoch 25 ends the LR's hold there" in out, out
    assert main(["schedule", *AUTO, *fixed, "train.epochs=4", f"run.dir={tmp_path / 'given'}"]) == 0
    assert "at chance" not in capsys.readouterr().out
