"""Soft targets: labels become probability vectors inside the loop, so label smoothing, mixup and cutmix
compose in any order and one loss serves them all.

Label smoothing: Szegedy et al., "Rethinking the Inception Architecture for Computer Vision" (2016); one of
the refinements measured in He et al., "Bag of Tricks for Image Classification" (2019).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor

from hasten.techniques.technique import Context, Switch, Technique

if TYPE_CHECKING:
    from hasten.recipe.schema import Recipe


def smooth(y_soft: Tensor, eps: float) -> Tensor:
    """Targets moved `eps` of the way towards the uniform distribution.

    Affine in `y_soft` with weights summing to 1, so it commutes with mixup and cutmix (both convex blends).
    """
    return y_soft * (1 - eps) + eps / y_soft.shape[1]


class LabelSmoothing(Technique):
    """Batch hook: smooths the soft targets by `eps` (`tricks.label_smoothing`); no randomness, no state."""

    name, hooks, order = "label_smoothing", frozenset({"on_batch"}), 10
    switches = (Switch("tricks.label_smoothing", "0", "0.1", "targets moved eps of the way to uniform"),)

    def __init__(self, eps: float):
        self.eps = eps

    @classmethod
    def from_recipe(cls, recipe: Recipe, context: Context) -> LabelSmoothing | None:
        return cls(recipe.tricks.label_smoothing) if recipe.tricks.label_smoothing else None

    def on_batch(self, images: Tensor, y_soft: Tensor) -> tuple[Tensor, Tensor]:
        return images, smooth(y_soft, self.eps)
