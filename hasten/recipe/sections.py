"""The recipe's sections about what is trained and how it learns: the data and its augmentation, the model, the
optimizer, the LR schedule; the frozen base every section shares and `replaced`, the one way a recipe changes
(hasten/run/resolve.py makes each choice into a new recipe with it). The precision modes are named here once.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hasten.data.fitting import RESIZE_MODES
from hasten.data.preprocessing import MAX_IMAGE_SIDE
from hasten.data.registry import DATASETS

PositiveFloat = Annotated[float, Field(gt=0)]
MAX_SYNTHETIC = 1_000_000  # images of the synthetic set: each is drawn one by one (a million take ~1 GB)
# Ceilings of the counts that size a run before anything checks what they cost: each far above any honest use, so
# that a typo (model.width=1000000000, train.threads=99999999) is a recipe error naming the key, not hours spent
# building a model, a million threads or worker processes started, or a loop that never ends.
MAX_WIDTH = 65_536  # channels of one layer: the widest ResNets of the literature have 4,096
MAX_BLOCKS = 1_000  # residual blocks in one stage: ResNet-1202 has 200 per stage
MAX_STAGES = 16  # ResNet stages: each doubles the channels and halves the image; 4 or 5 is usual
MAX_THREADS = 1_024  # torch threads, and loader worker processes: the largest machines have a few hundred cores
MAX_WORKERS = 1_024
MAX_EPOCHS = 100_000  # passes over the data: the longest published schedules take a few thousand
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
        description="Resize every image to size x size pixels (as data.resize says); null: as stored (images of "
        "mixed sizes, in a folder, a list or a Dataset: a square of their median shorter side).",
    )
    resize: Literal[RESIZE_MODES] = Field(
        "squash",
        description="How an image of another size is brought to data.size x data.size (every data kind: image "
        "folders, arrays, lists, Datasets; predict and exports repeat it): squash: resized to the square, the aspect "
        "ratio not kept; crop: the shorter side resized to data.size, the centre cut out; pad: the longer side resized "
        "to data.size, centred on black (zeros).",
    )
    rgb: bool | None = Field(
        None,
        description="true: 3 channels (grey repeated); false: 1 channel (luma); null: as stored (an image folder "
        "of grey and colour images: 3 channels).",
    )
    workers: Annotated[int, Field(ge=0, le=MAX_WORKERS)] | None = Field(
        None,
        description="imagefolder: DataLoader worker processes; null: one per CPU core but one, at most 4 (none for a "
        "folder read from its decode cache that fits in half the memory available: its rows are copied in the main "
        "process). They only decode: a seed's run is the same with any number of them.",
    )
    in_memory: bool | Literal["auto"] = Field(
        "auto",
        description="imagefolder: decode every image once and train from memory (no decoding per epoch). auto: when "
        "the decoded images take at most a quarter of the memory available (and 4 GiB); false: decode each epoch, "
        "in workers.",
    )
    cache: bool | Literal["auto"] = Field(
        "auto",
        description="imagefolder: decode each split once, at the run's size and mode, into a file in hasten's cache "
        "folder (folders/) that later epochs and runs memory-map instead of decoding the files; it is decoded again "
        "when a file is added, removed or changed. auto: for a folder not read into memory; true: also fills the "
        "in-memory copy; without the disk space for it, decoded each epoch as with false.",
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
    width: Annotated[int, Field(ge=1, le=MAX_WIDTH)] = Field(
        16, description="Channels of the first ResNet stage; each later stage doubles them."
    )
    blocks: Annotated[list[Annotated[int, Field(ge=0, le=MAX_BLOCKS)]], Field(max_length=MAX_STAGES)] = Field(
        [1, 1, 1], description=f"Residual blocks per ResNet stage; at most {MAX_STAGES} stages."
    )
    layers: list[str | dict[str, Any]] | None = Field(
        None,
        description="The layer list of a sequential model, e.g. [{conv: 32}, relu, {maxpool: 2}, flatten, "
        "{dense: classes}] (hasten/models/sequential.py).",
    )
    pool_first: bool = Field(
        False,
        description="ResNet: each stage max-pools its first conv's output before the batch norm and ReLU (airbench's "
        "order), which then run on a quarter of the pixels: a faster step, and another model.",
    )
    zero_init_residual: bool = Field(
        False, description="Start each residual branch's last BN scale (gamma) at 0 (Goyal et al., 2017)."
    )
    widths: list[Annotated[int, Field(ge=1, le=MAX_WIDTH)]] | None = Field(
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
    output: Literal["auto", "logits", "probabilities"] = Field(
        "auto",
        description="What the model returns. logits: any real numbers, which the loss takes as they are; "
        "probabilities: a softmax's output (each row in [0, 1], summing to 1), whose log is taken as the logits, "
        "in training, evaluation, predict and export alike (cross-entropy on the softmax's input, the same loss). "
        "auto: probabilities where a model of the user's returns rows like that for two kinds of input at start-up "
        "(with hasten.train's own loss), else logits.",
    )
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
    lr: float | Literal["auto"] | None = Field(
        None,
        description="Peak learning rate, per optim.base_batch examples when that is set. auto: picked by a short LR "
        "range test before training (hasten/tune/lr_find.py; calibrated in benchmarks/lr_auto.py). null: decided "
        "from the optimizer and the model, said at start and recorded: adam/adamw (and muon's non-filter parameters) "
        "0.002 for a model with batch norm (hasten's ResNet was tuned at it), 0.0015 for one without (an MLP, "
        "GroupNorm or LayerNorm nets, a transformer; its wide layers slowed by optim.fan_in_lr; measured on the "
        "model suite, docs/defaults.md); "
        "sgd: auto.",
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
    fan_in_lr: bool | Literal["auto"] = Field(
        "auto",
        description="adam, adamw: each weight whose fan-in (the inputs a unit reads) is over 576 takes optim.lr x "
        "576 / fan-in, as the maximal-update parametrisation scales Adam's hidden layers (hasten/engine/fan_in.py): "
        "an MLP's 3,072-input first layer would otherwise move 5x as far a step as a 3x3 convolution over 64 "
        "channels. A weight that feeds a batch norm keeps optim.lr. auto: on for adam and adamw, decided at start "
        "and recorded.",
    )
    layer_scale_lr: PositiveFloat | Literal["auto"] = Field(
        "auto",
        description="adam, adamw: a layer scale (a parameter whose elements all start at the same value, nonzero "
        "and at most 1e-3 in size: ConvNeXt's and CaiT's 1e-6 to 1e-5 branch scales) takes this times optim.lr, so "
        "its branch can grow within the run (hasten/engine/layer_scale.py); 1: optim.lr like every parameter. auto: "
        "10 for adam and adamw where the model has one, else 1, decided at start and recorded.",
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
