"""The recipe of `hasten gan`: a DCGAN run's knobs, validated in one place.

Loaded like a training recipe (hasten/recipe/schema.py): a YAML file or a shipped name (`dcgan-fashion`), then dotted
`key=value` overrides, then validation that reports every problem at once, each naming its dotted field, as
one `RecipeError` (exit code 2). Defaults follow Radford et al. (2015): Adam at lr 2e-4 with beta1 0.5,
mini-batches of 128, z of 100 numbers (standard normal here; the paper drew them uniformly).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import Field, ValidationError

from hasten.errors import RecipeError
from hasten.recipe.loading import read_recipe_yaml
from hasten.recipe.schema import (
    DEFAULT_RECIPE,
    MAX_EPOCHS,
    MAX_SYNTHETIC,
    MAX_THREADS,
    MAX_WIDTH,
    DataConfig,
    Fp32WeightsPrecision,
    Fraction,
    LossScaleConfig,
    PositiveFloat,
    Recipe,
    RunFolder,
    RunName,
    Section,
    apply_overrides,
    load_raw,
    recipe_error,
    shipped_recipes,
)

DEFAULT_GAN_RECIPE = "dcgan-fashion"
DatasetName = DataConfig.model_fields["name"].annotation  # the datasets `hasten train` knows


class GanData(Section):
    name: DatasetName = Field(
        "fashion-mnist",
        description="One of the registry's datasets (imagefolder, import and object are refused when the run "
        "loads its data); the DCGAN takes 28x28 images, padded to 32x32, and 32x32 ones as they are.",
    )
    root: str | None = Field(None, description="A folder holding the dataset's files under their official names.")
    download: bool = Field(
        True, description="Allow fetching from the official address (checked against a pinned SHA-256)."
    )
    subset: Annotated[int, Field(ge=1)] | None = Field(None, description="Train on the first N training images only.")
    synthetic_size: Annotated[int, Field(ge=8, le=MAX_SYNTHETIC)] = Field(
        512, description="Training images of the synthetic set (data.name=synthetic)."
    )


class GanModel(Section):
    latent: Annotated[int, Field(ge=1)] = Field(100, description="Length of the noise vector z.")
    width: Annotated[int, Field(ge=1, le=MAX_WIDTH)] = Field(
        64, description="Channels of D's first and G's last hidden layer; the others 2x and 4x that."
    )


class GanOptim(Section):
    """One Adam per network, with the same settings (the paper's)."""

    lr: PositiveFloat = Field(2e-4, description="Adam's learning rate, for both networks.")
    # beta1 0.5: the paper found 0.9 made training oscillate
    betas: tuple[Fraction, Fraction] = Field((0.5, 0.999), description="Adam's [beta1, beta2].")


class GanTrain(Section):
    epochs: Annotated[int, Field(ge=1, le=MAX_EPOCHS)] = Field(5, description="Passes over the training images.")
    batch_size: Annotated[int, Field(ge=2)] = Field(
        128, description="Real images per step (batch norm needs 2 or more)."
    )
    threads: Annotated[int, Field(ge=1, le=MAX_THREADS)] | None = Field(
        None, description="torch intra-op threads; null: torch's default."
    )
    # one-sided label smoothing (Salimans et al., "Improved Techniques for Training GANs", 2016) keeps D from
    # growing overconfident on real images
    real_label: Annotated[float, Field(gt=0.5, le=1)] = Field(
        1.0,
        description="D's target for real images; below 1 is one-sided label smoothing. Fake targets stay 0, G's "
        "stay 1.",
    )


class GanQuality(Section):
    """Fréchet distance on features of a hasten classifier (not Inception FID) and the class mix of samples."""

    enabled: bool = Field(True, description="Measure sample quality at all.")
    classifier: str | None = Field(
        None,
        description="The classifier's weights (.pt checkpoint or .safetensors); null: train one once per dataset and "
        "classifier recipe, kept in hasten's cache (gan-classifiers/) for every later run.",
    )
    classifier_recipe: str = Field(
        "fashion-fast", description="The training recipe whose model section the classifier's weights fit."
    )
    classifier_epochs: Annotated[int, Field(ge=1)] = Field(
        2, description="Epochs of the classifier when it is trained here."
    )
    classifier_overrides: list[str] = Field([], description="More key=value overrides for the classifier's recipe.")
    samples: Annotated[int, Field(ge=16)] = Field(2000, description="Generated and real images per estimate.")
    every_epoch: bool = Field(
        True, description="Also measure after every epoch (a metrics.csv column), not only at the end."
    )
    collapse_share: Annotated[float, Field(gt=0, lt=1)] = Field(
        0.5, description="Warn of mode collapse when one class takes more than this share of the samples."
    )


class GanRun(Section):
    dir: RunFolder = Field(None, description="The run's folder; null: runs/<recipe name>.")
    overwrite: bool = Field(
        False,
        description="A fresh run into a run.dir holding another run's files: move those into "
        "run.dir/replaced-<UTC time>/ (never deleted) instead of refusing, as hasten train does.",
    )

    progress: bool = Field(True, description="Show a rich progress bar; false: the summary is printed as JSON.")
    tensorboard: bool = Field(True, description="Write TensorBoard events into run.dir.")
    keep: Annotated[int, Field(ge=1)] = Field(2, description="Checkpoints kept (one per epoch, the newest).")
    grid: Annotated[int, Field(ge=1, le=32)] = Field(
        8, description="Sample grid of grid x grid images, drawn from fixed noise each epoch."
    )


class GanRecipe(Section):
    name: RunName = Field(
        "gan",
        description="The run's name, a plain folder name: runs/<name> unless run.dir is set. A recipe file or "
        "shipped recipe without one is named after itself.",
    )
    seed: int = Field(0, description="Seed of the run's random numbers (the sample grid's noise included).")
    precision: Fp32WeightsPrecision = Field(
        "fp32", description="Numeric precision of both networks: fp32, bf16 autocast, fp16 with loss scaling."
    )
    loss_scale: LossScaleConfig = Field(
        LossScaleConfig(), description="fp16: each network's scaler starts here, separately."
    )
    device: str = Field("auto", description="auto: cuda when available, else cpu.")
    resume: str | None = Field(
        None,
        description="auto: the newest complete checkpoint in run.dir/checkpoints, if any; or a checkpoint's path.",
    )
    data: GanData = Field(GanData(), description="The training images.")
    model: GanModel = Field(GanModel(), description="The DCGAN's generator G and discriminator D.")
    optim: GanOptim = Field(GanOptim(), description="The optimizers of both networks.")
    train: GanTrain = Field(GanTrain(), description="The training loop.")
    quality: GanQuality = Field(GanQuality(), description="Sample quality, measured while training and at its end.")
    run: GanRun = Field(GanRun(), description="The run folder.")


GAN_RECIPES = "a GAN recipe: dcgan-fashion (the default) or a YAML file like it"


def load_gan_recipe(source: str | None = None, overrides: list[str] | None = None) -> GanRecipe:
    """The GAN recipe named or at `source` (default: dcgan-fashion) with `overrides` applied and validated. An image
    folder, or a classifier's recipe (`hasten gan fashion-fast`), is refused in one line that says so."""
    # a folder (hasten train's `hasten train photos/`) would be told it is an unknown recipe: 'did you mean photos/?'
    if source is not None and source not in shipped_recipes() and Path(source).is_dir():
        raise RecipeError(
            f"{source} is a folder: hasten gan trains on a dataset of the registry (data.name=fashion-mnist, "
            f"mnist, ...), not on a folder; give it {GAN_RECIPES}"
        )
    raw, origin = load_raw(source or DEFAULT_GAN_RECIPE)
    if source is not None and extends_the_default(source):  # its keys may all be a GAN's too: said, not trained
        raise RecipeError(
            f"{origin} is a classifier's recipe, for hasten train (and schedule, lr-find, batch-size, bench, sweep): "
            f"it is the default recipe or extends it; hasten gan takes {GAN_RECIPES}"
        )
    try:
        return GanRecipe.model_validate(apply_overrides(raw, overrides or []))
    except ValidationError as exc:
        if classifier_recipe(raw):  # not a dozen unknown keys, each of them right for `hasten train`
            raise RecipeError(
                f"{origin} is a classifier's recipe, for hasten train (and schedule, lr-find, batch-size, bench, "
                f"sweep); hasten gan takes {GAN_RECIPES}"
            ) from None
        raise recipe_error(exc, origin, overrides, GanRecipe) from None


def extends_the_default(source: str) -> bool:
    """Whether `source` is the classifier's default recipe or extends it (through any chain of `extends`): the
    default recipe's values are the classifier schema's defaults, so its file holds only its name, which a GAN
    recipe would accept."""
    seen: set[str] = set()
    current: Any = source
    while isinstance(current, str) and current not in seen and len(seen) < 16:
        if current == DEFAULT_RECIPE:
            return True
        seen.add(current)
        try:
            raw, _, folder = read_recipe_yaml(current)
        except RecipeError:
            return False
        parent = raw.get("extends")
        if isinstance(parent, str) and folder is not None and (folder / parent).is_file():
            parent = str(folder / parent)
        current = parent
    return False


def classifier_recipe(raw: dict[str, Any]) -> bool:
    """Whether a recipe's mapping is a classifier's: it validates as one, and holds keys a GAN recipe does not know
    (a GAN recipe that only sets a value out of a GAN's range is not)."""
    try:
        GanRecipe.model_validate(raw)
    except ValidationError as error:
        if not any(problem["type"] == "extra_forbidden" for problem in error.errors()):
            return False
    else:
        return False
    try:
        Recipe.model_validate(raw)
    except ValidationError:
        return False
    return True


def gan_recipe_yaml(recipe: GanRecipe) -> str:
    """The resolved recipe as YAML, as saved beside every run."""
    return yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False)
