"""The recipe: every knob of a run, validated in one place.

A recipe is a YAML file (or the name of one shipped in `hasten/recipe/shipped/`), then dotted `key=value`
overrides from the command line, then `Recipe.model_validate`. Unknown keys, wrong types and values out of
range are all reported together, each naming its dotted field, as one `RecipeError` (exit code 2).
"""

from __future__ import annotations

import copy
import difflib
import importlib.resources
import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, get_args

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hasten.data.preprocessing import MAX_IMAGE_SIDE
from hasten.data.registry import DATASETS
from hasten.errors import RecipeError

PositiveFloat = Annotated[float, Field(gt=0)]
MAX_SYNTHETIC = 1_000_000  # images of the synthetic set: each is drawn one by one (a million take ~1 GB)
Fraction = Annotated[float, Field(ge=0, lt=1)]

# The numeric precision modes, named here once: hasten/engine/precision.py implements each, the recipes take them,
# the start-up probe picks among them. The GAN takes those that keep the weights in fp32 (not fp16-master).
Fp32WeightsPrecision = Literal["fp32", "bf16", "fp16"]
PrecisionName = Literal[Fp32WeightsPrecision, "fp16-master"]
PRECISION_MODES: tuple[str, ...] = get_args(PrecisionName)


BaseModelT = TypeVar("BaseModelT", bound=BaseModel)


