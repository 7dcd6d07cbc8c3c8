"""The recipe: every knob of a run, validated in one place.

A recipe is a YAML file (or the name of one shipped in `hasten/recipes/`), then dotted `key=value`
overrides from the command line, then `Recipe.model_validate`. Unknown keys, wrong types and values out of
range are all reported together, each naming its dotted field, as one `RecipeError` (exit code 2).
"""

from __future__ import annotations

import copy
import importlib.resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from hasten.errors import RecipeError

PositiveFloat = Annotated[float, Field(gt=0)]
Fraction = Annotated[float, Field(ge=0, lt=1)]


class Section(BaseModel):
    """Base of every recipe section: unknown keys are errors, values are checked on assignment too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class AugmentConfig(Section):
    flip: bool = False  # random horizontal flip, per sample, on the whole batch
    translate: Annotated[int, Field(ge=0)] = 0  # random shift of up to this many pixels (zero padding)


class DataConfig(Section):
    name: Literal["fashion-mnist", "mnist", "kmnist", "digits", "cifar10", "cifar100", "imagefolder", "synthetic"] = (
        "fashion-mnist"
    )
    root: str | None = None  # a folder holding the dataset's files under their official names
    download: bool = True  # allow fetching from the official address (checked against a pinned SHA-256)
    subset: Annotated[int, Field(ge=1)] | None = None  # first N training images
    test_subset: Annotated[int, Field(ge=1)] | None = None  # first N test images
    synthetic_size: Annotated[int, Field(ge=8)] = 512  # training images of the synthetic set
    augment: AugmentConfig = AugmentConfig()


class ModelConfig(Section):
    name: Literal["resnet", "sequential"] = "resnet"
    width: Annotated[int, Field(ge=1)] = 32  # channels of the first ResNet stage; later stages double it
    blocks: list[Annotated[int, Field(ge=0)]] = [1, 1, 1]  # residual blocks per ResNet stage
    layers: list[str | dict[str, Any]] | None = None  # the layer list of a sequential model
    zero_init_residual: bool = False  # start each residual branch's last BN gamma at 0 (Goyal et al.)

    @model_validator(mode="after")
    def _layers_for_sequential(self) -> ModelConfig:
        if self.name == "sequential" and not self.layers:
            raise ValueError("model.layers: a sequential model needs a non-empty layer list")
        if self.name == "resnet" and not self.blocks:
            raise ValueError("model.blocks: a resnet needs at least one stage")
        return self


class OptimConfig(Section):
    name: Literal["sgd", "adamw", "adam"] = "sgd"
    lr: PositiveFloat = 0.1  # peak learning rate, per `base_batch` examples when that is set
    base_batch: Annotated[int, Field(ge=1)] | None = None  # batch size `lr` is given for; None: no scaling
    scaling: Literal["linear", "sqrt"] = "linear"  # how lr grows with the global batch
    momentum: Annotated[float, Field(ge=0, lt=1)] = 0.9
    nesterov: bool = True
    betas: tuple[Fraction, Annotated[float, Field(ge=0, lt=1)]] = (0.9, 0.999)
    weight_decay: Annotated[float, Field(ge=0)] = 5e-4
    no_bias_decay: bool = True  # no weight decay on biases and normalisation parameters


class ScheduleConfig(Section):
    name: Literal["constant", "cosine", "one-cycle"] = "constant"
    warmup: Annotated[float, Field(ge=0, lt=1)] = 0.0  # fraction of the run spent warming up linearly
    floor: Annotated[float, Field(ge=0, le=1)] = 0.0  # final LR as a fraction of the peak (cosine)
    peak: Annotated[float, Field(gt=0, lt=1)] = 0.25  # one-cycle: where in the run the LR peaks
    start: Annotated[float, Field(ge=0, le=1)] = 0.04  # one-cycle: starting LR as a fraction of the peak
    end: Annotated[float, Field(ge=0, le=1)] = 0.0  # one-cycle: final LR as a fraction of the peak


class TrainConfig(Section):
    epochs: Annotated[int, Field(ge=1)] = 5
    batch_size: Annotated[int, Field(ge=1)] = 256
    eval_batch_size: Annotated[int, Field(ge=1)] = 1024
    channels_last: bool = False
    label_smoothing: Annotated[float, Field(ge=0, lt=1)] = 0.0
    tta_flip: bool = False  # evaluate on the image and its mirror, averaging the logits
    threads: Annotated[int, Field(ge=1)] | None = None  # torch intra-op threads; None: torch's default


class RunConfig(Section):
    dir: str | None = None  # default: runs/<recipe name>
    progress: bool = True  # rich progress bar
    tensorboard: bool = True
    thresholds: list[Annotated[float, Field(gt=0, le=1)]] = [0.90, 0.91, 0.92, 0.93, 0.94]


class Recipe(Section):
    name: str = "run"
    seed: int = 0
    precision: Literal["fp32", "bf16", "fp16", "fp16-master"] = "fp32"
    device: str = "auto"  # auto: cuda when available, else cpu
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    optim: OptimConfig = OptimConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    train: TrainConfig = TrainConfig()
    run: RunConfig = RunConfig()


DEFAULT_RECIPE = "fashion-fast"


def shipped_recipes() -> list[str]:
    """Names of the recipes that ship inside the package."""
    folder = importlib.resources.files("hasten") / "recipes"
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def _read_yaml(source: str) -> tuple[dict[str, Any], str]:
    """The raw mapping of a recipe given as a path or a shipped name, and where it came from."""
    path = Path(source)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise RecipeError(f"recipe file not found: {path}")
        text, origin = path.read_text(encoding="utf-8"), str(path)
    else:
        shipped = importlib.resources.files("hasten") / "recipes" / f"{source}.yaml"
        if not shipped.is_file():
            raise RecipeError(
                f"unknown recipe {source!r}: not a file, and not one of the shipped recipes "
                f"({', '.join(shipped_recipes())})"
            )
        text, origin = shipped.read_text(encoding="utf-8"), f"shipped recipe {source!r}"
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise RecipeError(f"{origin}: not valid YAML: {error}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise RecipeError(f"{origin}: a recipe must be a mapping of keys to values, got {type(raw).__name__}")
    raw.setdefault("name", path.stem if path.suffix in (".yaml", ".yml") else source)
    return raw, origin


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """`top` laid over `base`, section by section."""
    merged = copy.deepcopy(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def load_raw(source: str | None, _seen: tuple[str, ...] = ()) -> tuple[dict[str, Any], str]:
    """A recipe's mapping, with `extends: OTHER` resolved (the other recipe's keys under this one's)."""
    raw, origin = _read_yaml(source or DEFAULT_RECIPE)
    parent = raw.pop("extends", None)
    if parent is not None:
        if not isinstance(parent, str):
            raise RecipeError(f"{origin}: extends must name a recipe, got {parent!r}")
        if parent in _seen:
            raise RecipeError(f"{origin}: recipes extend each other in a loop: {' -> '.join(_seen + (parent,))}")
        base, _ = load_raw(parent, _seen + (parent,))
        base.pop("name", None)
        raw = _merge(base, raw)
    return raw, origin


