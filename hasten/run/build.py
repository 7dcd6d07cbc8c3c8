"""Recipe -> the objects a run needs: data loaders, model, optimizer, LR schedule, precision, hooks.

`train(recipe)` is the library entry point that `hasten train` calls.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.optim.swa_utils import update_bn

from hasten.clock import Clock
from hasten.data import ImageDataset, load_dataset
from hasten.data.imagefolder import (
    BatchDecoder,
    ImageFolder,
    ImageFolderLoader,
    fits_in_memory,
    folder_stats,
    open_image_folder,
    read_into_memory,
)
from hasten.data.loader import InMemoryLoader, channel_stats
from hasten.data.preprocessing import dataset_summary
from hasten.data.registry import mirror_invariant
from hasten.data.transforms import prepare
from hasten.data.user import StreamedData
from hasten.engine import distributed, step
from hasten.engine.compiling import compile_model
from hasten.engine.distributed import DistEnv, world_size
from hasten.engine.memory import available_memory_bytes
from hasten.engine.optimizers import Muon, muon_groups
from hasten.engine.precision import Precision, check_precision, make_precision
from hasten.engine.schedules import Scheduler, asked_rise_steps, rise_steps, scale_lr, scheduler
from hasten.errors import CheckpointError, DataError, HastenError, RecipeError
from hasten.models import build_model
from hasten.models.pretrained import pretrained_from_config, save_weights  # Freeze registers here
from hasten.models.user import check_model, own_model
from hasten.progress import say
from hasten.recipe.schema import PRECISION_MODES, OptimConfig, Recipe, apply_overrides, dotted, to_yaml, validate
from hasten.recipe.trust import USER_SOURCES
from hasten.run.loading import loader_options, loader_workers
from hasten.run.trainer import Hooks, Plan, Saving, Trainer
from hasten.run.user import builtin_holdout, load_data, recorded, streamed_loaders, user_objects
from hasten.runfolder.checkpoint import checkpoints_in, latest_usable, load_checkpoint, remove_stale_temporaries
from hasten.runfolder.folder import RunLock, check_resume_recipe, claim_fresh, recipe_changes
from hasten.runfolder.log import RunLog
from hasten.techniques import Context, Technique, techniques
from hasten.techniques.activation_checkpointing import checkpoint_activations
from hasten.techniques.discriminative import discriminative_groups
from hasten.tune import autotune, rules


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def run_dir(recipe: Recipe) -> Path:
    return Path(recipe.run.dir or Path("runs") / recipe.name)


def dataset(recipe: Recipe) -> ImageDataset | ImageFolder:
    """The recipe's dataset, cut to `data.subset` / `data.test_subset` when given, with `data.per_class`,
    `data.label_noise`, `data.size` and `data.rgb` applied. An image folder is scanned, not read into memory.
    A file or folder that cannot be read (permissions, a vanished disk) is a DataError naming it."""
    try:
        return _dataset(recipe)
    except OSError as error:
        where = error.filename or recipe.data.root or recipe.data.name
        raise DataError(f"data: cannot read {where}: {error.strerror or error}") from None


def _dataset(recipe: Recipe) -> ImageDataset | ImageFolder:
    cfg = recipe.data
    if cfg.name in USER_SOURCES:  # data.target's function (hasten/run/user.py)
        return load_data(recipe)
    if cfg.name == "imagefolder":
        options = dict(subset=cfg.subset, test_subset=cfg.test_subset, per_class=cfg.per_class, seed=recipe.seed)
        folder = open_image_folder(cfg.root, size=cfg.size, rgb=cfg.rgb, label_noise=cfg.label_noise,
                                   val_fraction=cfg.val_fraction, **options)  # fmt: skip
        if cfg.in_memory is True or (cfg.in_memory == "auto" and fits_in_memory(folder, available_memory_bytes())):
            return read_into_memory(folder, loader_workers(recipe))  # decoded once: the in-memory loader's fast path
        return folder
    data = load_dataset(cfg.name, cfg.root, download=cfg.download, synthetic_size=cfg.synthetic_size, seed=recipe.seed)
    if cfg.subset:
        data.train_images, data.train_labels = data.train_images[: cfg.subset], data.train_labels[: cfg.subset]
    if cfg.test_subset:
        data.test_images, data.test_labels = data.test_images[: cfg.test_subset], data.test_labels[: cfg.test_subset]
    options = dict(per_class=cfg.per_class, label_noise=cfg.label_noise, size=cfg.size, rgb=cfg.rgb)
    return builtin_holdout(recipe, prepare(data, seed=recipe.seed, **options))


def loaders(
    recipe: Recipe, data: ImageDataset | ImageFolder, device: torch.device, rank: int = 0, world_size: int = 1
) -> tuple[InMemoryLoader, InMemoryLoader] | tuple[ImageFolderLoader, ImageFolderLoader]:
    """Training and test loaders; normalisation statistics come from the training images. In-memory data is
    sliced into batches; an image folder is decoded by DataLoader workers. Their options: `loader_options`."""
    if isinstance(data, StreamedData):  # a user's Dataset, streamed by DataLoader workers
        return streamed_loaders(recipe, data, device, rank, world_size)
    if isinstance(data, ImageFolder):
        train, test = loader_options(recipe, *folder_stats(data, seed=recipe.seed), device, rank, world_size)
        workers = loader_workers(recipe)
        return (
            ImageFolderLoader(BatchDecoder(data.train, data.mode, data.size, data.resize), workers=workers, **train),
            ImageFolderLoader(BatchDecoder(data.test, data.mode, data.size, data.resize), workers=workers, **test),
        )
    train, test = loader_options(recipe, *channel_stats(data.train_images), device, rank, world_size)
    train_loader = InMemoryLoader(data.train_images, data.train_labels, **train)
    return train_loader, InMemoryLoader(data.test_images, data.test_labels, **test)


def train_size(data: ImageDataset | ImageFolder | StreamedData) -> int:
    """Training images in the dataset (all ranks together)."""
    return len(data.train.labels) if isinstance(data, ImageFolder | StreamedData) else len(data.train_labels)


def check_training_data(recipe: Recipe, data: ImageDataset | ImageFolder | StreamedData) -> None:
    """What no run can train on, refused before anything is built: fewer than two classes among the training
    labels (a classifier of one class scores 100% and learns nothing), and `data.classes` that are not the class
    names of a dataset that brings its own (a registered dataset, an image folder)."""
    labels = data.train.labels if isinstance(data, ImageFolder | StreamedData) else data.train_labels
    present = labels.unique().tolist() if len(labels) else []
    if len(present) < 2:
        names = [data.classes[i] for i in present if 0 <= i < len(data.classes)]
        what = f"only class {names[0]!r}" if names else "no labelled image"
        raise DataError(
            f"data: the {len(labels):,} training image(s) hold {what}: a classifier needs at least 2 classes "
            f"(data.name={recipe.data.name}" + (f", data.root={recipe.data.root}" if recipe.data.root else "") + ")"
        )
    given = recipe.data.classes
    if given is not None and recipe.data.name not in USER_SOURCES and list(given) != list(data.classes):
        shown = ", ".join(map(str, data.classes[:12])) + (", ..." if len(data.classes) > 12 else "")
        raise RecipeError(
            f"data.classes: {list(given)} are not the {len(data.classes)} classes of {recipe.data.name} ({shown}); "
            "leave data.classes out (it names the labels of your own data)"
        )


BYTES_PER_PARAMETER = 8  # the least any training keeps per parameter: its fp32 weight and its gradient


def check_model_size(recipe: Recipe, image_shape: tuple[int, ...], num_classes: int, device: torch.device) -> None:
    """A built-in model whose parameters would not fit in this machine's memory (`model.width=100000`) is refused
    before any of it is allocated: it is first built on the meta device, which holds shapes and no data."""
    if recipe.model.name not in ("resnet", "sequential"):
        return
    try:
        with torch.device("meta"):
            probe = build_model(recipe.model, image_shape, num_classes)
    except HastenError:
        raise
    except Exception:  # noqa: BLE001 - whatever fails here fails in the real build too, which says it
        return
    count = sum(p.numel() for p in probe.parameters())
    if device.type == "cuda":
        have = torch.cuda.get_device_properties(device).total_memory
    else:
        have = available_memory_bytes()
    if count * BYTES_PER_PARAMETER > have:
        from hasten.engine.memory import format_bytes

        keys = "model.layers" if recipe.model.name == "sequential" else "model.width, model.widths or model.blocks"
        raise RecipeError(
            f"model: the recipe's {recipe.model.name} has {count:,} parameters, whose weights and gradients alone "
            f"take {format_bytes(count * BYTES_PER_PARAMETER)}, more than the {format_bytes(have)} this machine has "
            f"free: make it smaller ({keys})"
        )


def check_batches(train_loader: Any, test_loader: Any, world: int) -> None:
    """A training set too small for a batch of two on every rank, or an empty evaluation split: a clear error
    before anything is built over them."""
    if len(train_loader) == 0:
        raise DataError(
            f"data: {train_loader.num_samples} training image(s) over {world} process(es): too few for a training "
            "batch of at least 2 images on each; give more training data"
        )
    if test_loader.num_samples == 0:
        raise DataError("data: the evaluation split holds no images")


def check_batch_norm_batch(model: nn.Module, recipe: Recipe) -> None:
    """A batch of one image for a model with batch norm, which cannot normalise one example in training."""
    norms = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    if norms and recipe.train.batch_size == 1:
        raise RecipeError(
            "train.batch_size: 1 image a batch, but the model has batch norm, which cannot normalise a single "
            "example in training: use at least 2"
        )


MIN_AUTO_BATCH = rules.MIN_BATCH  # train.min_steps_per_epoch halves the batch no further


def steps_batch(images: int, batch: int, accumulate: int, world: int, min_steps: int) -> int:
    """The largest batch <= `batch`, halving (not below MIN_AUTO_BATCH), at which an epoch of `images` split over
    `world` ranks with `accumulate` micro-batches per step has at least `min_steps` optimizer steps."""
    while batch > MIN_AUTO_BATCH and rules.steps_per_epoch(images, batch, world, accumulate) < min_steps:
        batch = max(batch // 2, MIN_AUTO_BATCH)
    return batch


def resolve_for_data(recipe: Recipe, data: ImageDataset | ImageFolder, world: int = 1) -> tuple[Recipe, list[str]]:
    """The recipe with its data-dependent settings decided for `data`, and one note per decision for the opening
    lines: flips and flip TTA where the dataset allows them (`auto`; alternating flips where it does not get a
    warning), training and TTA shifts of at most `data.augment.translate_max_fraction` of the image side, and a batch
    small enough to leave `train.min_steps_per_epoch` optimizer steps an epoch. A TTA shift of half the image side
    or more is a RecipeError. The returned recipe is what recipe.yaml records."""
    resolved, notes = recipe.model_copy(deep=True), []
    allowed = mirror_invariant(data.name)
    why = f"{data.name} is mirror-invariant" if allowed else f"a mirror may change the class of {data.name} images"
    aug, train_cfg = resolved.data.augment, resolved.train
    if aug.flip == "auto":
        aug.flip = allowed
        notes.append(f"flips {'on' if allowed else 'off'} ({why}; data.augment.flip=auto)")
    elif aug.flip == "alternate" and not allowed:  # asked for by name: honoured, but not silently
        notes.append(f"warning: alternating flips on as asked, though {why} (data.augment.flip=alternate)")
    side = min(data.image_shape[1:])
    if 2 * train_cfg.tta_translate >= side:
        raise RecipeError(
            f"train.tta_translate: {train_cfg.tta_translate} pixels is not below half the {side}-pixel side of the "
            f"{data.name} images; use at most {(side - 1) // 2}, e.g. 2, or 0 for off"
        )
    most = int(side * aug.translate_max_fraction)
    if aug.translate != "auto" and aug.translate > most:
        notes.append(
            f"translate {aug.translate} -> {most} pixels: at most {aug.translate_max_fraction:g} of the {side}-pixel "
            "images (data.augment.translate_max_fraction)"
        )
        aug.translate = most
    if train_cfg.tta_translate > most:  # shifts the size of those the training never showed (8x8 digits: none)
        notes.append(
            f"TTA shift {train_cfg.tta_translate} -> {most} pixels: at most {aug.translate_max_fraction:g} of the "
            f"{side}-pixel images, as the training shifts (data.augment.translate_max_fraction)"
        )
        train_cfg.tta_translate = most
    if train_cfg.tta_flip == "auto":
        train_cfg.tta_flip = allowed
        if allowed:
            notes.append("flip TTA on (train.tta_flip=auto)")
    if train_cfg.min_steps_per_epoch and train_cfg.batch_size != "auto":  # auto: the batch rule sees the steps
        n, asked = train_size(data), train_cfg.batch_size
        batch = steps_batch(n, asked, train_cfg.accumulate, world, train_cfg.min_steps_per_epoch)
        if batch != asked:
            train_cfg.batch_size = batch
            steps = rules.steps_per_epoch(n, batch, world, train_cfg.accumulate)
            notes.append(
                f"batch {asked} -> {batch}: {n:,} training images give {steps} steps an epoch "
                f"(train.min_steps_per_epoch={train_cfg.min_steps_per_epoch}; 0 keeps the batch)"
            )
    return resolved, notes


def global_batch(recipe: Recipe) -> int:
    """Examples per optimizer step across all processes: batch size x accumulation steps x world size.

    The one place this is computed: the LR scaling rule and everything that reports the batch use it.
    """
    return recipe.train.batch_size * recipe.train.accumulate * world_size()


AUTO_PLACEHOLDER_LR = 0.01  # optim.lr=auto: what the optimizer is built with until the range test has picked


def scaled_lr(config: OptimConfig, global_batch: int) -> float:
    """`optim.lr` scaled from `optim.base_batch` to `global_batch` (Goyal et al., 2017: linear; or sqrt)."""
    lr = AUTO_PLACEHOLDER_LR if config.lr == "auto" else config.lr
    return scale_lr(lr, config.base_batch, global_batch, config.scaling)


def lr_scale(recipe: Recipe) -> float:
    """The factor the batch-size rule multiplied `optim.lr` by (1 without `optim.base_batch`)."""
    return scale_lr(1.0, recipe.optim.base_batch, global_batch(recipe), recipe.optim.scaling)


def steps_per_epoch(recipe: Recipe, train_loader: InMemoryLoader) -> int:
    """Optimizer steps per epoch of the recipe's run over `train_loader` (hasten.engine.step.steps_per_epoch)."""
    return step.steps_per_epoch(len(train_loader), recipe.train.accumulate)


