"""The recipe of `hasten gan`: a DCGAN run's knobs, validated in one place.

Loaded like a training recipe (hasten/recipe/schema.py): a YAML file or a shipped name (`dcgan-fashion`), then dotted
`key=value` overrides, then validation that reports every problem at once, each naming its dotted field, as
one `RecipeError` (exit code 2). Defaults follow Radford et al. (2015): Adam at lr 2e-4 with beta1 0.5,
mini-batches of 128, z of 100 numbers (standard normal here; the paper drew them uniformly).
"""

from __future__ import annotations

from typing import Annotated

import yaml
from pydantic import Field, ValidationError

from hasten.recipe.schema import (
    MAX_SYNTHETIC,
    DataConfig,
    Fp32WeightsPrecision,
    Fraction,
    LossScaleConfig,
    PositiveFloat,
    RunFolder,
    Section,
    apply_overrides,
    load_raw,
    recipe_error,
)

DEFAULT_GAN_RECIPE = "dcgan-fashion"
DatasetName = DataConfig.model_fields["name"].annotation  # the datasets `hasten train` knows


class GanData(Section):
    name: DatasetName = "fashion-mnist"  # 28x28 images are padded to 32x32; 32x32 ones are used as they are
    root: str | None = None  # a folder holding the dataset's files under their official names
    download: bool = True  # allow fetching from the official address (checked against a pinned SHA-256)
    subset: Annotated[int, Field(ge=1)] | None = None  # first N training images
    synthetic_size: Annotated[int, Field(ge=8, le=MAX_SYNTHETIC)] = 512  # training images of the synthetic set


class GanModel(Section):
    latent: Annotated[int, Field(ge=1)] = 100  # length of the noise vector z
    width: Annotated[int, Field(ge=1)] = 64  # channels of D's first and G's last hidden layer; the others 2x, 4x


class GanOptim(Section):
    """One Adam per network, with the same settings (the paper's)."""

    lr: PositiveFloat = 2e-4
    betas: tuple[Fraction, Fraction] = (0.5, 0.999)  # beta1 0.5: the paper found 0.9 made training oscillate


class GanTrain(Section):
    epochs: Annotated[int, Field(ge=1)] = 5
    batch_size: Annotated[int, Field(ge=2)] = 128  # real images per step (batch norm needs 2 or more)
    threads: Annotated[int, Field(ge=1)] | None = None  # torch intra-op threads; None: torch's default
    # D's target for real images; below 1 is one-sided label smoothing (Salimans et al., "Improved Techniques for
    # Training GANs", 2016): D is kept from growing overconfident on real images; fake targets stay 0, G's stay 1
    real_label: Annotated[float, Field(gt=0.5, le=1)] = 1.0


class GanQuality(Section):
    """Fréchet distance on features of a hasten classifier (not Inception FID) and the class mix of samples."""

    enabled: bool = True
    classifier: str | None = None  # weights (.pt checkpoint or .safetensors); None: train one in run.dir/classifier
    classifier_recipe: str = "fashion-fast"  # the training recipe whose `model` section the weights fit
    classifier_epochs: Annotated[int, Field(ge=1)] = 2  # when training one here
    classifier_overrides: list[str] = []  # more key=value overrides for the classifier's recipe
    samples: Annotated[int, Field(ge=16)] = 2000  # generated and real images per estimate
    every_epoch: bool = True  # also measure after every epoch (a metrics.csv column), not only at the end
    collapse_share: Annotated[float, Field(gt=0, lt=1)] = 0.5  # warn of mode collapse when one class takes more


class GanRun(Section):
    dir: RunFolder = None  # default: runs/<recipe name>
    # a fresh run into a run.dir holding another run's files: move those into run.dir/replaced-<UTC time>/ (never
    # deleted) instead of refusing, as `hasten train` does
    overwrite: bool = False

    progress: bool = True  # rich progress bar; false: the summary is printed as JSON
    tensorboard: bool = True
    keep: Annotated[int, Field(ge=1)] = 2  # checkpoints kept (one per epoch, the newest)
    grid: Annotated[int, Field(ge=1, le=32)] = 8  # sample grid of grid x grid images from fixed noise


class GanRecipe(Section):
    name: str = "gan"
    seed: int = 0
    precision: Fp32WeightsPrecision = "fp32"
    loss_scale: LossScaleConfig = LossScaleConfig()  # fp16: each network's scaler starts here, separately
    device: str = "auto"  # auto: cuda when available, else cpu
    resume: str | None = None  # auto: the newest complete checkpoint in run.dir/checkpoints, if any; or a path
    data: GanData = GanData()
    model: GanModel = GanModel()
    optim: GanOptim = GanOptim()
    train: GanTrain = GanTrain()
    quality: GanQuality = GanQuality()
    run: GanRun = GanRun()


def load_gan_recipe(source: str | None = None, overrides: list[str] | None = None) -> GanRecipe:
    """The GAN recipe named or at `source` (default: dcgan-fashion) with `overrides` applied and validated."""
    raw, origin = load_raw(source or DEFAULT_GAN_RECIPE)
    try:
        return GanRecipe.model_validate(apply_overrides(raw, overrides or []))
    except ValidationError as exc:
        raise recipe_error(exc, origin, overrides, GanRecipe) from None


def gan_recipe_yaml(recipe: GanRecipe) -> str:
    """The resolved recipe as YAML, as saved beside every run."""
    return yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False)
