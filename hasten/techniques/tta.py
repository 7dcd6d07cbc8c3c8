"""Test-time augmentation: the logits of an image averaged with those of its mirror and of shifted copies.

One function, `tta_logits`, serves every place that evaluates a trained model (the trainer's evaluation,
`hasten evaluate`, `hasten predict`/`hasten.load`, the ONNX graph of `hasten export`), so they all compute the
same numbers op for op.

The set and weights are airbench's (Keller Jordan, 2024, `infer_mirror_translate`): with a shift t, the image
counts 1/2 and its copies moved diagonally by (+t, +t) and (-t, -t) pixels 1/4 each; with flips, each of these
is itself the mean of the image and its mirror. airbench pads with reflection; here the uncovered edge is filled
with what training's random translate puts there (hasten/data/loader.py `translate`: zero pixels, black, before
normalisation), i.e. the normalised value of a black pixel, `black_fill(mean, std)`, so a shifted test image
looks like a shifted training image.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def black_fill(mean: Tensor, std: Tensor) -> Tensor:
    """The normalised value of a black (0) pixel per channel, (1, C, 1, 1): what fills a translated image's edge.
    Bitwise what `(0 / 255 - mean) / std` gives, the loaders' normalisation of a zero pixel."""
    return -(mean.reshape(1, -1, 1, 1) / std.reshape(1, -1, 1, 1))


def shift(images: Tensor, dy: int, dx: int, fill: Tensor | float = 0.0) -> Tensor:
    """`images` (N, C, H, W) moved down by `dy` and right by `dx` pixels (negative: up, left); the uncovered
    edge holds `fill` (a scalar or (1, C, 1, 1)). The same pixels as the loader's `translate` with one shift for
    the whole batch; padding and slicing, so it exports to ONNX."""
    pad = max(abs(dy), abs(dx))
    if pad == 0:
        return images
    height, width = images.shape[-2:]
    rows, cols = slice(pad - dy, pad - dy + height), slice(pad - dx, pad - dx + width)
    window = nn.functional.pad(images, (pad, pad, pad, pad))[:, :, rows, cols]
    inside = nn.functional.pad(torch.ones((1, 1, height, width), device=images.device), (pad, pad, pad, pad))
    return torch.where(
        inside[:, :, rows, cols] > 0, window, torch.as_tensor(fill, dtype=images.dtype, device=images.device)
    )


def tta_logits(model: nn.Module, images: Tensor, flip: bool, translate: int, fill: Tensor | float = 0.0) -> Tensor:
    """float logits of `model` on normalised `images`: averaged with the mirrored images' when `flip`, and with
    copies shifted by (+translate, +translate) and (-translate, -translate) pixels (weights 1/2, 1/4, 1/4) when
    `translate` > 0, the edges filled with `fill` (`black_fill` of the run's normalisation)."""
    return tta_views(model, images, flip, translate, fill)[0]


def tta_views(
    model: nn.Module, images: Tensor, flip: bool, translate: int, fill: Tensor | float = 0.0
) -> tuple[Tensor, Tensor]:
    """`tta_logits`, op for op, and the logits of the plain view alone (the images as given), which it computes
    on the way: one evaluation gives the accuracy with and without test-time augmentation."""
    plain = model(images).float()

    def mirrored(x: Tensor, logits: Tensor | None = None) -> Tensor:
        logits = model(x).float() if logits is None else logits
        return (logits + model(x.flip(3)).float()) / 2 if flip else logits

    logits = mirrored(images, plain)
    if translate:
        down_right = mirrored(shift(images, translate, translate, fill))
        up_left = mirrored(shift(images, -translate, -translate, fill))
        logits = logits / 2 + (down_right + up_left) / 4
    return logits, plain


def views(flip: bool, translate: int) -> int:
    """Forward passes per image of `tta_logits`: the image, its mirror when `flip`, and both again shifted twice."""
    return (2 if flip else 1) * (3 if translate else 1)