def parse_value(text: str) -> Any:
    """A command-line value as YAML would read it, so `0.2`, `1e-3`, `true`, `null`, `[1,2]` get their types."""
    try:
        value = yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        return text
    if isinstance(value, str):
        try:  # YAML 1.1 reads `1e-3` as a string; users mean a number
            return float(value)
        except ValueError:
            return value
    return value


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
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                problems.append(f"{key}: {'.'.join(parents[: i + 1])} is a value, not a section")
                break
            node = child
        else:
            node[leaf] = parse_value(text)
    if problems:
        raise RecipeError("bad override(s):\n" + "\n".join(f"  - {p}" for p in problems))
    return result


def _describe(error: dict[str, Any]) -> str:
    field = ".".join(str(part) for part in error["loc"]) or "recipe"
    if error["type"] == "extra_forbidden":
        return f"{field}: unknown key"
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] in ("value_error", "assertion_error") and ": " in message:
        return message  # our validators already start with the field name
    return f"{field}: {message} (got {error.get('input')!r})"


def validate(raw: dict[str, Any], origin: str = "recipe") -> Recipe:
    """A validated `Recipe`, or one `RecipeError` that lists every problem, each naming its field."""
    try:
        return Recipe.model_validate(raw)
    except ValidationError as exc:
        lines = [_describe(error) for error in exc.errors()]
        raise RecipeError(
            f"{origin}: {len(lines)} problem(s):\n" + "\n".join(f"  - {line}" for line in lines)
        ) from None


def load_recipe(source: str | None = None, overrides: list[str] | None = None) -> Recipe:
    """The recipe named or at `source` (default: the default recipe) with `overrides` applied and validated."""
    raw, origin = load_raw(source)
    return validate(apply_overrides(raw, overrides or []), origin)


def to_yaml(recipe: Recipe) -> str:
    """The resolved recipe as YAML, as saved beside every run."""
    return yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False)
