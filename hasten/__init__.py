"""hasten: train neural networks fast and memory-efficiently, and measure what each technique buys."""

from __future__ import annotations

__version__ = "0.1.0"


def train(recipe: object = None, overrides: list[str] | None = None) -> dict:
    """Train a recipe (a `Recipe`, a YAML path or a shipped name; None: the default) and return its summary."""
    from hasten.build import train as _train
    from hasten.config import Recipe, load_recipe

    if not isinstance(recipe, Recipe):
        recipe = load_recipe(recipe, overrides)  # type: ignore[arg-type]
    elif overrides:
        from hasten.config import apply_overrides, validate

        recipe = validate(apply_overrides(recipe.model_dump(mode="json"), overrides))
    return _train(recipe)


def load(path: object, device: str = "cpu") -> object:
    """The model a run evaluated, from a run folder, checkpoint or `hasten export` file (.safetensors, .onnx),
    with `predict(images, top_k)` that converts images as training did; see hasten.inference.load."""
    from hasten.inference import load as _load

    return _load(path, device)  # type: ignore[arg-type]
