"""The generated image folders (hasten/data/toy.py): seeded, the promised counts, modes and sizes, readable by the
image-folder reader, and the arrows really mirror-sensitive."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy
import pytest
import torch
from PIL import Image

from hasten.data.imagefolder import open_image_folder, read_into_memory
from hasten.data.toy import ARROW_MIRROR, KINDS, make_toy
from hasten.errors import DataError

SMALL = dict(train_per_class=6, val_per_class=2)


def _digest(root: Path) -> str:
    sha = hashlib.sha256()
    for path in sorted(root.rglob("*.png")):
        sha.update(str(path.relative_to(root)).encode())
        sha.update(path.read_bytes())
    return sha.hexdigest()


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_same_seed_same_bytes_other_seed_other_images(tmp_path: Path, kind: str) -> None:
    make_toy(kind, tmp_path / "a", seed=3, **SMALL)
    make_toy(kind, tmp_path / "b", seed=3, **SMALL)
    make_toy(kind, tmp_path / "c", seed=4, **SMALL)
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    assert _digest(tmp_path / "a") != _digest(tmp_path / "c")


@pytest.mark.parametrize(
    ("kind", "classes", "mode", "size"), [("arrows", 8, "L", 28), ("colours", 9, "RGB", 32), ("shapes", 5, "L", 28)]
)
def test_counts_modes_sizes_and_the_reader(tmp_path: Path, kind: str, classes: int, mode: str, size: int) -> None:
    counts = make_toy(kind, tmp_path, seed=0, **SMALL)
    assert counts == {"train": 6 * classes, "val": 2 * classes}
    for split, per_class in (("train", 6), ("val", 2)):
        folders = sorted(p for p in (tmp_path / split).iterdir())
        assert len(folders) == classes
        for folder in folders:
            files = sorted(folder.glob("*.png"))
            assert len(files) == per_class
            with Image.open(files[0]) as image:
                assert image.mode == mode and image.size == (size, size)
    assert not list(tmp_path.glob(".toy-*"))  # the staging folder is gone
    data = read_into_memory(open_image_folder(tmp_path))
    assert data.num_classes == classes
    assert tuple(data.train_images.shape) == (6 * classes, 3 if mode == "RGB" else 1, size, size)
    assert numpy.bincount(data.test_labels.numpy()).tolist() == [2] * classes
    assert data.train_images.float().std() > 10  # not blank images


def test_default_sizes_are_a_few_hundred_to_two_thousand(tmp_path: Path) -> None:
    for kind in KINDS:
        counts = make_toy(kind, tmp_path / kind)
        assert 300 <= counts["train"] + counts["val"] <= 2000, (kind, counts)


def test_arrows_mirror_into_another_class(tmp_path: Path) -> None:
    """Mirroring swaps a class with its twin: what tells class A's mean image from class B's (A minus B),
    mirrored, is B minus A (cosine similarity near 1), while a mirror-invariant set would give A minus B back."""
    make_toy("arrows", tmp_path, seed=0, train_per_class=200, val_per_class=1)
    folder = open_image_folder(tmp_path)
    data = read_into_memory(folder)
    images, labels = data.train_images.float()[:, 0], data.train_labels
    means = {name: images[labels == i].mean(0) for i, name in enumerate(folder.classes)}

    def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a * b).sum() / (a.norm() * b.norm()))

    sensitive = [name for name, twin in ARROW_MIRROR.items() if twin != name]
    assert len(sensitive) == 6  # up and down are their own mirror images; the other six are not
    for name in sensitive:
        difference = means[name] - means[ARROW_MIRROR[name]]
        assert cosine(difference.flip(-1), -difference) > 0.6, name
    # the self-mirrored classes: mirroring leaves up minus down as it was
    up_minus_down = means["2_up"] - means["6_down"]
    assert cosine(up_minus_down.flip(-1), up_minus_down) > 0.7
    assert ARROW_MIRROR["4_left"] == "0_right"


def test_colours_need_colour(tmp_path: Path) -> None:
    """Same shape, different colour: the mean of each colour channel differs between red, green and blue classes."""
    make_toy("colours", tmp_path, seed=0, train_per_class=30, val_per_class=1)
    folder = open_image_folder(tmp_path)
    data = read_into_memory(folder)
    images = data.train_images.float()
    channel_means = {name: images[data.train_labels == i].mean((0, 2, 3)) for i, name in enumerate(folder.classes)}
    for shape in ("circle", "square", "triangle"):
        for channel, colour in enumerate(("red", "green", "blue")):
            mine = channel_means[f"{colour}_{shape}"][channel]
            others = [channel_means[f"{c}_{shape}"][channel] for c in ("red", "green", "blue") if c != colour]
            assert all(mine > other + 10 for other in others), (colour, shape)


def test_existing_folder_and_unknown_kind_are_errors(tmp_path: Path) -> None:
    make_toy("shapes", tmp_path, **SMALL)
    before = _digest(tmp_path)
    with pytest.raises(DataError, match="already exist"):
        make_toy("shapes", tmp_path, **SMALL)
    assert _digest(tmp_path) == before
    with pytest.raises(DataError, match="letters"):
        make_toy("letters", tmp_path / "x")
