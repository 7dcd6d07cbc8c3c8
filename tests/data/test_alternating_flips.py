"""Alternating (derandomised) flips, data.augment.flip=alternate: the exact masks of three epochs, the same mask on
resume, on every rank and on the streamed path, the recipe key and its note, and a 2-step run with it on."""

from __future__ import annotations

import pytest
import torch
import yaml

import hasten
from hasten.data import load_dataset
from hasten.data.imagefolder import ImageFolderLoader
from hasten.data.loader import Augment, InMemoryLoader, alternating_flips, first_epoch_flips
from hasten.errors import RecipeError
from hasten.recipe.schema import load_recipe
from hasten.run.build import build
from hasten.run.resolve import resolve_for_data

N = 41  # odd: with 2 ranks and remainder=pad one image is seen twice an epoch


def numbered_images(n: int = N) -> torch.Tensor:
    """Image i is one row [2i, 2i + 1]: its index and whether it was mirrored can be read back."""
    return torch.arange(2 * n, dtype=torch.uint8).view(n, 1, 1, 2)


def loader(seed: int = 5, **kwargs) -> InMemoryLoader:
    return InMemoryLoader(numbered_images(), torch.arange(N), 8, mean=torch.zeros(1), std=torch.ones(1), shuffle=True,
                          seed=seed, augment=Augment(flip="alternate"), **kwargs)  # fmt: skip


def read_back(batches) -> dict[int, list[bool]]:
    """index -> whether it came mirrored, once per time it was seen; the labels must agree with the pixels."""
    seen: dict[int, list[bool]] = {}
    for images, labels in batches:
        pixels = (images * 255).round().long().view(-1, 2)  # normalised with mean 0, std 1: pixel / 255
        index, mirrored = pixels.min(1).values // 2, pixels[:, 0] > pixels[:, 1]
        assert torch.equal(index, labels)
        for i, m in zip(index.tolist(), mirrored.tolist(), strict=True):
            seen.setdefault(i, []).append(m)
    return seen


def epoch_masks(source: InMemoryLoader, epochs: int = 3) -> list[torch.Tensor]:
    masks = []
    for epoch in range(epochs):
        source.set_epoch(epoch)
        seen = read_back(source.batches())
        assert sorted(seen) == list(range(N))
        masks.append(torch.tensor([seen[i][0] for i in range(N)]))
    return masks


def test_the_pure_functions_exact_values():
    first = first_epoch_flips(8, seed=3)
    assert torch.equal(first, torch.rand(8, generator=torch.Generator().manual_seed(3 * 1_000_003 + 0xF11B)) < 0.5)
    assert torch.equal(alternating_flips(first, 0), first) and torch.equal(alternating_flips(first, 2), first)
    assert torch.equal(alternating_flips(first, 1), ~first) and torch.equal(alternating_flips(first, 7), ~first)
    assert torch.equal(first_epoch_flips(8, seed=3), first) and not torch.equal(first_epoch_flips(64, 4)[:8], first)


def test_three_epochs_exact_masks_each_image_once_mirrored_in_two_consecutive_epochs():
    masks = epoch_masks(loader())
    assert torch.equal(masks[0], first_epoch_flips(N, 5))  # epoch 1: the seed's mask, whatever the shuffle
    assert 0 < int(masks[0].sum()) < N  # some mirrored, some not
    assert torch.equal(masks[1], ~masks[0]) and torch.equal(masks[2], masks[0])
    assert torch.equal(masks[0] ^ masks[1], torch.ones(N, dtype=torch.bool))  # flipped in exactly one of 1, 2
    assert torch.equal(masks[1] ^ masks[2], torch.ones(N, dtype=torch.bool))
    assert not torch.equal(epoch_masks(loader(seed=6), 1)[0], masks[0])  # another seed, another mask


def test_resume_mid_epoch_recomputes_the_same_masks():
    whole = loader()
    whole.set_epoch(1)
    expected = list(whole.batches())[2:]
    fresh = loader()  # a new process: no mask cached
    fresh.set_epoch(1)
    for (a, ya), (b, yb) in zip(fresh.batches(2), expected, strict=True):
        assert torch.equal(a, b) and torch.equal(ya, yb)


def test_every_rank_mirrors_an_image_alike():
    for epoch in range(2):
        seen: dict[int, list[bool]] = {}
        for rank in range(2):
            shard = loader(rank=rank, world_size=2, remainder="pad")
            shard.set_epoch(epoch)
            for i, flags in read_back(shard.batches()).items():
                seen.setdefault(i, []).extend(flags)
        assert sorted(seen) == list(range(N)) and sum(map(len, seen.values())) == N + 1  # one image twice
        expected = alternating_flips(first_epoch_flips(N, 5), epoch)
        assert all(flags == [bool(expected[i])] * len(flags) for i, flags in seen.items())


class Batches:
    """A batch source as the streamed path takes one: len() and [list of indices] -> (images, labels)."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        return numbered_images()[indices], torch.tensor(indices)


def test_the_streamed_loader_gives_the_in_memory_batches():
    streamed = ImageFolderLoader(Batches(), 8, mean=torch.zeros(1), std=torch.ones(1), shuffle=True, seed=5,
                                 augment=Augment(flip="alternate"))  # fmt: skip
    memory = loader()
    for epoch in (0, 1):
        streamed.set_epoch(epoch)
        memory.set_epoch(epoch)
        for (a, ya), (b, yb) in zip(streamed.batches(1), memory.batches(1), strict=True):
            assert torch.equal(a, b) and torch.equal(ya, yb)


class FakeMirrorInvariant:
    """What resolve_for_data reads of a dataset, for one where mirrors keep the class."""

    name, image_shape, train_labels, classes = "fashion-mnist", (1, 28, 28), torch.zeros(64), list("abcdefghij")


def test_the_recipe_key_is_validated_and_warned_about_where_mirrors_change_the_class():
    with pytest.raises(RecipeError, match="data.augment.flip"):
        load_recipe(None, ["data.augment.flip=sometimes"])
    recipe = load_recipe(None, ["data.augment.flip=alternate", "data.name=synthetic"])
    resolved, notes = resolve_for_data(recipe, load_dataset("synthetic", synthetic_size=64))
    assert resolved.data.augment.flip == "alternate"  # asked for by name: honoured
    assert any(n.startswith("warning: alternating flips on") for n in notes)
    assert not any("alternating" in n for n in resolve_for_data(recipe, FakeMirrorInvariant())[1])


def test_two_step_run_uses_alternating_flips_and_records_them(tiny_overrides, tmp_path):
    overrides = [*tiny_overrides, "data.synthetic_size=64", "train.batch_size=32", "train.epochs=1",
                 "data.augment.flip=alternate"]  # fmt: skip
    parts = build(load_recipe(None, overrides))
    assert parts.train_loader.augment == Augment(flip="alternate")
    summary = hasten.train(None, overrides)
    assert summary["steps"] == 2
    recorded = yaml.safe_load((tmp_path / "run" / "recipe.yaml").read_text())
    assert recorded["data"]["augment"]["flip"] == "alternate"
