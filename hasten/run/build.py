"""A run from a recipe: `build` (the data, the model, then resolve and assemble) and `train`, the library entry
point that `hasten train` calls: the run folder locked and claimed, the loop, the summary.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from hasten import threads
from hasten.clock import Clock
from hasten.data import ImageDataset, load_dataset
from hasten.data.imagefolder import (
    ImageFolder,
    fits_in_memory,
    read_into_memory,
)
from hasten.data.preprocessing import dataset_summary
from hasten.data.transforms import prepare
from hasten.data.user import StreamedData
from hasten.engine import distributed
from hasten.engine.distributed import DistEnv, world_size
from hasten.engine.memory import available_memory_bytes
from hasten.engine.norms import has_batch_norm
from hasten.engine.precision import check_precision
from hasten.engine.schedules import asked_rise_steps, lr_and_momentum, rise_steps
from hasten.errors import (
    CheckpointError,
    DataError,
    HastenError,
    RecipeError,
    out_of_memory,
    raised_in_their_code,
    their_error,
)
from hasten.machine import apply_cpu_allocator, cpu_allocator
from hasten.machine import current as current_machine
from hasten.models import build_model, meta_parameter_count
from hasten.models.pretrained import save_weights  # Freeze registers here
from hasten.models.user import check_image_size, own_model
from hasten.progress import say
from hasten.recipe.schema import Recipe, apply_overrides, to_yaml, validate
from hasten.recipe.sections import replaced
from hasten.recipe.trust import USER_SOURCES
from hasten.run.assemble import (
    Parts,
    assemble,
    global_batch,
    lr_scale,
    optimizer_steps,
    seed_everything,
    split_labels,
    train_size,
)
from hasten.run.extension import Extension
from hasten.run.loading import loader_workers, open_folder
from hasten.run.plan import Collapsed
from hasten.run.resolve import resolve, run_dir
from hasten.run.restart import (
    ABANDONED,
    RESTARTS,
    collapse_note,
    discard_start,
    first_weights,
    may_restart,
    restart_settings,
)
from hasten.run.trainer import Plan, Saving, Trainer
from hasten.run.user import builtin_holdout, load_data
from hasten.run.verdicts import absent_classes, majority_share
from hasten.runfolder.checkpoint import remove_stale_temporaries
from hasten.runfolder.folder import (
    RunLock,
    check_resume_recipe,
    claim_fresh,
    forget_unfinished_start,
    recipe_changes,
    refuse_links,
    refuse_taken,
)
from hasten.runfolder.log import RunLog
from hasten.tune import rules


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
        folder = open_folder(recipe, cfg.root)
        if cfg.in_memory is True or (cfg.in_memory == "auto" and fits_in_memory(folder, available_memory_bytes())):
            return read_into_memory(folder, loader_workers(recipe))  # decoded once: the in-memory loader's fast path
        return folder
    data = load_dataset(cfg.name, cfg.root, download=cfg.download, synthetic_size=cfg.synthetic_size, seed=recipe.seed)
    if cfg.subset:
        data.train_images, data.train_labels = data.train_images[: cfg.subset], data.train_labels[: cfg.subset]
    if cfg.test_subset:
        data.test_images, data.test_labels = data.test_images[: cfg.test_subset], data.test_labels[: cfg.test_subset]
    options = dict(per_class=cfg.per_class, label_noise=cfg.label_noise, size=cfg.size, rgb=cfg.rgb, fit=cfg.resize)
    return builtin_holdout(recipe, prepare(data, seed=recipe.seed, **options))


def check_training_data(recipe: Recipe, data: ImageDataset | ImageFolder | StreamedData, given: bool = False) -> None:
    """What no run can train on, refused before anything is built: fewer than two classes among the training
    labels (a classifier of one class scores 100% and learns nothing), and `data.classes` that are not the class
    names of a dataset that brings its own (a registered dataset, an image folder)."""
    labels = split_labels(data, "train")
    present = labels.unique().tolist() if len(labels) else []
    if len(present) < 2:
        names = [data.classes[i] for i in present if 0 <= i < len(data.classes)]
        what = f"only class {names[0]!r}" if names else "no labelled image"
        source = (  # the data= object's labels, or the recipe's dataset
            "the labels given as data="
            if given
            else f"data.name={recipe.data.name}" + (f", data.root={recipe.data.root}" if recipe.data.root else "")
        )
        raise DataError(
            f"data: the {len(labels):,} training image(s) hold {what}: a classifier needs at least 2 classes ({source})"
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
    """A built-in model whose parameters would not fit in this machine's memory (`model.width=60000`) is refused
    before any of it is allocated: it is first built on the meta device, which holds shapes and no data."""
    count = meta_parameter_count(recipe.model, image_shape, num_classes, build_model)
    if count is None:
        return
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


def build(
    recipe: Recipe, model: Any = None, data: Any = None, clock: Clock | None = None, loss_given: bool = False
) -> Parts:
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
    machine = current_machine()  # the facts every machine rule below reads: gathered once, or HASTEN_MACHINE's
    device = distributed.device_for(env, recipe.device, machine)
    distributed.init(env, device)
    clock = clock or Clock()  # marks where the start-up goes (hasten/clock.py)
    if recipe.train.threads:
        torch.set_num_threads(recipe.train.threads)
    allocator = cpu_allocator(machine, device.type)  # before the data: its arrays come from the allocator too
    allocator = allocator if apply_cpu_allocator(allocator) else None
    if recipe.precision != "auto":  # a fixed mode the device cannot run fails here, before data is read
        check_precision(recipe.precision, device)
    seed_everything(recipe.seed)
    given_model, given_data = model, data
    data = dataset(recipe) if data is None else load_data(recipe, data)
    clock.mark("data")
    check_training_data(recipe, data, given=given_data is not None)
    if given_model is not None:
        model = own_model(recipe.model, given_model, data.image_shape, len(data.classes))
    else:  # the recipe's: a built-in model or model.target's
        check_model_size(recipe, tuple(data.image_shape), len(data.classes), device)
        model = build_model(recipe.model, data.image_shape, len(data.classes))
        if recipe.model.name not in USER_SOURCES:  # hasten's own: do the images not shrink to nothing in it?
            check_image_size(model, tuple(data.image_shape), len(data.classes), recipe.model.name)
    clock.mark("model")
    # Building any torch.optim optimizer imports torch._dynamo (1.5-3.5 s on a CPU). The run's optimizer pays it,
    # or else the probe's first optimizer does: imported here, it is counted as the import it is, and the probe's
    # line in the start-up's split is the probe's own time
    importlib.import_module("torch._dynamo")  # (an `import` statement here would make `torch` local to build)
    clock.mark("start and imports")
    resolved = resolve(recipe, data, model, device, given_model, given_data, machine, loss_given)
    clock.mark("probe")
    parts = assemble(resolved.recipe, data, model, device, resolved.machine_keys, clock)
    parts.machine, parts.checkpoint, parts.cpu_allocator = machine, resolved.checkpoint, allocator
    parts.extendable, parts.warnings, parts.output_hook = resolved.extendable, resolved.warnings, resolved.output_hook
    return parts


def trainer_for(parts: Parts, plan: Plan, log: RunLog, saving: Saving | None = None) -> Trainer:
    """The loop over what `build` made, with the recipe's hooks."""
    loaders = (parts.train_loader, parts.test_loader)
    return Trainer(
        parts.model, parts.optimizer, parts.scheduler, parts.precision, loaders, plan, log, parts.hooks, saving
    )


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


