"""Batch mixing: mixup (Zhang et al., "mixup: Beyond Empirical Risk Minimization", 2018) and CutMix (Yun et
al., "CutMix: Regularization Strategy to Train Strong Classifiers with Localizable Features", 2019).

Both pair each example with another from the same batch (a permutation) and blend images and soft targets
with weight `lam ~ Beta(alpha, alpha)`: mixup blends whole images, CutMix pastes a box of the partner whose
area is a `1 - lam` share of the image, and the targets are blended by the box's exact area.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from hasten.data.seeds import numpy_stream
from hasten.techniques.technique import Context, Switch, Technique

if TYPE_CHECKING:
    from hasten.recipe.schema import Recipe

Box = tuple[int, int, int, int]  # top, bottom, left, right (bottom and right exclusive), in pixels


def mixup(x: Tensor, y_soft: Tensor, lam: float, perm: Tensor) -> tuple[Tensor, Tensor]:
    """Each example blended with `perm`'s partner: `lam` of itself, `1 - lam` of the partner."""
    return lam * x + (1 - lam) * x[perm], lam * y_soft + (1 - lam) * y_soft[perm]


def cutmix(x: Tensor, y_soft: Tensor, box: Box, perm: Tensor) -> tuple[Tensor, Tensor]:
    """Each image with the `box` region taken from `perm`'s partner; targets weighted by the box's area."""
    top, bottom, left, right = box
    mixed = x.clone()
    mixed[:, :, top:bottom, left:right] = x[perm][:, :, top:bottom, left:right]
    partner_share = (bottom - top) * (right - left) / (x.shape[2] * x.shape[3])
    return mixed, (1 - partner_share) * y_soft + partner_share * y_soft[perm]


def cutmix_box(lam: float, height: int, width: int, center: tuple[float, float]) -> Box:
    """The box of a `1 - lam` share of the image around `center` (fractions of height and width), clipped to
    the image as in Yun et al. (so a box at the edge is smaller, and the targets follow its real area)."""
    cut = math.sqrt(1 - lam)
    cy, cx = round(center[0] * height), round(center[1] * width)
    half_h, half_w = round(height * cut) // 2, round(width * cut) // 2
    return max(cy - half_h, 0), min(cy + half_h, height), max(cx - half_w, 0), min(cx + half_w, width)


class BatchMixing(Technique):
    """Batch hook: mixup or CutMix on each training batch (one of the two, with equal odds, when both are on,
    as timm does). Draws lambda, the permutation and the box from `rng`, the run's seeded generator; its state
    (the generator's) is checkpointed per rank, since each rank draws its own stream."""

    name, hooks, order = "mixing", frozenset({"on_batch"}), 20
    switches = (
        Switch("tricks.mixup", "0", "0.2", "mixup: each image blended with another of the batch"),
        Switch("tricks.cutmix", "0", "1.0", "cutmix: a box of another image of the batch pasted in"),
    )
    stateful = rank_local = True

    def __init__(self, mixup_alpha: float, cutmix_alpha: float, rng: np.random.Generator):
        self.mixup_alpha, self.cutmix_alpha, self.rng = mixup_alpha, cutmix_alpha, rng

    @classmethod
    def from_recipe(cls, recipe: Recipe, context: Context) -> BatchMixing | None:
        config = recipe.tricks
        if not (config.mixup or config.cutmix):
            return None
        # seeded by (seed, rank): runs repeat and ranks differ
        return cls(config.mixup, config.cutmix, numpy_stream(recipe.seed, context.rank))

    def on_batch(self, images: Tensor, y_soft: Tensor) -> tuple[Tensor, Tensor]:
        use_cutmix = self.cutmix_alpha > 0 and (self.mixup_alpha <= 0 or self.rng.random() < 0.5)
        alpha = self.cutmix_alpha if use_cutmix else self.mixup_alpha
        lam = float(self.rng.beta(alpha, alpha))
        perm = torch.from_numpy(self.rng.permutation(images.shape[0])).to(images.device)
        if not use_cutmix:
            return mixup(images, y_soft, lam, perm)
        box = cutmix_box(lam, images.shape[2], images.shape[3], (self.rng.random(), self.rng.random()))
        return cutmix(images, y_soft, box, perm)

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]
