"""Sample quality of a generator: a Fréchet distance on features of hasten's own classifier, and the class mix.

The Fréchet distance between two Gaussians fitted to feature vectors (Dowson and Landau, 1982) is
    d^2 = |mu_a - mu_b|^2 + Tr(S_a + S_b - 2 (S_a S_b)^(1/2)),
which is what FID computes (Heusel et al., "GANs Trained by a Two Time-Scale Update Rule Converge to a Local
Nash Equilibrium", 2017) on Inception-v3 pool features. Here the features are the penultimate layer (the
input of the last linear layer) of a hasten classifier trained on the same dataset. So this is a Fréchet
distance on hasten classifier features; it is not Inception FID, and its values are comparable only between
runs measured with the same classifier weights and the same sample count (the estimate is biased upwards
for small samples).

The classifier also labels the generated samples: a generator that covers the dataset gives a class mix near
the dataset's (uniform for Fashion-MNIST); mode collapse shows as a few classes taking most samples.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import ValidationError
from rich.console import Console
from torch import Tensor, nn

from hasten.data import ImageDataset
from hasten.data.cache import cache_folder
from hasten.data.loader import channel_stats
from hasten.errors import CheckpointError, HastenError
from hasten.models import build_model
from hasten.models.dcgan import SIZE, padded, signed
from hasten.recipe.gan import GanRecipe
from hasten.recipe.schema import (
    ModelConfig,
    apply_overrides,
    load_raw,
    load_recipe,
    load_yaml,
    read_text_file,
    validate,
)
from hasten.recipe.trust import Trust, embedded_recipe
from hasten.runfolder.checkpoint import load_checkpoint, read_weights
from hasten.runfolder.folder import RunFolderError
from hasten.version import __version__

NAME = "Fréchet distance on hasten classifier features; not Inception FID"


def gaussian_stats(features: Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Mean (F,) and covariance (F, F) of `features` (N, F), in float64."""
    values = features.detach().to("cpu", torch.float64).numpy()
    return values.mean(0), np.cov(values, rowvar=False)


def trace_sqrt_product(sigma_a: np.ndarray, sigma_b: np.ndarray) -> float:
    """Tr((S_a S_b)^(1/2)) for covariance matrices: scipy's sqrtm when available, else eigendecompositions."""
    try:
        from scipy.linalg import LinAlgWarning, sqrtm
    except ImportError:
        return trace_sqrt_product_eigh(sigma_a, sigma_b)
    with warnings.catch_warnings():  # near-singular covariances (few samples, collapsed modes) are expected
        warnings.simplefilter("ignore", LinAlgWarning)
        root = sqrtm(sigma_a @ sigma_b)
        if not np.isfinite(root).all():  # singular product: nudge both diagonals, as pytorch-fid does
            offset = np.eye(len(sigma_a)) * 1e-6
            root = sqrtm((sigma_a + offset) @ (sigma_b + offset))
    if not np.isfinite(root).all():
        return trace_sqrt_product_eigh(sigma_a, sigma_b)
    return float(np.real(np.trace(root)))  # tiny imaginary parts are round-off


def trace_sqrt_product_eigh(sigma_a: np.ndarray, sigma_b: np.ndarray) -> float:
    """Tr((S_a S_b)^(1/2)) = Tr((A S_b A)^(1/2)) with A = S_a^(1/2): symmetric, so two `eigh` calls suffice."""
    values, vectors = np.linalg.eigh(sigma_a)
    root_a = (vectors * np.sqrt(values.clip(min=0))) @ vectors.T
    inner = np.linalg.eigvalsh(root_a @ sigma_b @ root_a)
    return float(np.sqrt(inner.clip(min=0)).sum())


def frechet_distance(stats_a: tuple[np.ndarray, np.ndarray], stats_b: tuple[np.ndarray, np.ndarray]) -> float:
    """d^2 between Gaussians given as (mean, covariance); 0 for identical statistics."""
    (mu_a, sigma_a), (mu_b, sigma_b) = stats_a, stats_b
    mean_term = float(np.square(mu_a - mu_b).sum())
    return mean_term + float(np.trace(sigma_a) + np.trace(sigma_b)) - 2 * trace_sqrt_product(sigma_a, sigma_b)


def class_distribution(logits: Tensor, classes: list[str]) -> dict[str, float]:
    """Fraction of samples the classifier assigns to each class."""
    counts = torch.bincount(logits.argmax(1).cpu(), minlength=len(classes)).double()
    return {name: round(float(c), 4) for name, c in zip(classes, counts / max(len(logits), 1), strict=True)}