def planned_steps(recipe: Recipe, budget: int = rules.RUN_STEPS) -> int:
    """The optimizer steps train.epochs=auto would plan for a small set at the recipe's batch (rules.budget_steps;
    `budget` at the budget's own batch, rules.run_steps for the model)."""
    batch = recipe.train.batch_size
    if not isinstance(batch, int):
        return budget
    return rules.budget_steps(budget, batch, world_size(), recipe.train.accumulate)


def budget_epochs(recipe: Recipe, run_steps: int | None, budget: int = rules.RUN_STEPS) -> int | None:
    """For a run given a number of epochs that make fewer optimizer steps (`run_steps`) than the budget rule gives
    a small set (`budget`, rules.run_steps for the model): the epochs that give it that many; else (or `run_steps`
    not known) None."""
    epochs, budget = recipe.train.epochs, planned_steps(recipe, budget)
    if not run_steps or not isinstance(epochs, int) or run_steps >= budget:
        return None
    return -(-budget * epochs // run_steps)


def short_run_note(recipe: Recipe, run_steps: int, budget: int = rules.RUN_STEPS, chosen: bool = False) -> str | None:
    """Said at start-up for a run whose epochs fall short of the budget rule's optimizer steps: such a run stops
    while it is still learning, and where it stops moves with the seed (docs/defaults.md: 1,200 rendered letters at
    1 epoch, 75 steps, scored 33.8-48.2% over 5 seeds, at 3 epochs 93.8-96.5%). None for a run long enough.
    `budget`: the steps train.epochs=auto plans for this model (rules.run_steps); `chosen`: the epochs are
    train.epochs=auto's own, cut at its most (a very small set), not the user's."""
    epochs = budget_epochs(recipe, run_steps, budget)
    if epochs is None:
        return None
    planned = planned_steps(recipe, budget)
    whose = (f"train.epochs=auto's {recipe.train.epochs}, the most it plans,"
             if chosen else f"train.epochs={recipe.train.epochs}")  # fmt: skip
    return (
        f"{whose} gives this run {run_steps:,} optimizer steps, under the {planned:,} that train.epochs=auto plans "
        f"for a small set at this batch: it may stop while still learning, with an accuracy that varies with the "
        f"seed; train.epochs={epochs} gives it {planned:,}"
    )


def divergence_advice(recipe: Recipe, run_steps: int | None = None, budget: int = rules.RUN_STEPS) -> list[str]:
    """What a run that diverged or does not learn is told to try, as overrides its own recipe accepts (each is
    validated against it): first, for a run of fewer than the budget rule's optimizer steps (`run_steps`, when
    known), the epochs that give it that many (a small set at a few epochs has not started to learn, whatever its
    LR); then half the LR, the LR range test where its rule was measured for the optimizer (SGD), a warm-up twice as
    long, half the batch."""
    advice = []
    epochs = budget_epochs(recipe, run_steps, budget)
    if epochs is not None:
        advice.append(f"train.epochs={epochs}")
    lr = recipe.optim.lr
    if isinstance(lr, float):
        advice.append(f"optim.lr={lr / 2:.3g}")
    if recipe.optim.name in rules.LR_AUTO_CALIBRATED:  # elsewhere the range test's peak is a guess (docs/lr-auto.md)
        advice.append("optim.lr=auto")
    rise = recipe.schedule.min_warmup_steps
    advice.append(f"schedule.min_warmup_steps={max(2 * rise, 50) if isinstance(rise, int) else 50}")
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
            refuse_links(folder)  # whatever the run writes next goes to its own files, not through a link
            if checkpoint is not None:
                saved = checkpoint[1].get("recipe")
                allowed = [*recipe.resume_allow_changes, *machine_keys]  # the probe may choose otherwise now
                check_resume_recipe(saved, recipe.model_dump(mode="json"), allowed, str(checkpoint[0]))
            elif int(os.environ.get(RESTARTS, "0")) == 0:  # a restart continues its own files
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
    `hasten` command passes its process's start; by default, this call).

    A run whose batch, LR and epochs were all left to hasten, and whose model's outputs collapse (the same for every
    test image and class, no gradient left: hasten/run/verdicts.py, collapsed_outputs), is restarted once from its
    first weights at a larger batch and half the LR (`restart_settings`); the abandoned start's files are removed,
    its seconds stay in the wall clock, and summary.json's `restarted` records it."""
    clock = clock or Clock()
    clock.mark("start and imports")
    folder = run_dir(recipe)
    main = DistEnv.from_environ().is_main  # (before the process group is up: from the environment)
    if main:
        say(f"run folder: {folder}")
        if recipe.resume is None and not recipe.run.overwrite and not int(os.environ.get(RESTARTS, "0")):
            refuse_taken(folder)  # before the data, the probe and every decision: checked again when claimed
    # held from before the data is read: the checkpoint a resume continues from is read once, under the lock, and
    # a second run into the folder is refused before it has timed or decided anything
    with RunLock(folder) if main else contextlib.nullcontext():
        first = first_weights(model) if may_restart(recipe) else None
        asked, restart = recipe, None  # restart: the record of a start that collapsed, once there was one
        while True:  # once, or twice when the first start's outputs collapsed (the second never restarts)
            try:
                parts = build(asked, model, data, clock, loss_given=loss is not None)
            except Exception as error:  # the start-up runs their model (the probe, the numerics, the LR range test)
                if isinstance(error, HastenError) or out_of_memory(error) or not raised_in_their_code(error):
                    raise
                raise RecipeError(
                    f"start-up: trying the run on one batch, your code raised {their_error(error)}"
                ) from None
            recipe = parts.recipe  # what was used: every choice made (resolve), the user's model and data recorded
            trainer, log = start_run(recipe, parts, folder, loss, clock, restartable=first is not None and not restart)
            trainer.state.restarted = restart or trainer.state.restarted  # (a resumed run's from its checkpoint)
            # signals stay caught until the run returns: a stop once the last epoch is done lets the summary be
            # written and the run end with 0 (its work is complete), instead of killing it mid-write
            try:
                with trainer.stop_on_signals():
                    summary = trainer.fit()
                    model = distributed.unwrap(parts.model)
                    if recipe.run.save_weights and log.enabled:  # the weights evaluated: the EMA copy when there is one
                        save_weights(parts.hooks.eval_model(model) if parts.hooks.eval_model else model, log.dir)
                    summary |= {"run_dir": str(log.dir), "lr": parts.lr, "global_batch": global_batch(recipe)}
                    summary |= {"world_size": world_size(), "precision": recipe.precision}  # auto: as chosen
                    summary |= {"channels_last": recipe.train.channels_last}
                    if parts.machine is not None:  # the facts its machine rules read (hasten/machine.py)
                        summary["machine"] = parts.machine.record()
                    summary["cpu_allocator"] = parts.cpu_allocator  # glibc's mallopt settings taken; None: none
                    summary["threads_wait"] = threads.record()  # how the CPU threads wait, and why (hasten/threads.py)
                    # for evaluate and predict: the class names, the preprocessing (data.resize's fit among it)
                    summary |= dataset_summary(parts.data, parts.train_loader, parts.test_loader, recipe.data.resize)
                    summary["evaluated_on"] = evaluated_on(recipe)
                    summary["restarted"] = trainer.state.restarted  # None: one start; else the start replaced, why
                    summary["wall_seconds"] = round(trainer.wall_seconds(), 3)  # everything, from the command's start
                    log.summary(summary)
                    distributed.barrier()  # the ranks end together, once rank 0 has written everything
                    return summary
            except Collapsed as collapse:  # start again from the first weights, with the plan's settings
                clock.mark(ABANDONED)  # its own phase of the start-up, not the next start's data reading
                log.close()
                restart = collapse.record | {
                    "wall_seconds": round(collapse.record["wall_seconds"], 3),  # from the command's start
                    "from": {"train.batch_size": recipe.train.batch_size, "optim.lr": recipe.optim.lr},
                    "to": dict(trainer.plan.restart or {}),
                }
                say(collapse_note(restart))
                discard_start(folder)
                if isinstance(first, dict):  # the user's own model object: back to the weights it came with
                    model.load_state_dict(first)
                asked = replaced(asked, restart["to"])
            except Exception as error:
                theirs = recipe.model.name in USER_SOURCES and not isinstance(
                    error, MemoryError | torch.OutOfMemoryError
                )
                if not isinstance(error, HastenError) and not (theirs and raised_in_their_code(error)):
                    raise  # hasten's own failure: its traceback is the report
                log.close()
                fresh = parts.checkpoint is None and not int(os.environ.get(RESTARTS, "0"))
                if fresh and log.enabled and forget_unfinished_start(folder):  # a step-1 failure leaves no debris
                    say(f"run folder: {folder} left as it was (the run ended before its first checkpoint)")
                if isinstance(error, HastenError):
                    raise
                # their model's forward or backward in training (the start-up check runs it in evaluation mode only)
                layout = ""
                if recipe.train.channels_last is True and "view size is not compatible" in str(error):
                    layout = (
                        " in the channels_last layout, which its `view` cannot take (set train.channels_last=auto),"
                    )
                raise RecipeError(f"model: training your model{layout} raised {their_error(error)}") from None
            finally:
                log.close()
                if parts.output_hook is not None:  # a model object of the user's returns what it returned before
                    parts.output_hook.remove()


