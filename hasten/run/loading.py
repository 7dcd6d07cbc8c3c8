"""The recipe's data and loader settings, read in one place: an image folder opened with the recipe's data keys
(`open_folder`), and whichever path the data takes (in memory, an image folder, a
user's streamed Dataset, the test loader `hasten evaluate` rebuilds), its loaders get their options from here.

The training loader is shuffled from the seed, augmented as data.augment says and shares its remainder over the
ranks as train.remainder says; the test loader takes eval batches, split over the ranks so each image counts once
(hasten/data/loader.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from hasten.data import foldercache
from hasten.data.imagefolder import ImageFolder, decoded_bytes, default_workers, fits_in_memory, open_image_folder
from hasten.data.loader import Augment
from hasten.engine import distributed
from hasten.engine.memory import available_memory_bytes, format_bytes
from hasten.progress import say
from hasten.recipe.schema import Recipe
from hasten.tune import rules


def open_folder(recipe: Recipe, root: str | Path) -> ImageFolder:
    """The image folder at `root` with the recipe's data keys applied; what opening it decided (a folder of mixed
    image sizes: the square side) is said once, by the main process, with the run's other opening lines."""
    cfg = recipe.data
    folder = open_image_folder(root, size=cfg.size, rgb=cfg.rgb, label_noise=cfg.label_noise, seed=recipe.seed,
                               val_fraction=cfg.val_fraction, subset=cfg.subset, test_subset=cfg.test_subset,
                               per_class=cfg.per_class, fit=cfg.resize)  # fmt: skip
    if distributed.is_main():
        for note in folder.notes:
            say(note)
    if cfg.cache is True or (cfg.cache == "auto" and not reads_into_memory(recipe, folder)):
        folder = with_decode_cache(folder, loader_workers(recipe))
    return folder


def reads_into_memory(recipe: Recipe, folder: ImageFolder) -> bool:
    """Whether the run decodes `folder` into memory (data.in_memory; `auto`: when it fits), as hasten/run/build.py
    decides it."""
    cfg = recipe.data
    return cfg.in_memory is True or (cfg.in_memory == "auto" and fits_in_memory(folder, available_memory_bytes()))


def with_decode_cache(folder: ImageFolder, workers: int) -> ImageFolder:
    """`folder` reading its images from the decode cache (hasten/data/foldercache.py), each split decoded into it
    now (by `workers` DataLoader workers) when no earlier run has; said in one line. Where the disk has not the
    room, or the cache cannot be written, said in one line too, and `folder` as it was: decoded each epoch.

    Under torchrun each rank that finds no cache decodes its own (they write the same file name, and the last
    rename wins): making the others wait for the main process would hold them in a collective past its timeout
    while a large folder decodes."""
    speak = distributed.is_main()
    plans = foldercache.plan_cache(folder)
    where = foldercache.cache_dir()
    need = foldercache.missing_bytes(plans)
    try:
        free = foldercache.free_bytes() if need else 0
    except OSError as error:
        return _streamed(folder, f"cannot read {where}: {error.strerror or error}", speak)
    if need and not foldercache.fits_on_disk(plans, free):
        room = f"{format_bytes(need)} (and {format_bytes(foldercache.DISK_HEADROOM)} to spare)"
        return _streamed(folder, f"decoding the folder needs {room} in {where}, {format_bytes(free)} free", speak)
    if speak and need:
        count = sum(plan.shape[0] for plan in plans if plan.found is None)
        say(f"data.cache: decoding {count:,} images once into {where} ({format_bytes(need)}); later epochs and runs "
            "read them from there")  # fmt: skip
    elif speak:
        say(f"data.cache: reading the {sum(plan.shape[0] for plan in plans):,} images decoded earlier from {where}")
    try:
        return foldercache.fill_cache(folder, plans, workers)
    except OSError as error:
        return _streamed(folder, f"cannot write {error.filename or where}: {error.strerror or error}", speak)


def _streamed(folder: ImageFolder, why: str, speak: bool) -> ImageFolder:
    if speak:
        say(f"data.cache: {why}; the images are decoded from the files each epoch instead")
    return folder


def eval_batch_size(recipe: Recipe, device: torch.device, image_shape: tuple[int, ...]) -> int:
    """`train.eval_batch_size`, or for `auto` the rule's batch for (C, H, W) images on this device at the recipe's
    precision (hasten/tune/rules.py's eval_batch; an undecided precision counts as fp32's four bytes)."""
    asked = recipe.train.eval_batch_size
    if asked != "auto":
        return asked
    height, width = int(image_shape[-2]), int(image_shape[-1])
    return rules.eval_batch(device.type, height, width, rules.element_bytes(recipe.precision))


def loader_options(
    recipe: Recipe,
    mean: Tensor,
    std: Tensor,
    device: torch.device,
    image_shape: tuple[int, ...],
    rank: int = 0,
    world_size: int = 1,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The keyword arguments of the run's training and test loaders (`ShardedEpochs`'s options), with the
    normalisation statistics `mean` and `std` of its training images."""
    aug, cfg = recipe.data.augment, recipe.train
    common = dict(mean=mean, std=std, channels_last=cfg.channels_last, device=device, rank=rank, world_size=world_size)
    augment = Augment(aug.flip, aug.translate) if (aug.flip or aug.translate) else None
    train = dict(batch_size=cfg.batch_size, shuffle=True, seed=recipe.seed, augment=augment, remainder=cfg.remainder)
    test = dict(batch_size=eval_batch_size(recipe, device, image_shape), remainder="split")
    return train | common, test | common


def loader_workers(recipe: Recipe) -> int:
    """DataLoader workers for the data paths that decode or fetch in workers: data.workers, else the default."""
    return default_workers() if recipe.data.workers is None else recipe.data.workers


MAPPED_SHARE = 0.5  # a decode cache of at most this share of the memory available stays in the page cache


def placed_workers(recipe: Recipe, data: Any) -> int:
    """data.workers as a run decides it: as given; unset, none for a folder read from its decode cache that the
    page cache can hold (its batches are copies of rows of the map, cheaper in the main process than sent from a
    worker: 4x less time an epoch without a model, benchmarks/folder_cache.py), else the machine's default. A
    larger cache keeps the workers, whose reads from the disk then overlap the training."""
    if recipe.data.workers is None and isinstance(data, ImageFolder) and data.train.cached is not None:
        if decoded_bytes(data) <= MAPPED_SHARE * available_memory_bytes():
            return 0
    return loader_workers(recipe)
