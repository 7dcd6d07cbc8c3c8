"""The user's own model and data, beside the recipe: from Python (`hasten.train(recipe, model=..., data=...)`)
or from YAML by import path (`model.name=import model.target=pkg.mod:fn model.args={...}`, the same for data),
the `class_path`/`init_args` idea of LightningCLI.

The recipe stays the single source of settings; these functions only turn the user's objects into what
`build` needs (a model, an in-memory or streamed dataset), check them before training starts, and record in
the recipe what was used, so the run folder's recipe.yaml says which model (import path and arguments, or
class and parameter count) and which class names a run trained.

The trust boundary (the idea of Hugging Face's `trust_remote_code=False`): a recipe read back from a run folder,
checkpoint or export is data, not a program. Code that rebuilds a run from such a recipe does it inside
`embedded_recipe(source, trust)`, and there `import_target` imports nothing the recipe names unless the user
named the same target themselves or passed `--trust-code` (`trust_code=True`): the refusal names the target
and the flag. The gate sits in `import_target`, the one function that turns a recipe's import path into code.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import sys
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hasten.config import ModelConfig, Recipe, validate
from hasten.data.datasets import ImageDataset
from hasten.data.imagefolder import ImageFolder, ImageFolderLoader, default_workers, open_image_folder
from hasten.data.loader import Augment
from hasten.data.own import StreamedData, hold_out, own_data, stream_stats
from hasten.data.transforms import prepare
from hasten.errors import HastenError, RecipeError
from hasten.progress import say

USER_SOURCES = ("import", "object")  # model.name / data.name values that stand for the user's own objects
# keyword arguments a model or data target receives from hasten when its signature has them and the recipe's
# args do not set them: what the data says the model must take in and put out
SHAPE_ARGUMENTS = ("num_classes", "in_channels", "image_size")


class UntrustedCode(HastenError):
    """A run folder, checkpoint or export names code to import, and the user has not said to trust it (exit 2)."""


@dataclass(frozen=True)
class Trust:
    """Which import paths a recipe from a run folder, checkpoint or export may make hasten import: none by default;
    those the user names again (`named`: dotted key -> target, e.g. {"model.target": "pkg.nets:make"}); any with
    `code` (`--trust-code`, `trust_code=True`)."""

    code: bool = False
    named: Mapping[str, str] = field(default_factory=dict)

    def allows(self, key: str, target: str) -> bool:
        return self.code or self.named.get(key) == target


_EMBEDDED: ContextVar[tuple[str, Trust] | None] = ContextVar("hasten_embedded_recipe", default=None)


@contextlib.contextmanager
def embedded_recipe(source: str, trust: Trust) -> Iterator[None]:
    """Inside the block the recipe at work is `source`'s (a run folder, checkpoint or export): `import_target`
    imports only what `trust` allows. Nested blocks keep the outer (stricter or equal) source's name."""
    token = _EMBEDDED.set((source, trust))
    try:
        yield
    finally:
        _EMBEDDED.reset(token)


def check_trusted(path: str, key: str) -> None:
    """UntrustedCode when a recipe from a file (`embedded_recipe`) names `key`=`path` and the user did not trust it."""
    scope = _EMBEDDED.get()
    if scope is None or scope[1].allows(key, path):
        return
    source, _ = scope
    raise UntrustedCode(
        f"{source} names {key}={path}: hasten imports no code that a run folder, checkpoint or export names (it is "
        f"data, not a program). If you trust its author, pass --trust-code (Python: trust_code=True), or name the "
        f"same target yourself ({key}={path})"
    )


def import_target(path: str, key: str) -> Any:
    """The object at `path` ("package.module:name" or "package.module.name"), importable from sys.path or the
    current folder; RecipeError naming `key` and `path` otherwise. Inside `embedded_recipe`, UntrustedCode unless
    the user trusted it: checked before anything is imported."""
    check_trusted(path, key)
    module_name, sep, attribute = path.partition(":")
    if not sep:
        module_name, _, attribute = path.rpartition(".")
    if not module_name or not attribute:
        raise RecipeError(f"{key}={path}: write an import path as package.module:name")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        here = str(Path.cwd())
        if here in sys.path or not isinstance(error, ModuleNotFoundError):
            raise RecipeError(f"{key}={path}: cannot import module {module_name!r} ({error})") from None
        sys.path.append(here)  # the `hasten` script does not look in the current folder; `python -m hasten` does
        return import_target(path, key)
    target: Any = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise RecipeError(f"{key}={path}: module {module_name!r} has no attribute {attribute!r}")
        target = getattr(target, part)
    return target


def call_target(target: Any, args: dict[str, Any], key: str, **shape: Any) -> Any:
    """`target(**args)`, adding each of `shape` (SHAPE_ARGUMENTS) that its signature takes and `args` lacks."""
    if not callable(target):
        raise RecipeError(f"{key}: {target!r} is not callable")
    try:
        parameters = inspect.signature(target).parameters
    except (TypeError, ValueError):  # a builtin without a signature: pass args alone
        parameters = {}
    extra = {name: value for name, value in shape.items() if name in parameters and name not in args}
    try:
        return target(**args, **extra)
    except TypeError as error:  # wrong or missing arguments: name the key the user can fix
        raise RecipeError(f"{key}: calling {getattr(target, '__qualname__', target)} failed: {error}") from None


