"""Use what you trained: load a run folder, a checkpoint or an export, and predict on image files.

What is loaded is always the model the run evaluated: with `tricks.ema` on, the EMA copy (with its own
batch-norm statistics), read through one function, `evaluated_state_dict`. It comes with what training did to
images (`hasten.data.preprocessing.Preprocessing`: Pillow mode, size, resize, mean/std), the class names and
the run's test-time augmentation (flip, translate), so `predict` on any image file gives what the run
measured. As timm's `inference.py` and fastai's `load_learner`/`predict` do; evaluation is in
`hasten.use.evaluate`, exports (safetensors with metadata, ONNX) in `hasten.use.export`.

Sources: a run folder (its newest complete checkpoint, the one summary.json's test_accuracy comes from), a
hasten checkpoint (`.pt`), a `.safetensors` file written by `hasten export`, or an `.onnx` export (run by
onnxruntime). Anything else is a CheckpointError naming the file (exit 2). Checkpoints load weights-only.

Everything read from such a source is data: summary.json and export metadata are checked by pydantic schemas
(`SummaryRecord`, `ExportRecord`) before use, and the model is rebuilt from the recipe inside
`hasten.recipe.trust.embedded_recipe`, so an import path it names (`model.target`, `data.target`) is imported only when
the user trusts it (`trust_code=True`, `--trust-code`) or names it again (`hasten.load(..., model=...)`).
"""

from __future__ import annotations

import csv
import json
import math
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import numpy
import torch
from PIL import Image
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator
from torch import Tensor, nn

from hasten.data.imagefolder import IMAGE_SUFFIXES
from hasten.data.preprocessing import (
    MAX_IMAGE_SIDE,
    MODE_OF,
    MODES,
    PREDICT_BYTES,
    Preprocessing,
    PreprocessingRecord,
    preprocessing_for,
    resizer_of,
)
from hasten.engine.distributed import checked_device
from hasten.errors import CheckpointError, DataError, HastenError, schema_problems
from hasten.recipe.schema import Recipe, validate
from hasten.recipe.trust import USER_SOURCES, Trust, embedded_recipe
from hasten.runfolder.checkpoint import latest_usable, load_checkpoint, load_model_weights, training_checkpoint
from hasten.techniques.tta import black_fill, tta_logits
from hasten.text import printable
from hasten.tune import rules
from hasten.use.onnx_graph import check_onnx_graph

WRAPPER_PREFIXES = ("module.", "_orig_mod.")  # AveragedModel / DDP and torch.compile prefix every key


def _strip(key: str) -> str:
    for prefix in WRAPPER_PREFIXES:
        while key.startswith(prefix):
            key = key[len(prefix) :]
    return key


def evaluated_state_dict(checkpoint: dict[str, Any]) -> dict[str, Tensor]:
    """The weights (and buffers) the run evaluated at this checkpoint: the EMA copy when `tricks.ema` was on
    and it had averaged at least one step (as `EMA.eval_model` decides), else the live model's.

    The EMA's state is an AveragedModel state dict (`module.`-prefixed keys plus `n_averaged`); its BatchNorm
    running statistics are averaged with the weights (`use_buffers=True`), so they match them. The one place
    that reads them: exports, `hasten.load`, evaluate and predict all go through here.
    """
    if "model" not in checkpoint:
        raise CheckpointError("not a hasten checkpoint: it holds no model weights")
    ema = (checkpoint.get("hooks") or {}).get("ema")
    tricks = (checkpoint.get("recipe") or {}).get("tricks")
    decay = tricks.get("ema") if isinstance(tricks, dict) else 0
    ema_on = isinstance(decay, (int, float)) and decay > 0
    count = ema.get("n_averaged", 0) if isinstance(ema, dict) else 0
    if isinstance(count, Tensor):  # one integer (TrainingCheckpoint checks it where the checkpoint is read)
        count = int(count.reshape(-1)[0]) if count.numel() == 1 else 0
    if ema_on and isinstance(ema, dict) and isinstance(count, int) and count > 0:
        return {_strip(k): v for k, v in ema.items() if k != "n_averaged"}
    return {_strip(k): v for k, v in checkpoint["model"].items()}


