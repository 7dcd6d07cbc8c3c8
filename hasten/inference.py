"""Use what you trained: load a run folder, a checkpoint or an export, and predict on image files.

What is loaded is always the model the run evaluated: with `tricks.ema` on, the EMA copy (with its own
batch-norm statistics), read through one function, `evaluated_state_dict`. It comes with what training did to
images (`hasten.data.preprocessing.Preprocessing`: Pillow mode, size, resize, mean/std), the class names and
the run's test-time augmentation (flip, translate), so `predict` on any image file gives what the run
measured. As timm's `inference.py` and fastai's `load_learner`/`predict` do; evaluation is in
`hasten.evaluation`, exports (safetensors with metadata, ONNX) in `hasten.exporting`.

Sources: a run folder (its newest complete checkpoint, the one summary.json's test_accuracy comes from), a
hasten checkpoint (`.pt`), a `.safetensors` file written by `hasten export`, or an `.onnx` export (run by
onnxruntime). Anything else is a CheckpointError naming the file (exit 2). Checkpoints load weights-only.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from hasten.checkpoint import latest_usable, load_checkpoint, load_model_weights
from hasten.config import Recipe, validate
from hasten.data.imagefolder import IMAGE_SUFFIXES
from hasten.data.preprocessing import Preprocessing, preprocessing_for
from hasten.errors import CheckpointError, DataError, HastenError
from hasten.tta import black_fill, tta_logits

WRAPPER_PREFIXES = ("module.", "_orig_mod.")  # AveragedModel / DDP and torch.compile prefix every key
PREDICT_BATCH = 256  # images per forward pass in predict


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
    ema_on = float(((checkpoint.get("recipe") or {}).get("tricks") or {}).get("ema") or 0) > 0
    if ema_on and isinstance(ema, dict) and int(ema.get("n_averaged", 0)) > 0:
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
    preprocessing: Preprocessing | None  # None for images of 2 or 4 channels (no Pillow mode to read files into)
    test_accuracy: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

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
    if not isinstance(state.get("recipe"), dict) or not state["recipe"] or "model" not in state:
        raise CheckpointError(
            f"{path} is not a hasten training checkpoint: it holds no recipe and model (a bare state dict cannot "
            "say which model it is; load it with model.pretrained=PATH)"
        )
    return path, state


def _summary_beside(checkpoint: Path) -> dict[str, Any]:
    """summary.json of the run folder a checkpoint sits in (RUN/checkpoints/step-N.pt), or {}."""
    path = checkpoint.parent.parent / "summary.json"
    try:
        return json.loads(path.read_text()) if checkpoint.parent.name == "checkpoints" and path.is_file() else {}
    except (OSError, ValueError):
        return {}


def recorded_accuracy(checkpoint: Path, state: dict[str, Any]) -> float | None:
    """The test accuracy the run measured with this checkpoint's weights: its epoch's row of metrics.csv."""
    trainer = state.get("trainer") or {}
    if trainer.get("batch", 0) or checkpoint.parent.name != "checkpoints":  # mid-epoch, or outside a run folder
        return None
    from hasten.report import read_metrics

    rows = [r for r in read_metrics(checkpoint.parent.parent) if int(r.get("step", -1)) == trainer.get("step")]
    return rows[-1].get("test_accuracy") if rows else None


def facts_from_checkpoint(path: Path, state: dict[str, Any]) -> RunFacts:
    """The run's facts: from summary.json beside the checkpoint when it has them, else from the recipe's data."""
    recipe = validate(state["recipe"], f"the recipe in {path}")
    summary = _summary_beside(path)
    accuracy = recorded_accuracy(path, state)
    same_data = (summary.get("dataset") or {}).get("name") == recipe.data.name  # not a later run's, on other data
    if same_data and summary.get("classes") and summary.get("preprocessing"):
        try:
            pre = Preprocessing.from_dict(summary["preprocessing"], f"{path.parent.parent / 'summary.json'}")
        except ValueError:
            pre = None  # edited by hand or from another version: the data below says the same
        if pre is not None:
            shape = (pre.channels, pre.height, pre.width)
            return RunFacts(recipe, list(summary["classes"]), shape, pre.mean, pre.std, pre, accuracy)
    from hasten.build import dataset

    data = dataset(recipe)
    mean, std = training_stats(data, recipe.seed)
    pre = None  # images of 2 or 4 channels: no Pillow mode to read files into
    if data.image_shape[0] in (1, 3):
        pre = preprocessing_for(data.image_shape, mean, std, from_folder=hasattr(data, "root"))
    mean_t, std_t = tuple(mean.tolist()), tuple(std.tolist())
    return RunFacts(recipe, list(data.classes), tuple(data.image_shape), mean_t, std_t, pre, accuracy)


def training_stats(data: Any, seed: int) -> tuple[Tensor, Tensor]:
    """Per-channel mean and std of a dataset's training images, computed as the run's loaders computed them."""
    from hasten.data.imagefolder import ImageFolder, folder_stats
    from hasten.data.loader import channel_stats

    return folder_stats(data, seed=seed) if isinstance(data, ImageFolder) else channel_stats(data.train_images)


def network(
    facts: RunFacts, weights: dict[str, Tensor], source: str, prepare: Callable[[nn.Module], nn.Module] | None = None
) -> nn.Module:
    """The recipe's model for the run's input and classes, holding `weights`; CheckpointError when they are
    from another model (names every key that does not fit). `prepare`: the run's `Precision.prepare`, to
    evaluate as the run did (fp16-master: fp16 weights); without it the weights are fp32."""
    from hasten.models import build_model

    try:
        model = build_model(facts.recipe.model, facts.image_shape, len(facts.classes))
    except (ValueError, TypeError, RuntimeError) as error:
        raise CheckpointError(f"{source}: cannot rebuild its model from its recipe: {error}") from None
    if prepare is not None:
        model = prepare(model)
    elif any(v.dtype == torch.float16 for v in weights.values()):  # fp16-master keeps fp16 weights, fp32 BN
        weights = {k: v.float() if v.is_floating_point() else v for k, v in weights.items()}
    load_model_weights(model, weights, source)
    return model.eval()


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


class Predicts:
    """`predict` and `probabilities` for anything that maps uint8 pixels to logits (`logits_of`)."""

    classes: list[str]
    preprocessing: Preprocessing

    def logits_of(self, pixels: Tensor) -> Tensor:
        raise NotImplementedError

    def probabilities(self, images: Any) -> Tensor:
        """(N, classes) probabilities of images: paths, Pillow images, or uint8 (N, C, H, W) in the model's mode."""
        pixels = self.preprocessing.batch(images)
        logits = torch.cat([self.logits_of(chunk) for chunk in pixels.split(PREDICT_BATCH)])
        return logits.float().softmax(1)

    def predict(self, images: Any, top_k: int = 1) -> list[Prediction]:
        """Class names and probabilities of the top `top_k` classes of each image, converted as training did."""
        items = [images] if isinstance(images, (str, Path)) else images
        names = [str(i) if isinstance(i, (str, Path)) else f"#{n}" for n, i in enumerate(items)]
        probs = self.probabilities(images)
        k = max(1, min(top_k, len(self.classes)))
        values, indices = probs.topk(k, dim=1)
        return [
            Prediction(name, self.classes[int(idx[0])], int(idx[0]), float(val[0]),
                       [(self.classes[int(i)], float(v)) for v, i in zip(val, idx, strict=True)])
            for name, val, idx in zip(names, values, indices, strict=True)
        ]  # fmt: skip


