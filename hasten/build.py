"""Recipe -> the objects a run needs: data loaders, model, optimizer, LR schedule, precision, hooks.

`train(recipe)` is the library entry point that `hasten train` calls.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from hasten.config import OptimConfig, Recipe, to_yaml
from hasten.data import ImageDataset, load_dataset
from hasten.data.loader import Augment, InMemoryLoader, channel_stats
from hasten.models import build_model
from hasten.precision import Precision, make_precision
from hasten.runlog import RunLog
from hasten.schedules import lr_scheduler
from hasten.trainer import Plan, Trainer


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def run_dir(recipe: Recipe) -> Path:
    return Path(recipe.run.dir or Path("runs") / recipe.name)


def dataset(recipe: Recipe) -> ImageDataset:
    """The recipe's dataset, cut to `data.subset` / `data.test_subset` when given."""
    cfg = recipe.data
    data = load_dataset(cfg.name, cfg.root, download=cfg.download, synthetic_size=cfg.synthetic_size, seed=recipe.seed)
    if cfg.subset:
        data.train_images, data.train_labels = data.train_images[: cfg.subset], data.train_labels[: cfg.subset]
    if cfg.test_subset:
        data.test_images, data.test_labels = data.test_images[: cfg.test_subset], data.test_labels[: cfg.test_subset]
    return data


def loaders(
    recipe: Recipe, data: ImageDataset, device: torch.device, rank: int = 0, world_size: int = 1
) -> tuple[InMemoryLoader, InMemoryLoader]:
    """Training and test loaders; normalisation statistics come from the training images."""
    mean, std = channel_stats(data.train_images)
    aug = recipe.data.augment
    common = dict(
        mean=mean, std=std, channels_last=recipe.train.channels_last, device=device, rank=rank, world_size=world_size
    )
    train = InMemoryLoader(
        data.train_images,
        data.train_labels,
        recipe.train.batch_size,
        shuffle=True,
        seed=recipe.seed,
        augment=Augment(aug.flip, aug.translate) if (aug.flip or aug.translate) else None,
        **common,
    )
    test = InMemoryLoader(data.test_images, data.test_labels, recipe.train.eval_batch_size, pad_shards=False, **common)
    return train, test


def scaled_lr(config: OptimConfig, global_batch: int) -> float:
    """`optim.lr` scaled from `optim.base_batch` to `global_batch` (Goyal et al., 2017: linear; or sqrt)."""
    if config.base_batch is None:
        return config.lr
    ratio = global_batch / config.base_batch
    return config.lr * (ratio if config.scaling == "linear" else ratio**0.5)


def param_groups(model: nn.Module, weight_decay: float, no_bias_decay: bool) -> list[dict[str, Any]]:
    """With `no_bias_decay`, biases and normalisation parameters (every 1-D tensor) get no weight decay."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not no_bias_decay:
        return [{"params": params, "weight_decay": weight_decay}]
    decay = [p for p in params if p.ndim > 1]
    no_decay = [p for p in params if p.ndim <= 1]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def optimizer(config: OptimConfig, groups: list[dict[str, Any]], lr: float) -> torch.optim.Optimizer:
    if config.name == "sgd":
        return torch.optim.SGD(
            groups, lr=lr, momentum=config.momentum, nesterov=config.nesterov and config.momentum > 0
        )
    cls = torch.optim.AdamW if config.name == "adamw" else torch.optim.Adam
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
    scheduler: torch.optim.lr_scheduler.LRScheduler
    precision: Precision
    lr: float


def build(recipe: Recipe) -> Parts:
    device = resolve_device(recipe.device)
    if recipe.train.threads:
        torch.set_num_threads(recipe.train.threads)
    precision = make_precision(recipe.precision, device)  # fails before any data is read
    seed_everything(recipe.seed)
    data = dataset(recipe)
    train_loader, test_loader = loaders(recipe, data, device)
    model = build_model(recipe.model, tuple(data.train_images.shape[1:]), len(data.classes)).to(device)
    if recipe.train.channels_last:
        model = model.to(memory_format=torch.channels_last)
    model = precision.prepare(model)
    lr = scaled_lr(recipe.optim, recipe.train.batch_size)
    opt = optimizer(recipe.optim, param_groups(model, recipe.optim.weight_decay, recipe.optim.no_bias_decay), lr)
    scheduler = lr_scheduler(opt, recipe.schedule, recipe.train.epochs * len(train_loader))
    return Parts(recipe, device, data, model, train_loader, test_loader, opt, scheduler, precision, lr)


def train(recipe: Recipe) -> dict[str, Any]:
    """Train the recipe; writes the run folder and returns the summary."""
    parts = build(recipe)
    log = RunLog(run_dir(recipe), tensorboard=recipe.run.tensorboard)
    log.write_recipe(to_yaml(recipe))
    plan = Plan(
        epochs=recipe.train.epochs,
        num_classes=len(parts.data.classes),
        label_smoothing=recipe.train.label_smoothing,
        tta_flip=recipe.train.tta_flip,
        thresholds=recipe.run.thresholds,
        progress=recipe.run.progress,
    )
    trainer = Trainer(
        parts.model,
        parts.optimizer,
        parts.scheduler,
        parts.precision,
        (parts.train_loader, parts.test_loader),
        plan,
        log,
    )
    try:
        summary = trainer.fit()
    finally:
        log.close()
    return summary | {"run_dir": str(log.dir), "lr": parts.lr}