def lengthening(recipe: Recipe, parts: Parts, log: RunLog, saving: Saving) -> Callable[[int], None]:
    """What lengthening the run to some epochs does (hasten/run/extension.py): the schedule over their optimizer
    steps from the step it is at, recipe.yaml and the checkpoints' recipe with them (a resume continues as long)."""

    def apply(epochs: int) -> None:
        longer = replaced(recipe, {"train.epochs": epochs})
        total = optimizer_steps(longer, parts.train_loader)
        parts.scheduler.retarget(*lr_and_momentum(longer.schedule, total, lr_scale(longer)), total)
        log.write_recipe(to_yaml(longer))
        saving.recipe = longer.model_dump(mode="json")

    return apply


def start_run(
    recipe: Recipe,
    parts: Parts,
    folder: Path,
    loss: Callable[[Tensor, Tensor], Tensor] | None,
    clock: Clock,
    restartable: bool = False,
) -> tuple[Trainer, RunLog]:
    """The loop over the built `parts`, ready in its (locked) run folder: resumed from a checkpoint when the recipe
    asks, the folder claimed, recipe.yaml written, the warnings and the resolved LR scaling said. `restartable`:
    outputs that collapse end the loop with `Collapsed` and the settings to restart with (`train`)."""
    checkpoint = parts.checkpoint  # read by resolve, under the run's lock, before anything in the folder is written
    claim_run_folder(recipe, folder, checkpoint, parts.machine_keys)
    log = RunLog(folder, enabled=distributed.is_main(), tensorboard=recipe.run.tensorboard)
    run_steps = optimizer_steps(recipe, parts.train_loader)
    budget = rules.run_steps(has_batch_norm(parts.model))  # what train.epochs=auto plans for this model
    plan = Plan(
        epochs=recipe.train.epochs,
        num_classes=len(parts.data.classes),
        class_names=tuple(parts.data.classes),
        tta_flip=recipe.train.tta_flip,
        tta_translate=recipe.train.tta_translate,
        thresholds=recipe.run.thresholds,
        progress=recipe.run.progress,
        accumulate=recipe.train.accumulate,
        on_nan=recipe.train.on_nan,
        rise_steps=rise_steps(recipe.schedule, run_steps, lr_scale(recipe)),
        clip_grad_norm=recipe.train.clip_grad_norm,
        eval_every_steps=recipe.train.eval_every_steps,
        divergence_advice=divergence_advice(recipe, run_steps, budget),
        mid_eval=recipe.train.mid_eval,
        clock=clock,
    )
    if loss is not None:
        plan.loss = loss
    batch, lr = recipe.train.batch_size, recipe.optim.lr  # a larger batch at half the LR, for outputs that collapse
    if batch < rules.COLLAPSE_BATCH and recipe.train.accumulate == 1 and isinstance(lr, float):
        plan.collapse_advice = f"train.batch_size={rules.COLLAPSE_BATCH} optim.lr={lr / 2:.3g}"
    # chance, for the warnings and the lengthening: the largest class's share where one class stands out
    training_labels = split_labels(parts.data, "train")
    if restartable and parts.extendable and checkpoint is None:
        plan.restart = restart_settings(recipe, len(training_labels), budget)
    plan.test_chance, plan.train_chance = (
        majority_share(split_labels(parts.data, "test")),
        majority_share(training_labels),
    )
    saving = Saving(log.dir / "checkpoints", recipe.run.save_every, recipe.run.save_every_steps, recipe.run.keep,
                    recipe.model_dump(mode="json"))  # fmt: skip
    if parts.extendable:  # train.epochs=auto: lengthened or shortened once, by the training (hasten/run/extension.py)
        apply = lengthening(recipe, parts, log, saving)  # shortened only where its epochs hold the whole budget:
        whole = run_steps >= planned_steps(recipe, budget)  # 60 epochs of 200 images fit early and still gain
        plan.extension = Extension(recipe.schedule.peak, apply, recipe.train.end_early and whole)
    trainer = trainer_for(parts, plan, log, saving)
    absent = absent_classes(training_labels, parts.data.classes)
    for text in (*parts.warnings, *risky_settings(recipe, parts), *([absent] if absent else [])):
        trainer.warn(text)
    asked = asked_rise_steps(recipe.schedule, lr_scale(recipe))
    if 2 * plan.rise_steps < asked and checkpoint is None:  # under half the warm-up asked for
        trainer.warn(
            f"the run has only {run_steps} optimizer steps: its LR rises over "
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
        if parts.cpu_allocator:
            said = ", ".join(f"{name} {value >> 20} MiB" for name, value in parts.cpu_allocator.items())
            say(f"CPU allocator (glibc mallopt): {said}: a step's tensors reuse the heap's pages, not fresh ones")
        said = threads.DECIDED.describe() if threads.DECIDED is not None else None
        if parts.device.type == "cpu" and said:  # a CPU run whose command chose its threads' wait: why
            say(said)
        chosen = parts.extendable  # train.epochs=auto chose the epochs (capped at its most, where short)
        note = short_run_note(recipe, run_steps, budget, chosen) if checkpoint is None else None
        if note:
            say(note)
    return trainer, log
