"""Cutout (DeVries & Taylor, "Improved Regularization of Convolutional Neural Networks with Cutout", 2017): a
square of each training image, at a random centre and clipped at the border, set to zero, which after
normalisation is the training set's mean pixel. The targets stay: the object is still there, partly hidden.

This file, its key in the recipe (`tricks.cutout`), its line in hasten/techniques/registry.py and its test are
all it took to add: the technique declares its hook point, its state and its switch, build finds it, and
`hasten bench --ablate` switches it off.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from hasten.data.seeds import numpy_stream
from hasten.techniques.technique import Context, Switch, Technique

if TYPE_CHECKING:
    from hasten.recipe.schema import Recipe


def cutout(x: Tensor, centers: Tensor, length: int) -> Tensor:
    """`x` (N, C, H, W) with a `length` x `length` square around each image's `centers` row (y, x in pixels)
    zeroed, clipped to the image; a new tensor."""
    height, width = x.shape[2], x.shape[3]
    top = (centers[:, 0] - length // 2).clamp(min=0)
    bottom = (centers[:, 0] - length // 2 + length).clamp(max=height)
    left = (centers[:, 1] - length // 2).clamp(min=0)
    right = (centers[:, 1] - length // 2 + length).clamp(max=width)
    rows = torch.arange(height, device=x.device)[None, :, None]
    cols = torch.arange(width, device=x.device)[None, None, :]
    inside_rows = (rows >= top[:, None, None]) & (rows < bottom[:, None, None])  # (N, H, 1)
    inside = inside_rows & (cols >= left[:, None, None]) & (cols < right[:, None, None])  # (N, H, W)
    return x.masked_fill(inside[:, None], 0)


class Cutout(Technique):
    """Batch hook (`tricks.cutout`: the square's side in pixels): draws each image's centre from the run's
    generator seeded by (seed, rank); its state is checkpointed per rank, like the mixing stream."""

    name, hooks, order = "cutout", frozenset({"on_batch"}), 15  # before mixing, as a per-image augmentation
    switches = (Switch("tricks.cutout", "0", "8", "a square of each training image, at a random centre, zeroed"),)
    stateful = rank_local = True

    def __init__(self, length: int, rng: np.random.Generator):
        self.length, self.rng = length, rng

    @classmethod
    def from_recipe(cls, recipe: Recipe, context: Context) -> Cutout | None:
        if not recipe.tricks.cutout:
            return None
        return cls(recipe.tricks.cutout, numpy_stream(recipe.seed, context.rank, cls.order))

    def on_batch(self, images: Tensor, y_soft: Tensor) -> tuple[Tensor, Tensor]:
        n, _, height, width = images.shape
        centers = np.stack([self.rng.integers(0, height, n), self.rng.integers(0, width, n)], axis=1)
        return cutout(images, torch.from_numpy(centers).to(images.device), self.length), y_soft

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]
