"""A user's own model and data (hasten/run/user.py, hasten/models/user.py, hasten/data/user.py):
models and data defined only here, through every technique, from Python and from the command line by import path;
bad input exits 2 naming the problem."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from torch import nn

import hasten
from hasten.cli import main
from hasten.data.imagefolder import ImageFolderLoader
from hasten.data.loader import InMemoryLoader
from hasten.data.user import as_images, stratified_holdout
from hasten.errors import DataError, RecipeError
from hasten.recipe.schema import load_recipe
from hasten.run.build import build
from hasten.runfolder.checkpoint import checkpoints_in, load_checkpoint
from tests.counted import assert_counted

CLASSES = ["north", "east", "south", "west"]
QUIET = ["run.progress=false", "run.tensorboard=false", "train.threads=1", "train.batch_size=16", "train.epochs=2"]
TIMEOUT = 180  # seconds for a subprocess: a hang fails the test instead of the suite


def quadrant_image(label: int, rng: np.random.Generator, size: int = 12) -> np.ndarray:
    """H x W x 3 uint8 noise with a bright patch in the quadrant `label` names."""
    image = rng.integers(0, 120, (size, size, 3), dtype=np.uint8)
    row, col = divmod(label, 2)
    half = size // 2
    image[row * half : (row + 1) * half, col * half : (col + 1) * half] += 120
    return image


def quadrants(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A learnable 4-class set of colour images, N x H x W x 3 uint8 (numpy's layout), and their labels."""
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(n) % 4)
    return np.stack([quadrant_image(int(label), rng) for label in labels]), labels.astype(np.int64)


