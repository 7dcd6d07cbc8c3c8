"""Recipe -> the objects a run needs: data loaders, model, optimizer, LR schedule, precision, hooks.

`train(recipe)` is the library entry point that `hasten train` calls.
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from hasten import distributed
from hasten.checkpoint import checkpoints_in, latest_usable, load_checkpoint, remove_stale_temporaries
from hasten.compiling import compile_model
from hasten.config import OptimConfig, Recipe, to_yaml
from hasten.data import ImageDataset, load_dataset
from hasten.data.imagefolder import ImageFolder, ImageFolderLoader, image_folder_loaders, open_image_folder
from hasten.data.loader import Augment, InMemoryLoader, channel_stats
from hasten.data.transforms import prepare
from hasten.distributed import DistEnv, world_size
from hasten.errors import CheckpointError, DataError, HastenError, RecipeError
from hasten.finetune import Freeze, discriminative_groups, pretrained_from_config, save_weights
from hasten.models import ResNet, build_model
from hasten.precision import Precision, make_precision
from hasten.runfolder import RunLock, check_resume_recipe, claim_fresh, recipe_changes
from hasten.runlog import RunLog
from hasten.schedules import Scheduler, scale_lr, scheduler
from hasten.trainer import Hooks, Plan, Saving, Trainer
from hasten.tricks import EMA, BatchMixing, LabelSmoothing, param_groups


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
    if cfg.name == "imagefolder":
        options = dict(subset=cfg.subset, test_subset=cfg.test_subset, per_class=cfg.per_class)
        return open_image_folder(cfg.root, size=cfg.size, rgb=cfg.rgb, label_noise=cfg.label_noise, **options)
    data = load_dataset(cfg.name, cfg.root, download=cfg.download, synthetic_size=cfg.synthetic_size, seed=recipe.seed)
    if cfg.subset:
        data.train_images, data.train_labels = data.train_images[: cfg.subset], data.train_labels[: cfg.subset]
    if cfg.test_subset:
        data.test_images, data.test_labels = data.test_images[: cfg.test_subset], data.test_labels[: cfg.test_subset]
    options = dict(per_class=cfg.per_class, label_noise=cfg.label_noise, size=cfg.size, rgb=cfg.rgb)
    return prepare(data, seed=recipe.seed, **options)


def loaders(
    recipe: Recipe, data: ImageDataset | ImageFolder, device: torch.device, rank: int = 0, world_size: int = 1
) -> tuple[InMemoryLoader, InMemoryLoader] | tuple[ImageFolderLoader, ImageFolderLoader]:
    """Training and test loaders; normalisation statistics come from the training images. In-memory data is
    sliced into batches; an image folder is decoded by DataLoader workers."""
    aug = recipe.data.augment
    remainder = recipe.train.remainder
    if isinstance(data, ImageFolder):
        return image_folder_loaders(
            data,
            recipe.train.batch_size,
            recipe.train.eval_batch_size,
            seed=recipe.seed,
            augment=Augment(aug.flip, aug.translate) if (aug.flip or aug.translate) else None,
            workers=recipe.data.workers,
            channels_last=recipe.train.channels_last,
            device=device,
            rank=rank,
            world_size=world_size,
            remainder=remainder,
        )
    mean, std = channel_stats(data.train_images)
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
        remainder=remainder,
        **common,
    )
    test = InMemoryLoader(data.test_images, data.test_labels, recipe.train.eval_batch_size, remainder="split", **common)
    return train, test


def global_batch(recipe: Recipe) -> int:
    """Examples per optimizer step across all processes: batch size x accumulation steps x world size.

    The one place this is computed: the LR scaling rule and everything that reports the batch use it.
    """
    return recipe.train.batch_size * recipe.train.accumulate * world_size()


def scaled_lr(config: OptimConfig, global_batch: int) -> float:
    """`optim.lr` scaled from `optim.base_batch` to `global_batch` (Goyal et al., 2017: linear; or sqrt)."""
    return scale_lr(config.lr, config.base_batch, global_batch, config.scaling)


def steps_per_epoch(recipe: Recipe, train_loader: InMemoryLoader) -> int:
    """Optimizer steps per epoch: one per `train.accumulate` micro-batches, the last group possibly short."""
    return -(-len(train_loader) // recipe.train.accumulate)


def optimizer_steps(recipe: Recipe, train_loader: InMemoryLoader) -> int:
    """Optimizer steps in the whole run: what the LR schedule spans."""
    return recipe.train.epochs * steps_per_epoch(recipe, train_loader)


def tricks(recipe: Recipe, model: nn.Module, rank: int = 0) -> tuple[Hooks, dict[str, Any]]:
    """The loop's hooks for the recipe's `tricks` section, and the stateful ones by name (for checkpoints).

    Random draws come from a numpy generator seeded by (seed, rank), so runs repeat and ranks differ.
    """
    config, hooks, stateful = recipe.tricks, Hooks(), {}
    if config.label_smoothing:
        hooks.on_batch.append(LabelSmoothing(config.label_smoothing).on_batch)
    if config.mixup or config.cutmix:
        mixing = BatchMixing(config.mixup, config.cutmix, np.random.default_rng([recipe.seed, rank]))
        hooks.on_batch.append(mixing.on_batch)
        stateful["mixing"] = mixing
        hooks.rank_local.add("mixing")  # its stream differs per rank: checkpoints keep one per rank
    if config.ema:
        ema = EMA(model, config.ema)
        hooks.after_step.append(ema.after_step)
        hooks.eval_model = ema.eval_model
        stateful["ema"] = ema
    return hooks, stateful


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
    scheduler: Scheduler
    precision: Precision
    lr: float  # the peak LR after the scaling rule
    hooks: Hooks
    trick_state: dict[str, Any]  # stateful tricks by name (EMA, mixing RNG): each has state_dict()
    compiled: bool = False  # train.compile asked for it and torch.compile worked


def build(recipe: Recipe) -> Parts:
    """Under torchrun (several processes) this joins the process group first: each rank gets its own device,
    its shard of every epoch, its own random streams for augmentation, mixing and dropout, and the model
    wrapped in DistributedDataParallel; the model starts from the same weights everywhere (DDP broadcasts
    rank 0's)."""
    env = DistEnv.from_environ()
    device = distributed.device_for(env, recipe.device)
    distributed.init(env, device)
    rank, world = distributed.rank(), world_size()
    if recipe.train.threads:
        torch.set_num_threads(recipe.train.threads)
    scale = recipe.loss_scale
    precision = make_precision(recipe.precision, device, scale.init, scale.growth_interval)  # before data is read
    seed_everything(recipe.seed)
    data = dataset(recipe)
    train_loader, test_loader = loaders(recipe, data, device, rank, world)
    model = build_model(recipe.model, data.image_shape, len(data.classes))
    if recipe.model.pretrained:
        print(pretrained_from_config(model, recipe.model).describe(), file=sys.stderr)
    model = model.to(device)
    if recipe.train.channels_last:
        model = model.to(memory_format=torch.channels_last)
    if recipe.train.checkpoint_activations:
        if not isinstance(model, ResNet):
            raise RecipeError("train.checkpoint_activations: only model.name=resnet has blocks to checkpoint")
        model.checkpoint_activations = True
    if recipe.train.sync_batchnorm and world > 1:  # before the optimizer and EMA see the modules; keeps the params
        if device.type == "cpu":
            raise RecipeError(
                "train.sync_batchnorm: torch's SyncBatchNorm runs on GPUs only; CPU ranks keep their own batch "
                "statistics (set it false, or run on GPUs)"
            )
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = precision.prepare(model)
    lr = scaled_lr(recipe.optim, global_batch(recipe))
    decay, no_bias_decay = recipe.optim.weight_decay, recipe.optim.no_bias_decay
    if recipe.optim.layer_lr_decay < 1:  # discriminative fine-tuning: per-layer LRs
        groups = discriminative_groups(model, lr, recipe.optim.layer_lr_decay, decay, no_bias_decay)
    else:
        groups = param_groups(model, decay, no_bias_decay)
    opt = optimizer(recipe.optim, precision.optimizer_groups(groups), lr)  # fp16-master: the fp32 masters
    schedule = scheduler(opt, recipe.schedule, optimizer_steps(recipe, train_loader))
    hooks, trick_state = tricks(recipe, model, rank)
    if recipe.train.freeze_epochs:  # after the optimizer, which must hold the frozen parameters too
        if world > 1:
            raise RecipeError("train.freeze_epochs: not supported with several processes yet (DDP fixes its set)")
        freeze = Freeze(model, recipe.train.freeze_epochs * steps_per_epoch(recipe, train_loader))
        hooks.after_step.append(freeze.after_step)
        trick_state["freeze"] = freeze
    if world > 1:
        seed_everything((recipe.seed * 1_000_003 + rank) % 2**63)  # after the weights: dropout masks differ per rank
        model = distributed.wrap(model, device)  # after the EMA copy and the optimizer, which hold the inner model
    compiled = False
    if recipe.train.compile:  # last: the EMA copy above stays eager
        model, failure = compile_model(model, next(iter(train_loader))[0], precision.autocast)
        compiled = failure is None
        if failure:
            print(failure, file=sys.stderr)
    parts = Parts(
        recipe, device, data, model, train_loader, test_loader, opt, schedule, precision, lr, hooks, trick_state
    )
    parts.compiled = compiled
    return parts


def trainer_for(parts: Parts, plan: Plan, log: RunLog, saving: Saving | None = None) -> Trainer:
    """The loop over what `build` made, with the recipe's hooks."""
    loaders = (parts.train_loader, parts.test_loader)
    return Trainer(
        parts.model, parts.optimizer, parts.scheduler, parts.precision, loaders, plan, log, parts.hooks, saving
    )


def resume_from(recipe: Recipe, folder: Path) -> tuple[Path, dict[str, Any]] | None:
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
        if distributed.is_main():
            print(f"resume=auto: no checkpoint in {folder} yet; starting afresh", file=sys.stderr)
        return None
    return found if found is not None else (chosen, load_checkpoint(chosen, require_digest=True))


def claim_run_folder(recipe: Recipe, folder: Path, checkpoint: tuple[Path, dict[str, Any]] | None) -> None:
    """Before anything is written: a resume must continue the same run (the checkpoint's recipe), a fresh run
    must not mix with another run's files (hasten/runfolder.py). Rank 0 checks; every rank gets its verdict."""
    error = None
    if distributed.is_main():
        try:
            if checkpoint is not None:
                saved = checkpoint[1].get("recipe")
                check_resume_recipe(
                    saved, recipe.model_dump(mode="json"), recipe.resume_allow_changes, str(checkpoint[0])
                )
            elif int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == 0:  # a restart continues its own files
                claim_fresh(folder, recipe.run.overwrite, resuming=recipe.resume == "auto")
        except HastenError as failure:
            error = (type(failure), str(failure))
    error = distributed.broadcast_object(error)
    if error:
        raise error[0](error[1])


def train(recipe: Recipe) -> dict[str, Any]:
    """Train the recipe; writes the run folder and returns the summary. The folder is locked while the run
    writes it (hasten/runfolder.py): two runs never share one."""
    parts = build(recipe)
    folder = run_dir(recipe)
    lock = RunLock(folder) if distributed.is_main() else contextlib.nullcontext()
    with lock:
        return _train_locked(recipe, parts, folder)


def _train_locked(recipe: Recipe, parts: Parts, folder: Path) -> dict[str, Any]:
    checkpoint = resume_from(recipe, folder / "checkpoints")  # before anything in the run folder is written
    claim_run_folder(recipe, folder, checkpoint)
    log = RunLog(folder, enabled=distributed.is_main(), tensorboard=recipe.run.tensorboard)
    plan = Plan(
        epochs=recipe.train.epochs,
        num_classes=len(parts.data.classes),
        tta_flip=recipe.train.tta_flip,
        thresholds=recipe.run.thresholds,
        progress=recipe.run.progress,
        accumulate=recipe.train.accumulate,
        on_nan=recipe.train.on_nan,
    )
    parts.hooks.stateful.update(parts.trick_state)
    saving = Saving(log.dir / "checkpoints", recipe.run.save_every, recipe.run.save_every_steps, recipe.run.keep,
                    recipe.model_dump(mode="json"))  # fmt: skip
    trainer = trainer_for(parts, plan, log, saving)
    if checkpoint is not None:
        path, state = checkpoint
        try:
            trainer.load_state_dict(state, str(path))
        except CheckpointError:
            log.close()
            raise
        if log.enabled:
            print(f"resuming from {path} (epoch {trainer.state.epoch}, step {trainer.state.step})", file=sys.stderr)
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
        print(f"global batch {batch} ({how}); peak LR {parts.lr:.4g} ({rule})", file=sys.stderr)
    # signals stay caught until the run returns: a stop once the last epoch is done lets the summary be written
    # and the run end with 0 (its work is complete), instead of killing it mid-write
    try:
        with trainer.stop_on_signals():
            summary = trainer.fit()
            model = distributed.unwrap(parts.model)
            if recipe.run.save_weights and log.enabled:  # the weights evaluated: the EMA copy when there is one
                save_weights(parts.hooks.eval_model(model) if parts.hooks.eval_model else model, log.dir)
            summary |= {"run_dir": str(log.dir), "lr": parts.lr, "global_batch": batch, "world_size": world_size()}
            log.summary(summary)
            distributed.barrier()  # the ranks end together, once rank 0 has written everything
    finally:
        log.close()
    return summary
