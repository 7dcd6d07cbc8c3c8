"""The recipe's data keys: label noise (exact count, seeded, never the true class), per-class caps, balanced
subsets of a folder's file order, resizing and channel counts, and their effect through `build.dataset`."""

from __future__ import annotations

import pytest
import torch

from hasten.data.transforms import (
    class_interleaved,
    first_per_class,
    flip_labels,
    noise_generator,
    resize_images,
    set_channels,
)
from hasten.recipe.schema import load_recipe
from hasten.run.build import dataset


@pytest.mark.parametrize(("fraction", "n", "expected"), [(0.2, 1000, 200), (0.15, 7, 1), (0.5, 3, 2), (0.0, 50, 0)])
def test_label_noise_flips_exactly_round_p_n_to_other_classes(fraction: float, n: int, expected: int) -> None:
    labels = torch.arange(n) % 10
    noisy, flipped = flip_labels(labels, fraction, 10, noise_generator(0))
    changed = torch.nonzero(noisy != labels).flatten()
    assert len(flipped) == expected and torch.equal(changed, flipped)  # every chosen label really moved
    assert noisy.min() >= 0 and noisy.max() < 10 and noisy.dtype == labels.dtype
    assert torch.equal(labels, torch.arange(n) % 10)  # the input is not modified


def test_label_noise_is_seeded_and_spread_over_the_other_classes() -> None:
    labels = torch.zeros(20000, dtype=torch.long)
    first, idx = flip_labels(labels, 0.3, 5, noise_generator(1))
    again, _ = flip_labels(labels, 0.3, 5, noise_generator(1))
    other, other_idx = flip_labels(labels, 0.3, 5, noise_generator(2))
    assert torch.equal(first, again) and not torch.equal(idx, other_idx)
    counts = torch.bincount(first[idx], minlength=5)
    assert counts[0] == 0 and all(abs(c / 6000 - 0.25) < 0.02 for c in counts[1:].tolist())


def test_label_noise_through_the_recipe_touches_only_training_labels() -> None:
    common = ["data.name=digits"]
    clean, noisy = dataset(load_recipe(None, common)), dataset(load_recipe(None, [*common, "data.label_noise=0.25"]))
    assert (clean.train_labels != noisy.train_labels).sum() == round(0.25 * len(clean.train_labels))
    assert torch.equal(clean.test_labels, noisy.test_labels)
    reseeded = dataset(load_recipe(None, [*common, "data.label_noise=0.25", "seed=1"]))
    assert not torch.equal(reseeded.train_labels, noisy.train_labels)


def test_per_class_and_interleaved_subsets() -> None:
    labels = torch.tensor([2, 0, 0, 1, 2, 0, 2, 1])
    assert first_per_class(labels, 2).tolist() == [0, 1, 2, 3, 4, 7]
    grouped = torch.tensor([0, 0, 0, 1, 1, 2])
    assert grouped[class_interleaved(grouped)].tolist() == [0, 1, 2, 0, 1, 0]
    data = dataset(load_recipe(None, ["data.name=digits", "data.per_class=10"]))
    assert torch.bincount(data.train_labels).tolist() == [10] * 10


def test_resize_and_channels() -> None:
    grey = torch.full((2, 1, 8, 8), 200, dtype=torch.uint8)
    big = resize_images(grey, 28)
    assert big.shape == (2, 1, 28, 28) and big.dtype == torch.uint8 and int(big.min()) == int(big.max()) == 200
    rgb = set_channels(big, True)
    assert rgb.shape == (2, 3, 28, 28) and torch.equal(set_channels(rgb, False), big)
    assert set_channels(grey, False) is grey
    data = dataset(load_recipe(None, ["data.name=digits", "data.size=28", "data.rgb=true"]))
    assert data.image_shape == (3, 28, 28) and data.test_images.shape[1:] == (3, 28, 28)


def test_imagefolder_without_root_is_a_recipe_error() -> None:
    from hasten.errors import RecipeError

    with pytest.raises(RecipeError, match="data.root: an image folder needs"):
        load_recipe(None, ["data.name=imagefolder"])