def describe_class(obj: object) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


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
        options = dict(subset=cfg.subset, test_subset=cfg.test_subset, per_class=cfg.per_class, seed=recipe.seed)
        return open_image_folder(data, size=cfg.size, rgb=cfg.rgb, label_noise=cfg.label_noise,
                                 val_fraction=cfg.val_fraction, **options)  # fmt: skip
    workers = default_workers() if cfg.workers is None else cfg.workers
    loaded = own_data(data, classes=cfg.classes, val_fraction=cfg.val_fraction, seed=recipe.seed, subset=cfg.subset,
                      test_subset=cfg.test_subset, workers=workers)  # fmt: skip
    if isinstance(loaded, ImageDataset):
        options = dict(per_class=cfg.per_class, label_noise=cfg.label_noise, size=cfg.size, rgb=cfg.rgb)
        return prepare(loaded, seed=recipe.seed, **options)
    unsupported = [k for k in ("per_class", "size", "rgb") if getattr(cfg, k) is not None]
    unsupported += ["label_noise"] if cfg.label_noise else []
    if unsupported:
        raise RecipeError(
            f"data.{unsupported[0]}: not applied to a streamed Dataset; do it in the Dataset (its transform), or "
            "give the data as (images, labels) arrays"
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
    aug = recipe.data.augment
    mean, std = stream_stats(data.train, seed=recipe.seed)
    workers = default_workers() if recipe.data.workers is None else recipe.data.workers
    common = dict(mean=mean, std=std, channels_last=recipe.train.channels_last, device=device, workers=workers,
                  rank=rank, world_size=world_size)  # fmt: skip
    train = ImageFolderLoader(
        data.train.batches(),  # type: ignore[arg-type]  # any batch source: len() and [list of indices]
        recipe.train.batch_size,
        shuffle=True,
        seed=recipe.seed,
        augment=Augment(aug.flip, aug.translate) if (aug.flip or aug.translate) else None,
        remainder=recipe.train.remainder,
        **common,
    )
    test = ImageFolderLoader(data.test.batches(), recipe.train.eval_batch_size, remainder="split", **common)  # type: ignore[arg-type]
    return train, test


def own_model(config: ModelConfig, model: Any, image_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """The user's model: `model`, an nn.Module or a callable returning one (a class, a factory: called after the
    run's seed is set, with num_classes / in_channels / image_size when it takes them), or with None the
    recipe's model.target called with model.args (and those three the same way). Zero-init applies where the
    model has residual blocks ending in batch norm; elsewhere a note says it was skipped."""
    key = "model"
    if model is None:
        if config.name != "import":
            raise RecipeError(
                "model.name=object: this run's model was a Python object; pass it again: hasten.train(..., model=...)"
            )
        model, key = import_target(config.target or "", "model.target"), f"model.target={config.target}"
    if not isinstance(model, nn.Module):
        shape = dict(num_classes=num_classes, in_channels=image_shape[0], image_size=tuple(image_shape[1:]))
        model = call_target(model, config.args if key != "model" else {}, key, **shape)
    if not isinstance(model, nn.Module):
        raise RecipeError(f"{key}: expected an nn.Module (or a callable returning one), got {type(model).__name__}")
    if not any(p.requires_grad for p in model.parameters()):
        raise RecipeError(f"{key}: the model {type(model).__name__} has no trainable parameters")
    if config.zero_init_residual:
        from hasten.tricks.zero_init import zero_init_residual

        if not zero_init_residual(model):
            say(
                f"model.zero_init_residual: {type(model).__name__} has no residual blocks ending in batch norm "
                "(hasten.models.Residual, or a module with a `last_bn` BatchNorm attribute); skipped"
            )
    return model


def check_model(model: nn.Module, image_shape: tuple[int, ...], num_classes: int, device: torch.device) -> None:
    """Before training: the model maps a batch of 2 images of `image_shape` to (2, num_classes) logits; a
    RecipeError naming the shapes otherwise. Runs in eval mode without gradients, on zeros (no RNG drawn, no
    batch-norm statistics changed)."""
    name = type(model).__name__
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(torch.zeros(2, *image_shape, device=device))
    except Exception as error:  # any failure of the user's forward: say what it was given
        raise RecipeError(
            f"model {name}: its forward fails on a batch of 2 images of shape {tuple(image_shape)} (C, H, W): "
            f"{type(error).__name__}: {error}"
        ) from None
    finally:
        model.train(was_training)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (2, num_classes):
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise RecipeError(
            f"model {name}: returns {got} for a batch of 2 images of shape {tuple(image_shape)}; it must return "
            f"class logits of shape (2, {num_classes}) for the data's {num_classes} classes (labels "
            f"0..{num_classes - 1}; give the class names, data.classes, if there are more than the labels show)"
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
