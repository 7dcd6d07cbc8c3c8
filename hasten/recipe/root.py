"""The recipe's sections about the run (the loop, the tricks, the loss scale, the run folder, sweep and transfer)
and `Recipe`, the root model: its defaults are the default recipe, what `hasten train` runs.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from hasten.recipe.sections import (
    MAX_EPOCHS,
    MAX_THREADS,
    DataConfig,
    ModelConfig,
    OptimConfig,
    PositiveFloat,
    PrecisionName,
    ScheduleConfig,
    Section,
)
from hasten.text import printable


class TrainConfig(Section):
    epochs: Annotated[int, Field(ge=1, le=MAX_EPOCHS)] | Literal["auto"] = Field(
        "auto",
        description="Passes over the training data. auto: enough optimizer steps for the data (hasten/tune/rules.py), "
        "decided at start and recorded.",
    )
    batch_size: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        "auto",
        description="Training images per step, per process. auto: the batch of least predicted time to the result on "
        "this machine (hasten/tune/rules.py).",
    )
    eval_batch_size: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        "auto",
        description="Images per batch when evaluating. auto: 256 on a GPU; on a CPU, where activations that outgrow "
        "the caches slow the pass, at most 256 images and 1 MiB of input at the precision's element size (fp32: 256 "
        "of up to 45x45 pixels, 64 at 64x64; bf16 twice as many where the bytes bind), at least 16 "
        "(hasten/tune/rules.py).",
    )
    # so time to accuracy resolves to seconds
    eval_every_steps: Annotated[int, Field(ge=0)] = Field(
        0,
        description="Also evaluate every N optimizer steps (0: only at epoch ends); these evaluations are excluded "
        "from training time, as the epoch-end ones are, and listed in summary.json.",
    )
    # plain takes a sixth of a flip+shift TTA evaluation's wall time; the accuracy it reports is a little lower, so
    # time to accuracy is never flattered
    mid_eval: Literal["plain", "tta"] = Field(
        "plain",
        description="How the evaluations before the last one (each epoch's end, train.eval_every_steps) are made: "
        "plain: every test image once, without test-time augmentation; tta: as the last one. The last evaluation, "
        "the one the run reports, always uses the TTA of train.tta_flip and train.tta_translate.",
    )
    channels_last: bool | Literal["auto"] = Field(
        "auto",
        description="NHWC memory format for the model and the batches (conv nets). auto: timed at start-up "
        "(hasten/tune/autotune.py).",
    )
    accumulate: Annotated[int, Field(ge=1)] = Field(
        1, description="Micro-batches of train.batch_size summed into one optimizer step."
    )
    compile: bool = Field(
        False, description="torch.compile the model; falls back to eager, with a message, where it cannot."
    )
    checkpoint_activations: bool = Field(
        False,
        description="Recompute activations in the backward pass instead of keeping them (torch.utils.checkpoint): "
        "hasten's ResNet its own segments, any other model each top-level child with parameters but the last.",
    )
    checkpoint_modules: list[str] | None = Field(
        None,
        description="Recompute the activations of these named submodules (dotted, as named_modules gives them) in "
        "the backward pass, on any model; null: as train.checkpoint_activations says.",
    )
    tta_flip: bool | Literal["auto"] = Field(
        "auto",
        description="Evaluate on the image and its mirror, averaging the logits. auto: where the dataset allows "
        "mirrors and the training shows them (data.augment.flip not false).",
    )
    tta_translate: Annotated[int, Field(ge=0)] = Field(
        0,
        description="Evaluate on copies shifted diagonally by (+t, +t) and (-t, -t) pixels too (airbench's TTA: "
        "weights 1/2, 1/4, 1/4; edges filled as training's translate fills them); below half the image side. 0: off.",
    )
    progressive_resize: Annotated[float, Field(ge=0, lt=1)] = Field(
        0.0,
        description="Progressive resizing (Howard, fast.ai DAWNBench): training images start at this fraction of "
        "their side and grow linearly to full size by train.progressive_until of the optimizer steps; evaluation at "
        "full size. 0: off.",
    )
    progressive_until: Annotated[float, Field(gt=0, le=1)] = Field(
        0.5, description="Fraction of the run's optimizer steps by which progressive resizing reaches full size."
    )
    # benchmarks/generalization.py measures why
    min_steps_per_epoch: Annotated[int, Field(ge=0)] = Field(
        0,
        description="On small datasets the batch is halved (down to 16) until an epoch has at least this many "
        "optimizer steps, the LR following by optim.scaling; 0: train.batch_size as given.",
    )
    threads: Annotated[int, Field(ge=1, le=MAX_THREADS)] | None = Field(
        None, description="torch intra-op threads; null: torch's default."
    )
    end_early: bool = Field(
        False,
        description="With train.epochs=auto: true ends the LR's hold once the training accuracy has stayed at 99% or "
        "more for 3 epochs, and decays over as many epochs (hasten/run/extension.py): 1.3-2.4x sooner on sets that "
        "fit early, up to 4 points lower on 300 images (docs/defaults.md); false keeps the planned epochs.",
    )
    freeze_epochs: Annotated[int, Field(ge=0)] = Field(
        0, description="Train only the classifier head for the first N epochs, then the whole model."
    )
    on_nan: Literal["raise", "skip"] = Field(
        "raise", description="On a non-finite loss: raise stops, naming the step; skip skips that update."
    )
    clip_grad_norm: Annotated[float, Field(ge=0)] | None = Field(
        None,
        description="Clip the global gradient norm to this before each update (after fp16's unscaling); null or 0: "
        "off.",
    )
    remainder: Literal["pad", "drop"] = Field(
        "pad",
        description="Several processes (hasten train --devices N, torchrun): what becomes of the training samples "
        "that do not divide by the ranks each epoch: pad repeats a few so all ranks get as many (DistributedSampler's "
        "default), drop leaves them out of that epoch (its drop_last). Evaluation always counts each image once.",
    )
    sync_batchnorm: bool = Field(
        False, description="Several processes: batch-norm statistics over the global batch (SyncBatchNorm)."
    )


class TricksConfig(Section):
    """The bag of tricks (hasten/techniques/); each 0 means off."""

    label_smoothing: Annotated[float, Field(ge=0, lt=1)] = Field(
        0.1, description="Label smoothing eps: the targets are moved eps of the way towards uniform."
    )
    mixup: Annotated[float, Field(ge=0)] = Field(
        0.0, description="mixup (Zhang et al., 2018): alpha of Beta(alpha, alpha); 0: off."
    )
    cutmix: Annotated[float, Field(ge=0)] = Field(
        0.0,
        description="CutMix (Yun et al., 2019): alpha of Beta(alpha, alpha); 0: off. With mixup on too, one of the "
        "two per batch, with equal odds.",
    )
    # warmed up so that a short run does not evaluate its initial weights
    ema: float = Field(
        0.0,
        description="Decay of the weights' moving average per optimizer step, in (0, 1), warmed up as "
        "min(ema, (1 + t) / (10 + t)) after t steps; the average is what is evaluated. 0: off.",
    )
    # 1,024: as accurate as 4,096 on fashion-fast's checkpoints from step 60 to the end (within 0.15 points, either
    # way; without it, 11 points lower at step 60), a quarter of the seconds
    ema_bn_images: Annotated[int, Field(ge=0)] = Field(
        1024,
        description="Training images over which the average's batch-norm statistics are recomputed before it is "
        "evaluated; 0: keep the averaged running statistics.",
    )
    cutout: Annotated[int, Field(ge=0)] = Field(
        0, description="Side in pixels of the square zeroed in each training image (DeVries, 2017); 0: off."
    )
    lookahead_steps: Annotated[int, Field(ge=0)] = Field(
        0,
        description="Lookahead (Zhang et al., 2019): every k optimizer steps the slow weights move "
        "tricks.lookahead_alpha of the way to the live ones, which are reset to them; k=0: off.",
    )
    lookahead_alpha: Annotated[float, Field(gt=0, le=1)] = Field(
        0.5, description="Lookahead: the share of the way the slow weights move at each sync."
    )

    @model_validator(mode="after")
    def _ema_decay(self) -> TricksConfig:
        if self.ema != 0 and not 0 < self.ema < 1:
            raise ValueError(f"tricks.ema: the decay must be in (0, 1), e.g. 0.99, or 0 for off (got {self.ema:g})")
        return self


class LossScaleConfig(Section):
    """Dynamic loss scaling of fp16 and fp16-master (Micikevicius et al., 2018): halve on inf/NaN, grow after
    `growth_interval` clean steps."""

    # the one home of these defaults: hasten/engine/precision.py's modes take theirs from here
    init: PositiveFloat = Field(2.0**16, description="The scale the loss is multiplied by at the first step (2**16).")
    growth_interval: Annotated[int, Field(ge=1)] = Field(
        2000, description="Clean optimizer steps before the scale doubles."
    )


def unsafe_folder(path: str | Path) -> str | None:
    """Why `path` may not be a folder hasten writes a run or results into (the filesystem root, the home folder or
    one above it: run.overwrite would move the user's files), or None."""
    try:
        resolved = Path(path).expanduser().resolve()
        home = Path.home().resolve()
    except (OSError, RuntimeError, ValueError):
        return None
    if resolved == Path(resolved.anchor):
        return "the filesystem root"
    if resolved == home or resolved in home.parents:
        return "your home folder" if resolved == home else f"a folder above your home folder ({home})"
    return None


def _own_run_folder(folder: str | None) -> str | None:
    reason = unsafe_folder(folder) if folder else None
    if reason:
        raise ValueError(f"run.dir: {folder!r} is {reason}; a run needs a folder of its own, e.g. runs/NAME")
    return folder


# `run.dir` of every recipe kind (training, the GAN): None or a folder that is not the root or the home folder
RunFolder = Annotated[str | None, AfterValidator(_own_run_folder)]


class RunConfig(Section):
    dir: RunFolder = Field(
        None,
        description="The run's folder; null: runs/<recipe name>, or runs/<recipe name>-<data.name> on other data "
        "than the recipe's own.",
    )
    overwrite: bool = Field(
        False,
        description="A fresh run into a run.dir holding another run's files: move those into "
        "run.dir/replaced-<UTC time>/ (never deleted) instead of refusing.",
    )
    progress: bool = Field(True, description="Show a rich progress bar.")
    tensorboard: bool = Field(True, description="Write TensorBoard events into run.dir.")
    thresholds: list[Annotated[float, Field(gt=0, le=1)]] = Field(
        [0.90, 0.91, 0.92, 0.93, 0.94],
        description="Test accuracies whose time summary.json's time_to_accuracy records: the training seconds at "
        "which each was first reached (null if never).",
    )
    save_weights: bool = Field(
        False,
        description="Write the evaluated weights (the EMA copy where tricks.ema is on) to run.dir/model.safetensors, "
        "for model.pretrained.",
    )
    save_every: Annotated[int, Field(ge=0)] = Field(1, description="Checkpoint every N epochs (0: not at epoch ends).")
    save_every_steps: Annotated[int, Field(ge=0)] = Field(
        0, description="Also checkpoint every N optimizer steps (0: off)."
    )
    keep: Annotated[int, Field(ge=1)] = Field(
        2, description="Newest checkpoints kept in run.dir/checkpoints (the best one is kept too)."
    )


class SweepConfig(Section):
    """`hasten sweep`'s grid when the command line gives no --vary (hasten/experiments/sweep.py)."""

    vary: list[str] = Field([], description="KEY=V1,V2,... items, as --vary takes them.")


class TransferConfig(Section):
    """`hasten transfer` (hasten/experiments/transfer.py): the pretraining run and the fine-tuning set sizes."""

    pretrain: list[str] = Field([], description="key=value overrides that turn this recipe into the pretraining run.")
    per_class: list[Annotated[int, Field(ge=1)] | None] = Field(
        [10, 50, None], description="Fine-tuning set sizes, in training images per class; null: all of them."
    )


def plain_name(name: str) -> str:
    """`name`, a run's name, when it is a plain folder name: runs/<name> never leaves runs/, and holds no control
    character (ESC, a newline: the name is shown in every path of the run's folder); else a ValueError saying so."""
    if not name.strip() or any(c in name for c in "/\\\0") or name.strip() in (".", ".."):
        raise ValueError(
            f"name: {name!r} must be a plain folder name (no '/', '\\', '..'): it names runs/<name>, which a "
            "run may not leave (set run.dir to write elsewhere)"
        )
    if printable(name) != name:
        raise ValueError(
            f"name: {name!r} must be a plain folder name, without control characters: it names runs/<name> (a "
            "recipe file's name is the run's name unless the recipe sets one: give one, name=...)"
        )
    return name


RunName = Annotated[str, AfterValidator(plain_name)]  # a run's name (recipe key `name`), checked by plain_name


class Recipe(Section):
    name: RunName = Field(
        "default",
        description="The run's name, a plain folder name: runs/<name> unless run.dir is set. A recipe file or "
        "shipped recipe without one is named after itself.",
    )
    # torch and numpy seeds are unsigned 64-bit
    seed: Annotated[int, Field(ge=0, lt=2**63)] = Field(
        0, description="Seed of the run's random numbers: Python's, numpy's and torch's, the data order and draws."
    )
    precision: Literal[PrecisionName, "auto"] = Field(
        "auto",
        description="Numeric precision: fp32; bf16 autocast; fp16 autocast with dynamic loss scaling; fp16-master, "
        "fp16 weights with fp32 master copies. auto: the fastest numerically safe mode on this machine, timed at "
        "start-up (hasten/tune/autotune.py).",
    )
    loss_scale: LossScaleConfig = Field(LossScaleConfig(), description="Read by precision=fp16 and fp16-master only.")
    device: str = Field("auto", description="auto, cpu, cuda, cuda:N or mps; auto: cuda when available, else cpu.")
    data: DataConfig = Field(DataConfig(), description="The dataset and how it is read.")
    model: ModelConfig = Field(ModelConfig(), description="The network and its initialisation.")
    optim: OptimConfig = Field(OptimConfig(), description="The optimizer.")
    schedule: ScheduleConfig = Field(ScheduleConfig(), description="How the LR (and momentum) change over the run.")
    train: TrainConfig = Field(TrainConfig(), description="The training loop and its evaluations.")
    tricks: TricksConfig = Field(
        TricksConfig(), description="Regularisation and weight-averaging techniques added to the loop."
    )
    run: RunConfig = Field(RunConfig(), description="The run folder: logs, checkpoints, outputs.")
    sweep: SweepConfig = Field(SweepConfig(), description="Read by hasten sweep only.")
    resume: str | None = Field(
        None,
        description="auto: the newest complete checkpoint in run.dir; or a checkpoint's path. Also written as a "
        "section: resume: {from: auto, allow_changes: [...]}.",
    )
    resume_allow_changes: list[str] = Field(
        [],
        description="Dotted keys (or whole sections) that may differ from the checkpoint's recipe on resume; also "
        "written resume.allow_changes=[...].",
    )
    transfer: TransferConfig = Field(TransferConfig(), description="Read by hasten transfer only.")

    @model_validator(mode="after")
    def _compatible(self) -> Recipe:
        if self.tricks.lookahead_steps and self.precision == "fp16-master":
            raise ValueError(
                "tricks.lookahead_steps: the lookahead resets the model's weights, but under precision=fp16-master "
                "the optimizer steps fp32 master copies and writes them back over the weights; use bf16 or fp16"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _resume_section(cls, data: Any) -> Any:
        """`resume` may be a section {from, allow_changes}: stored as `resume` and `resume_allow_changes`."""
        if isinstance(data, dict) and isinstance(data.get("resume"), dict):
            data = dict(data)
            section = dict(data.pop("resume"))
            data["resume"] = section.pop("from", None)
            if "allow_changes" in section:
                data["resume_allow_changes"] = section.pop("allow_changes")
            if section:
                unknown = ", ".join(map(str, section))
                raise ValueError(f"resume: unknown key(s) {unknown} (it takes from, allow_changes)")
        return data

    @field_validator("device")
    @classmethod
    def _device_name(cls, device: str) -> str:
        if not DEVICE.fullmatch(device):
            raise ValueError(f"device: {device!r} is not auto, cpu, cuda, cuda:N or mps")
        return device


DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")
