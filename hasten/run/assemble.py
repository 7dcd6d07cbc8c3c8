"""Assemble: a resolved recipe -> the objects a run needs (loaders, the techniques and their hooks, the model on
its device, layout and precision, the optimizer and its schedule, DDP), built without changing the recipe.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.optim.swa_utils import update_bn

from hasten.clock import Clock
from hasten.data import ImageDataset
from hasten.data.imagefolder import (
    ImageFolder,
    ImageFolderLoader,
    folder_stats,
)
from hasten.data.loader import InMemoryLoader, channel_stats
from hasten.data.seeds import stream_seed
from hasten.data.user import StreamedData
from hasten.engine import distributed, step
from hasten.engine.compiling import compile_model
from hasten.engine.distributed import world_size
from hasten.engine.fan_in import fan_in_groups
from hasten.engine.layer_scale import layer_scale_groups
from hasten.engine.norms import has_batch_norm
from hasten.engine.optimizers import Muon, muon_groups
from hasten.engine.precision import Precision, make_precision
from hasten.engine.schedules import Scheduler, scale_lr, scheduler
from hasten.errors import DataError, RecipeError
from hasten.machine import Machine
from hasten.models.pretrained import pretrained_from_config  # Freeze registers here
from hasten.progress import say
from hasten.recipe.schema import OptimConfig, Recipe
from hasten.recipe.trust import USER_SOURCES
from hasten.run.loading import loader_options, loader_workers
from hasten.run.trainer import Hooks
from hasten.run.user import streamed_loaders
from hasten.techniques import Context, Technique, techniques
from hasten.techniques.activation_checkpointing import checkpoint_activations
from hasten.techniques.discriminative import discriminative_groups


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def loaders(
    recipe: Recipe, data: ImageDataset | ImageFolder, device: torch.device, rank: int = 0, world_size: int = 1
) -> tuple[InMemoryLoader, InMemoryLoader] | tuple[ImageFolderLoader, ImageFolderLoader]:
    """Training and test loaders; normalisation statistics come from the training images. In-memory data is
    sliced into batches; an image folder is decoded by DataLoader workers. Their options: `loader_options`."""
    if isinstance(data, StreamedData):  # a user's Dataset, streamed by DataLoader workers
        return streamed_loaders(recipe, data, device, rank, world_size)
    stats = normalisation_stats(data, recipe.seed)
    train, test = loader_options(recipe, *stats, device, data.image_shape, rank, world_size)
    if isinstance(data, ImageFolder):
        workers = loader_workers(recipe)
        return (
            ImageFolderLoader(data.decoder(data.train), workers=workers, **train),
            ImageFolderLoader(data.decoder(data.test), workers=workers, **test),
        )
    train_loader = InMemoryLoader(data.train_images, data.train_labels, **train)
    return train_loader, InMemoryLoader(data.test_images, data.test_labels, **test)


# the last statistics computed: (the training images they came from, weakly held; the seed; mean and std)
_last_stats: tuple[weakref.ref, int, tuple[Tensor, Tensor]] | None = None


def normalisation_stats(data: ImageDataset | ImageFolder, seed: int) -> tuple[Tensor, Tensor]:
    """Per-channel mean and std of the training images (a folder's: of a seeded sample), computed once for the
    same images and seed: the start-up probe's batch and the run's loaders both normalise with them, and over
    60,000 images (or 1,000 decoded files) they take a noticeable part of the start-up."""
    global _last_stats
    source = data.train if isinstance(data, ImageFolder) else data.train_images
    if _last_stats is not None and _last_stats[0]() is source and _last_stats[1] == seed:
        return _last_stats[2]
    stats = folder_stats(data, seed=seed) if isinstance(data, ImageFolder) else channel_stats(data.train_images)
    _last_stats = (weakref.ref(source), seed, stats)
    return stats


def split_labels(data: ImageDataset | ImageFolder | StreamedData, split: str) -> Tensor:
    """The labels of the "train" or "test" split, of any kind of data (in memory: `train_labels`; a folder or a
    streamed Dataset: `train.labels`)."""
    return (
        getattr(data, split).labels
        if isinstance(data, ImageFolder | StreamedData)
        else getattr(data, f"{split}_labels")
    )


def train_size(data: ImageDataset | ImageFolder | StreamedData) -> int:
    """Training images in the dataset (all ranks together)."""
    return len(split_labels(data, "train"))


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
    norms = has_batch_norm(model)
    if norms and recipe.train.batch_size == 1:
        raise RecipeError(
            "train.batch_size: 1 image a batch, but the model has batch norm, which cannot normalise a single "
            "example in training: use at least 2"
        )


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
    fused = config.fused is True  # decided in resolve, where torch has the kernel (run/resolve.py's resolve_fused)
    return cls(groups, lr=lr, betas=config.betas, fused=fused or None)


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
    machine: Machine | None = None  # the facts the machine's rules read (hasten/machine.py); None: not recorded
    checkpoint: tuple[Path, dict[str, Any]] | None = None  # what a resume continues from, read once by resolve
    cpu_allocator: dict[str, int] | None = None  # the C allocator's settings the run took (hasten/machine.py)
    extendable: bool = False  # train.epochs=auto may lengthen the run once (hasten/run/extension.py)
    warnings: tuple[str, ...] = ()  # what the run warns of from its start (hasten/run/resolve.py)
    output_hook: Any = None  # model.output=probabilities: the forward hook on the model (taken off a user's object)


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
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)  # (GPU ranks: resolve refuses it on CPU ones)
    model = precision.prepare(model)
    lr = scaled_lr(recipe.optim, global_batch(recipe))
    decay = recipe.optim.weight_decay
    if recipe.optim.layer_lr_decay < 1:  # discriminative fine-tuning: per-layer LRs
        groups = discriminative_groups(model, lr, recipe.optim.layer_lr_decay, decay, no_bias_decay=False)
    else:
        groups = [{"params": [p for p in model.parameters() if p.requires_grad], "weight_decay": decay}]
    if recipe.optim.fan_in_lr is True:  # decided in resolve: wide layers at a share of the LR (engine/fan_in.py)
        groups = fan_in_groups(groups, model, lr)
    if isinstance(recipe.optim.layer_scale_lr, float):  # decided in resolve: layer scales at a multiple of the LR
        groups = layer_scale_groups(groups, model, lr, recipe.optim.layer_scale_lr)
    for technique in _at(made, "param_groups"):  # no-bias-decay
        groups = technique.param_groups(groups)
    opt = optimizer(recipe.optim, precision.optimizer_groups(groups), lr)  # fp16-master: the fp32 masters
    schedule = scheduler(opt, recipe.schedule, optimizer_steps(recipe, train_loader), lr_scale(recipe))
    for technique in _at(made, "on_optimizer"):  # the EMA's copy, Freeze: the optimizer holds every parameter
        technique.on_optimizer(model)
    hooks = Hooks.from_techniques(made)
    if world > 1:
        seed_everything(stream_seed(recipe.seed, rank) % 2**63)  # after the weights: dropout masks differ per rank
        # after the EMA copy and the optimizer, which hold the inner model; a user's model may leave parameters
        # out of its loss (an auxiliary head, hasten/models/user.py's OutputReader)
        model = distributed.wrap(model, device, find_unused=recipe.model.name in USER_SOURCES)
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