class TinyNet(nn.Module):
    """A user's CNN, unknown to hasten: conv-BN-ReLU features and a linear head."""

    def __init__(self, num_classes: int = 4, in_channels: int = 3, width: int = 6):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(), nn.AdaptiveAvgPool2d(2)
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(4 * width, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class StopAt(TinyNet):
    """TinyNet that sends its own process SIGTERM at the $HASTEN_TEST_SIGTERM_AT-th training forward pass: the
    fault comes from the test, at a deterministic point of the run."""

    def __init__(self, num_classes: int = 4, in_channels: int = 3):
        super().__init__(num_classes, in_channels)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sigterm_when_due(self)
        return super().forward(x)


def sigterm_when_due(model: nn.Module) -> None:
    """Counts `model`'s training forward passes (in `model.calls`) and sends this process SIGTERM at the
    $HASTEN_TEST_SIGTERM_AT-th: a fault from the test, at a deterministic point of the run."""
    if model.training and torch.is_grad_enabled():
        model.calls += 1
        if model.calls == int(os.environ.get("HASTEN_TEST_SIGTERM_AT", "0")):
            os.kill(os.getpid(), signal.SIGTERM)


class Lazy(torch.utils.data.Dataset):
    """A Dataset not held in memory: each item is made when asked, as numpy H x W x C; it leaves a file named by
    the process id that read it in `seen`, so the test can see the DataLoader workers did."""

    def __init__(self, n: int, seed: int, seen: Path):
        self.n, self.seed, self.seen = n, seed, seen

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        (self.seen / str(os.getpid())).touch()
        label = index % 4
        return quadrant_image(label, np.random.default_rng([self.seed, index])), label


@pytest.mark.numerics
def test_own_model_and_arrays_train_with_bf16_one_cycle_mixup_ema_and_the_run_folder_records_them(tmp_path):
    train, test = quadrants(192, 0), quadrants(64, 1)
    overrides = [*QUIET, "precision=bf16", "schedule.name=one-cycle", "tricks.mixup=0.4", "tricks.ema=0.9",
                 "train.channels_last=true", "optim.lr=0.4", f"run.dir={tmp_path / 'run'}"]  # fmt: skip
    summary = hasten.train("fashion-fast", overrides, model=TinyNet(), data=(train, test, CLASSES))
    assert summary["epochs"] == 2 and summary["evaluated_on"] == "test"
    assert summary["test_accuracy"] > 0.5  # 4 classes: chance is 0.25
    recorded = yaml.safe_load((tmp_path / "run" / "recipe.yaml").read_text())
    assert recorded["model"]["name"] == "object"
    assert recorded["model"]["target"] == f"{__name__}.TinyNet"
    assert recorded["model"]["parameters"] == sum(p.numel() for p in TinyNet().parameters())
    assert recorded["data"]["classes"] == CLASSES
    assert recorded["precision"] == "bf16" and recorded["tricks"]["mixup"] == 0.4
    state = load_checkpoint(checkpoints_in(tmp_path / "run" / "checkpoints")[0])
    assert "ema" in state["hooks"] and "mixing" in state["ranks"][0]["hooks"]
    assert set(state["model"]) == set(TinyNet().state_dict())
    # the recorded recipe names what to pass again; without the model it says so
    with pytest.raises(RecipeError, match="model=..."):
        hasten.train(str(tmp_path / "run" / "recipe.yaml"), [f"run.dir={tmp_path / 'again'}"], data=(train, test))


class LazyHead(nn.Module):
    """A user's VGG-style CNN whose head is nn.LazyLinear, so its author never computes the flattened size."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Sequential(nn.Flatten(), nn.LazyLinear(16), nn.ReLU(), nn.LazyLinear(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def test_a_model_with_lazy_modules_takes_its_shapes_from_the_data_and_trains(tmp_path):
    train, test = quadrants(192, 0), quadrants(64, 1)
    summary = hasten.train(None, [*QUIET, f"run.dir={tmp_path / 'run'}"], model=LazyHead(), data=(train, test))
    assert summary["test_accuracy"] > 0.25, summary["test_accuracy"]  # learnt: 4 classes
    recorded = yaml.safe_load((tmp_path / "run" / "recipe.yaml").read_text())
    assert recorded["model"]["parameters"] == 3 * 6 * 9 + 6 + (6 * 6 * 6) * 16 + 16 + 16 * 4 + 4  # shaped, counted


def test_a_loss_callable_replaces_the_soft_cross_entropy(tmp_path):
    calls = []

    def squared_error(logits: torch.Tensor, soft_targets: torch.Tensor) -> torch.Tensor:
        calls.append(soft_targets.shape)
        return (logits.softmax(1) - soft_targets).square().sum(1).mean()

    data = quadrants(96, 0)
    overrides = [*QUIET, "train.epochs=1", "data.val_fraction=0.25", f"run.dir={tmp_path / 'run'}"]
    summary = hasten.train("fashion-fast", overrides, model=TinyNet, data=data, loss=squared_error)
    assert len(calls) == 72 // 16 + 1 and calls[0] == (16, 4)  # 72 kept for training: 5 batches of up to 16
    assert summary["evaluated_on"].startswith("val: 0.25")


def test_a_dataset_that_is_not_in_memory_streams_through_workers_in_the_in_memory_order(tmp_path):
    seen = tmp_path / "seen"
    seen.mkdir()
    images, labels = quadrants(64, 3)
    recipe = load_recipe("fashion-fast", [*QUIET, "data.workers=2", "train.batch_size=8", "data.augment.translate=1"])
    streamed = build(recipe, model=TinyNet(), data=(Lazy(64, 3, seen), (images, labels), CLASSES))
    assert isinstance(streamed.train_loader, ImageFolderLoader) and streamed.train_loader.workers == 2
    batches = list(streamed.train_loader.batches())
    assert sum(len(y) for _, y in batches) == 64
    assert {int(p.name) for p in seen.iterdir()} - {os.getpid()}, "DataLoader worker processes read the items"

    # the same items held in memory give the very same batches (same order, augmentation and normalisation)
    lazy = Lazy(64, 3, seen)
    pairs = [lazy[i] for i in range(64)]
    arrays = (np.stack([p[0] for p in pairs]), np.array([p[1] for p in pairs]))
    in_memory = build(recipe, model=TinyNet(), data=(arrays, (images, labels), CLASSES))
    assert isinstance(in_memory.train_loader, InMemoryLoader)
    for (xa, ya), (xb, yb) in zip(batches, in_memory.train_loader.batches(), strict=True):
        assert torch.equal(ya, yb)
        torch.testing.assert_close(xa, xb, rtol=1e-5, atol=1e-2)  # stats: a 1000-item sample vs all, in float32


def test_float_arrays_train_at_full_precision_on_the_streamed_path(tmp_path):
    (images, labels), test = quadrants(64, 0), quadrants(32, 1)
    floats = (images.transpose(0, 3, 1, 2) / 255).astype(np.float32)  # N x C x H x W in [0, 1], as torch users have
    still = ["data.workers=0", "data.augment.translate=0", "data.augment.flip=false"]
    recipe = load_recipe("fashion-fast", [*QUIET, *still])
    parts = build(recipe, model=TinyNet(), data=((floats, labels), test, CLASSES))
    x, _ = next(iter(parts.train_loader))
    loader = parts.train_loader
    # normalised by the floats' own statistics (the loader works in units of 1/255, whatever the scale)
    expected = (torch.from_numpy(floats[int(loader.indices(0)[0])]) / 255 - loader.mean[0]) / loader.std[0]
    torch.testing.assert_close(x[0], expected)
    overrides = [*QUIET, "train.epochs=1", "data.workers=0", f"run.dir={tmp_path / 'r'}"]
    assert hasten.train("fashion-fast", overrides, model=TinyNet, data=((floats, labels), test))["epochs"] == 1


def test_streamed_dataset_trains_and_holds_out_a_stratified_val_split(tmp_path):
    seen = tmp_path / "seen"
    seen.mkdir()
    overrides = [*QUIET, "train.epochs=1", "data.workers=1", "data.val_fraction=0.25", f"run.dir={tmp_path / 'r'}"]
    summary = hasten.train("fashion-fast", overrides, model=TinyNet(), data=Lazy(80, 5, seen))
    assert summary["evaluated_on"].startswith("val") and summary["dataset"]["test_size"] == 20  # a quarter of 80
    assert_counted(summary)
    assert yaml.safe_load((tmp_path / "r" / "recipe.yaml").read_text())["data"]["target"] == f"{__name__}.Lazy"


def test_dataloaders_give_their_datasets_and_an_iterable_dataset_is_refused(tmp_path):
    seen = tmp_path / "seen"
    seen.mkdir()
    train = torch.utils.data.DataLoader(Lazy(48, 1, seen), batch_size=5, shuffle=True)
    recipe = load_recipe("fashion-fast", [*QUIET, "data.workers=0"])
    parts = build(recipe, model=TinyNet(), data=(train, quadrants(16, 2), CLASSES))
    assert parts.train_loader.batch_size == 16 and parts.train_loader.shard_size == 48  # the recipe's batching

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            yield from ()

    with pytest.raises(DataError, match="IterableDataset"):
        build(recipe, model=TinyNet(), data=(Stream(), quadrants(16, 2)))


def test_stratified_holdout_is_seeded_and_per_class():
    labels = torch.tensor([0] * 40 + [1] * 20 + [2] * 4)
    kept, held = stratified_holdout(labels, 0.25, seed=7)
    assert sorted(torch.cat([kept, held]).tolist()) == list(range(64))
    assert [int((labels[held] == c).sum()) for c in range(3)] == [10, 5, 1]
    again, held_again = stratified_holdout(labels, 0.25, seed=7)
    assert torch.equal(held, held_again) and not torch.equal(held, stratified_holdout(labels, 0.25, seed=8)[1])


@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        ((5, 7, 9), (5, 1, 7, 9)),
        ((5, 7, 9, 3), (5, 3, 7, 9)),
        ((5, 2, 7, 9), (5, 2, 7, 9)),
        ((5, 6, 6, 6), (5, 6, 6, 6)),
    ],
)
def test_image_layouts_become_n_c_h_w(shape, expected):
    images = np.arange(np.prod(shape)).reshape(shape) % 256
    out = as_images(images.astype(np.uint8), "x")
    assert tuple(out.shape) == expected and out.dtype == torch.uint8
    if len(shape) == 4 and shape[3] < shape[1]:
        assert torch.equal(out[2, 1], torch.from_numpy(images[2, :, :, 1].astype(np.uint8)))


def test_resumes_bitwise_after_sigterm_from_the_command_line_by_import_path(tmp_path, monkeypatch):
    common = ["train", "fashion-fast", *QUIET, "train.epochs=3", "precision=bf16", "tricks.mixup=0.4", "tricks.ema=0.9",
              "schedule.name=one-cycle", "model.name=import", f"model.target={__name__}:StopAt",
              "data.name=import", f"data.target={__name__}:quadrant_split", "data.args={n: 96}",
              "run.save_every_steps=4", "run.keep=100"]  # fmt: skip
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    assert main([*common, f"run.dir={whole}"]) == 0
    monkeypatch.setenv("HASTEN_TEST_SIGTERM_AT", "9")  # epoch 2 of 3 (6 steps per epoch), between checkpoints
    assert main([*common, f"run.dir={stopped}"]) == 143  # checkpointed at the step boundary, then stopped
    state = load_checkpoint(checkpoints_in(stopped / "checkpoints")[0])
    assert state["trainer"]["step"] == 9 and state["trainer"]["batch"] == 3
    monkeypatch.delenv("HASTEN_TEST_SIGTERM_AT")
    assert main([*common, f"run.dir={stopped}", "resume=auto"]) == 0
    a = load_checkpoint(checkpoints_in(whole / "checkpoints")[0])
    b = load_checkpoint(checkpoints_in(stopped / "checkpoints")[0])
    assert a["trainer"]["step"] == b["trainer"]["step"] == 18
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    for key, value in a["hooks"]["ema"].items():
        assert not isinstance(value, torch.Tensor) or torch.equal(value, b["hooks"]["ema"][key]), key
    assert (
        json.loads((whole / "summary.json").read_text())["test_accuracy"]
        == json.loads((stopped / "summary.json").read_text())["test_accuracy"]
    )
    recorded = yaml.safe_load((stopped / "recipe.yaml").read_text())
    assert recorded["model"]["target"] == f"{__name__}:StopAt" and recorded["data"]["args"] == {"n": 96}


def quadrant_split(n: int, seed: int = 0) -> tuple:
    """A data target for the import path: (train, test, class names)."""
    return quadrants(n, seed), quadrants(n // 3, seed + 1), CLASSES


USER_SCRIPT = """
import sys
import numpy as np
import torch
from torch import nn
import hasten


class Net(nn.Module):  # no batch norm: per-rank batch statistics would differ from one process's
    def __init__(self, num_classes, in_channels):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(in_channels, 6, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2),
                                  nn.Flatten(), nn.Linear(24, num_classes))

    def forward(self, x):
        return self.body(x)


