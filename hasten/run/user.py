"""The user's own model and data in a run: from Python (`hasten.train(recipe, model=..., data=...)`) or by import
path (`data.name=import data.target=pkg.mod:fn data.args={...}`, the same for the model).

The recipe stays the single source of settings; these functions only turn the user's objects into what `build`
needs (an in-memory or streamed dataset; the model is hasten/models/user.py's), and record in the recipe what was
used, so the run folder's recipe.yaml says which model (import path and arguments, or class and parameter count)
and which class names a run trained.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from hasten.data.datasets import ImageDataset
from hasten.data.imagefolder import ImageFolder, ImageFolderLoader
from hasten.data.transforms import prepare
from hasten.data.user import StreamedData, hold_out, own_data, stream_stats
from hasten.engine import distributed
from hasten.errors import RecipeError
from hasten.progress import say
from hasten.recipe.schema import Recipe, validate
from hasten.recipe.trust import USER_SOURCES, call_target, describe_class, import_target
from hasten.run.loading import loader_options, loader_workers, open_folder


def describe_data(data: Any) -> str:
    """What a data object was, for recipe.yaml: a folder path, a Dataset's class, arrays' type, shape and dtype."""
    if isinstance(data, (str, Path)):
        return str(data)
    if isinstance(data, (torch.Tensor,)) or hasattr(data, "shape"):
        return f"{type(data).__module__}.{type(data).__name__} {tuple(data.shape)} {data.dtype}"
    if isinstance(data, (tuple, list)):
        return "(" + ", ".join(describe_data(part) for part in data if not isinstance(part, (list, tuple)) or
                               part and not isinstance(part[0], str)) + ")"  # fmt: skip
    return describe_class(data)


def load_data(recipe: Recipe, data: Any = None) -> ImageDataset | StreamedData | ImageFolder:
    """The user's data (`data`, or the recipe's data.target) with the recipe's data keys applied."""
    cfg = recipe.data
    if data is None:
        if cfg.name != "import":
            raise RecipeError(
                "data.name=object: this run's data was a Python object; pass it again: hasten.train(..., data=...)"
            )
        data = call_target(import_target(cfg.target or "", "data.target"), cfg.args, "data.target")
    if isinstance(data, (str, Path)):  # an image folder
        return open_folder(recipe, data)
    loaded = own_data(data, classes=cfg.classes, val_fraction=cfg.val_fraction, seed=recipe.seed, subset=cfg.subset,
                      test_subset=cfg.test_subset, workers=loader_workers(recipe), size=cfg.size, rgb=cfg.rgb,
                      fit=cfg.resize)  # fmt: skip
    if distributed.is_main():  # what was decided about the images' size and channels, said once
        for note in loaded.notes:
            say(note)
    if isinstance(loaded, ImageDataset):  # data.size and data.rgb are applied: own_data brought every image to them
        return prepare(loaded, seed=recipe.seed, per_class=cfg.per_class, label_noise=cfg.label_noise)
    unsupported = ["per_class"] if cfg.per_class is not None else []
    unsupported += ["label_noise"] if cfg.label_noise else []
    if unsupported:
        raise RecipeError(
            f"data.{unsupported[0]}: not applied to a streamed Dataset; do it in the Dataset, or give the data as "
            "(images, labels) arrays"
        )
    return loaded


def builtin_holdout(recipe: Recipe, data: ImageDataset) -> ImageDataset:
    """A shipped dataset with data.val_fraction: its evaluation split held out of its training images."""
    return hold_out(data, recipe.data.val_fraction, recipe.seed) if recipe.data.val_fraction else data


def streamed_loaders(
    recipe: Recipe, data: StreamedData, device: torch.device, rank: int = 0, world_size: int = 1
) -> tuple[ImageFolderLoader, ImageFolderLoader]:
    """A Dataset streamed like an image folder: each rank's shard of the epoch's seeded order, whole batches
    fetched by DataLoader workers, augmented and normalised on the main process as the in-memory path does."""
    mean, std, data.value_range = stream_stats(data.train, seed=recipe.seed)  # the range: for summary.json's units
    train, test = loader_options(recipe, mean, std, device, data.image_shape, rank, world_size)
    workers = loader_workers(recipe)
    # any batch source will do (len() and [list of indices]), not only an image folder's decoder
    return (
        ImageFolderLoader(data.train.batches(), workers=workers, **train),  # type: ignore[arg-type]
        ImageFolderLoader(data.test.batches(), workers=workers, **test),  # type: ignore[arg-type]
    )


def recorded(recipe: Recipe, model: nn.Module, model_given: bool, data: Any, classes: list[str]) -> Recipe:
    """The recipe as recipe.yaml records it: the model object's class and parameter count, the data object's
    type, the class names; import paths and their args are already in it."""
    raw = recipe.model_dump(mode="json")
    raw["model"]["parameters"] = sum(p.numel() for p in model.parameters())
    if model_given:
        raw["model"]["name"], raw["model"]["target"] = "object", describe_class(model)
    if data is not None:
        raw["data"]["name"] = "object"
        raw["data"]["target"] = describe_data(data)
    raw["data"]["classes"] = list(classes)
    return validate(raw, "recorded recipe")


def user_objects(recipe: Recipe, model: Any, data: Any) -> bool:
    """Whether the run involves the user's own model or data (so `build` checks them and records them)."""
    given = model is not None or data is not None
    return given or recipe.model.name in USER_SOURCES or recipe.data.name in USER_SOURCES