class Predictor(nn.Module, Predicts):
    """A trained network with what it needs to be used: `forward` takes normalised images (B, C, H, W) and
    returns logits, averaged over the run's TTA (mirror, shifted copies: hasten/tta.py); `predict` takes
    image files or uint8 pixels and does the preprocessing. `model` is the bare network, for your own code."""

    def __init__(self, model: nn.Module, facts: RunFacts):
        super().__init__()
        self.model, self.facts = model.eval(), facts
        self.classes, self.tta_flip, self.tta_translate = facts.classes, facts.tta_flip, facts.tta_translate
        self.register_buffer("fill", black_fill(torch.tensor(facts.mean), torch.tensor(facts.std)), persistent=False)
        if facts.preprocessing is None:
            raise DataError(f"images of {facts.image_shape[0]} channels: predict reads only grey or RGB images")
        self.preprocessing = facts.preprocessing
        self.eval()

    def forward(self, images: Tensor, tta_flip: bool | None = None, tta_translate: int | None = None) -> Tensor:
        flip = self.tta_flip if tta_flip is None else tta_flip
        translate = self.tta_translate if tta_translate is None else tta_translate
        return tta_logits(self.model, images, flip, translate, self.fill)

    @torch.no_grad()
    def logits_of(self, pixels: Tensor) -> Tensor:
        device = next(self.model.parameters()).device
        return self(self.preprocessing.normalise(pixels.to(device))).cpu()