def quadrants(n, seed, size=12):
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(n) % 4)
    images = rng.integers(0, 120, (n, size, size, 3), dtype=np.uint8)
    for i, label in enumerate(labels):
        row, col = divmod(int(label), 2)
        images[i, row * 6 : (row + 1) * 6, col * 6 : (col + 1) * 6] += 120
    return images, labels


if __name__ == "__main__":
    data = (quadrants(128, 0), quadrants(101, 1))  # 101 test images: the ranks' evaluation splits differ
    hasten.train("fashion-fast", sys.argv[1:], model=Net, data=data)
"""


def test_a_users_script_under_two_processes_matches_one(tmp_path):
    script = tmp_path / "user_script.py"
    script.write_text(textwrap.dedent(USER_SCRIPT))
    base = [
        *QUIET,
        "precision=fp32",
        "train.channels_last=false",
        "train.min_steps_per_epoch=0",
        "tricks.ema=0",
        "tricks.label_smoothing=0",
        "data.augment.flip=false",
        "data.augment.translate=0",
        "optim.lr=0.05",
        "optim.base_batch=32",
        "train.eval_batch_size=32",
        "train.tta_translate=0",
        "optim.name=sgd",
    ]  # fmt: skip  (Muon orthogonalises in bf16: parity within rounding, not 1e-5)
    one, two = tmp_path / "one", tmp_path / "two"
    run = dict(capture_output=True, text=True, timeout=TIMEOUT, env=os.environ | {"OMP_NUM_THREADS": "1"})
    single = subprocess.run([sys.executable, str(script), *base, "train.batch_size=32", f"run.dir={one}"], **run)
    assert single.returncode == 0, single.stderr[-3000:]
    launch = "from hasten.engine.distributed import launch; sys.exit(launch(2, sys.argv[2:], script=sys.argv[1]))"
    launcher = "import sys; " + launch
    pair = subprocess.run(
        [sys.executable, "-c", launcher, str(script), *base, "train.batch_size=16", f"run.dir={two}"], **run
    )
    assert pair.returncode == 0, pair.stderr[-3000:]
    a, b = (json.loads((folder / "summary.json").read_text()) for folder in (one, two))
    assert b["world_size"] == 2 and b["global_batch"] == a["global_batch"] == 32
    assert a["test_accuracy"] == pytest.approx(b["test_accuracy"], abs=1 / 101 + 1e-9)  # whole test set, one flip
    wa = load_checkpoint(checkpoints_in(one / "checkpoints")[0])["model"]
    wb = load_checkpoint(checkpoints_in(two / "checkpoints")[0])["model"]
    for key in wa:
        torch.testing.assert_close(wb[key], wa[key], rtol=1e-5, atol=1e-6)


class WrongWidth(TinyNet):
    def __init__(self) -> None:
        super().__init__(num_classes=7)


def test_bad_inputs_exit_2_naming_the_problem(tmp_path, capsys):
    here = [*QUIET, f"run.dir={tmp_path / 'r'}"]  # never the working folder's runs/: a user's demo run may be there
    args = ["train", "fashion-fast", *here, "data.name=import",
            f"data.target={__name__}:quadrant_split", "data.args={n: 48}"]  # fmt: skip
    assert main([*args, "model.name=import", f"model.target={__name__}:WrongWidth"]) == 2
    err = capsys.readouterr().err
    assert "WrongWidth" in err and "(2, 7)" in err and "(2, 4)" in err

    assert main([*args, "model.name=import", "model.target=no_such_package.nets:make"]) == 2
    err = capsys.readouterr().err
    assert "model.target=no_such_package.nets:make" in err and "cannot import" in err
    assert main([*args, "model.name=import", f"model.target={__name__}:NoSuchNet"]) == 2
    assert "has no attribute 'NoSuchNet'" in capsys.readouterr().err
    assert main(["train", *here, "data.name=import", "data.target=missing.module:load"]) == 2
    assert "data.target=missing.module:load" in capsys.readouterr().err
    assert main(["train", *here, "model.name=import"]) == 2
    assert "model.target" in capsys.readouterr().err
    assert not (tmp_path / "r").exists(), "nothing was written before the checks"

    images, labels = quadrants(32, 0)
    with pytest.raises(DataError, match=r"data: test labels: labels outside \[0, 4\).*found 8 at index 0"):
        hasten.train("fashion-fast", here, model=TinyNet(), data=((images, labels), (images, labels + 6), CLASSES))
    with pytest.raises(DataError, match="labels outside"):
        hasten.train("fashion-fast", here, model=TinyNet(), data=((images, labels - 1), (images, labels)))
    with pytest.raises(DataError, match="data.val_fraction"):
        hasten.train("fashion-fast", here, model=TinyNet(), data=(images, labels))
    with pytest.raises(DataError, match="pixels 0..255"):
        hasten.train("fashion-fast", here, model=TinyNet(), data=(images.astype(np.int64) * 4, labels))
    # the source named is the object given, never the default recipe's dataset the data= replaced
    with pytest.raises(DataError, match=r"hold only class '0'.*\(the labels given as data=\)$"):
        hasten.train(None, here, model=TinyNet(), data=((images, labels * 0), (images, labels)))
    # one image of each class: a held-out share of none, said with the key that changes it
    with pytest.raises(DataError, match=r"evaluation split is empty: data.val_fraction=0.2 holds out no image"):
        hasten.train(None, [*here, "data.val_fraction=0.2"], model=TinyNet(), data=(images[:4], np.arange(4)))
    with pytest.raises(DataError, match=r"evaluation split is empty: the test part given holds no image"):
        hasten.train(None, here, model=TinyNet(), data=((images, labels), (images[:0], labels[:0])))


def test_activation_checkpointing_over_named_modules_keeps_names_and_gradients(tmp_path):
    data = (quadrants(32, 0), quadrants(16, 1), CLASSES)
    grads = {}
    for modules in ("null", "[features]", "[features.0]"):
        torch.manual_seed(0)
        recipe = load_recipe("fashion-fast", [*QUIET, "precision=fp32", f"train.checkpoint_modules={modules}"])
        parts = build(recipe, model=TinyNet, data=data)
        x, y = next(iter(parts.train_loader))
        nn.functional.cross_entropy(parts.model(x), y).backward()
        grads[modules] = {
            k: p.grad.clone() for k, p in parts.model.state_dict(keep_vars=True).items() if p.grad is not None
        }
    assert set(grads["[features]"]) == set(grads["null"]) == set(grads["[features.0]"])
    for key, grad in grads["null"].items():
        torch.testing.assert_close(grads["[features]"][key], grad)
        torch.testing.assert_close(grads["[features.0]"][key], grad)
    with pytest.raises(RecipeError, match="no submodule 'body'"):
        build(load_recipe("fashion-fast", [*QUIET, "train.checkpoint_modules=[body]"]), model=TinyNet, data=data)


def test_lr_find_and_the_batch_size_finder_take_the_users_model_and_data(tmp_path):
    from hasten.experiments.batch_size import find_batch_size
    from hasten.tune.lr_find import lr_find

    data = (quadrants(64, 0), quadrants(32, 1), CLASSES)
    recipe = load_recipe("fashion-fast", [*QUIET, "precision=fp32", f"run.dir={tmp_path / 'r'}"])
    net = TinyNet()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    result = lr_find(build(recipe, model=net, data=data), steps=12)
    assert len(result.lrs) > 0 and result.suggestion > 0
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items()), "lr_find put the weights back"
    advice = find_batch_size(recipe, 256 * 2**20, model=net, data=data)
    assert 1 <= advice.batch_size <= 64  # at most the whole training set
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items()), "measured on a copy"


@pytest.mark.parametrize(
    "technique",
    [["precision=fp16"], ["precision=fp16-master"], ["train.accumulate=2", "train.batch_size=8"],
     ["train.compile=true"], ["tricks.cutmix=1.0", "tricks.label_smoothing=0.1", "schedule.name=cosine"]],
)  # fmt: skip
def test_every_technique_applies_to_the_users_model(tmp_path, technique):
    data = (quadrants(64, 0), quadrants(32, 1), CLASSES)
    overrides = [*QUIET, "train.epochs=1", "tricks.ema=0.9", *technique, f"run.dir={tmp_path / 'r'}"]
    summary = hasten.train("fashion-fast", overrides, model=TinyNet, data=data)
    assert summary["epochs"] == 1 and np.isfinite(summary["train_loss"])
    recorded = yaml.safe_load((tmp_path / "r" / "recipe.yaml").read_text())
    for item in technique:  # the run folder records the technique the user's model trained with
        key, _, value = item.partition("=")
        node = recorded
        for part in key.split("."):
            node = node[part]
        assert node == yaml.safe_load(value), item


# ----- what the user passes in Python: refused naming the item, key or call, never a traceback -----


class Items(torch.utils.data.Dataset):
    """A user's Dataset of the quadrant images whose item `bad` gives `label` as its label; with `targets`, the labels
    come from that attribute (no pass over the items)."""

    def __init__(self, n: int, bad: int = -1, label: object = 0, targets: bool = False):
        self.images, self.labels_ = quadrants(n, 0)
        self.bad, self.label = bad, label
        if targets:
            self.targets = [label if i == bad else int(y) for i, y in enumerate(self.labels_)]

    def __len__(self) -> int:
        return len(self.labels_)

    def __getitem__(self, index: int) -> tuple[np.ndarray, object]:
        return self.images[index], self.label if index == self.bad else int(self.labels_[index])


def test_labels_that_are_class_names_become_indices_into_the_names_given_or_found(capsys, tmp_path):
    from hasten.data.user import own_data

    (images, labels), (test, test_labels) = quadrants(40, 0), quadrants(8, 1)
    named = lambda values: np.array(["cat", "dog", "emu", "ant"])[values]  # noqa: E731
    found = own_data(((images, named(labels)), (test, list(named(test_labels)))))  # an array, and a list
    assert (
        found.classes == ["ant", "cat", "dog", "emu"]
        and "4 classes, in sorted order (ant, cat" in capsys.readouterr().out
    )
    assert torch.equal(found.train_labels, torch.tensor([["ant", "cat", "dog", "emu"].index(n) for n in named(labels)]))
    given = own_data(((images, named(labels)), (test, named(test_labels)), ["cat", "dog", "emu", "ant"]))
    assert torch.equal(given.train_labels, torch.from_numpy(labels))
    assert torch.equal(given.test_labels, torch.from_numpy(test_labels))
    with pytest.raises(DataError, match=r"label 'emu' is not one of the class names \['cat', 'dog', 'ant'\]"):
        own_data(((images, named(labels)), (test, named(test_labels)), ["cat", "dog", "ant"]))
    overrides = [*QUIET, "model.width=4", "data.val_fraction=0.25", f"run.dir={tmp_path}"]
    result = hasten.train(None, overrides, data=(images, named(labels)))
    assert result["classes"] == ["ant", "cat", "dog", "emu"] and result.predict(test[:1])[0].label in result["classes"]


def test_images_labels_and_class_names_are_one_named_part_not_train_test_and_names(tmp_path):
    """data=(images, labels, class_names): the training part with its names, held out by data.val_fraction (the
    same split as (images, labels) with data.classes); without a held-out share it is said to need one, and a
    third item that is not names is named in the form the data has."""
    from hasten.data.user import own_data

    images, labels = quadrants(40, 0)
    named = own_data((images, labels, CLASSES), val_fraction=0.25)
    pair = own_data((images, labels), classes=CLASSES, val_fraction=0.25)
    assert named.classes == CLASSES and len(named.train_labels) == 32 and len(named.test_labels) == 8
    assert torch.equal(named.train_labels, pair.train_labels) and torch.equal(named.test_images, pair.test_images)
    with pytest.raises(DataError, match=r"only a training part was given.*data\.val_fraction=0\.1"):
        own_data((images, labels, CLASSES))
    with pytest.raises(DataError, match=r"third item of \(images, labels, class_names\) must be a list of class"):
        own_data((images, labels, "north"))
    with pytest.raises(DataError, match=r"third item of \(train, test, class_names\)"):
        own_data(((images, labels), (images, labels), [0, 1, 2, 3]))
    result = hasten.train(None, [*QUIET, "model.width=4", "data.val_fraction=0.25", f"run.dir={tmp_path}"],
                          data=(images, labels, CLASSES))  # fmt: skip
    assert result["classes"] == CLASSES and result.predict(images[:1])[0].label in CLASSES


def test_labels_that_are_not_class_indices_are_refused_naming_the_split_index_and_value():
    from hasten.data.user import own_data

    images, labels = quadrants(40, 0)
    test = quadrants(8, 1)
    for given, needle in (
        (labels - 1, r"data: train labels: labels outside \[0, classes\): found -1 at index \d+"),
        (labels + 0.5, r"data: train labels: .*whole numbers 0..K-1: found \d.5 at index 0 \(40 label"),
        (np.where(np.arange(40) == 5, np.nan, labels), r"found nan at index 5"),
        (np.array([str(v) for v in labels]), r"data: the labels of one part are class names and the other's are"),
    ):
        with pytest.raises(DataError, match=needle):
            own_data(((images, given), test))
    bad = labels.copy()
    bad[9] = 4  # one past the 4 class names
    with pytest.raises(DataError, match=r"data: test labels: labels outside \[0, 4\) \(the 4 class names\): found 4 "
                                        r"at index 9 \(1 such"):  # fmt: skip
        own_data((test, (images, bad), CLASSES))
    # one-hot rows (Keras' to_categorical) are the class each holds; soft rows are refused naming the shape
    assert torch.equal(own_data(((images, np.eye(4)[labels]), test)).train_labels, torch.from_numpy(labels))
    with pytest.raises(DataError, match=r"or one-hot rows \(one 1, the rest 0\); got \(40, 4\) that are neither"):
        own_data(((images, np.full((40, 4), 0.25)), test))
    # whole-number floats are the integers they hold (float label columns are common: pandas, MATLAB files)
    assert torch.equal(own_data(((images, labels.astype(np.float32)), test)).train_labels, torch.from_numpy(labels))

    # a Dataset's labels, item by item (int() would truncate 2.5 to 2 and read "3" as 3) and from its targets
    for label, needle in (
        (2.5, r"data: train \(Items\)\[17\]: the label 2.5 \(float\) is not a class index"),
        (np.float32(0.5), r"\[17\]: the label 0.5 \(float32\) is not a class index"),
        ("3", r"\[17\]: the label '3' \(str\) is not a class index"),
        (-1, r"\[17\]: the label -1 is outside \[0, classes\)"),
        (torch.tensor([1, 2]), r"\[17\]: a label must be one class index, got a Tensor of shape \(2,\)"),
    ):
        with pytest.raises(DataError, match=needle):
            own_data((Items(40, 17, label), test))
    with pytest.raises(DataError, match=r"\(Items\)\[17\]: the label 4 is outside \[0, 4\)"):
        own_data((Items(40, 17, 4), test, CLASSES))
    with pytest.raises(DataError, match=r"\(Items\).targets: .*found 0.5 at index 17"):
        own_data((Items(40, 17, 0.5, targets=True), test))
    assert own_data((Items(40, 17, 3.0), test)).train.labels[17] == 3


def test_complex_images_are_refused_naming_the_dtype():
    from hasten.data.user import own_data

    images, labels = quadrants(40, 0)
    test = quadrants(8, 1)
    for complex_images in (images.astype(np.complex64), torch.from_numpy(images).to(torch.complex64)):
        with pytest.raises(DataError, match=r"data: train images: images are complex64 \(complex numbers\)"):
            own_data(((complex_images, labels), test))
    dataset = Items(40)
    dataset.images = dataset.images.astype(np.complex128)
    with pytest.raises(DataError, match=r"data: train \(Items\)\[0\]: the image is complex128 \(complex numbers\)"):
        own_data((dataset, test))
    # 16-bit integer pixels are read (torch has no min or max for uint16), and held to 0..255 as other integers
    assert own_data(((images.astype(np.uint16), labels), test)).train_images.dtype == torch.uint8
    wide = np.full_like(images, 4095, dtype=np.uint16) * (labels[:, None, None, None] > 0)
    with pytest.raises(DataError, match=r"pixels 0..255, got 0..4095; give images of a wider range .* as floats"):
        own_data(((wide, labels), test))
    assert own_data(((wide.astype(np.float32), labels), test)).num_classes == 4  # as advised: streamed floats


class Raises(Items):
    """A user's Dataset whose item 17 raises, in every process, or only in DataLoader worker processes."""

    def __init__(self, n: int, in_workers_only: bool = False, targets: bool = False):
        super().__init__(n, targets=targets)
        self.in_workers_only = in_workers_only

    def __getitem__(self, index: int) -> tuple[np.ndarray, object]:
        if index == 17 and (torch.utils.data.get_worker_info() is not None or not self.in_workers_only):
            raise ValueError(f"cannot decode scan {index}")
        return super().__getitem__(index)