@dataclass
class RunFacts:
    """What a trained model needs besides its weights: the recipe, class names, input and normalisation."""

    recipe: Recipe
    classes: list[str]
    image_shape: tuple[int, int, int]  # (C, H, W)
    mean: tuple[float, ...]
    std: tuple[float, ...]
    preprocessing: Preprocessing | None  # None for images of more than 4 channels (no Pillow mode)
    test_accuracy: float | None = None  # these weights' (metrics.csv's row of the checkpoint's step)
    metadata: dict[str, Any] = field(default_factory=dict)
    summary_accuracy: float | None = None  # summary.json's test_accuracy: the run's last weights'

    def __post_init__(self) -> None:
        # the names predict, evaluate and export show and write, wherever they came from (summary.json, an export,
        # a dataset's own files such as CIFAR's batches.meta, a recipe's data.classes): printable text
        self.classes = [printable(name) if isinstance(name, str) else name for name in self.classes]

    @property
    def tta_flip(self) -> bool:
        return self.recipe.train.tta_flip

    @property
    def tta_translate(self) -> int:
        return self.recipe.train.tta_translate


def checkpoint_of(source: str | Path) -> tuple[Path, dict[str, Any]]:
    """The checkpoint a run folder or checkpoint path names, loaded weights-only; CheckpointError naming it."""
    path = Path(source)
    if path.is_dir():
        found = latest_usable(path / "checkpoints")
        if found is None:
            where = path / "checkpoints"
            raise CheckpointError(f"{path}: no usable checkpoint in {where} (is it a hasten run folder?)")
        path, state = found
    else:
        if path.is_file() and not zipfile.is_zipfile(path):  # torch.save writes a zip; a text file or image is not
            raise CheckpointError(
                f"{path} is not a checkpoint (not a PyTorch zip file); expected a run folder, a checkpoint .pt, "
                "or a .safetensors or .onnx file written by hasten export"
            )
        state = load_checkpoint(path)
    if "model" not in state and {"generator", "discriminator"} <= state.keys():  # hasten/experiments/gan.py's
        raise CheckpointError(
            f"{path} is a `hasten gan` checkpoint (a generator and a discriminator), not a classifier's: evaluate, "
            "predict and export read the runs of hasten train"
        )
    if not isinstance(state.get("recipe"), dict) or not state["recipe"] or "model" not in state:
        raise CheckpointError(
            f"{path} is not a hasten training checkpoint: it holds no recipe and model (a bare state dict cannot "
            "say which model it is; load it with model.pretrained=PATH)"
        )
    training_checkpoint(state, str(path))
    if "trainer" in state:
        from hasten.run.state import trainer_position

        trainer_position(state["trainer"], str(path))
    return path, state


# a class name read from a file (summary.json, an export's metadata): printable, its control characters escaped as a
# class folder's are (hasten.data.imagefolder.class_name), so what predict, evaluate and hasten.load show of it is text
ShownName = Annotated[str, AfterValidator(printable)]


