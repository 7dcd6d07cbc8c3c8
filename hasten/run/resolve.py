"""Resolve: every choice a run makes, in one place (docs/architecture.md): the data-dependent rules, the machine
probe's choices, a resume's recorded choices, optim.lr=auto. `resolve` returns the recipe that recipe.yaml
records and `assemble` builds from.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from hasten.data import ImageDataset
from hasten.data.imagefolder import (
    ImageFolder,
)
from hasten.data.registry import mirror_invariant
from hasten.data.user import StreamedData
from hasten.engine import distributed
from hasten.engine.distributed import world_size
from hasten.engine.norms import has_batch_norm
from hasten.engine.patches import patch_side
from hasten.errors import CheckpointError, RecipeError
from hasten.machine import Machine
from hasten.machine import current as current_machine
from hasten.models.copying import copy_model
from hasten.models.user import check_model, habit_warnings, output_kind, read_output
from hasten.progress import say
from hasten.recipe.schema import PRECISION_MODES, Recipe, dotted, replaced
from hasten.recipe.trust import USER_SOURCES
from hasten.run.assemble import assemble, check_batch_norm_batch, loaders, lr_scale, train_size
from hasten.run.extension import holds_peak
from hasten.run.loading import eval_batch_size, placed_workers
from hasten.run.shares import resolve_lr_shares
from hasten.run.user import recorded, user_objects
from hasten.runfolder.checkpoint import checkpoints_in, latest_usable, load_checkpoint
from hasten.tune import autotune, choices, numerics, rules


def run_dir(recipe: Recipe) -> Path:
    return Path(recipe.run.dir or Path("runs") / recipe.name)


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
    changes: dict[str, Any] = {}
    notes: list[str] = []
    allowed = mirror_invariant(data.name)
    why = f"{data.name} is mirror-invariant" if allowed else f"a mirror may change the class of {data.name} images"
    aug, train_cfg = recipe.data.augment, recipe.train
    if aug.flip == "auto":
        changes["data.augment.flip"] = allowed
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
        changes["data.augment.translate"] = most
    if train_cfg.tta_translate > most:  # shifts the size of those the training never showed (8x8 digits: none)
        notes.append(
            f"TTA shift {train_cfg.tta_translate} -> {most} pixels: at most {aug.translate_max_fraction:g} of the "
            f"{side}-pixel images, as the training shifts (data.augment.translate_max_fraction)"
        )
        changes["train.tta_translate"] = most
    if recipe.schedule.min_warmup_steps == "auto":
        rise = changes["schedule.min_warmup_steps"] = rules.auto_rise_steps(len(data.classes))
        notes.append(
            f"LR rise over at least {rise} optimizer steps ({len(data.classes)} classes; "
            f"schedule.min_warmup_steps=auto: one a class, at least {rules.MIN_RISE_STEPS})"
        )
    if train_cfg.tta_flip == "auto":  # the mirror view only where the training shows mirrored images
        trained = changes.get("data.augment.flip", aug.flip) is not False
        changes["train.tta_flip"] = allowed and trained
        if allowed:
            notes.append(
                "flip TTA on (train.tta_flip=auto)"
                if trained
                else "flip TTA off: the training shows no mirrored "
                "images (data.augment.flip=false; train.tta_flip=auto)"
            )
    if train_cfg.min_steps_per_epoch and train_cfg.batch_size != "auto":  # auto: the batch rule sees the steps
        n, asked = train_size(data), train_cfg.batch_size
        batch = steps_batch(n, asked, train_cfg.accumulate, world, train_cfg.min_steps_per_epoch)
        if batch != asked:
            changes["train.batch_size"] = batch
            steps = rules.steps_per_epoch(n, batch, world, train_cfg.accumulate)
            notes.append(
                f"batch {asked} -> {batch}: {n:,} training images give {steps} steps an epoch "
                f"(train.min_steps_per_epoch={train_cfg.min_steps_per_epoch}; 0 keeps the batch)"
            )
    return replaced(recipe, changes), notes


@dataclass(frozen=True)
class Resolved:
    """What `resolve` returns: the frozen recipe with every choice in it (what recipe.yaml records and `assemble`
    builds from), the keys this machine decided (a resume may decide them otherwise: they are not held to the
    checkpoint's), and the checkpoint a resume continues from, read once (None: a fresh run)."""

    recipe: Recipe
    machine_keys: tuple[str, ...] = ()
    checkpoint: tuple[Path, dict[str, Any]] | None = None
    extendable: bool = False  # train.epochs=auto may lengthen the run once (hasten/run/extension.py)
    warnings: tuple[str, ...] = ()  # what the run warns of from its start (recorded in summary.json)
    output_hook: Any = None  # model.output=probabilities: the hook that reads the model's outputs as their log


def resolve(
    recipe: Recipe,
    data: Any,
    model: nn.Module,
    device: torch.device,
    given_model: Any = None,
    given_data: Any = None,
    machine: Machine | None = None,
    loss_given: bool = False,
) -> Resolved:
    """Every setting the recipe leaves open, decided once: flips, shifts and TTA from the data; the user's model
    and data recorded; the device, the loader's workers and threads, in-memory or streamed, the images' size and
    channels; precision, memory layout and batch from the machine (or as the run being resumed chose them); the
    budget from the data; the fused optimizer; optim.lr=auto by a range test. One line per decision is printed;
    the returned recipe is frozen and holds the values (it is the one recipe.yaml records and `assemble` builds
    from, unchanged). A resume's checkpoint is read here, once. `machine`: the facts the machine's rules read
    (None: hasten.machine.current()); `loss_given`: the user gave hasten.train a loss of their own, which takes
    what their model returns as it is."""
    machine = machine or current_machine()
    world = world_size()
    warned: tuple[str, ...] = ()
    epochs_auto = recipe.train.epochs == "auto"
    recipe, notes = resolve_for_data(recipe, data, world)
    recipe, more, placed = resolve_placement(recipe, data, device)
    notes += more
    if user_objects(recipe, given_model, given_data):  # fail before anything is timed or trained
        trial = copy_model(model).to(device)  # the checks' copy: lazy modules shaped, nothing of the run's moved
        if said := check_model(trial, data.image_shape, len(data.classes), device):
            notes.append(said)
        recipe = recorded(recipe, model, given_model is not None, given_data, data.classes)
        recipe, more, warned = resolve_output(recipe, trial, data.image_shape, device, loss_given, len(data.classes))
        notes += more
    else:  # what the run trains, recorded as for a user's model: its class names and size
        recipe = replaced(recipe, {"data.classes": list(data.classes),
                                   "model.parameters": sum(p.numel() for p in model.parameters())})  # fmt: skip
        if recipe.model.output == "auto":  # hasten's own models end in their classifier's logits
            recipe = replaced(recipe, {"model.output": "logits"})
    # a user's model returns its logits however it returns them, a softmax's as their log: before the probe runs it
    theirs = given_model is not None or recipe.model.name in USER_SOURCES
    hook = read_output(model, recipe.model.output, len(data.classes), theirs)
    if recipe.train.batch_size != "auto":  # before anything is timed: the probe would train on that batch
        check_batch_norm_batch(model, recipe)
    check_assembly(recipe, device, world)
    recipe, more = resolve_whiten(recipe, given_model is not None)
    notes += more
    checkpoint = resume_from(recipe, run_dir(recipe) / "checkpoints")  # read once: the run continues from it
    recipe, more = resolve_default_lr(recipe, model, given_model is not None, resumed_lr(recipe, checkpoint))
    notes += more
    recipe, more = resolve_lr_shares(recipe, model)
    notes += more
    resumed = resumed_choices(recipe, checkpoint)  # a resume continues with what its run chose: exact, as resumes are
    budget = rules.run_steps(has_batch_norm(model))  # train.epochs=auto's steps, which the batch's candidates keep
    recipe, machine_keys, more = choose_on_machine(recipe, model, data, device, resumed, machine, budget)
    notes += more
    recipe, more = resolve_budget(recipe, data, world, resumed, budget, patch_side(model))
    notes += more
    if recipe.train.eval_batch_size == "auto":  # after the precision: a bf16 batch's activations take half the bytes
        recipe = replaced(recipe, {"train.eval_batch_size": eval_batch_size(recipe, device, data.image_shape)})
        side = "x".join(str(int(n)) for n in data.image_shape[-2:])
        where = f"{side} images in {recipe.precision} on a CPU" if device.type == "cpu" else f"on {device.type}"
        notes.append(f"train.eval_batch_size=auto -> {recipe.train.eval_batch_size} ({where})")
    recipe = resolve_fused(recipe, device)
    if distributed.is_main():
        for note in notes:
            say(note)
    if recipe.optim.lr == "auto":  # last: the range test runs the run as decided so far
        recipe = resolve_lr(recipe, data, model, device)
    longer = epochs_auto and extendable(recipe, data, world, resumed, budget)
    return Resolved(recipe, (*machine_keys, *placed, "optim.fused"), checkpoint, longer, warned, hook)


def resolve_output(
    recipe: Recipe,
    trial: nn.Module,
    image_shape: tuple[int, ...],
    device: torch.device,
    loss_given: bool,
    num_classes: int,
) -> tuple[Recipe, list[str], tuple[str, ...]]:
    """`model.output: auto` decided for the user's model (hasten/models/user.py's output_kind, run on `trial`, a
    copy of it on the device): probabilities where it ends in a softmax, or in a sigmoid on two classes' one output
    (unless the user's own loss takes them as they are), else logits; with the warning a sigmoid's outputs get, and
    the habits' (user.habit_warnings) whatever model.output says. Returns the recipe, the lines to say, the warnings."""
    habits = habit_warnings(trial, image_shape, device, num_classes)  # whatever model.output says
    if recipe.model.output != "auto":
        return recipe, [], habits
    kind, warning = output_kind(trial, image_shape, device, num_classes)
    warnings, name = (*habits, *([warning] if warning else ())), type(trial).__name__
    if kind == "logits":
        return replaced(recipe, {"model.output": "logits"}), [], warnings
    ends = "a sigmoid" if kind == "sigmoid" else "a softmax"
    if loss_given:
        said = f"{name} ends in {ends}, and the loss given to hasten.train takes its probabilities as they are"
        return replaced(recipe, {"model.output": "logits"}), [f"model.output=auto -> logits: {said}"], warnings
    how = (
        (
            "(one probability per image for two classes, p of class 1), so log(1 - p) and log(p) are taken as the "
            "logits (the same loss as BCEWithLogitsLoss on the sigmoid's input"
        )
        if kind == "sigmoid"
        else ("(every row sums to 1), so their log is taken as the logits (the same loss as on the softmax's input")
    )
    note = f"model.output=auto -> probabilities: {name} ends in {ends} {how}; model.output=logits: as they are)"
    return replaced(recipe, {"model.output": "probabilities"}), [note], warnings


def resolve_placement(recipe: Recipe, data: Any, device: torch.device) -> tuple[Recipe, list[str], tuple[str, ...]]:
    """Where and how the run goes, recorded: `device: auto` as the device chosen, `data.in_memory: auto` as the
    data was read (decoded into memory or streamed from files), `data.cache: auto` as whether a folder is read from
    its decode cache, `data.workers` and `train.threads` unset as the counts the machine's rules gave, and
    `data.size` and `data.rgb` unset as the images come, whatever the data (images of mixed sizes, in a folder, a
    list or a Dataset: the square side they are resized to), so the recorded recipe, run again, reads them the
    same. Returns the recipe, the lines to say, and the keys decided here that a resume on another machine may
    decide otherwise."""
    changes: dict[str, Any] = {}
    notes: list[str] = []
    if recipe.device == "auto":
        changes["device"] = device.type
    cached = isinstance(data, ImageFolder) and data.train.cached is not None  # hasten/data/foldercache.py
    if recipe.data.in_memory == "auto":
        changes["data.in_memory"] = not isinstance(data, ImageFolder | StreamedData)
        if recipe.data.name == "imagefolder":
            streamed = "read from its decode cache each epoch" if cached else "decoded from its files each epoch"
            how = "decoded once into memory" if changes["data.in_memory"] else streamed
            notes.append(f"data.in_memory=auto -> {str(changes['data.in_memory']).lower()}: the folder is {how}")
    if recipe.data.cache == "auto":
        changes["data.cache"] = cached
    if recipe.data.workers is None:
        changes["data.workers"] = placed_workers(recipe, data)
    if recipe.train.threads is None:
        changes["train.threads"] = torch.get_num_threads()
    channels, height, width = (int(n) for n in data.image_shape)
    if recipe.data.size is None and height == width:
        changes["data.size"] = height
    if recipe.data.rgb is None and channels in (1, 3):
        changes["data.rgb"] = channels == 3
    return replaced(recipe, changes), notes, tuple(key for key in PLACEMENT_KEYS if key in changes)


PLACEMENT_KEYS = ("device", "data.in_memory", "data.workers", "train.threads")  # the machine's, not the data's


def check_assembly(recipe: Recipe, device: torch.device, world: int) -> None:
    """What `assemble` could not build, refused here, before anything is timed: torch's SyncBatchNorm on CPU ranks."""
    if recipe.train.sync_batchnorm and world > 1 and device.type == "cpu":
        raise RecipeError(
            "train.sync_batchnorm: torch's SyncBatchNorm runs on GPUs only; CPU ranks keep their own batch "
            "statistics (set it false, or run on GPUs)"
        )


def resolve_fused(recipe: Recipe, device: torch.device) -> Recipe:
    """`optim.fused: auto` decided: torch's fused Adam/AdamW kernel (one pass over every parameter; on a CPU ~4x
    less step time than the loop) where torch has it for the device; the parameters the optimizer steps are fp32
    in every precision mode (fp16-master's are its fp32 masters). A fused kernel asked for on a device without one
    is a RecipeError naming the key."""
    fused = recipe.optim.fused
    has = recipe.optim.name in ("adam", "adamw") and device.type in fused_devices()
    if fused == "auto":
        return replaced(recipe, {"optim.fused": has})
    if fused and not has:
        what = f"optim.name={recipe.optim.name}" if recipe.optim.name not in ("adam", "adamw") else device.type
        raise RecipeError(f"optim.fused: torch has no fused kernel for {what}; set optim.fused=false (or auto)")
    return recipe


def fused_devices() -> tuple[str, ...]:
    """The device types torch's fused Adam/AdamW serve (torch's own list; cuda and cpu where it cannot be read)."""
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

        return tuple(_get_fused_kernels_supported_devices())
    except ImportError:  # torch moved it: the two every torch >= 2.4 serves
        return ("cuda", "cpu")


def resolve_whiten(recipe: Recipe, model_given: bool) -> tuple[Recipe, list[str]]:
    """`model.whiten: auto` decided (hasten/tune/rules.py's auto_whiten): on for hasten's ResNet from scratch, off
    for a model object given to `hasten.train`, an imported or layer-list model, or pretrained weights."""
    if recipe.model.whiten != "auto":
        return recipe, []
    name = "object" if model_given else recipe.model.name
    recipe = replaced(recipe, {"model.whiten": rules.auto_whiten(name, recipe.model.pretrained)})
    if recipe.model.whiten:
        return recipe, ["model.whiten=auto -> true: the ResNet's first conv whitens the images' patches, frozen"]
    kept = "the pretrained weights" if recipe.model.pretrained else f"model.name={name}"
    return recipe, [f"model.whiten=auto -> false: {kept} keeps its own first conv"]


def resolve_default_lr(
    recipe: Recipe, model: nn.Module, model_given: bool = False, resumed: float | None = None
) -> tuple[Recipe, list[str]]:
    """`optim.lr` unset, decided from the optimizer and what the model is made of (hasten/tune/rules.py's
    default_lr): the LR hasten's ResNet, a batch-norm net, was tuned at is not assumed for a model without batch
    norm. `resumed`: the LR the run being resumed trained at (`resumed_lr`), kept: a run that restarted at half
    the rule's (hasten/run/build.py) goes on at it."""
    if recipe.optim.lr is not None:
        return recipe, []
    if resumed is not None:
        return replaced(recipe, {"optim.lr": resumed}), [
            f"optim.lr unset -> {resumed:g}, as the run being resumed chose"
        ]
    batch_norm = has_batch_norm(model)
    lr = rules.default_lr(recipe.optim.name, batch_norm)
    recipe = replaced(recipe, {"optim.lr": lr})
    if lr == "auto":
        return recipe, [f"optim.lr unset -> auto: a range test picks it ({recipe.optim.name}'s rule)"]
    per = f" per {recipe.optim.base_batch}" if recipe.optim.base_batch else ""
    if model_given:
        which = f"the model given to hasten.train ({type(model).__name__})"
    elif recipe.model.name == "import":
        which = f"model.target={recipe.model.target}"
    else:
        which = f"model.name={recipe.model.name}"
    why = (
        "has batch norm: the LR hasten's ResNet, a batch-norm net, was tuned at"
        if batch_norm
        else "has no batch norm: a lower LR than hasten's batch-norm ResNet was tuned at (docs/defaults.md)"
    )
    return recipe, [f"optim.lr unset -> {lr:g}{per}: {which} {why}"]


def resolve_budget(
    recipe: Recipe,
    data: Any,
    world: int,
    resumed: dict[str, Any] | None = None,
    budget: int = rules.RUN_STEPS,
    patch: int = 0,
) -> tuple[Recipe, list[str]]:
    """`train.epochs: auto` decided from the training set, the batch and the optimizer steps a small set needs
    (`budget`: rules.run_steps, by whether the model has batch norm), or as the run being resumed decided it; then
    `data.augment.translate: auto` from the images' side, the epochs and `patch` (hasten.engine.patches.patch_side:
    the side of the patches a model whose only spatial layer cuts them; 0 for any other)."""
    if "auto" not in (recipe.train.epochs, recipe.data.augment.translate):
        return recipe, []
    notes = []
    if recipe.train.epochs == "auto" and resumed and "train.epochs" in resumed:
        recipe = replaced(recipe, {"train.epochs": resumed["train.epochs"]})
        notes.append(f"train.epochs=auto -> {recipe.train.epochs}, as the run being resumed chose")
    elif recipe.train.epochs == "auto":
        images, batch = train_size(data), recipe.train.batch_size
        accumulate = recipe.train.accumulate
        epochs = rules.auto_epochs(images, batch, world, accumulate, budget)
        recipe = replaced(recipe, {"train.epochs": epochs})
        steps = epochs * rules.steps_per_epoch(images, batch, world, accumulate)
        needed = rules.budget_steps(budget, batch, world, accumulate)
        why = [] if budget == rules.RUN_STEPS else ["a model without batch norm learns more slowly"]
        if needed != budget:
            why.append(f"{budget:,} at batch {rules.BUDGET_BATCH} x (1 + {rules.NOISE_BATCH}/B) / (1 + "
                       f"{rules.NOISE_BATCH}/{rules.BUDGET_BATCH}) at batch {batch * world * accumulate}")  # fmt: skip
        notes.append(
            f"train.epochs=auto -> {epochs}: {steps:,} optimizer steps over {images:,} images "
            f"(at least {needed:,} steps{''.join(f' ({w})' for w in why)}, {rules.MIN_EPOCHS}-{rules.MAX_EPOCHS} "
            "epochs)"
        )
    aug = recipe.data.augment
    if aug.translate == "auto":
        side = min(data.image_shape[1:])
        shift = min(rules.auto_translate(side, recipe.train.epochs, patch), int(side * aug.translate_max_fraction))
        recipe = replaced(recipe, {"data.augment.translate": shift})
        epochs, rule = recipe.train.epochs, f"shifts in runs of {rules.AUTO_TRANSLATE_EPOCHS} epochs or more"
        views = rules.patch_shift_epochs(round(side * rules.AUTO_TRANSLATE_FRACTION))
        if patch and views > 1:  # a transformer's or Mixer's patches: each shifted view learnt from the data
            rule = (f"the model's only spatial layer cuts {patch}x{patch}-pixel patches, so a shift changes every "
                    f"patch and each shifted view is learnt from the data: shifts in runs of {views} epochs or more, "
                    "one a view")  # fmt: skip
        notes.append(f"data.augment.translate=auto -> {shift} pixel(s): {side}-pixel images, {epochs} epochs ({rule})")
    return recipe, notes


def extendable(recipe: Recipe, data: Any, world: int, resumed: dict[str, Any] | None, budget: int) -> bool:
    """Whether a run whose epochs `train.epochs: auto` chose may lengthen itself once (hasten/run/extension.py):
    its schedule holds the peak LR (a one-cycle from its peak: the default's) and it has not been lengthened (a
    resumed run's recorded epochs are the rule's own)."""
    if not holds_peak(recipe.schedule):
        return False
    if resumed and "train.epochs" in resumed:
        train = recipe.train
        return resumed["train.epochs"] == rules.auto_epochs(train_size(data), train.batch_size, world,
                                                            train.accumulate, budget)  # fmt: skip
    return True


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


def resumed_choices(recipe: Recipe, checkpoint: tuple[Path, dict[str, Any]] | None) -> dict[str, Any]:
    """What the run being resumed (its `checkpoint`, as `resume_from` found it) chose for the keys this recipe
    leaves `auto`, from the checkpoint's recipe (values checked before use); {} when nothing is resumed or left to
    choose."""
    asked = [key for key in RESUMED_KEYS if _recorded_value(recipe.model_dump(), key) == "auto"]
    saved = checkpoint[1].get("recipe") if checkpoint else None
    if not asked or not isinstance(saved, dict):
        return {}
    chosen = {key: _recorded_value(saved, key) for key in asked}
    return {key: value for key, value in chosen.items() if _valid_choice(key, value)}


def resumed_lr(recipe: Recipe, checkpoint: tuple[Path, dict[str, Any]] | None) -> float | None:
    """The LR, a positive number, that the run being resumed (its `checkpoint`) recorded where this recipe leaves
    `optim.lr` unset; None otherwise."""
    saved = checkpoint[1].get("recipe") if checkpoint and recipe.optim.lr is None else None
    lr = _recorded_value(saved, "optim.lr") if isinstance(saved, dict) else None
    valid = isinstance(lr, float | int) and not isinstance(lr, bool) and math.isfinite(lr) and lr > 0
    return float(lr) if valid else None


def probe_batch(recipe: Recipe, data: Any, device: torch.device, size: int) -> tuple[Tensor, Tensor]:
    """The first training batch of `size` images (per process), as the run's loader makes them (shuffled in the
    run's seeded order, augmented, normalised): what the start-up probe times."""
    trial = replaced(recipe, {"train.batch_size": size, "train.channels_last": False})  # the probe lays it out
    if trial.data.augment.translate == "auto":  # decided with the budget, after the probe; no part of the step
        trial = replaced(trial, {"data.augment.translate": 0})
    train_loader, _ = loaders(trial, data, device, distributed.rank(), world_size())
    return next(iter(train_loader))  # (the probe gives each candidate the batch in its own layout)


def choose_on_machine(
    recipe: Recipe,
    model: nn.Module,
    data: Any,
    device: torch.device,
    resumed: dict[str, Any] | None = None,
    machine: Machine | None = None,
    budget: int = rules.RUN_STEPS,
) -> tuple[Recipe, tuple[str, ...], list[str]]:
    """`precision`, `train.channels_last` and `train.batch_size` left `auto`, decided by timing the run's training
    step on this machine (hasten/tune/autotune.py; the batch by hasten/tune/rules.py's time rule), or as the run being
    resumed decided them (`resumed`). Returns the recipe holding the values chosen (recipe.yaml records them), the
    keys that were `auto`, and the lines that say what was chosen. The probe times copies of `model` and leaves the
    model and the random streams as they were. `machine`: the facts the candidates are drawn from (None:
    hasten.machine.current()). `budget`: the optimizer steps `train.epochs: auto` gives a small set
    (rules.run_steps), which each candidate batch's run must keep."""
    machine = machine or current_machine()
    values = {"precision": recipe.precision, "train.channels_last": recipe.train.channels_last,
              "train.batch_size": recipe.train.batch_size}  # fmt: skip
    asked = [key for key, value in values.items() if value == "auto"]
    given = choices.given_precision_notes(recipe.precision, machine, device.type)  # one given that is slow here
    if not asked:
        return recipe, (), given
    kept = {key: (resumed or {})[key] for key in asked if key in (resumed or {})}
    notes = [f"{', '.join(f'{k}=auto -> {v}' for k, v in kept.items())}, as the run being resumed chose"] * bool(kept)
    notes += given
    values |= kept
    options = choices.candidates(values["precision"], values["train.channels_last"], device.type, machine)
    if values["precision"] == "auto" and len({option.precision for option in options}) == 1:
        notes.append(f"precision=auto -> {options[0].precision}: {choices.why_one_precision(machine, device.type)}")
    world = world_size()
    images, accumulate = train_size(data), recipe.train.accumulate
    if values["train.batch_size"] == "auto":
        epochs = recipe.train.epochs if recipe.train.epochs != "auto" else None
        sizes = rules.batch_candidates(images, epochs, world, accumulate, budget)
    else:
        sizes = [values["train.batch_size"]]
    choice = options[0]
    # the images each process will train on, at the most epochs any candidate batch gives the run: what bounds the
    # probe's time (autotune.time_limit)
    epochs_ = recipe.train.epochs
    run_epochs = epochs_ if epochs_ != "auto" else rules.auto_epochs(images, min(sizes), world, accumulate, budget)
    run_images = images * run_epochs // world
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):  # dropout, DataLoader seeds
        batch = probe_batch(recipe, data, device, max(sizes)) if len(options) > 1 or len(sizes) > 1 else None
        if "precision" in asked and "precision" not in kept and len(options) > 1:  # speed alone is not safety
            options, more = numerics.safe_options(model, batch, options, device)
            notes += more
        if len(options) > 1:
            at = min(max(sizes), rules.PROBE_BATCH)
            probed = [key for key in ("precision", "train.channels_last") if key in asked and key not in kept]
            # timed here, or as timed before on this machine (the probe's cache), and said there
            live = recipe.run.progress
            choice = autotune.cached_probe(
                model, (batch[0][:at], batch[1][:at]), len(data.classes), options, probed, machine, run_images, live
            ).choice
        if len(sizes) > 1:
            timed = rules.timed_sizes(sizes)
            measured, where = autotune.cached_batch_times(
                model, batch, len(data.classes), choice, timed, machine, run_images, recipe.run.progress
            )
            seconds = rules.step_time_line(measured.seconds, sizes)
            noise = measured.steadiness.spread if measured.steadiness is not None else 0.0
            chosen = values["train.batch_size"] = rules.choose_batch(seconds, tie=rules.batch_tie(noise))
            notes.append(f"{rules.describe_batch_choice(seconds, chosen, measured.seconds)}; {where}")
            notes += rules.shorter_run_note(measured.seconds, chosen, images, epochs, world, accumulate, budget)
        elif values["train.batch_size"] == "auto":
            values["train.batch_size"] = sizes[0]
            notes.append(
                f"train.batch_size=auto -> {sizes[0]}: the smallest batch; {images:,} training images leave no "
                f"larger one {rules.steps_needed(epochs, budget)} optimizer steps"
            )
    recipe = replaced(recipe, {"precision": choice.precision, "train.channels_last": choice.channels_last,
                               "train.batch_size": values["train.batch_size"]})  # fmt: skip
    return recipe, tuple(key for key in asked), notes