class FailingForward(TinyNet):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise ValueError("the user's forward fails")


def test_the_users_own_code_that_raises_is_reported_as_theirs_naming_the_item_and_call(tmp_path, monkeypatch):
    from hasten.data.user import own_data

    test = quadrants(8, 1)
    theirs = r"ValueError: cannot decode scan 17 \(at .*test_user.py:\d+, in __getitem__\); HASTEN_DEBUG=1 shows"
    for workers in (0, 2):  # the labels' pass over the items: in this process, then in DataLoader workers
        with pytest.raises(DataError, match=r"data: train \(Raises\): your Dataset's item 17 raised " + theirs) as e:
            own_data((Raises(40), test), workers=workers)
        assert "Traceback" not in str(e.value)
    # in training, raised inside a worker: the item is still named
    overrides = [*QUIET, "train.epochs=1", "precision=fp32", "data.workers=2", f"run.dir={tmp_path / 'r'}"]
    with pytest.raises(DataError, match=r"your Dataset's item 17 raised " + theirs):
        hasten.train(None, overrides, model=TinyNet(), data=(Raises(40, in_workers_only=True, targets=True), test))
    with pytest.raises(RecipeError, match=r"model FailingForward: given a batch of 2 images of shape \(3, 12, 12\) "
                                          r"\(C, H, W\), its forward raised ValueError: the user's forward fails \(at "
                                          r".*test_user.py:\d+, in forward\)"):  # fmt: skip
        hasten.train(None, [*QUIET, f"run.dir={tmp_path / 'm'}"], model=FailingForward(), data=(test, test))

    monkeypatch.setenv("HASTEN_DEBUG", "1")  # their whole traceback, in the message, from a worker process too
    with pytest.raises(DataError) as e:
        own_data((Raises(40), test), workers=1)
    said = str(e.value)
    assert "Traceback (most recent call last)" in said and 'raise ValueError(f"cannot decode scan' in said