def optimizer_steps(recipe: Recipe, train_loader: InMemoryLoader) -> int:
    """Optimizer steps in the whole run: what the LR schedule spans."""
    return recipe.train.epochs * steps_per_epoch(recipe, train_loader)


def bn_calibration(
    loader: InMemoryLoader, autocast: Callable[[], contextlib.AbstractContextManager], images: int
) -> Callable[[nn.Module], None]:
    """A function that recomputes a model's batch-norm statistics over the first `images` training images of the
    current epoch (as augmented for training, never mixed), under the run's autocast; with several processes
    the statistics are then averaged over the ranks, so every rank evaluates the same model."""

    def calibrate(module: nn.Module) -> None:
        count = max(1, -(-images // loader.batch_size))
        with autocast():
            update_bn(itertools.islice(loader.batches(0), count), module)
        if world_size() > 1:
            distributed.average_batch_norm_statistics(module)

    return calibrate


def first_train_images(loader: InMemoryLoader | ImageFolderLoader, count: int) -> Tensor:
    """The first `count` training images in stored order (all of them when fewer), normalised as the loader
    normalises its batches and not augmented: what whitening computes its filters from. The same on every rank:
    the in-memory images are sliced, a folder's or a user's Dataset's are decoded a batch at a time."""
    if isinstance(loader, InMemoryLoader):
        return loader.normalise(loader.images[:count])
    chunks, total = [], min(count, loader.num_samples)
    for start in range(0, total, loader.batch_size):
        item = loader.decoder[list(range(start, min(start + loader.batch_size, total)))]
        if isinstance(item, str):  # a decoding failure, reported by the decoder as text
            raise DataError(item)
        chunks.append(loader.normalise(item[0].to(loader.device)))
    return torch.cat(chunks)


def tricks(recipe: Recipe, model: nn.Module, rank: int = 0) -> tuple[Hooks, dict[str, Any]]:
    """The loop's hooks for the recipe's techniques, bound to the built `model`, and the stateful ones by name;
    for code that builds its own model (benchmarks). Random draws are seeded by (seed, rank)."""
    made = techniques(recipe, Context(rank=rank))
    for technique in made:
        technique.on_optimizer(model)
    hooks = Hooks.from_techniques(made)
    return hooks, hooks.stateful


def _at(made: list[Technique], point: str) -> list[Technique]:
    """The techniques that declare hook point `point`, in their order."""
    return [technique for technique in made if point in technique.hooks]


def optimizer(config: OptimConfig, groups: list[dict[str, Any]], lr: float) -> torch.optim.Optimizer:
    if config.name == "muon":  # the filters orthogonalised at optim.muon_lr, the rest Nesterov SGD at `lr`
        split = muon_groups(groups, lr, config.muon_lr, config.muon_momentum)
        if not any(group.get("orthogonalize") for group in split) and distributed.is_main():
            # a user's MLP, or every filter frozen (model.whiten): all of it is the Nesterov SGD part, said so
            say(
                "optim.name=muon: the model has no trainable convolution filters; every parameter takes Nesterov SGD "
                "at optim.lr"
            )
        return Muon(split, lr=lr, momentum=config.momentum, nesterov=config.nesterov and config.momentum > 0)
    if config.name == "sgd":
        return torch.optim.SGD(
            groups, lr=lr, momentum=config.momentum, nesterov=config.nesterov and config.momentum > 0
        )
    cls = torch.optim.AdamW if config.name == "adamw" else torch.optim.Adam
    try:  # torch's fused kernel: one pass over all the parameters (on CPU ~4x less step time than the loop)
        return cls(groups, lr=lr, betas=config.betas, fused=True)
    except (RuntimeError, ValueError):  # parameters on a device or in a dtype it does not serve
        return cls(groups, lr=lr, betas=config.betas)


@dataclass
class Parts:
    """Everything `build` makes from a recipe."""

    recipe: Recipe
    device: torch.device
    data: ImageDataset
    model: nn.Module
    train_loader: InMemoryLoader
    test_loader: InMemoryLoader
    optimizer: torch.optim.Optimizer
    scheduler: Scheduler
    precision: Precision
    lr: float  # the peak LR after the scaling rule
    hooks: Hooks  # from the recipe's technique objects: their loop hooks and, in `hooks.stateful`, their state
    compiled: bool = False  # train.compile asked for it and torch.compile worked
    machine_keys: tuple[str, ...] = ()  # keys set to auto that the start-up probe decided (hasten/tune/autotune.py)


def build(recipe: Recipe, model: Any = None, data: Any = None, clock: Clock | None = None) -> Parts:
    """The run's parts. `model` and `data` are the user's own (hasten/run/user.py: an nn.Module or a callable making
    one; arrays, a Dataset, a folder path, or (train, test[, class_names])); None: the recipe's.

    Two steps: `resolve` decides every setting the recipe leaves to the data, the machine or a resumed run and
    returns the recipe with those values in (what recipe.yaml records); `assemble` makes the objects from that
    recipe and never changes it.

    Under torchrun (several processes) this joins the process group first: each rank gets its own device,
    its shard of every epoch, its own random streams for augmentation, mixing and dropout, and the model
    wrapped in DistributedDataParallel; the model starts from the same weights everywhere (DDP broadcasts
    rank 0's)."""
    env = DistEnv.from_environ()
    device = distributed.device_for(env, recipe.device)
    distributed.init(env, device)
    clock = clock or Clock()  # marks where the start-up goes (hasten/clock.py)
    if recipe.train.threads:
        torch.set_num_threads(recipe.train.threads)
    if recipe.precision != "auto":  # a fixed mode the device cannot run fails here, before data is read
        check_precision(recipe.precision, device)
    seed_everything(recipe.seed)
    given_model, given_data = model, data
    data = dataset(recipe) if data is None else load_data(recipe, data)
    clock.mark("data")
    check_training_data(recipe, data)
    if given_model is not None:
        model = own_model(recipe.model, given_model, data.image_shape, len(data.classes))
    else:  # the recipe's: a built-in model or model.target's
        check_model_size(recipe, tuple(data.image_shape), len(data.classes), device)
        model = build_model(recipe.model, data.image_shape, len(data.classes))
    clock.mark("model")
    recipe, machine_keys = resolve(recipe, data, model, device, given_model, given_data)
    clock.mark("probe")
    return assemble(recipe, data, model, device, machine_keys, clock)


def resolve(
    recipe: Recipe, data: Any, model: nn.Module, device: torch.device, given_model: Any = None, given_data: Any = None
) -> tuple[Recipe, tuple[str, ...]]:
    """Every setting the recipe leaves open, decided once: flips, shifts and TTA from the data; the user's model
    and data recorded; precision, memory layout and batch from the machine (or as the run being resumed chose
    them); the budget from the data; optim.lr=auto by a range test. One line per decision is printed; the returned
    recipe holds the values (it is the one recipe.yaml records and `assemble` builds from, unchanged), with the keys
    the machine decided (a resume may decide them again)."""
    world = world_size()
    recipe, notes = resolve_for_data(recipe, data, world)
    if user_objects(recipe, given_model, given_data):  # fail before anything is timed or trained
        check_model(copy.deepcopy(model).to(device), data.image_shape, len(data.classes), device)
        recipe = recorded(recipe, model, given_model is not None, given_data, data.classes)
    resumed = resumed_choices(recipe)  # a resume continues with what its run chose: exact, as resumes are
    recipe, machine_keys, more = choose_on_machine(recipe, model, data, device, resumed)
    notes += more
    recipe, more = resolve_budget(recipe, data, world, resumed)
    notes += more
    if distributed.is_main():
        for note in notes:
            say(note)
    if recipe.optim.lr == "auto":  # last: the range test runs the run as decided so far
        recipe = resolve_lr(recipe, data, model, device)
    return recipe, machine_keys


def resolve_budget(
    recipe: Recipe, data: Any, world: int, resumed: dict[str, Any] | None = None
) -> tuple[Recipe, list[str]]:
    """`train.epochs: auto` decided from the training set and the batch (hasten/tune/rules.py), or as the run being
    resumed decided it; then `data.augment.translate: auto` from the images' side and the epochs."""
    if "auto" not in (recipe.train.epochs, recipe.data.augment.translate):
        return recipe, []
    recipe, notes = recipe.model_copy(deep=True), []
    if recipe.train.epochs == "auto" and resumed and "train.epochs" in resumed:
        recipe.train.epochs = resumed["train.epochs"]
        notes.append(f"train.epochs=auto -> {recipe.train.epochs}, as the run being resumed chose")
    elif recipe.train.epochs == "auto":
        images, batch = train_size(data), recipe.train.batch_size
        recipe.train.epochs = rules.auto_epochs(images, batch, world, recipe.train.accumulate)
        steps = recipe.train.epochs * rules.steps_per_epoch(images, batch, world, recipe.train.accumulate)
        notes.append(
            f"train.epochs=auto -> {recipe.train.epochs}: {steps:,} optimizer steps over {images:,} images "
            f"(at least {rules.RUN_STEPS} steps, {rules.MIN_EPOCHS}-{rules.MAX_EPOCHS} epochs)"
        )
    aug = recipe.data.augment
    if aug.translate == "auto":
        side = min(data.image_shape[1:])
        aug.translate = min(rules.auto_translate(side, recipe.train.epochs), int(side * aug.translate_max_fraction))
        notes.append(
            f"data.augment.translate=auto -> {aug.translate} pixel(s): {side}-pixel images, {recipe.train.epochs} "
            f"epochs (shifts in runs of {rules.AUTO_TRANSLATE_EPOCHS} epochs or more)"
        )
    return recipe, notes


def assemble(
    recipe: Recipe,
    data: Any,
    model: nn.Module,
    device: torch.device,
    machine_keys: tuple[str, ...] = (),
    clock: Clock | None = None,
    announce: bool = True,
) -> Parts:
    """The run's objects from the resolved `recipe`, which is not changed: loaders, the techniques and their hooks,
    the model on its device, layout and precision, the optimizer and its schedule; DDP around the model.
    `announce=False` (a trial assembly, for optim.lr=auto's range test) says nothing."""
    rank, world = distributed.rank(), world_size()
    clock = clock or Clock()
    scale = recipe.loss_scale
    precision = make_precision(recipe.precision, device, scale.init, scale.growth_interval)
    train_loader, test_loader = loaders(recipe, data, device, rank, world)
    check_batches(train_loader, test_loader, world)
    # the EMA's BN statistics, under the run's autocast
    calibrate = bn_calibration(train_loader, precision.autocast, recipe.tricks.ema_bn_images)
    context = Context(rank=rank, world_size=world, steps_per_epoch=steps_per_epoch(recipe, train_loader),
                      total_steps=optimizer_steps(recipe, train_loader), image_shape=tuple(data.image_shape),
                      calibrate=calibrate,
                      train_images=lambda count: first_train_images(train_loader, count))  # fmt: skip
    made = techniques(recipe, context)  # every technique the recipe turns on; each declares its hook points
    check_batch_norm_batch(model, recipe)
    for technique in _at(made, "on_model"):
        technique.on_model(model)
    if recipe.model.pretrained:
        report = pretrained_from_config(model, recipe.model)
        if announce:
            say(report.describe())
    model = model.to(device)
    if recipe.train.checkpoint_activations or recipe.train.checkpoint_modules:
        model = checkpoint_activations(model, recipe.train.checkpoint_modules)
    if recipe.train.channels_last:
        model = model.to(memory_format=torch.channels_last)
    if recipe.train.sync_batchnorm and world > 1:  # before the optimizer and EMA see the modules; keeps the params
        if device.type == "cpu":
            raise RecipeError(
                "train.sync_batchnorm: torch's SyncBatchNorm runs on GPUs only; CPU ranks keep their own batch "
                "statistics (set it false, or run on GPUs)"
            )
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = precision.prepare(model)
    lr = scaled_lr(recipe.optim, global_batch(recipe))
    decay = recipe.optim.weight_decay
    if recipe.optim.layer_lr_decay < 1:  # discriminative fine-tuning: per-layer LRs
        groups = discriminative_groups(model, lr, recipe.optim.layer_lr_decay, decay, no_bias_decay=False)
    else:
        groups = [{"params": [p for p in model.parameters() if p.requires_grad], "weight_decay": decay}]
    for technique in _at(made, "param_groups"):  # no-bias-decay
        groups = technique.param_groups(groups)
    opt = optimizer(recipe.optim, precision.optimizer_groups(groups), lr)  # fp16-master: the fp32 masters
    schedule = scheduler(opt, recipe.schedule, optimizer_steps(recipe, train_loader), lr_scale(recipe))
    for technique in _at(made, "on_optimizer"):  # the EMA's copy, Freeze: the optimizer holds every parameter
        technique.on_optimizer(model)
    hooks = Hooks.from_techniques(made)
    if world > 1:
        seed_everything((recipe.seed * 1_000_003 + rank) % 2**63)  # after the weights: dropout masks differ per rank
        model = distributed.wrap(model, device)  # after the EMA copy and the optimizer, which hold the inner model
    compiled = False
    if recipe.train.compile:  # last: the EMA copy above stays eager
        model, failure = compile_model(model, next(iter(train_loader))[0], precision.autocast)
        compiled = failure is None
        if failure:
            say(failure)
    parts = Parts(recipe, device, data, model, train_loader, test_loader, opt, schedule, precision, lr, hooks)
    parts.compiled, parts.machine_keys = compiled, machine_keys
    clock.mark("optimizer and techniques")
    return parts


MACHINE_KEYS = ("precision", "train.channels_last", "train.batch_size")  # decided by timing on this machine
RESUMED_KEYS = (*MACHINE_KEYS, "train.epochs")  # what an `auto` run records and its resume keeps


def _recorded_value(saved: dict[str, Any], key: str) -> Any:
    try:
        return dotted(saved, key)
    except KeyError:
        return None


def _valid_choice(key: str, value: Any) -> bool:
    if key == "precision":
        return value in PRECISION_MODES
    if key == "train.channels_last":
        return isinstance(value, bool)
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1  # batch, epochs


def resumed_choices(recipe: Recipe) -> dict[str, Any]:
    """What the run being resumed (resume=PATH or auto, an elastic restart) chose for the keys this recipe leaves
    `auto`, from its checkpoint's recipe (values checked before use); {} when nothing is resumed or left to choose."""
    asked = [key for key in RESUMED_KEYS if _recorded_value(recipe.model_dump(), key) == "auto"]
    if not asked:
        return {}
    found = resume_from(recipe, run_dir(recipe) / "checkpoints", announce=False)
    saved = found[1].get("recipe") if found else None
    if not isinstance(saved, dict):
        return {}
    chosen = {key: _recorded_value(saved, key) for key in asked}
    return {key: value for key, value in chosen.items() if _valid_choice(key, value)}


def probe_batch(recipe: Recipe, data: Any, device: torch.device, size: int) -> tuple[Tensor, Tensor]:
    """The first training batch of `size` images (per process), as the run's loader makes them (shuffled in the
    run's seeded order, augmented, normalised): what the start-up probe times."""
    trial = recipe.model_copy(deep=True)
    trial.train.batch_size = size
    if trial.data.augment.translate == "auto":  # decided with the budget, after the probe; no part of the step
        trial.data.augment.translate = 0
    train_loader, _ = loaders(trial, data, device, distributed.rank(), world_size())
    images, labels = next(iter(train_loader))
    return images.contiguous(), labels


def choose_on_machine(
    recipe: Recipe, model: nn.Module, data: Any, device: torch.device, resumed: dict[str, Any] | None = None
) -> tuple[Recipe, tuple[str, ...], list[str]]:
    """`precision`, `train.channels_last` and `train.batch_size` left `auto`, decided by timing the run's training
    step on this machine (hasten/tune/autotune.py; the batch by hasten/tune/rules.py's time rule), or as the run being
    resumed decided them (`resumed`). Returns the recipe holding the values chosen (recipe.yaml records them), the
    keys that were `auto`, and the lines that say what was chosen. The probe times copies of `model` and leaves the
    model and the random streams as they were."""
    values = {"precision": recipe.precision, "train.channels_last": recipe.train.channels_last,
              "train.batch_size": recipe.train.batch_size}  # fmt: skip
    asked = [key for key, value in values.items() if value == "auto"]
    if not asked:
        return recipe, (), []
    kept = {key: (resumed or {})[key] for key in asked if key in (resumed or {})}
    notes = [f"{', '.join(f'{k}=auto -> {v}' for k, v in kept.items())}, as the run being resumed chose"] * bool(kept)
    values |= kept
    options = autotune.candidates(values["precision"], values["train.channels_last"], device)
    world = world_size()
    images, accumulate = train_size(data), recipe.train.accumulate
    if values["train.batch_size"] == "auto":
        epochs = recipe.train.epochs if recipe.train.epochs != "auto" else None
        sizes = rules.batch_candidates(images, epochs, world, accumulate)
    else:
        sizes = [values["train.batch_size"]]
    choice = options[0]
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):  # dropout, DataLoader seeds
        batch = probe_batch(recipe, data, device, max(sizes)) if len(options) > 1 or len(sizes) > 1 else None
        if len(options) > 1:
            at = min(max(sizes), rules.PROBE_BATCH)
            probed = [key for key in ("precision", "train.channels_last") if key in asked and key not in kept]
            # timed here, or as timed before on this machine (the probe's cache), and said there
            choice = autotune.cached_probe(
                model, (batch[0][:at], batch[1][:at]), len(data.classes), options, probed
            ).choice
        if len(sizes) > 1:
            timed = rules.timed_sizes(sizes)
            measured, where = autotune.cached_batch_times(model, batch, len(data.classes), choice, timed)
            seconds = rules.step_time_line(measured, sizes)
            values["train.batch_size"] = rules.choose_batch(seconds)
            notes.append(f"{rules.describe_batch_choice(seconds, values['train.batch_size'], measured)}; {where}")
        elif values["train.batch_size"] == "auto":
            values["train.batch_size"] = sizes[0]
            notes.append(
                f"train.batch_size=auto -> {sizes[0]}: the smallest batch; {images:,} training images leave no "
                f"larger one {rules.MIN_RUN_STEPS} optimizer steps"
            )
    recipe = recipe.model_copy(deep=True)
    recipe.precision, recipe.train.channels_last = choice.precision, choice.channels_last
    recipe.train.batch_size = values["train.batch_size"]
    return recipe, tuple(key for key in asked), notes


def resolve_lr(recipe: Recipe, data: Any, model: nn.Module, device: torch.device) -> Recipe:
    """optim.lr=auto: a short LR range test picks the peak LR (lr_find.AUTO_RULE), run on a trial assembly of the
    run (a copy of `model` with the run's loader, batch hooks, precision and optimizer, built at a placeholder LR and
    then dropped); the returned recipe records it as `optim.lr` (per `optim.base_batch`). The random streams are
    left as they were."""
    from hasten.tune.lr_find import AUTO_RULE, AUTO_START, AUTO_STEPS, auto_lr, lr_find

    trial_recipe = recipe.model_copy(deep=True)
    trial_recipe.train.compile = False  # the sweep's few steps are not worth a compile
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        trial = assemble(trial_recipe, data, copy.deepcopy(model), device, announce=False)
        result = lr_find(trial, start=AUTO_START, steps=AUTO_STEPS)
    peak = auto_lr(result)
    recipe = recipe.model_copy(deep=True)
    scale = lr_scale(recipe)
    recipe.optim.lr = peak / scale
    if distributed.is_main():
        per = f" ({peak / scale:.4g} per {recipe.optim.base_batch})" if recipe.optim.base_batch else ""
        say(f"optim.lr=auto: peak LR {peak:.4g}{per} from a {len(result.lrs)}-step range test ({AUTO_RULE})")
    return recipe


def trainer_for(parts: Parts, plan: Plan, log: RunLog, saving: Saving | None = None) -> Trainer:
    """The loop over what `build` made, with the recipe's hooks."""
    loaders = (parts.train_loader, parts.test_loader)
    return Trainer(
        parts.model, parts.optimizer, parts.scheduler, parts.precision, loaders, plan, log, parts.hooks, saving
    )


def resume_from(recipe: Recipe, folder: Path, announce: bool = True) -> tuple[Path, dict[str, Any]] | None:
    """The checkpoint to continue from: `resume=PATH`, or with `resume=auto` (and after an elastic restart by
    torchrun) the newest complete one in the run's checkpoints folder; None to start afresh. With several
    processes rank 0 chooses and the others load the file it chose."""
    source = recipe.resume
    if source is None and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
        source = "auto"  # torchrun restarted the workers: continue from the last checkpoint
    if source is None:
        return None
    if source != "auto":
        return Path(source), load_checkpoint(source)
    found, error = None, None
    if distributed.is_main():
        try:
            found = latest_usable(folder)
            if found is None and checkpoints_in(folder):
                error = f"resume=auto: no usable checkpoint in {folder} (each was skipped, see the warnings)"
        except CheckpointError as failure:
            error = str(failure)
    chosen, error = distributed.broadcast_object((found[0] if found else None, error))
    if error:
        raise CheckpointError(error)
    if chosen is None:
        if distributed.is_main() and announce:
            say(f"resume=auto: no checkpoint in {folder} yet; starting afresh")
        return None
    return found if found is not None else (chosen, load_checkpoint(chosen, require_digest=True))


# above these a peak LR is almost surely a mistake (muon: the SGD part's optim.lr)
SAFE_PEAK_LR = {"sgd": 5.0, "adam": 0.05, "adamw": 0.05, "muon": 5.0}


def risky_settings(recipe: Recipe, parts: Parts) -> list[str]:
    """Values that are legal but almost surely wrong: a peak LR far above any that trains (after the scaling
    rule), a batch larger than the training set."""
    found, bound = [], SAFE_PEAK_LR[recipe.optim.name]
    if parts.lr > bound:
        found.append(
            f"peak LR {parts.lr:.4g} (optim.lr={recipe.optim.lr:g} scaled to the global batch "
            f"{global_batch(recipe)}) is above {bound:g}, where {recipe.optim.name} runs diverge"
        )
    images = train_size(parts.data)
    if recipe.train.batch_size > images:
        found.append(f"train.batch_size={recipe.train.batch_size} is larger than the {images:,} training images")
    return found


def divergence_advice(recipe: Recipe) -> list[str]:
    """What a run that diverged or does not learn is told to try, as overrides its own recipe accepts (each is
    validated against it: optim.lr=auto is offered only where the optimizer takes it): half the LR, the LR range
    test, a warm-up twice as long, half the batch."""
    lr = recipe.optim.lr
    advice = [f"optim.lr={lr / 2:.3g}"] if isinstance(lr, float) else []
    advice += ["optim.lr=auto", f"schedule.min_warmup_steps={max(2 * recipe.schedule.min_warmup_steps, 50)}"]
    batch = recipe.train.batch_size
    if isinstance(batch, int) and batch >= 2 * rules.MIN_BATCH:
        advice.append(f"train.batch_size={batch // 2}")
    raw = recipe.model_dump(mode="json")
    accepted = []
    for override in advice:
        try:
            validate(apply_overrides(raw, [override]))
        except RecipeError:
            continue
        accepted.append(override)
    return accepted


def evaluated_on(recipe: Recipe) -> str:
    """Which split every test_* metric of the run is measured on."""
    fraction = recipe.data.val_fraction
    return f"val: {fraction:g} of the training data held out (seed {recipe.seed})" if fraction else "test"


def claim_run_folder(
    recipe: Recipe, folder: Path, checkpoint: tuple[Path, dict[str, Any]] | None, machine_keys: Sequence[str] = ()
) -> None:
    """Before anything is written: a resume must continue the same run (the checkpoint's recipe), a fresh run
    must not mix with another run's files (hasten/runfolder/folder.py). Rank 0 checks; every rank gets its verdict."""
    error = None
    if distributed.is_main():
        try:
            if checkpoint is not None:
                saved = checkpoint[1].get("recipe")
                allowed = [*recipe.resume_allow_changes, *machine_keys]  # the probe may choose otherwise now
                check_resume_recipe(saved, recipe.model_dump(mode="json"), allowed, str(checkpoint[0]))
            elif int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == 0:  # a restart continues its own files
                claim_fresh(folder, recipe.run.overwrite, resuming=recipe.resume == "auto")
        except HastenError as failure:
            error = (type(failure), str(failure))
    error = distributed.broadcast_object(error)
    if error:
        raise error[0](error[1])


def train(
    recipe: Recipe,
    model: Any = None,
    data: Any = None,
    loss: Callable[[Tensor, Tensor], Tensor] | None = None,
    clock: Clock | None = None,
) -> dict[str, Any]:
    """Train the recipe (with the user's `model` and `data`, see `build`; `loss(logits, soft targets)` in place
    of the soft cross-entropy); writes the run folder and returns the summary. The folder is locked while the run
    writes it (hasten/runfolder/folder.py): two runs never share one. Wall-clock times count from `clock`'s start (the
    `hasten` command passes its process's start; by default, this call)."""
    clock = clock or Clock()
    clock.mark("start and imports")
    if DistEnv.from_environ().is_main:  # (before the process group is up: from the environment)
        say(f"run folder: {run_dir(recipe)}")
    parts = build(recipe, model, data, clock)
    recipe = parts.recipe  # what was used: data-dependent settings decided, the user's model and data recorded
    folder = run_dir(recipe)
    lock = RunLock(folder) if distributed.is_main() else contextlib.nullcontext()
    with lock:
        trainer, log = start_run(recipe, parts, folder, loss, clock)
        # signals stay caught until the run returns: a stop once the last epoch is done lets the summary be written
        # and the run end with 0 (its work is complete), instead of killing it mid-write
        try:
            with trainer.stop_on_signals():
                summary = trainer.fit()
                model = distributed.unwrap(parts.model)
                if recipe.run.save_weights and log.enabled:  # the weights evaluated: the EMA copy when there is one
                    save_weights(parts.hooks.eval_model(model) if parts.hooks.eval_model else model, log.dir)
                summary |= {"run_dir": str(log.dir), "lr": parts.lr, "global_batch": global_batch(recipe)}
                summary |= {"world_size": world_size(), "precision": recipe.precision}  # auto: as chosen
                summary |= {"channels_last": recipe.train.channels_last}
                summary |= dataset_summary(parts.data, parts.train_loader, parts.test_loader)  # for evaluate/predict
                summary["evaluated_on"] = evaluated_on(recipe)
                summary["wall_seconds"] = round(trainer.wall_seconds(), 3)  # everything, from the command's start
                log.summary(summary)
                distributed.barrier()  # the ranks end together, once rank 0 has written everything
        finally:
            log.close()
        return summary


def start_run(
    recipe: Recipe, parts: Parts, folder: Path, loss: Callable[[Tensor, Tensor], Tensor] | None, clock: Clock
) -> tuple[Trainer, RunLog]:
    """The loop over the built `parts`, ready in its (locked) run folder: resumed from a checkpoint when the recipe
    asks, the folder claimed, recipe.yaml written, the warnings and the resolved LR scaling said."""
    checkpoint = resume_from(recipe, folder / "checkpoints")  # before anything in the run folder is written
    claim_run_folder(recipe, folder, checkpoint, parts.machine_keys)
    log = RunLog(folder, enabled=distributed.is_main(), tensorboard=recipe.run.tensorboard)
    plan = Plan(
        epochs=recipe.train.epochs,
        num_classes=len(parts.data.classes),
        tta_flip=recipe.train.tta_flip,
        tta_translate=recipe.train.tta_translate,
        thresholds=recipe.run.thresholds,
        progress=recipe.run.progress,
        accumulate=recipe.train.accumulate,
        on_nan=recipe.train.on_nan,
        rise_steps=rise_steps(recipe.schedule, optimizer_steps(recipe, parts.train_loader), lr_scale(recipe)),
        clip_grad_norm=recipe.train.clip_grad_norm,
        eval_every_steps=recipe.train.eval_every_steps,
        divergence_advice=divergence_advice(recipe),
        mid_eval=recipe.train.mid_eval,
        clock=clock,
    )
    if loss is not None:
        plan.loss = loss
    saving = Saving(log.dir / "checkpoints", recipe.run.save_every, recipe.run.save_every_steps, recipe.run.keep,
                    recipe.model_dump(mode="json"))  # fmt: skip
    trainer = trainer_for(parts, plan, log, saving)
    for text in risky_settings(recipe, parts):
        trainer.warn(text)
    asked = asked_rise_steps(recipe.schedule, lr_scale(recipe))
    if 2 * plan.rise_steps < asked and checkpoint is None:  # under half the warm-up asked for
        trainer.warn(
            f"the run has only {optimizer_steps(recipe, parts.train_loader)} optimizer steps: its LR rises over "
            f"{plan.rise_steps} of them where schedule.min_warmup_steps asks for {asked}; more epochs or a smaller "
            "batch would let it warm up fully"
        )
    if checkpoint is not None:
        path, state = checkpoint
        try:
            trainer.load_state_dict(state, str(path))
        except CheckpointError:
            log.close()
            raise
        if log.enabled:
            say(f"resuming from {path} (epoch {trainer.state.epoch}, step {trainer.state.step})")
        saved = state.get("recipe")
        if isinstance(saved, dict) and recipe_changes(saved, recipe.model_dump(mode="json")):
            saving.protect = (path,)  # the run changes from here on (resume.allow_changes): keep where it began
    if log.enabled:  # a killed save's temporary files, whether the run starts afresh or resumes
        if checkpoint is not None:
            log.existing_metrics()  # an unreadable metrics.csv stops the resume before anything is written
        remove_stale_temporaries(saving.folder)
    log.write_recipe(to_yaml(recipe))  # only once the checkpoint, if any, fitted: a failed resume changes nothing
    batch = global_batch(recipe)
    if log.enabled:  # the resolved scaling: what the LR rule was given and what it made of it
        how = f"{recipe.train.batch_size} x {recipe.train.accumulate} accumulated x {world_size()} process(es)"
        o = recipe.optim
        rule = f"{o.scaling} rule from {o.lr:g} per {o.base_batch}" if o.base_batch else "no optim.base_batch: as given"
        say(f"global batch {batch} ({how}); peak LR {parts.lr:.4g} ({rule})")
    return trainer, log