class Section(BaseModel):
    """Base of every recipe section: unknown keys are errors, no float setting may be NaN or infinite, and a
    validated recipe is frozen: what `resolve` decides is made into a new recipe (`replaced`), so the recipe a run
    records is the one every part of it was built from."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def replaced(model: BaseModelT, changes: dict[str, Any]) -> BaseModelT:
    """A copy of the frozen `model` (a recipe or a section) with `changes`, dotted keys to values
    ({"train.epochs": 5, "data.augment.flip": True}), set; `model` is unchanged. Each changed section is copied,
    the others shared (they cannot change). The values are checked as the recipe's own are: a change that a recipe
    file could not hold is a ValueError naming the key (a bug in hasten, never the user's input)."""
    nested: dict[str, dict[str, Any]] = {}
    flat: dict[str, Any] = {}
    for key, value in changes.items():
        head, _, rest = key.partition(".")
        if head not in type(model).model_fields:
            raise ValueError(f"{key}: no such key in {type(model).__name__}")
        if rest:
            nested.setdefault(head, {})[rest] = value
        else:
            flat[head] = value
    for head, inner in nested.items():
        flat[head] = replaced(getattr(model, head), inner)
    copy_ = model.model_copy(update=flat)
    try:
        type(model).model_validate(copy_.model_dump())
    except ValidationError as error:
        raise ValueError(f"{', '.join(changes)}: {error}") from None
    return copy_


class AugmentConfig(Section):
    flip: bool | Literal["auto", "alternate"] = Field(
        "auto",
        description="Random horizontal flip, per image, applied to the whole batch. auto: on where the dataset is "
        "mirror-invariant (Fashion-MNIST, CIFAR), off where a mirror changes the class (digits, letters) and for "
        "unknown data; alternate: derandomised (airbench): random per image in epoch 1, then each epoch the opposite "
        "of the one before (honoured on any dataset, with a warning where a mirror may change the class).",
    )
    # auto skips short runs, which the shift slows more than it regularises
    translate: Annotated[int, Field(ge=0)] | Literal["auto"] = Field(
        "auto",
        description="Random shift of up to this many pixels (zero padding). auto: 1/32 of the image side in runs of 5 "
        "epochs or more, none in shorter ones (hasten/tune/rules.py).",
    )
    # 2 pixels suit 28x28 images, while an 8x8 digit moved 2 pixels loses a quarter of itself (digits at 2 epochs:
    # 87.5% with it, 98.9% without)
    translate_max_fraction: Annotated[float, Field(ge=0, le=0.5)] = Field(
        0.1, description="Cap on data.augment.translate, as a fraction of the image's shorter side."
    )


# the registry's datasets, a folder of images by class, and the user's own data (hasten/run/user.py)
DatasetName = Literal[(*DATASETS, "imagefolder", "import", "object")]


class DataConfig(Section):
    name: DatasetName = Field(
        "fashion-mnist",
        description="The dataset: one of the registry's, imagefolder (a folder of images by class at data.root), "
        "import (data.target's function returns the data) or object (given in Python: hasten.train(data=...)).",
    )
    root: str | None = Field(
        None,
        description="A folder holding the dataset's files under their official names (for an image folder, the "
        "one holding train/ and val/ or test/). null: $HASTEN_DATA, the cache (~/.cache/hasten/<name>) and system "
        "copies are tried, then the download.",
    )
    download: bool = Field(
        True, description="Allow fetching from the official address (checked against a pinned SHA-256)."
    )
    subset: Annotated[int, Field(ge=1)] | None = Field(None, description="Train on the first N training images only.")
    test_subset: Annotated[int, Field(ge=1)] | None = Field(None, description="Evaluate on the first N test images.")
    synthetic_size: Annotated[int, Field(ge=8, le=MAX_SYNTHETIC)] = Field(
        512, description="Training images of the synthetic set (data.name=synthetic)."
    )
    augment: AugmentConfig = Field(AugmentConfig(), description="Augmentation of the training batches.")
    size: Annotated[int, Field(ge=1, le=MAX_IMAGE_SIDE)] | None = Field(
        None,
        description="Resize every image to size x size pixels; null: as stored (an image folder of mixed sizes: a "
        "square of its median shorter side).",
    )
    rgb: bool | None = Field(
        None,
        description="true: 3 channels (grey repeated); false: 1 channel (luma); null: as stored (an image folder "
        "of grey and colour images: 3 channels).",
    )
    workers: Annotated[int, Field(ge=0)] | None = Field(
        None,
        description="imagefolder: DataLoader worker processes; null: one per CPU core but one, at most 4.",
    )
    in_memory: bool | Literal["auto"] = Field(
        "auto",
        description="imagefolder: decode every image once and train from memory (no decoding per epoch). auto: when "
        "the decoded images take at most a quarter of the memory available (and 4 GiB); false: decode each epoch, "
        "in workers.",
    )
    per_class: Annotated[int, Field(ge=1)] | None = Field(
        None, description="Keep at most the first N training images of each class."
    )
    label_noise: Annotated[float, Field(ge=0, lt=1)] = Field(
        0.0,
        description="Fraction of training labels moved to another class, seeded (Nakkiran et al., 2019); test "
        "labels stay.",
    )
    target: str | None = Field(
        None,
        description='The user\'s own data (hasten/run/user.py): "package.module:function" returning (train, test[, '
        "class_names]) or a training part alone.",
    )
    args: dict[str, Any] = Field({}, description="Keyword arguments of data.target's function.")
    classes: list[str] | None = Field(
        None,
        description="Class names, recorded in recipe.yaml; given ones name the labels 0..K-1.",
    )
    val_fraction: Annotated[float, Field(ge=0, lt=1)] = Field(
        0.0,
        description="A seeded, stratified share of the training data held out as the evaluation split, for data "
        "without one.",
    )

    @model_validator(mode="after")
    def _folder_needs_root(self) -> DataConfig:
        if self.name == "imagefolder" and not self.root:
            raise ValueError("data.root: an image folder needs data.root=DIR (holding train/<class>/ and val/<class>/)")
        if self.name == "import" and not self.target:
            raise ValueError("data.target: data.name=import needs data.target=package.module:function")
        return self


class ModelConfig(Section):
    name: Literal["resnet", "sequential", "import", "object"] = Field(
        "resnet",
        description="resnet: hasten's ResNet; sequential: built from model.layers; import: model.target's callable "
        "returns the nn.Module; object: given in Python (hasten.train(model=...)).",
    )
    width: Annotated[int, Field(ge=1)] = Field(
        16, description="Channels of the first ResNet stage; each later stage doubles them."
    )
    blocks: list[Annotated[int, Field(ge=0)]] = Field([1, 1, 1], description="Residual blocks per ResNet stage.")
    layers: list[str | dict[str, Any]] | None = Field(
        None,
        description="The layer list of a sequential model, e.g. [{conv: 32}, relu, {maxpool: 2}, flatten, "
        "{dense: classes}] (hasten/models/sequential.py).",
    )
    zero_init_residual: bool = Field(
        False, description="Start each residual branch's last BN scale (gamma) at 0 (Goyal et al., 2017)."
    )
    widths: list[Annotated[int, Field(ge=1)]] | None = Field(
        None,
        description="ResNet: channels of each stage (one per model.blocks entry) in place of width x 2**stage; "
        "null: from model.width.",
    )
    # without it 100 classes of rendered glyphs stayed at chance for the whole default budget (docs/defaults.md)
    whiten: bool | Literal["auto"] = Field(
        "auto",
        description="Patch-whitening init of the first Conv2d, frozen when every filter is set "
        "(hasten/techniques/whitening.py). auto: on for hasten's ResNet trained from scratch (model.name=resnet, no "
        "model.pretrained), off for any other model.",
    )
    whiten_eps: Annotated[float, Field(gt=0)] = Field(
        5e-4, description="Added to each eigenvalue before 1/sqrt in the whitening: caps its gain."
    )
    whiten_images: Annotated[int, Field(ge=1)] = Field(
        5000, description="Training images the whitening patches are taken from."
    )
    init: Literal["default", "dirac"] = Field(
        "default", description="dirac: 3x3 convs start as the identity on their inputs (hasten/techniques/dirac.py)."
    )
    bn_momentum: Annotated[float, Field(gt=0, le=1)] | None = Field(
        None,
        description="Running-statistics momentum of every BatchNorm layer (torch's convention); null: the model's.",
    )
    bn_eps: Annotated[float, Field(gt=0)] | None = Field(
        None, description="Epsilon of every BatchNorm layer; null: the model's."
    )
    bn_weight: Literal["learn", "frozen"] = Field(
        "learn", description="frozen: BN scales fixed at 1, only the shifts train."
    )
    pretrained: str | None = Field(
        None,
        description="Weights to start from: a safetensors file, a hasten checkpoint, a state dict, or an http(s) URL.",
    )
    pretrained_sha256: str | None = Field(
        None, description="Pinned SHA-256 of the file at a model.pretrained URL (required for URLs)."
    )
    pretrained_strict: bool = Field(
        True, description="false: load the weights that fit and report the rest, instead of stopping."
    )
    reset_head: bool = Field(
        False, description="A fresh classifier head even when the class count matches the pretrained weights'."
    )
    target: str | None = Field(
        None, description='import: "package.module:callable"; object: the class trained (recorded).'
    )
    args: dict[str, Any] = Field({}, description="Keyword arguments of model.target's callable.")
    parameters: int | None = Field(
        None, description="Recorded in recipe.yaml: the parameter count of the model trained (not read back)."
    )

    @model_validator(mode="after")
    def _layers_for_sequential(self) -> ModelConfig:
        if self.name == "import" and not self.target:
            raise ValueError("model.target: model.name=import needs model.target=package.module:callable")
        if self.name == "sequential" and not self.layers:
            raise ValueError("model.layers: a sequential model needs a non-empty layer list")
        if self.name == "resnet" and not self.blocks:
            raise ValueError("model.blocks: a resnet needs at least one stage")
        if self.widths is not None and self.name != "resnet":
            raise ValueError("model.widths: only hasten's ResNet (model.name=resnet) has stages to set the widths of")
        if self.widths is not None and len(self.widths) != len(self.blocks):
            raise ValueError(
                f"model.widths: one width per stage: {len(self.widths)} given for the {len(self.blocks)} stages of "
                f"model.blocks={self.blocks}"
            )
        if self.zero_init_residual and self.bn_weight == "frozen":
            raise ValueError(
                "model.bn_weight: frozen BN scales with model.zero_init_residual=true would keep the zeroed scales at "
                "0 for ever and switch those residual branches off; set one of the two"
            )
        url = self.pretrained is not None and self.pretrained.startswith(("http://", "https://"))
        if url and not self.pretrained_sha256:
            raise ValueError(
                "model.pretrained_sha256: weights from a URL need their pinned SHA-256 (sha256sum of the file)"
            )
        return self


class OptimConfig(Section):
    # robust from batch 16 to 512 on every set measured (docs/defaults.md)
    name: Literal["sgd", "adamw", "adam", "muon"] = Field(
        "adamw",
        description="The optimizer. muon: conv filters orthogonalised by Muon (hasten/engine/optimizers.py), every "
        "other parameter Nesterov SGD at optim.lr.",
    )
    # checked positive by _positive_lr, not by the type: one error, not one per member of the union
    lr: float | Literal["auto"] = Field(
        0.002,
        description="Peak learning rate, per optim.base_batch examples when that is set. auto: picked by a short LR "
        "range test before training (hasten/tune/lr_find.py; calibrated in benchmarks/lr_auto.py).",
    )
    base_batch: Annotated[int, Field(ge=1)] | None = Field(
        32, description="The batch size optim.lr is given for; null: no scaling with the batch."
    )
    scaling: Literal["linear", "sqrt"] = Field(
        "sqrt", description="How the LR grows with the global batch from optim.base_batch (Goyal et al.: linear)."
    )
    momentum: Annotated[float, Field(ge=0, lt=1)] = Field(
        0.9,
        description="SGD momentum (sgd, and muon's non-filter parameters); one-cycle and cyclic schedules replace it "
        "with schedule.momentum's cycle unless that is null.",
    )
    nesterov: bool = Field(True, description="Nesterov momentum for sgd and muon (where optim.momentum > 0).")
    betas: tuple[Fraction, Annotated[float, Field(ge=0, lt=1)]] = Field(
        (0.9, 0.999), description="adam, adamw: the moment decays [beta1, beta2]."
    )
    weight_decay: Annotated[float, Field(ge=0)] = Field(
        0.01,
        description="Weight decay: added to the gradient (L2) for sgd, adam and muon's non-filter parameters; "
        "decoupled for adamw and muon's filters.",
    )
    no_bias_decay: bool = Field(
        True, description="No weight decay on biases and normalisation parameters (every 1-D parameter)."
    )
    fused: bool | Literal["auto"] = Field(
        "auto",
        description="adam, adamw: torch's fused kernel, one pass over every parameter (on a CPU ~4x less step time "
        "than the loop). auto: where torch has one for the device (false for sgd and muon), decided at start.",
    )
    layer_lr_decay: Annotated[float, Field(gt=0, le=1)] = Field(
        1.0,
        description="Discriminative fine-tuning (Howard & Ruder, 2018): each layer below the head gets this times "
        "the LR of the layer above it; 1: one LR for all.",
    )
    # no scaling rule: the orthogonalised update has the same size at any batch
    muon_lr: PositiveFloat = Field(
        0.02,
        description="muon: peak LR of the conv filters, per step whatever the batch; the LR schedule drives it too.",
    )
    muon_momentum: Annotated[float, Field(ge=0, lt=1)] = Field(
        0.95,
        description="muon: the filters' momentum (torch.optim.Muon's lerp form), kept fixed by one-cycle's momentum "
        "cycling.",
    )

    @model_validator(mode="after")
    def _muon_lr_is_given(self) -> OptimConfig:
        if self.name == "muon" and self.lr == "auto":
            raise ValueError(
                "optim.lr: auto is not available with optim.name=muon: the range test would sweep the filters' "
                "optim.muon_lr with the other parameters' LR; give optim.lr"
            )
        return self

    @field_validator("lr", mode="before")
    @classmethod
    def _positive_lr(cls, lr: Any) -> Any:
        # before the union is tried: one message for a number out of range, not one per member of the union
        if isinstance(lr, (int, float)) and not isinstance(lr, bool) and not (math.isfinite(lr) and lr > 0):
            raise ValueError(
                f"optim.lr: the peak learning rate must be a finite number greater than 0, or auto (got {lr!r})"
            )
        return lr


class ScheduleConfig(Section):
    """LR schedule over the run, stepped every optimizer step; see hasten/engine/schedules.py for the papers.

    `linear`: after the warm-up the LR falls in a straight line to `floor` x the peak at the end (linear-to-zero).
    airbench's triangular schedule is `one-cycle` with `anneal: linear`: `start` x peak rising to the peak at
    `peak` of the run, then falling to `end` x peak (with `momentum: null` for its fixed momentum)."""

    # the default holds the peak for the first half of the run, then falls straight to zero (warmup-stable-decay, a
    # one-cycle that starts at its peak): a run decaying from its first step stayed at chance on some seeds of small
    # sets where holding the peak learnt them (docs/defaults.md)
    name: Literal["constant", "step", "cosine", "linear", "cyclic", "one-cycle"] = Field(
        "one-cycle",
        description="The schedule's shape: constant, step decay at schedule.milestones, cosine or linear down to "
        "schedule.floor, cyclic (Smith, 2017), or one-cycle (Smith & Topin, 2018).",
    )
    warmup: Annotated[float, Field(ge=0)] = Field(
        0.0,
        description="Linear warmup before any schedule: a fraction of the run (< 1) or a count of optimizer steps "
        "(>= 1).",
    )
    # after a 10-step rise a 100-class set stayed near the loss of a uniform guess for up to three epochs
    min_warmup_steps: Annotated[int, Field(ge=0)] | Literal["auto"] = Field(
        "auto",
        description="The LR rises to its peak over at least this many optimizer steps (times the batch rule's LR "
        "factor when above 1; at most half the run): one-cycle's rise is lengthened, other schedules get a warmup. "
        "0: off. auto: one step per class of the data, at least 10 (hasten/tune/rules.py's auto_rise_steps).",
    )
    floor: Annotated[float, Field(ge=0, le=1)] = Field(
        0.0, description="cosine, linear: the final LR as a fraction of the peak."
    )
    milestones: list[Annotated[float, Field(gt=0, lt=1)]] = Field(
        [0.5, 0.75], description="step: where the LR drops, as fractions of the run (increasing)."
    )
    gamma: Annotated[float, Field(gt=0, le=1)] = Field(
        0.1, description="step: LR factor at each milestone; cyclic exp_range: the factor per cycle."
    )
    cycles: Annotated[int, Field(ge=1)] = Field(
        4, description="cyclic: full triangles over the run (after the warmup)."
    )
    mode: Literal["triangular", "triangular2", "exp_range"] = Field(
        "triangular", description="cyclic: the mode of Smith (2017)."
    )
    low: Annotated[float, Field(ge=0)] = Field(
        0.1, description="cyclic: the lower bound as a fraction of the peak; below 1."
    )
    peak: Annotated[float, Field(gt=0, lt=1)] = Field(
        0.5, description="one-cycle: where in the run the LR peaks, as a fraction of it."
    )
    start: Annotated[float, Field(ge=0, le=1)] = Field(
        1.0, description="one-cycle: the starting LR as a fraction of the peak."
    )
    end: Annotated[float, Field(ge=0, le=1)] = Field(
        0.0, description="one-cycle: the final LR as a fraction of the peak."
    )
    anneal: Literal["linear", "cosine"] = Field("linear", description="one-cycle: the shape of each phase.")
    momentum: tuple[Fraction, Fraction] | None = Field(
        None,
        description="one-cycle and cyclic: [low, high] momentum (Adam: beta1), cycled opposite to the LR; null: "
        "optim's fixed momentum.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> ScheduleConfig:
        problems = []
        if self.warmup >= 1 and self.warmup != int(self.warmup):
            problems.append(
                f"schedule.warmup: {self.warmup:g} is neither a fraction of the run (< 1) nor a whole step count"
            )
        if self.low >= 1:
            problems.append(
                f"schedule.low: cyclic bounds reversed: the lower bound ({self.low:g} x the peak LR) must be below "
                "the peak (optim.lr), e.g. 0.1"
            )
        if self.momentum is not None and self.momentum[0] > self.momentum[1]:
            problems.append(f"schedule.momentum: bounds reversed: give [low, high], got {list(self.momentum)}")
        if any(b <= a for a, b in zip(self.milestones, self.milestones[1:], strict=False)):
            problems.append(f"schedule.milestones: must increase, got {self.milestones}")
        if problems:
            raise ValueError("\n  - ".join(problems))
        return self


class TrainConfig(Section):
    epochs: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
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
        "the caches slow the pass, 64 of up to 64x64 pixels, fewer of larger images, at least 16 "
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
        description="Evaluate on the image and its mirror, averaging the logits. auto: where flips are allowed (as "
        "data.augment.flip decides).",
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
    threads: Annotated[int, Field(ge=1)] | None = Field(
        None, description="torch intra-op threads; null: torch's default."
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


class Recipe(Section):
    name: str = Field(
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

    @field_validator("name")
    @classmethod
    def _plain_name(cls, name: str) -> str:
        if not name.strip() or any(c in name for c in "/\\\0") or name.strip() in (".", ".."):
            raise ValueError(
                f"name: {name!r} must be a plain folder name (no '/', '\\', '..'): it names runs/<name>, which a "
                "run may not leave (set run.dir to write elsewhere)"
            )
        return name

    @field_validator("device")
    @classmethod
    def _device_name(cls, device: str) -> str:
        if not DEVICE.fullmatch(device):
            raise ValueError(f"device: {device!r} is not auto, cpu, cuda, cuda:N or mps")
        return device


DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


DEFAULT_RECIPE = "default"


def did_you_mean(source: str) -> str:
    """'; did you mean X?' for a recipe name or folder that does not exist: the closest shipped recipe, or the
    closest folder beside the path given (a mistyped `photos/`); empty when nothing is close."""
    path = Path(source.rstrip("/") or source)
    if "/" in source or source.startswith("."):  # written as a path: a folder (or recipe file) beside it
        parent = path.parent if str(path.parent) else Path(".")
        try:
            near = [p.name for p in parent.iterdir() if not p.name.startswith(".")]
        except OSError:
            near = []
        found = difflib.get_close_matches(path.name, near, n=1, cutoff=0.6)
        if not found:
            return "; no such folder either"
        close = parent / found[0]
        return f"; no such folder either: did you mean {close}{'/' if close.is_dir() else ''}?"
    found = difflib.get_close_matches(source, shipped_recipes(), n=1, cutoff=0.6)
    return f"; did you mean {found[0]}?" if found else ""


def shipped_recipes() -> list[str]:
    """Names of the recipes that ship inside the package."""
    folder = importlib.resources.files("hasten.recipe") / "shipped"
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


MAX_YAML_NODES = 100_000  # values a recipe may expand to through YAML aliases (`*name`); real recipes hold ~100


class BoundedLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a document whose aliases expand to more than MAX_YAML_NODES values, or
    refer to themselves: a few hundred bytes of nested aliases ("billion laughs") would otherwise become
    gigabytes once the recipe is copied, merged and validated."""

    def compose_document(self) -> yaml.Node:
        node = super().compose_document()
        sizes: dict[int, int] = {}
        open_nodes: set[int] = set()

        def expanded(n: yaml.Node) -> int:  # values `n` stands for once every alias is copied out
            if id(n) in sizes:
                return sizes[id(n)]
            if id(n) in open_nodes:
                raise yaml.YAMLError("an alias refers to the value that contains it (a recursive structure)")
            open_nodes.add(id(n))
            children = n.value if isinstance(n, yaml.SequenceNode) else []
            if isinstance(n, yaml.MappingNode):
                children = [part for pair in n.value for part in pair]
            total = 1
            for child in children:
                total += expanded(child)
                if total > MAX_YAML_NODES:
                    raise yaml.YAMLError(
                        f"its aliases expand to more than {MAX_YAML_NODES:,} values (an alias bomb?); "
                        "write the values out or use fewer nested aliases"
                    )
            open_nodes.discard(id(n))
            sizes[id(n)] = total
            return total

        if node is not None:
            expanded(node)
        return node

    def compose_mapping_node(self, anchor: str | None) -> yaml.MappingNode:
        """A mapping that sets a key twice is an error naming both lines (YAML would keep the last silently)."""
        node = super().compose_mapping_node(anchor)
        seen: dict[str, int] = {}
        for key, _ in node.value:
            if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                if key.value in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key.value!r} (first set on line {seen[key.value]}): a recipe "
                        "sets each key once", key.start_mark,
                    )  # fmt: skip
                seen[key.value] = key.start_mark.line + 1
        return node


def load_yaml(text: str, origin: str) -> Any:
    """`text` parsed as YAML with BoundedLoader; a RecipeError naming `origin` when it is not valid or too big."""
    try:
        return yaml.load(text, Loader=BoundedLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise RecipeError(f"{origin}: not a usable recipe: nested too deeply") from None
    except yaml.YAMLError as error:
        raise RecipeError(f"{origin}: not valid YAML: {error}") from None


def read_text_file(path: Path, what: str) -> str:
    """A UTF-8 text file's contents; a RecipeError naming the file when it is unreadable, binary or not UTF-8."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise RecipeError(f"{what} {path}: cannot read it: {error.strerror or error}") from None
    if b"\0" in data:
        raise RecipeError(f"{what} {path}: a binary file, not a YAML recipe")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise RecipeError(f"{what} {path}: not UTF-8 text (byte {error.start}): not a YAML recipe") from None


RECIPE_SUFFIXES = (".yaml", ".yml")


def _read_yaml(source: str | Path) -> tuple[dict[str, Any], str, Path | None]:
    """The raw mapping of a recipe given as a path or a shipped name, where it came from, and the folder of its
    file (None for a shipped recipe). A file must be YAML by name (.yaml or .yml): any other file is refused
    before it is read, so nothing of it is echoed back."""
    path = Path(source)
    if path.suffix in RECIPE_SUFFIXES or path.is_file():  # a folder named like a recipe does not shadow it
        if not path.is_file():
            raise RecipeError(f"recipe file not found: {path}")
        if path.suffix.lower() not in RECIPE_SUFFIXES:
            raise RecipeError(f"{path}: not a recipe file (a recipe is YAML, named .yaml or .yml)")
        text, origin, folder = read_text_file(path, "recipe"), str(path), path.parent
    else:
        shipped = importlib.resources.files("hasten.recipe") / "shipped" / f"{source}.yaml"
        if not str(source) or not shipped.is_file():
            raise RecipeError(
                f"unknown recipe {str(source)!r}: not a file, and not one of the shipped recipes "
                f"({', '.join(shipped_recipes())}){did_you_mean(str(source))}"
            )
        text, origin, folder = shipped.read_text(encoding="utf-8"), f"shipped recipe {str(source)!r}", None
    raw = load_yaml(text, origin)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise RecipeError(f"{origin}: a recipe must be a mapping of keys to values, got {type(raw).__name__}")
    raw.setdefault("name", path.stem if path.suffix in RECIPE_SUFFIXES else str(source))
    return raw, origin, folder


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """`top` laid over `base`, section by section."""
    merged = copy.deepcopy(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def load_raw(source: str | Path | None, _seen: tuple[str, ...] = ()) -> tuple[dict[str, Any], str]:
    """A recipe's mapping, with `extends: OTHER` resolved (the other recipe's keys under this one's). OTHER is a
    shipped recipe's name, or a .yaml file found from the folder of the recipe that extends it (as an include
    is), not from the current folder."""
    raw, origin, folder = _read_yaml(source or DEFAULT_RECIPE)
    parent = raw.pop("extends", None)
    if parent is not None:
        if not isinstance(parent, str) or not parent.strip():
            raise RecipeError(f"{origin}: extends must name a recipe, got {parent!r}")
        target: str | Path = parent
        looks_like_path = Path(parent).suffix in RECIPE_SUFFIXES or "/" in parent or "\\" in parent
        if looks_like_path or Path(parent).is_file():
            base_folder = folder if folder is not None else Path.cwd()
            target = (base_folder / Path(parent).expanduser()).resolve()
            if not target.is_file():
                raise RecipeError(f"{origin}: extends: {parent}: no such recipe file (looked for {target})")
            if target.suffix.lower() not in RECIPE_SUFFIXES:
                raise RecipeError(f"{origin}: extends: {parent}: not a recipe file (a recipe is YAML, .yaml or .yml)")
        key = str(target)
        if key in _seen or (folder is not None and key == str(Path(source or "").resolve())):
            chain = " -> ".join((*_seen, key))
            raise RecipeError(f"{origin}: recipes extend each other in a loop: {chain}")
        base, _ = load_raw(target, _seen + (key,))
        base.pop("name", None)
        raw = _merge(base, raw)
    return raw, origin


def parse_value(text: str) -> Any:
    """A command-line value as YAML would read it, so `0.2`, `1e-3`, `true`, `null`, `[1,2]` get their types."""
    try:
        value = yaml.load(text, Loader=BoundedLoader) if text.strip() else ""  # noqa: S506 - a SafeLoader
    except yaml.constructor.ConstructorError as error:
        if "duplicate key" in str(error.problem):  # a mapping that sets a key twice is refused, not taken as text
            raise RecipeError(f"{text!r}: {error.problem}") from None
        return text
    except (yaml.YAMLError, RecursionError):
        return text
    if isinstance(value, str):
        try:  # YAML 1.1 reads `1e-3` as a string; users mean a number
            return float(value)
        except ValueError:
            return value
    return value


SHORTHAND = {"resume": "from"}  # a top-level value that may also be written as a section: resume=auto


def dotted(tree: Any, key: str) -> Any:
    """The value at dotted `key` (`train.epochs`) of a nested dict such as a dumped recipe; KeyError when the path
    is not there."""
    node = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(key)
        node = node[part]
    return node


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """`raw` with each `dotted.key=value` set; a malformed override is an error naming it."""
    result = copy.deepcopy(raw)
    problems = []
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key or any(not part for part in key.split(".")):
            problems.append(f"{item!r}: an override is written key=value, e.g. optim.lr=0.2")
            continue
        *parents, leaf = key.split(".")
        node = result
        for i, part in enumerate(parents):
            if i == 0 and part in SHORTHAND and not isinstance(node.get(part), (dict, type(None))):
                node[part] = {SHORTHAND[part]: node[part]}  # `resume=auto resume.allow_changes=[...]`
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                problems.append(f"{key}: {'.'.join(parents[: i + 1])} is a value, not a section")
                break
            node = child
        else:
            try:
                value = parse_value(text)
            except RecipeError as error:
                problems.append(f"{key}: {error}")
                continue
            if not parents and leaf in SHORTHAND and isinstance(node.get(leaf), dict) and not isinstance(value, dict):
                node[leaf][SHORTHAND[leaf]] = value  # `resume=auto` keeps the section's allow_changes
            else:
                node[leaf] = value
    if problems:
        raise RecipeError("bad override(s):\n" + "\n".join(f"  - {p}" for p in problems))
    return result


MOVED = {
    "train.label_smoothing": "tricks.label_smoothing",
    "run.resume": "resume",
}  # keys that moved, so old recipes get a pointer


# values hasten records itself (the user's Python object given to hasten.train), not ones a user types
INTERNAL_VALUES = ("object",)
# where a value is not one of the names: what else the user may have meant
OTHER_WAYS = {
    "model.name": "your own model: model.name=import model.target=package.module:callable",
    "data.name": "your own data: data.name=import data.target=package.module:function, or a folder of images: "
    "data.name=imagefolder data.root=DIR",
}


def _fields_of(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every dotted key of a recipe model, sections included (`train`, `train.epochs`, ...)."""
    keys = []
    for name, info in model.model_fields.items():
        keys.append(prefix + name)
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            keys += _fields_of(info.annotation, f"{prefix}{name}.")
    return keys


def closest_key(dotted: str, root: type[BaseModel]) -> str | None:
    """The valid key nearest to an unknown `dotted` one (`train.epoch` -> `train.epochs`, `lr` -> `optim.lr`)."""
    keys = _fields_of(root)
    leaf = dotted.rsplit(".", 1)[-1]
    same_section = [k for k in keys if k.rsplit(".", 1)[0] == dotted.rsplit(".", 1)[0] and "." in dotted]
    for pool, word in ((same_section, dotted), (keys, dotted)):
        found = difflib.get_close_matches(word, pool, n=1, cutoff=0.75)
        if found:
            return found[0]
    by_leaf = [k for k in keys if k.rsplit(".", 1)[-1] == leaf]  # the right key in another section
    if by_leaf:
        return by_leaf[0]
    found = difflib.get_close_matches(leaf, [k.rsplit(".", 1)[-1] for k in keys], n=1, cutoff=0.8)
    return next((k for k in keys if found and k.rsplit(".", 1)[-1] == found[0]), None)


def _describe(error: dict[str, Any], root: type[BaseModel] | None = None) -> str:
    field = ".".join(str(part) for part in error["loc"]) or "recipe"
    if error["type"] == "extra_forbidden":
        if field in MOVED:
            return f"{field}: unknown key (moved to {MOVED[field]})"
        guess = closest_key(field, root) if root is not None else None
        return f"{field}: unknown key" + (f" (did you mean {guess}?)" if guess else "")
    if error["type"] == "literal_error":
        allowed = [v for v in re.findall(r"'([^']*)'", str((error.get("ctx") or {}).get("expected", ""))) if
                   v not in INTERNAL_VALUES]  # fmt: skip
        given = error.get("input")
        guess = difflib.get_close_matches(str(given), allowed, n=1, cutoff=0.6) if allowed else []
        text = f"{field}: {given!r} is not one of {', '.join(allowed)}"
        text += f" (did you mean {guess[0]}?)" if guess else ""
        return text + (f"; for {OTHER_WAYS[field]}" if field in OTHER_WAYS else "")
    if error["type"] == "union":  # _joined_unions: what each member of the field's union takes
        parts = sorted(error["parts"], key=lambda part: part.startswith("or "))
        return f"{field}: {error.get('input')!r}: should be {', '.join(parts)}"
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] in ("value_error", "assertion_error") and ": " in message:
        return message  # our validators already start with the field name
    return f"{field}: {message} (got {str(repr(error.get('input')))[:200]})"


_UNION_MEMBER = re.compile(r"^(constrained-\w+|int|float|str|bool|literal\[.*\])$")


def _joined_unions(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pydantic reports a value that fits no member of a union (`int >= 1 | "auto"`) once per member, each at
    the field plus the member's tag: one problem per field instead, naming what each member would take."""
    joined: list[dict[str, Any]] = []
    by_field: dict[tuple, dict[str, Any]] = {}
    for error in errors:
        loc = tuple(error["loc"])
        if not (loc and isinstance(loc[-1], str) and _UNION_MEMBER.match(loc[-1])):
            joined.append(error)
            continue
        if error["type"] == "literal_error":
            wanted = ", ".join(re.findall(r"'([^']*)'", str((error.get("ctx") or {}).get("expected", ""))))
            part = f"or one of {wanted}" if "," in wanted else f"or {wanted}"
        else:
            part = error["msg"].removeprefix("Value error, ").removeprefix("Input should be ")
        if loc[:-1] in by_field:
            by_field[loc[:-1]]["parts"].append(part)
        else:
            by_field[loc[:-1]] = {"type": "union", "loc": loc[:-1], "input": error.get("input"), "parts": [part]}
            joined.append(by_field[loc[:-1]])
    return joined


def _origin_of(error: dict[str, Any], overrides: list[str]) -> str | None:
    """The override (`key=value`) the problem comes from, when its key is the problem's field, a section around
    it, or a key inside it; None when it comes from the recipe itself."""
    field = ".".join(str(part) for part in error["loc"])
    for item in reversed(overrides):
        key = item.partition("=")[0]
        if key and (key == field or field.startswith(key + ".") or (field and key.startswith(field + "."))):
            return item
    return None


def recipe_error(
    exc: ValidationError, origin: str, overrides: list[str] | None = None, root: type[BaseModel] | None = None
) -> RecipeError:
    """One `RecipeError` listing every problem of a failed validation, each naming its dotted field (and the
    nearest valid key for an unknown one, from `root`'s fields); a problem an override made is attributed to the
    command line, the others to `origin`."""
    found = [(_describe(error, root), _origin_of(error, overrides or [])) for error in _joined_unions(exc.errors())]
    if overrides and all(where is not None for _, where in found):  # the recipe itself is fine: say so
        lines = [line if line.startswith(where.partition("=")[0] + ":") else f"{line} (from {where})"
                 for line, where in found]  # fmt: skip
        header = f"the command line (over {origin}): {len(lines)} problem(s)"
    else:
        lines = [line + (f" (from the command line: {where})" if where else "") for line, where in found]
        header = f"{origin}: {len(lines)} problem(s)"
    return RecipeError(header + ":\n" + "\n".join(f"  - {line}" for line in lines))


def validate(raw: dict[str, Any], origin: str = "recipe", overrides: list[str] | None = None) -> Recipe:
    """A validated `Recipe`, or one `RecipeError` that lists every problem, each naming its field (problems from
    `overrides`, already applied to `raw`, are attributed to the command line)."""
    try:
        return Recipe.model_validate(raw)
    except ValidationError as exc:
        raise recipe_error(exc, origin, overrides, Recipe) from None


def image_folder_layout(folder: str | Path) -> bool:
    """Whether `folder` is laid out as an image folder: a train/ folder of class folders."""
    train = Path(folder) / "train"
    return train.is_dir() and any(p.is_dir() for p in train.iterdir())


def load_recipe(source: str | None = None, overrides: list[str] | None = None) -> Recipe:
    """The recipe named or at `source` (default: the default recipe) with `overrides` applied and validated.
    `source` may also be an image folder (DIR/train/<class>/...): the default recipe on it, as with
    `data.name=imagefolder data.root=DIR`."""
    overrides = list(overrides or [])
    shipped = (
        source is not None and (importlib.resources.files("hasten.recipe") / "shipped" / f"{source}.yaml").is_file()
    )
    if source is not None and not shipped and Path(source).is_dir():
        if not image_folder_layout(source):
            raise RecipeError(
                f"{source} is a folder, not a recipe: give a recipe (.yaml or a shipped name), or a folder of images "
                "laid out as train/<class>/*.png and val/<class>/... (hasten train DIR trains the default recipe on it)"
            )
        overrides = ["data.name=imagefolder", f"data.root={source}", *overrides]
        source = None
    raw, origin = load_raw(source)
    recipe = validate(apply_overrides(raw, overrides or []), origin, overrides)
    section = raw.get("data")
    own_data = section.get("name", DataConfig().name) if isinstance(section, dict) else DataConfig().name
    if recipe.run.dir is None and recipe.name == DEFAULT_RECIPE:  # the default recipe's run is named by its data
        recipe = replaced(recipe, {"run.dir": str(Path("runs") / data_label(recipe.data))})
    elif recipe.run.dir is None and recipe.data.name != own_data:  # never in the folder of the recipe's own data
        recipe = replaced(recipe, {"run.dir": str(Path("runs") / f"{recipe.name}-{recipe.data.name}")})
    return recipe


def data_label(data: DataConfig) -> str:
    """A folder name for the data a recipe trains on: an image folder's own name, else the dataset's."""
    if data.name == "imagefolder" and data.root:
        name = Path(data.root).expanduser().resolve().name
        if name and name not in (".", "..") and not name.startswith("."):
            return name
    return data.name


def to_yaml(recipe: Recipe) -> str:
    """The resolved recipe as YAML, as saved beside every run."""
    return yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False)