def raising_data(n: int = 48) -> tuple:
    """A data target whose code fails."""
    raise FileNotFoundError(f"/data/scans/index.csv (n={n})")


class RaisingNet(TinyNet):
    def __init__(self, num_classes: int = 4, in_channels: int = 3):
        super().__init__(num_classes, in_channels)
        raise KeyError("width")


def test_targets_that_raise_exit_2_naming_the_key_and_their_code(tmp_path, capsys):
    args = ["train", "fashion-fast", *QUIET, f"run.dir={tmp_path / 'r'}"]
    data = ["data.name=import", f"data.target={__name__}:quadrant_split", "data.args={n: 48}"]
    for extra, needles in (
        (["data.name=import", f"data.target={__name__}:raising_data"],
         ["data.target: calling raising_data raised FileNotFoundError: /data/scans/index.csv (n=48) (at ",
          "test_user.py:", "in raising_data)"]),
        ([*data, "model.name=import", f"model.target={__name__}:RaisingNet"],
         ["model.target=tests.run.test_user:RaisingNet: calling RaisingNet raised KeyError: 'width' (at ",
          "in __init__)"]),
        ([*data, "model.name=import", f"model.target={__name__}:FailingForward"],
         ["model FailingForward: given a batch of 2 images", "forward raised ValueError: the user's forward fails"]),
    ):  # fmt: skip
        assert main([*args, *extra]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err, err
        for needle in needles:
            assert needle in " ".join(err.split()), (needle, err)


class IntegerLogits(TinyNet):
    """A user's model whose forward rounds its logits to integers (no gradient can flow through them)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x).round().long()


def test_integer_logits_and_a_loss_that_is_not_one_number_are_refused_naming_what_was_returned(tmp_path):
    from hasten.engine.loss import UserLoss

    data = (quadrants(32, 0), quadrants(16, 1))
    overrides = [*QUIET, "train.epochs=1", "precision=fp32"]
    with pytest.raises(RecipeError, match=r"model IntegerLogits: returns int64 logits of shape \(2, 4\) .*must "
                                          "return floating-point class logits"):  # fmt: skip
        hasten.train(None, [*overrides, f"run.dir={tmp_path / 'a'}"], model=IntegerLogits(), data=data)

    def per_example(logits: torch.Tensor, soft_targets: torch.Tensor) -> torch.Tensor:
        return (logits - soft_targets).square().sum(1)  # not reduced over the batch

    with pytest.raises(RecipeError, match=r"loss: your loss .*per_example\(logits of shape \(16, 4\), soft targets of "
                                          r"shape \(16, 4\)\) returned a float32 tensor of shape \(16,\); it must "
                                          "return one number"):  # fmt: skip
        hasten.train(None, [*overrides, f"run.dir={tmp_path / 'b'}"], model=TinyNet(), data=data, loss=per_example)

    logits, targets = torch.randn(3, 4, requires_grad=True), torch.eye(4)[:3]
    for loss, needle in (
        (lambda x, y: 0.5, r"returned float; it must return a tensor of one number"),
        (lambda x, y: (x - y).abs().sum().long(), r"returned a int64 tensor of shape \(\); it must be floating-point"),
        (lambda x, y: (x - y).abs().sum().detach(), r"returned a float32 tensor of shape \(\); it has no gradient"),
        (lambda x, y: x[:, 7].mean(), r"raised IndexError: index 7 is out of bounds .*\(at .*test_user.py:\d+, in"),
    ):
        with pytest.raises(RecipeError, match=needle):
            UserLoss(loss)(logits, targets)
    assert UserLoss(lambda x, y: (x - y).square().mean().reshape(1))(logits, targets).shape == ()  # one number


class DictItems(torch.utils.data.Dataset):
    """Items as dicts, as Hugging Face datasets and many users' Datasets give them."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, keys: tuple[str, str] = ("image", "label")):
        self.images, self.labels, self.keys = images, labels, keys

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, object]:
        return {self.keys[0]: self.images[index], self.keys[1]: int(self.labels[index]), "id": index}