class SummaryRecord(BaseModel):
    """What `hasten.load`, evaluate and export read from a run's summary.json, checked before use."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    classes: list[ShownName] | None = None
    dataset: dict[str, Any] | None = None
    preprocessing: PreprocessingRecord | None = None
    test_accuracy: float | None = None


def read_summary(path: Path) -> SummaryRecord | None:
    """A run folder's summary.json checked by SummaryRecord; None when there is none; CheckpointError naming the
    file and the field when it is not JSON or does not fit."""
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else type(error).__name__
        raise CheckpointError(
            f"{path}: not a summary hasten writes ({reason}); move it away to use the checkpoint alone"
        ) from None
    try:
        return SummaryRecord.model_validate(raw)
    except ValidationError as error:
        raise CheckpointError(f"{path}: {schema_problems(error)}; move it away to use the checkpoint alone") from None


def _summary_beside(checkpoint: Path) -> SummaryRecord | None:
    """summary.json of the run folder a checkpoint sits in (RUN/checkpoints/step-N.pt), checked; or None."""
    if checkpoint.parent.name != "checkpoints":
        return None
    return read_summary(checkpoint.parent.parent / "summary.json")


def recorded_accuracy(checkpoint: Path, state: dict[str, Any]) -> float | None:
    """The test accuracy the run measured with this checkpoint's weights: its epoch's row of metrics.csv."""
    trainer = state.get("trainer") or {}
    if trainer.get("batch", 0) or checkpoint.parent.name != "checkpoints":  # mid-epoch, or outside a run folder
        return None
    from hasten.runfolder.log import read_metrics

    try:
        rows = [r for r in read_metrics(checkpoint.parent.parent) if r.get("step", -1) == trainer.get("step")]
        accuracy = rows[-1].get("test_accuracy") if rows else None
        return accuracy if isinstance(accuracy, float) and math.isfinite(accuracy) else None
    except (OSError, ValueError, TypeError, UnicodeDecodeError, csv.Error):
        return None  # a metrics.csv edited or damaged: the recorded accuracy is only shown beside the result


OWN_DATA = "own"  # summary.json's dataset name for data given as arrays or a Dataset (hasten.data.user.own_data)


def facts_from_checkpoint(path: Path, state: dict[str, Any], trust: Trust | None = None) -> RunFacts:
    """The run's facts: from summary.json beside the checkpoint when it has them, else from the recipe's data
    (read under the trust boundary: a data.target it names is imported only as `trust` allows)."""
    recipe = validate(state["recipe"], f"the recipe in {path}")
    summary = _summary_beside(path)
    accuracy = recorded_accuracy(path, state)
    last = summary.test_accuracy if summary is not None else None
    recorded_name = (summary.dataset or {}).get("name") if summary is not None else None
    # not another's data (evaluate on data.name=...): the run's own, or what was given to hasten.train as a Python
    # object (arrays, a Dataset, a folder's path), which only the summary beside the checkpoint describes (the recipe
    # cannot read it again; its preprocessing is recorded there), or by a data.target function, which it would
    # have to import (the summary spares it: only evaluating on that data needs it)
    given = summary is not None and (recipe.data.name == "object" or (recipe.data.name == "import"
                                                                     and recorded_name == OWN_DATA))  # fmt: skip
    same_data = recorded_name == recipe.data.name or given
    if same_data and summary.classes and summary.preprocessing is not None:
        pre = Preprocessing.from_dict(summary.preprocessing.model_dump(), str(path.parent.parent / "summary.json"))
        shape = (pre.channels, pre.height, pre.width)
        return RunFacts(recipe, list(summary.classes), shape, pre.mean, pre.std, pre, accuracy, summary_accuracy=last)
    from hasten.run.build import dataset

    with embedded_recipe(str(path), trust or Trust()):
        data = dataset(recipe)
    mean, std = training_stats(data, recipe.seed)
    pre = None  # images of more than 4 channels: no Pillow mode to read files into
    if data.image_shape[0] in MODE_OF:
        pre = preprocessing_for(data.image_shape, mean, std, resizer=resizer_of(data), fit=recipe.data.resize)
    shape, mean_t, std_t = tuple(data.image_shape), tuple(mean.tolist()), tuple(std.tolist())
    return RunFacts(recipe, list(data.classes), shape, mean_t, std_t, pre, accuracy, summary_accuracy=last)


def training_stats(data: Any, seed: int) -> tuple[Tensor, Tensor]:
    """Per-channel mean and std of a dataset's training images, computed as the run's loaders computed them."""
    from hasten.data.imagefolder import ImageFolder, folder_stats
    from hasten.data.loader import channel_stats

    return folder_stats(data, seed=seed) if isinstance(data, ImageFolder) else channel_stats(data.train_images)


def check_rebuilt_size(config: Any, facts: RunFacts, weights: dict[str, Tensor], source: str) -> None:
    """A file's recipe sizes the model rebuilt from it: hasten's own models are first built on the meta device
    (shapes, no memory), and refused before anything is allocated when they hold more parameters than the file
    has weights (its recipe is not its weights': `model.width=10000` beside a small net's weights took 23 GB)."""
    from hasten.models import meta_parameter_count

    wanted = meta_parameter_count(config, facts.image_shape, len(facts.classes))
    held = sum(t.numel() for t in weights.values())
    if wanted is not None and wanted > held:
        raise CheckpointError(
            f"{source}: its weights are from another model: its recipe's {config.name} has {wanted:,} parameters, "
            f"the file holds {held:,} weight values (refused before building it)"
        )


def network(
    facts: RunFacts,
    weights: dict[str, Tensor],
    source: str,
    prepare: Callable[[nn.Module], nn.Module] | None = None,
    *,
    trust: Trust | None = None,
    model: Any = None,
) -> nn.Module:
    """The recipe's model for the run's input and classes, holding `weights`; CheckpointError when they are
    from another model (names every key that does not fit). `prepare`: the run's `Precision.prepare`, to
    evaluate as the run did (fp16-master: fp16 weights); without it the weights are fp32.

    The model is rebuilt under the trust boundary: hasten's own models from their recipe; a `model.target` the
    recipe names only as `trust` allows (hasten.recipe.trust.embedded_recipe). `model`: the user's own nn.Module, or a
    class or function making one (called with model.args and num_classes/in_channels/image_size as in training),
    in place of the recipe's, or its import path ("pkg.nets:Net", imported as the user names it)."""
    from hasten.models import build_model
    from hasten.models.user import check_model, has_lazy_parameters, read_output, shape_args, unwrapped
    from hasten.recipe.trust import call_target, describe_class, import_target

    config = facts.recipe.model
    if isinstance(model, str):  # an import path the user gives (`--model pkg.nets:Net`): theirs to import
        model = import_target(model, "model")
    if model is None and config.name == "object":
        raise CheckpointError(
            f"{source}: its model was a Python object ({config.target or 'a module'}), which a file cannot hold; "
            "give it again: hasten.load(path, model=YourNet)"
        )
    if model is None:
        check_rebuilt_size(config, facts, weights, source)
    try:
        with embedded_recipe(source, trust or Trust()):
            if model is None:
                net = build_model(config, facts.image_shape, len(facts.classes))
            elif isinstance(model, nn.Module):
                net = model
            else:
                shape = shape_args(model, facts.image_shape, len(facts.classes), "model")
                net = call_target(model, config.args, "model", **shape)
    except (ValueError, TypeError, RuntimeError) as error:
        raise CheckpointError(f"{source}: cannot rebuild its model from its recipe: {error}") from None
    if not isinstance(net, nn.Module):
        raise CheckpointError(f"model: expected an nn.Module (or a callable returning one), got {describe_class(net)}")
    net = unwrapped(net, "model")  # the module inside torch.compile's or DataParallel's wrapper, as in training
    if has_lazy_parameters(net):  # nn.LazyLinear and kin take their shapes from a first batch, as in training
        check_model(net, facts.image_shape, len(facts.classes), torch.device("cpu"))
    load_model_weights(net, weights, source)  # names and shapes first: nothing below copies a tensor that does not fit
    # its logits however it returns them, a softmax's probabilities as their log, as in training
    read_output(net, config.output, len(facts.classes), user=model is not None or config.name in USER_SOURCES)
    if prepare is not None:
        net = prepare(net)
    elif any(v.dtype == torch.float16 for v in net.state_dict().values()):  # fp16-master keeps fp16 weights
        net = net.float()
    return net.eval()


