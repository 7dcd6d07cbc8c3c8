"""`hasten train` end to end on small data: it learns, and it writes every file of the run folder."""

from __future__ import annotations

import csv
import json

import pytest
import torch
import yaml

import hasten
from hasten.cli import main
from hasten.recipe.schema import load_recipe
from hasten.run.build import build


@pytest.mark.numerics
def test_train_end_to_end_writes_the_run_folder(tiny_overrides, tmp_path, capsys):
    assert main(["train", "fashion-fast", *tiny_overrides]) == 0
    run = tmp_path / "run"
    summary = json.loads((run / "summary.json").read_text())
    keys = ("test_accuracy", "epochs", "wall_seconds", "images_per_second", "peak_memory_bytes", "time_to_accuracy")
    assert all(key in summary for key in keys)
    assert summary["epochs"] == 2
    assert summary["test_accuracy"] > 0.5  # 10 classes: chance is 0.1
    assert summary["peak_memory_bytes"] > 0 and summary["images_per_second"] > 0
    assert set(summary["time_to_accuracy"]) == {"0.90", "0.91", "0.92", "0.93", "0.94"}
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    assert [r["epoch"] for r in rows] == ["1", "2"]
    assert float(rows[-1]["test_accuracy"]) == pytest.approx(summary["test_accuracy"])
    saved = yaml.safe_load((run / "recipe.yaml").read_text())
    assert saved["data"]["name"] == "synthetic" and saved["train"]["epochs"] == 2
    assert (run / "recipe.yaml").read_text().startswith(f"# hasten {hasten.__version__}")
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    printed = json.loads(capsys.readouterr().out)  # run.progress=false prints the summary as JSON
    assert printed["test_accuracy"] == summary["test_accuracy"]


@pytest.mark.numerics
def test_sequential_recipe_from_layer_list(tiny_overrides, tmp_path):
    layers = "[{conv: 8}, relu, {maxpool: 2}, flatten, {dense: 32}, relu, {dense: classes}]"
    summary = hasten.train(
        None,
        [
            *tiny_overrides,
            "model.name=sequential",
            f"model.layers={layers}",
            "optim.name=adamw",
            "optim.lr=0.003",
            "precision=fp32",
        ],
    )
    assert summary["test_accuracy"] > 0.5


def test_same_seed_same_run_other_seed_other_run(tiny_overrides, tmp_path):
    def metrics(*extra: str) -> list[dict[str, str]]:
        folder = tmp_path / "-".join(extra)
        rerun = "run.overwrite=true"  # the same folder twice: the second run moves the first one's files aside
        hasten.train(None, [*tiny_overrides, "data.augment.flip=true", f"run.dir={folder}", rerun, *extra])
        return [
            {k: v for k, v in row.items() if "second" not in k}
            for row in csv.DictReader((folder / "metrics.csv").open())
        ]

    assert metrics("seed=1") == metrics("seed=1", "run.tensorboard=false")
    assert metrics("seed=1") != metrics("seed=2")


def test_build_is_deterministic_and_scales_lr_to_the_batch(tiny_overrides):
    first, second = (build(load_recipe("fashion-fast", tiny_overrides)) for _ in range(2))
    for a, b in zip(first.model.state_dict().values(), second.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    recipe = load_recipe("fashion-fast", tiny_overrides)
    assert first.lr == pytest.approx(recipe.optim.lr * recipe.train.batch_size / recipe.optim.base_batch)


def test_data_error_exits_2_naming_the_folder(tmp_path, capsys):
    code = main(["train", "data.name=mnist", f"data.root={tmp_path}", "data.download=false", "run.progress=false"])
    assert code == 2
    assert str(tmp_path) in capsys.readouterr().err


def test_unwritable_run_dir_is_a_clear_error(tiny_overrides, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert main(["train", *tiny_overrides, f"run.dir={blocker / 'run'}"]) == 2
    assert "run.dir" in capsys.readouterr().err


def test_eval_every_steps_resolves_time_to_accuracy_without_changing_training(tiny_overrides, tmp_path):
    """384 images at batch 16: 24 steps an epoch; every 10 steps an evaluation besides the epoch ends."""
    common = [*tiny_overrides, "run.thresholds=[0.2,0.5,0.9]", "tricks.ema=0.9", "tricks.ema_bn_images=64"]
    plain = hasten.train(None, [*common, f"run.dir={tmp_path / 'plain'}"])
    often = hasten.train(None, [*common, f"run.dir={tmp_path / 'often'}", "train.eval_every_steps=10"])
    assert [step for _, step, _, _ in plain["accuracy_curve"]] == [24, 48]
    assert [step for _, step, _, _ in often["accuracy_curve"]] == [10, 20, 24, 30, 40, 48]
    seconds = [s for s, _, _, _ in often["accuracy_curve"]]
    assert seconds == sorted(seconds) and seconds[-1] == pytest.approx(often["train_seconds"], abs=1e-3)
    # the evaluations change nothing the run learns (the EMA's statistics are recomputed before each one)
    assert often["train_loss"] == plain["train_loss"]
    assert often["test_accuracy"] == plain["test_accuracy"]
    for key, seconds_at in often["time_to_accuracy"].items():  # the first evaluation at or above each threshold
        reached = [s for s, _, accuracy, _ in often["accuracy_curve"] if accuracy >= float(key)]
        assert seconds_at == (reached[0] if reached else None)
    assert round(often["best_test_accuracy"], 6) == max(accuracy for _, _, accuracy, _ in often["accuracy_curve"])


@pytest.mark.machine
def test_the_normalisation_statistics_are_computed_once_a_run(tiny_overrides, monkeypatch):
    from hasten.run import assemble

    computed: list[int] = []
    real = assemble.channel_stats
    monkeypatch.setattr(assemble, "channel_stats", lambda images: (computed.append(len(images)), real(images))[1])
    # channels_last=auto: two candidates, so the start-up probe times a batch made by the run's own loaders
    parts = build(load_recipe(None, [*tiny_overrides, "train.channels_last=auto"]))
    assert computed == [len(parts.data.train_images)]  # the probe's batch and the run's loaders share them
    mean, std = real(parts.data.train_images)
    loader = parts.train_loader  # (on the run's device: a GPU's where there is one)
    assert torch.equal(loader.mean.flatten().cpu(), mean) and torch.equal(loader.std.flatten().cpu(), std)
    build(load_recipe(None, [*tiny_overrides, "seed=1", "data.subset=128"]))  # other images: computed afresh
    assert computed == [len(parts.data.train_images), 128]


def test_a_used_run_folder_is_refused_before_the_data_the_probe_or_any_decision(tiny_overrides, tmp_path, monkeypatch):
    import hasten.run.build as build_module
    from hasten.runfolder.folder import RunFolderError

    hasten.train(None, [*tiny_overrides, "train.epochs=1"])
    built = []
    monkeypatch.setattr(
        build_module, "build", lambda recipe, model=None, data=None, clock=None, loss_given=False: built.append(1)
    )
    with pytest.raises(RunFolderError, match="holds another run's files"):
        hasten.train(None, [*tiny_overrides, "train.epochs=1"])
    assert not built  # refused before anything slow