def test_a_dataset_of_dict_items_trains_by_its_image_and_label_keys(tmp_path):
    (images, labels), (test, test_labels) = quadrants(64, 0), quadrants(32, 1)
    data = (DictItems(images, labels), DictItems(test, test_labels, ("img", "labels")))
    result = hasten.train(None, [*QUIET, "model.width=4", "precision=fp32", f"run.dir={tmp_path}"], data=data)
    assert result["dataset"]["train_size"] == 64 and result["dataset"]["test_size"] == 32
    with pytest.raises(DataError, match=r"\[0\]: an item that is a dict must hold an image under one of .*got the keys "
                                        r"\['picture', 'cls', 'id'\]"):  # fmt: skip
        hasten.train(None, [*QUIET, f"run.dir={tmp_path / 'bad'}"], data=(DictItems(images, labels, ("picture", "cls")),
                                                                          DictItems(test, test_labels)))  # fmt: skip


def test_image_file_paths_and_names_as_a_csv_gives_them_train_and_a_file_that_is_no_image_is_named(tmp_path):
    from PIL import Image as PILImage

    (images, labels), (test, test_labels) = quadrants(48, 0), quadrants(16, 1)
    names = np.array(["ant", "bee", "cat", "dog"])
    paths = []
    for i, image in enumerate(np.concatenate([images, test])):
        path = tmp_path / f"{i}.png"
        # every fourth a palette PNG (as many PNGs are): read as the colours it stands for, not its palette indices
        (PILImage.fromarray(image).quantize(64) if i % 4 == 0 else PILImage.fromarray(image)).save(path)
        paths.append(str(path))
    data = ((paths[:48], list(names[labels])), (paths[48:], list(names[test_labels])))
    result = hasten.train(None, [*QUIET, "model.width=4", f"run.dir={tmp_path / 'run'}"], data=data)
    assert result["classes"] == list(names) and result["dataset"]["train_size"] == 48
    assert result["preprocessing"]["channels"] == 3  # the palette files read as RGB
    (tmp_path / "broken.png").write_bytes(b"not an image")
    broken = ([str(tmp_path / "broken.png"), *paths[1:48]], labels)
    with pytest.raises(DataError, match=r"cannot read .*broken.png as an image"):
        hasten.train(None, [*QUIET, f"run.dir={tmp_path / 'bad'}"], data=(broken, (paths[48:], test_labels)))
