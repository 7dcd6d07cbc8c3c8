"""hasten: train neural networks fast and memory-efficiently, and measure what each technique buys."""

from __future__ import annotations

from hasten.version import __version__

__all__ = ["__version__", "load", "train"]


def train(
    recipe: object = None,
    overrides: list[str] | None = None,
    *,
    model: object = None,
    data: object = None,
    loss: object = None,
) -> dict:
    """Train a recipe (a `Recipe`, a YAML path or a shipped name; None: the default) and return the result: the
    run's summary (a dict, as summary.json holds it) with the trained model beside it (hasten.use.result.Trained:
    `result.predict(images)`, `result.evaluate((images, labels))`, `result.export("model.onnx")`, `result.model`).

    Your own model and data go beside the recipe, which still holds every setting (hasten/run/user.py):
    `model`: an nn.Module (trained in place) or a callable making one (called after the run's seed is set, with
    `num_classes`, `in_channels`, `image_size` when it takes them). `data`: an (images, labels) pair of arrays
    (uint8 N x H x W [x C] or N x C x H x W; held in memory), a torch Dataset of (image, label) (streamed by
    DataLoader workers), an image folder path, or (train, test) / (train, test, class_names) of those; a train
    part alone needs `data.val_fraction`. `loss(logits, soft_targets) -> loss` replaces the soft cross-entropy.
    """
    from hasten.recipe.schema import Recipe, load_recipe
    from hasten.run.build import train as _train

    _check_arguments(recipe, overrides, Recipe)
    if not isinstance(recipe, Recipe):
        recipe = load_recipe(recipe, overrides)  # type: ignore[arg-type]
    elif overrides:
        from hasten.recipe.schema import apply_overrides, validate

        recipe = validate(apply_overrides(recipe.model_dump(mode="json"), overrides))
    from hasten.use.result import Trained

    summary = _train(recipe, model=model, data=data, loss=loss)  # type: ignore[arg-type]
    return Trained(summary, model) if summary.get("run_dir") else summary


def _check_arguments(recipe: object, overrides: object, recipe_type: type) -> None:
    """RecipeError naming `recipe` or `overrides` when it is not of a kind train takes, where a dict failed deep in
    the loading and one string of overrides was read character by character."""
    from pathlib import Path

    from hasten.errors import RecipeError

    if recipe is not None and not isinstance(recipe, (recipe_type, str, Path)):
        raise RecipeError(
            f"recipe: a Recipe, a YAML file's path or a shipped recipe's name (None: the default recipe), got "
            f"{type(recipe).__name__}; give settings as overrides, ['train.epochs=1', ...]"
        )
    if overrides is None:
        return
    if isinstance(overrides, str):
        raise RecipeError(
            f"overrides: a list of 'key=value' strings, got one string ({overrides[:60]!r}); give a list, e.g. "
            "['train.epochs=1', 'run.dir=runs/x'] (text.split() splits one at its spaces)"
        )
    if not isinstance(overrides, (list, tuple)):
        raise RecipeError(f"overrides: a list of 'key=value' strings, e.g. ['train.epochs=1'], got "
                          f"{type(overrides).__name__}")  # fmt: skip
    if bad := [item for item in overrides if not isinstance(item, str)]:
        raise RecipeError(f"overrides: a list of 'key=value' strings, e.g. ['train.epochs=1'], got {bad[0]!r} "
                          f"({type(bad[0]).__name__}) among them")  # fmt: skip


def load(path: object, device: str = "cpu", *, trust_code: bool = False, model: object = None) -> object:
    """The model a run evaluated, from a run folder, checkpoint or `hasten export` file (.safetensors, .onnx),
    with `predict(images, top_k)` that converts images as training did; see hasten.use.load.load.

    The file is data: a `model.target` or `data.target` it names is not imported unless `trust_code=True`; or
    give `model=` yourself (an nn.Module, or the class or function that makes it)."""
    from hasten.use.load import load as _load

    return _load(path, device, trust_code=trust_code, model=model)  # type: ignore[arg-type]