@dataclass
class Prediction:
    """One image's prediction: the top class and the `top_k` classes with their probabilities."""

    source: str
    label: str
    index: int
    probability: float
    top: list[tuple[str, float]]

    def as_dict(self) -> dict[str, Any]:
        return {"image": self.source, "class": self.label, "index": self.index, "probability": self.probability,
                "top": [{"class": c, "probability": p} for c, p in self.top]}  # fmt: skip


def checked_top_k(top_k: Any) -> int:
    """`top_k` as the count of classes to list: a whole number of 1 or more (more than the model's classes lists
    them all); a HastenError naming it otherwise, where topk raised a TypeError or 0 and below read as 1."""
    if isinstance(top_k, bool) or not isinstance(top_k, (int, numpy.integer)) or top_k < 1:
        raise HastenError(f"top_k: {top_k!r} ({type(top_k).__name__}) is not a count of classes; give a whole number "
                          "of 1 or more")  # fmt: skip
    return int(top_k)


class Predicts:
    """`predict` and `probabilities` for anything that maps uint8 pixels to logits (`logits_of`)."""

    classes: list[str]
    preprocessing: Preprocessing

    def logits_of(self, pixels: Tensor) -> Tensor:
        raise NotImplementedError

    def device_type(self) -> str:
        """Where `logits_of` computes: "cpu" unless a subclass says otherwise."""
        return "cpu"

    def chunk(self) -> int:
        """Images per forward pass: as many as an fp32 evaluation (predict computes in fp32) would batch on this
        device (`train.eval_batch_size: auto`, hasten/tune/rules.py), and at most PREDICT_BYTES of them as floats."""
        pre = self.preprocessing
        batch = rules.eval_batch(self.device_type(), pre.height, pre.width)
        return max(1, min(batch, PREDICT_BYTES // (4 * pre.channels * pre.height * pre.width)))

    def probabilities(self, images: Any) -> Tensor:
        """(N, classes) probabilities of images: paths, Pillow images, or uint8 (N, C, H, W) in the model's mode.
        Files are read a chunk at a time (`chunk` images), so a folder of any size takes the memory of one chunk."""
        pre = self.preprocessing
        per_chunk = self.chunk()
        if isinstance(images, (Tensor, numpy.ndarray)):
            pixels = pre.batch(images)
            logits = [self.logits_of(chunk) for chunk in pixels.split(per_chunk)]
        else:
            items = [images] if isinstance(images, (str, Path, Image.Image)) else list(images)
            if not items:
                raise DataError("no images to predict on")
            logits = [self.logits_of(pre.batch(items[i : i + per_chunk])) for i in range(0, len(items), per_chunk)]
        return torch.cat(logits).float().softmax(1)

    def predict(self, images: Any, top_k: int = 1) -> list[Prediction]:
        """Class names and probabilities of the top `top_k` classes of each image, converted as training did."""
        k = min(checked_top_k(top_k), len(self.classes))  # checked before any image is read
        if isinstance(images, (Tensor, numpy.ndarray)):  # a batch, or one image: its number of axes says which
            probs = self.probabilities(images)
            items: list[Any] = [None] * len(probs)
        else:  # one file or Pillow image, or a sequence of them (read once: a generator too)
            items = [images] if isinstance(images, (str, Path, Image.Image)) else list(images)
            probs = self.probabilities(items)
        # each image's name as shown (a file name's control characters escaped, hasten.text.printable)
        names = [printable(str(i)) if isinstance(i, (str, Path)) else f"#{n}" for n, i in enumerate(items)]
        values, indices = probs.topk(k, dim=1)
        return [
            Prediction(name, self.classes[int(idx[0])], int(idx[0]), float(val[0]),
                       [(self.classes[int(i)], float(v)) for v, i in zip(val, idx, strict=True)])
            for name, val, idx in zip(names, values, indices, strict=True)
        ]  # fmt: skip


class Predictor(nn.Module, Predicts):
    """A trained network with what it needs to be used: `forward` takes normalised images (B, C, H, W) and
    returns logits, averaged over the run's TTA (mirror, shifted copies: hasten/techniques/tta.py); `predict` takes
    image files or uint8 pixels and does the preprocessing. `model` is the bare network, for your own code."""

    def __init__(self, model: nn.Module, facts: RunFacts):
        super().__init__()
        self.model, self.facts = model.eval(), facts
        self.classes, self.tta_flip, self.tta_translate = facts.classes, facts.tta_flip, facts.tta_translate
        self.register_buffer("fill", black_fill(torch.tensor(facts.mean), torch.tensor(facts.std)), persistent=False)
        if facts.preprocessing is None:
            raise DataError(f"images of {facts.image_shape[0]} channels: predict reads images of 1 to 4 channels")
        self.preprocessing = facts.preprocessing
        self.eval()

    def forward(self, images: Tensor, tta_flip: bool | None = None, tta_translate: int | None = None) -> Tensor:
        flip = self.tta_flip if tta_flip is None else tta_flip
        translate = self.tta_translate if tta_translate is None else tta_translate
        return tta_logits(self.model, images, flip, translate, self.fill)

    @torch.no_grad()
    def logits_of(self, pixels: Tensor) -> Tensor:
        device = next(self.model.parameters()).device
        # arrays given (N, H, W, C) come as a view in that layout: a model's own `x.view(...)` needs the standard one
        pre = self.preprocessing  # pixels in the units the training images were in, then training's normalisation
        return self(pre.normalise(pre.in_units(pixels.to(device))).contiguous()).cpu()

    def device_type(self) -> str:
        return next(self.model.parameters()).device.type


def decode_metadata(meta: dict[str, str]) -> dict[str, Any]:
    """An export's `hasten_*` metadata (JSON strings, as `hasten.use.export` writes them) as values."""
    return {key.removeprefix("hasten_"): json.loads(value) for key, value in meta.items() if key.startswith("hasten_")}


class ExportRecord(BaseModel):
    """An export's metadata (`hasten.use.export.metadata`) as `hasten.load` and predict use it, checked before use:
    class names, an input shape within MAX_IMAGE_SIDE, one finite mean and positive std per channel, the
    preprocessing consistent with the input, a TTA shift below half the image side."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    classes: Annotated[list[ShownName], Field(min_length=1)]
    preprocessing: PreprocessingRecord | None = None
    input_shape: tuple[Annotated[int, Field(ge=1, le=4)], Annotated[int, Field(ge=1, le=MAX_IMAGE_SIDE)],
                       Annotated[int, Field(ge=1, le=MAX_IMAGE_SIDE)]]  # fmt: skip
    mean: list[float]
    std: list[Annotated[float, Field(gt=0)]]
    tta_flip: bool = False
    tta_translate: Annotated[int, Field(ge=0)] = 0
    recipe: dict[str, Any] | None = None
    test_accuracy: float | None = None

    @model_validator(mode="after")
    def _consistent(self) -> ExportRecord:
        channels, height, width = self.input_shape
        if len(self.mean) != channels or len(self.std) != channels:
            raise ValueError(f"mean and std: one value per input channel ({channels})")
        pre = self.preprocessing
        if pre is not None and (MODES[pre.mode], pre.height, pre.width) != self.input_shape:
            raise ValueError(f"preprocessing: {pre.mode} {pre.height}x{pre.width} does not match input_shape "
                             f"{list(self.input_shape)}")  # fmt: skip
        if 2 * self.tta_translate >= min(height, width):
            raise ValueError(f"tta_translate: {self.tta_translate} pixels is not below half the {min(height, width)}-"
                             "pixel side")  # fmt: skip
        return self


def export_record(meta: dict[str, str], path: Path) -> tuple[dict[str, Any], ExportRecord]:
    """An export's decoded `hasten_*` metadata and its ExportRecord; CheckpointError naming the file and the field."""
    try:
        raw = decode_metadata(meta)
    except (ValueError, RecursionError) as error:
        raise CheckpointError(f"{path}: its hasten metadata is not JSON ({type(error).__name__})") from None
    try:
        return raw, ExportRecord.model_validate(raw)
    except ValidationError as error:
        raise CheckpointError(f"{path}: its hasten metadata does not fit: {schema_problems(error)}") from None


class OnnxPredictor(Predicts):
    """An ONNX export run by onnxruntime: its graph takes uint8 (N, C, H, W) and does the normalisation (and
    the flip TTA where the run used it); the metadata gives the classes and the conversion of image files."""

    def __init__(self, path: Path):
        try:
            import onnxruntime
        except ImportError:
            raise HastenError("predicting with an .onnx file needs onnxruntime: pip install 'hasten[onnx]'") from None
        check_onnx_graph(path)  # no file it names is read, nothing it computes from constants alone is huge
        try:
            self.session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        except Exception as error:  # onnxruntime raises its own types for files that are not ONNX
            raise CheckpointError(f"{path} is not a readable ONNX model: {str(error).splitlines()[0]}") from None
        meta = self.session.get_modelmeta().custom_metadata_map
        if "hasten_preprocessing" not in meta:
            raise CheckpointError(f"{path}: no hasten metadata (write it with hasten export --format onnx)")
        self.metadata, record = export_record(meta, path)
        if record.preprocessing is None:
            raise CheckpointError(f"{path}: its hasten metadata holds no preprocessing (images of over 4 channels)")
        self.classes = list(record.classes)
        self.preprocessing = Preprocessing.from_dict(record.preprocessing.model_dump(), str(path))
        self.input_name = self.session.get_inputs()[0].name
        outputs = self.session.get_outputs()[0].shape
        width = outputs[-1] if outputs else None
        if isinstance(width, int) and width != len(self.classes):
            raise CheckpointError(
                f"{path}: the graph gives {width} logits per image but its metadata names {len(self.classes)} classes"
            )
        self.path = path

    def logits_of(self, pixels: Tensor) -> Tensor:
        pre = self.preprocessing
        if pre.units == "own":  # the graph takes float images as the user's code made them (pixels are refused)
            pixels = pre.in_units(pixels).float()
        elif pixels.is_floating_point():  # the graph takes uint8 pixels: floats in the training images' units
            pre.warn_scale(pixels)
            pixels = (pixels * (255 if pre.fraction else 1)).round().clamp(0, 255).to(torch.uint8)
        try:
            logits = torch.from_numpy(self.session.run(None, {self.input_name: pixels.numpy()})[0])
        except Exception as error:  # onnxruntime's own error types: a graph that does not take the input
            raise CheckpointError(f"{self.path}: onnxruntime cannot run it: {str(error).splitlines()[0]}") from None
        if logits.dim() != 2 or logits.shape[1] != len(self.classes):
            raise CheckpointError(
                f"{self.path}: the graph gives logits of shape {tuple(logits.shape)} but its metadata names "
                f"{len(self.classes)} classes"
            )
        return logits


def safetensors_facts(path: Path) -> tuple[dict[str, Tensor], RunFacts]:
    """Weights and run facts of a `hasten export` safetensors file; CheckpointError naming it otherwise."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            weights = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not a dict)
    except Exception as error:  # safetensors raises its own error types for bad headers
        raise CheckpointError(f"{path} is not a readable safetensors file: {error}") from None
    if "hasten_recipe" not in meta:
        raise CheckpointError(
            f"{path}: no hasten metadata (not written by hasten export); it holds bare weights, which do not say "
            "which model, classes or preprocessing they are for"
        )
    raw, record = export_record(meta, path)
    if record.recipe is None:
        raise CheckpointError(f"{path}: its hasten metadata holds no recipe to rebuild the model from")
    recipe = validate(record.recipe, f"the recipe in {path}")
    pre = Preprocessing.from_dict(record.preprocessing.model_dump(), str(path)) if record.preprocessing else None
    facts = RunFacts(recipe, list(record.classes), tuple(record.input_shape), tuple(record.mean), tuple(record.std),
                     pre, record.test_accuracy, raw)  # fmt: skip
    if facts.tta_translate * 2 >= min(facts.image_shape[1:]):
        raise CheckpointError(f"{path}: the recipe's train.tta_translate is not below half the image side")
    return weights, facts


def load(
    source: str | Path, device: str | torch.device = "cpu", *, trust_code: bool = False, model: Any = None
) -> Predictor | OnnxPredictor:
    """The model a run evaluated, ready to use: `hasten.load("runs/fashion-fast").predict(["shoe.png"])`.

    `source`: a run folder, a hasten checkpoint, a `hasten export` .safetensors or .onnx file. The result has
    `predict(images, top_k)`, `probabilities(images)`, `classes` and `preprocessing`; a torch source is also
    an `nn.Module` (normalised images in, logits out) whose bare network is `.model`.

    A source is data: hasten's own models are rebuilt from its recipe, but a `model.target` or `data.target` it
    names is not imported unless `trust_code=True`; or pass your model yourself, `model=` an nn.Module, the
    class or function that makes it (called as in training), or its import path ("pkg.nets:Net").
    """
    device = checked_device(device)  # before anything is read: a device this machine lacks costs nothing
    path = Path(source)
    trust = Trust(code=trust_code)
    if path.suffix == ".onnx" and path.is_file():
        return OnnxPredictor(path)
    if path.suffix == ".safetensors" and path.is_file():
        weights, facts = safetensors_facts(path)
    else:
        if not path.exists():
            raise CheckpointError(f"not found: {path} (expected a run folder, checkpoint, .safetensors or .onnx)")
        path, state = checkpoint_of(path)
        weights, facts = evaluated_state_dict(state), facts_from_checkpoint(path, state, trust)
    return Predictor(network(facts, weights, str(path), trust=trust, model=model), facts).to(device)


def image_files(inputs: Sequence[str | Path]) -> list[Path]:
    """The image files named, and those under the folders named (recursively, sorted); DataError when one is
    missing or nothing is an image."""
    files: list[Path] = []
    for item in map(Path, inputs):
        if item.is_dir():
            files += sorted(p for p in item.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
        elif item.is_file():
            files.append(item)
        else:
            raise DataError(f"{item}: no such image file or folder")
    if not files:
        raise DataError(f"no image files ({', '.join(IMAGE_SUFFIXES)}) in {', '.join(map(str, inputs))}")
    return files