class ClassifierFeatures:
    """A trained classifier as a feature extractor for images in [-1, 1], padded to `size` x `size`.

    Images are mapped back to what the classifier was trained on: [0, 1], the padding cropped off, normalised
    with the training set's per-channel mean and std. Features are the input of the last linear layer.
    """

    def __init__(self, model: nn.Module, mean: Tensor, std: Tensor, image_size: int, padded_size: int):
        linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
        if not linears:
            raise CheckpointError("the classifier has no linear layer whose input could serve as features")
        self.model = model.eval()
        self.head = linears[-1]
        device = next(model.parameters()).device
        self.mean, self.std = mean.to(device).view(1, -1, 1, 1), std.to(device).view(1, -1, 1, 1)
        self.crop = slice((padded_size - image_size) // 2, (padded_size - image_size) // 2 + image_size)

    @torch.no_grad()
    def __call__(self, images: Tensor) -> tuple[Tensor, Tensor]:
        """(features (N, F), logits (N, classes)) of `images` (N, C, padded, padded) in [-1, 1], in fp32."""
        captured: list[Tensor] = []
        handle = self.head.register_forward_pre_hook(lambda _, inputs: captured.append(inputs[0].float()))
        try:
            x = (images.float()[:, :, self.crop, self.crop] + 1) / 2
            logits = self.model((x - self.mean) / self.std).float()
        finally:
            handle.remove()
        return captured[0], logits

    def over(self, batches: Iterable[Tensor]) -> tuple[Tensor, Tensor]:
        """Features and logits of every batch, concatenated."""
        features, logits = zip(*(self(batch) for batch in batches), strict=True)
        return torch.cat(features), torch.cat(logits)


def read_summary(path: Path) -> Any:
    from hasten.use.load import read_summary as read  # here: inference needs the model stack

    return read(path)


def classifier_model_config(path: Path, recipe: str, overrides: list[str]) -> tuple[ModelConfig, str]:
    """The `model` section the weights in `path` were trained with, and where it came from: the recipe saved
    in a hasten checkpoint, else the recipe.yaml beside the file (as `hasten train` leaves next to
    model.safetensors), else `recipe` with `overrides`."""
    beside = path.parent / "recipe.yaml"
    candidates = [
        (load_checkpoint(path).get("recipe") if path.suffix != ".safetensors" else None, f"the recipe in {path}"),
        (load_yaml(read_text_file(beside, "recipe"), str(beside)) if beside.is_file() else None, str(beside)),
    ]
    for saved, source in candidates:
        if isinstance(saved, dict) and isinstance(saved.get("model"), dict):
            try:
                return ModelConfig.model_validate(saved["model"]), source
            except ValidationError:
                continue  # from another hasten version, or not a classifier's recipe: try the next source
    return load_recipe(recipe, overrides).model, f"recipe {recipe!r}"


def load_classifier(
    path: str | Path, recipe: str, overrides: list[str], data: ImageDataset, trust_code: bool = False
) -> nn.Module:
    """The classifier whose weights are in `path` (a hasten checkpoint, .safetensors or a plain state dict),
    for `data`'s image shape and classes, in eval mode. A model section read from a file is data: a model.target it
    names is imported only with `trust_code`, or when the classifier recipe the user gives names the same one."""
    path = Path(path)
    weights = read_weights(path)
    config, source = classifier_model_config(path, recipe, overrides)
    try:
        own = load_recipe(recipe, overrides).model.target
    except HastenError:
        own = None
    with embedded_recipe(source, Trust(code=trust_code, named={"model.target": own} if own else {})):
        model = build_model(config, data.image_shape, data.num_classes)
    try:
        model.load_state_dict(weights)
    except RuntimeError as error:
        lines = str(error).splitlines()
        raise CheckpointError(
            f"quality.classifier: {path} does not fit the model of {source} for {data.name} "
            f"(set quality.classifier_recipe to the recipe it was trained with): {lines[-1].strip()}"
        ) from None
    return model.eval()


def classifier_folder(recipe: str, overrides: list[str]) -> Path:
    """Where the classifier of `recipe` with `overrides` is kept across GAN runs: a folder of hasten's cache named by
    a digest of the resolved classifier recipe (its data, model, budget, seed and device; not its run keys) and the
    hasten version, so every GAN run on that dataset with that classifier recipe reuses one training."""
    raw, origin = load_raw(recipe)
    settings = validate(apply_overrides(raw, overrides), origin).model_dump(mode="json")
    settings.pop("run", None)
    digest = hashlib.sha256(json.dumps([settings, __version__], sort_keys=True).encode()).hexdigest()[:16]
    return cache_folder("gan-classifiers") / digest


ASKED = "classifier-recipe.json"  # beside a trained classifier: the recipe it was asked to train, before resolving


def train_classifier(recipe: str, overrides: list[str], folder: Path) -> tuple[Path, float, bool]:
    """Train `recipe` with `overrides` the way `hasten train` does, into `folder`, keeping its weights
    (folder/model.safetensors beside folder/recipe.yaml, and the recipe as asked in folder/ASKED); reuse them when
    they were trained from the same recipe as asked (what the run then decided, its `auto` keys and its batch, is the
    run's). Returns (weights path, test accuracy, whether they were reused)."""
    from hasten.run.build import train  # here: the classifier's training stack is needed only now

    raw, origin = load_raw(recipe)
    wanted = validate(
        apply_overrides(raw, [*overrides, f"run.dir={folder}", "run.save_weights=true", "run.overwrite=true"]), origin
    )
    asked = json.dumps(wanted.model_dump(mode="json"), sort_keys=True)
    weights, summary, record = folder / "model.safetensors", folder / "summary.json", folder / ASKED
    if weights.is_file() and summary.is_file() and record.is_file():
        fresh = record.stat().st_mtime >= weights.stat().st_mtime  # the weights are not newer than the record
        try:  # what the folder holds is checked before it is trusted; anything unreadable is trained again
            same = record.stat().st_size <= 1 << 20 and record.read_text(encoding="utf-8") == asked
            accuracy = read_summary(summary).test_accuracy if fresh and same else None
        except (HastenError, OSError, UnicodeDecodeError):
            accuracy = None
        if accuracy is not None:
            return weights, accuracy, True
    folder.mkdir(parents=True, exist_ok=True)
    record.unlink(missing_ok=True)
    result = train(wanted)
    record.write_text(asked, encoding="utf-8")  # after the weights: a run stopped midway is trained again
    return weights, float(result["test_accuracy"]), False


@dataclass
class QualityProbe:
    """Measures generated images against a fixed set of real ones, with a fixed classifier and sample count."""

    features: ClassifierFeatures
    reference: tuple[np.ndarray, np.ndarray]  # Gaussian statistics of the real images' features
    noise: Tensor  # the z of the measured samples, fixed, so epochs are compared on the same draws
    classes: list[str]
    info: dict[str, Any]  # what was measured with what, for the summary

    def measure(self, images: Tensor, batch: int = 500) -> tuple[float, dict[str, float]]:
        """(Fréchet distance to the reference, class distribution) of generated `images` in [-1, 1]."""
        features, logits = self.features.over(images.split(batch))
        return frechet_distance(gaussian_stats(features), self.reference), class_distribution(logits, self.classes)


def quality_probe(
    recipe: GanRecipe,
    data: ImageDataset,
    device: torch.device,
    folder: Path,
    console: Console,
    trust_code: bool = False,
) -> QualityProbe:
    """The Fréchet distance and class-mix probe, with `quality.classifier`, or a classifier trained with
    `quality.classifier_recipe` on the same dataset, once: kept in hasten's cache (`classifier_folder`) and reused
    by every later run with the same classifier recipe (in run.dir/classifier when the cache is busy)."""
    quality, cfg = recipe.quality, recipe.data
    accuracy: float | None = None
    if quality.classifier:
        weights, source = Path(quality.classifier), "given (quality.classifier)"
    else:
        overrides = [
            f"data.name={cfg.name}", f"data.root={cfg.root or 'null'}", f"data.download={str(cfg.download).lower()}",
            f"data.synthetic_size={cfg.synthetic_size}", f"seed={recipe.seed}", f"device={recipe.device}",
            f"train.epochs={quality.classifier_epochs}", f"run.progress={str(recipe.run.progress).lower()}",
            *quality.classifier_overrides,
        ]  # fmt: skip
        classifier_dir = classifier_folder(quality.classifier_recipe, overrides)
        console.print(
            f"quality: no classifier given (quality.classifier); reusing the one trained with "
            f"{quality.classifier_recipe} for {quality.classifier_epochs} epochs on this dataset in {classifier_dir}, "
            "or training it there once for every later run",
            highlight=False,
        )
        try:
            weights, accuracy, reused = train_classifier(quality.classifier_recipe, overrides, classifier_dir)
        except RunFolderError as busy:  # another GAN run is training it now, or the cache cannot be written
            console.print(f"quality: {busy}; training the classifier in this run's folder instead", highlight=False)
            classifier_dir = folder / "classifier"
            weights, accuracy, reused = train_classifier(quality.classifier_recipe, overrides, classifier_dir)
        source = f"{'reused' if reused else 'trained'}: {quality.classifier_recipe}, {quality.classifier_epochs} epochs"
        console.print(f"quality: classifier {weights} ({source}), test accuracy {accuracy:.4f}", highlight=False)
    model = load_classifier(weights, quality.classifier_recipe, quality.classifier_overrides, data, trust_code)
    model = model.to(device)
    mean, std = channel_stats(data.train_images)  # what the classifier was normalised with: the whole training set
    features = ClassifierFeatures(model, mean, std, data.image_shape[1], SIZE)
    n = min(quality.samples, len(data.test_images), len(data.train_images))

    def real(images: Tensor) -> list[Tensor]:
        return [signed(padded(chunk)).to(device) for chunk in images[:n].split(500)]

    reference = gaussian_stats(features.over(real(data.test_images))[0])
    floor = frechet_distance(gaussian_stats(features.over(real(data.train_images))[0]), reference)
    noise = torch.randn(n, recipe.model.latent, generator=torch.Generator().manual_seed(recipe.seed + 1))
    info = {
        "measure": NAME,
        "samples": n,
        "reference": f"the first {n} test images",
        "real_train_vs_test": round(floor, 4),  # the floor: real images against real ones, same count
        "classifier": str(weights),
        "classifier_source": source,
        "classifier_test_accuracy": accuracy,
    }
    return QualityProbe(features, reference, noise.to(device), data.classes, info)