def resolve_lr(recipe: Recipe, data: Any, model: nn.Module, device: torch.device) -> Recipe:
    """optim.lr=auto: a short LR range test picks the peak LR (lr_find.AUTO_RULE), run on a trial assembly of the
    run (a copy of `model` with the run's loader, batch hooks, precision and optimizer, built at a placeholder LR and
    then dropped); the returned recipe records it as `optim.lr` (per `optim.base_batch`). The random streams are
    left as they were."""
    from hasten.tune.lr_find import AUTO_RULE, AUTO_START, AUTO_STEPS, auto_lr, lr_find

    trial_recipe = replaced(recipe, {"train.compile": False})  # the sweep's few steps are not worth a compile
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        trial = assemble(trial_recipe, data, copy_model(model), device, announce=False)
        result = lr_find(trial, start=AUTO_START, steps=AUTO_STEPS)
    peak = auto_lr(result)
    scale = lr_scale(recipe)
    recipe = replaced(recipe, {"optim.lr": peak / scale})
    if distributed.is_main():
        per = f" ({peak / scale:.4g} per {recipe.optim.base_batch})" if recipe.optim.base_batch else ""
        say(f"optim.lr=auto: peak LR {peak:.4g}{per} from a {len(result.lrs)}-step range test ({AUTO_RULE})")
        if recipe.optim.name not in rules.LR_AUTO_CALIBRATED:
            say(
                f"warning: optim.lr=auto's rule was measured for {', '.join(rules.LR_AUTO_CALIBRATED)} only; for "
                f"optim.name={recipe.optim.name} its peak is a guess (on 100 classes of glyphs it picked 0.57 per 32 "
                "for adamw, and the run stayed at chance): give optim.lr if the run does not learn"
            )
    return recipe


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