def decode_metadata(meta: dict[str, str]) -> dict[str, Any]:
    """An export's `hasten_*` metadata (JSON strings, as `hasten.exporting` writes them) as values."""
    return {key.removeprefix("hasten_"): json.loads(value) for key, value in meta.items() if key.startswith("hasten_")}


class OnnxPredictor(Predicts):
    """An ONNX export run by onnxruntime: its graph takes uint8 (N, C, H, W) and does the normalisation (and
    the flip TTA where the run used it); the metadata gives the classes and the conversion of image files."""

    def __init__(self, path: Path):
        try:
            import onnxruntime
        except ImportError:
            raise HastenError("predicting with an .onnx file needs onnxruntime: pip install 'hasten[onnx]'") from None
        try:
            self.session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        except Exception as error:  # onnxruntime raises its own types for files that are not ONNX
            raise CheckpointError(f"{path} is not a readable ONNX model: {str(error).splitlines()[0]}") from None
        meta = self.session.get_modelmeta().custom_metadata_map
        if "hasten_preprocessing" not in meta:
            raise CheckpointError(f"{path}: no hasten metadata (write it with hasten export --format onnx)")
        try:
            self.metadata = decode_metadata(meta)
            self.classes = list(self.metadata["classes"])
            self.preprocessing = Preprocessing.from_dict(self.metadata["preprocessing"], str(path))
        except (KeyError, TypeError, ValueError) as error:
            raise CheckpointError(f"{path}: its hasten metadata is incomplete ({error})") from None
        self.input_name = self.session.get_inputs()[0].name

    def logits_of(self, pixels: Tensor) -> Tensor:
        return torch.from_numpy(self.session.run(None, {self.input_name: pixels.numpy()})[0])


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
    try:
        raw = decode_metadata(meta)
        recipe = validate(raw["recipe"], f"the recipe in {path}")
        pre = Preprocessing.from_dict(raw["preprocessing"], str(path)) if raw.get("preprocessing") else None
        shape = tuple(raw["input_shape"])
        facts = RunFacts(recipe, list(raw["classes"]), shape, tuple(raw["mean"]), tuple(raw["std"]), pre,
                         raw.get("test_accuracy"), raw)  # fmt: skip
    except (KeyError, TypeError, ValueError) as error:
        raise CheckpointError(f"{path}: its hasten metadata is incomplete ({error})") from None
    return weights, facts


def load(source: str | Path, device: str | torch.device = "cpu") -> Predictor | OnnxPredictor:
    """The model a run evaluated, ready to use: `hasten.load("runs/fashion-fast").predict(["shoe.png"])`.

    `source`: a run folder, a hasten checkpoint, a `hasten export` .safetensors or .onnx file. The result has
    `predict(images, top_k)`, `probabilities(images)`, `classes` and `preprocessing`; a torch source is also
    an `nn.Module` (normalised images in, logits out) whose bare network is `.model`.
    """
    path = Path(source)
    if path.suffix == ".onnx" and path.is_file():
        return OnnxPredictor(path)
    if path.suffix == ".safetensors" and path.is_file():
        weights, facts = safetensors_facts(path)
    else:
        if not path.exists():
            raise CheckpointError(f"not found: {path} (expected a run folder, checkpoint, .safetensors or .onnx)")
        path, state = checkpoint_of(path)
        weights, facts = evaluated_state_dict(state), facts_from_checkpoint(path, state)
    return Predictor(network(facts, weights, str(path)), facts).to(device)


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
