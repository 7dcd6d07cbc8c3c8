"""A user's images as they come (a list or a Dataset whose items differ in size, grey beside colour) brought to the
one shape a run trains on, by the rules an image folder follows (hasten/data/imagefolder.py):

- the size: `data.size` when given; else, when the images looked at come in several sizes, a square of their
  median shorter side (`fitting.mixed_sizes_side`); else the one size they have, untouched;
- the channels: 3 for `data.rgb=true` (grey repeated; an alpha channel dropped), 1 for false (ITU-R 601-2 luma, as
  Pillow's convert("L")); unset, as they come, and where they come grey and in colour, 3 (as a folder is read);
- each image of another size is brought to it with Pillow as `data.resize` says (squash, crop, pad:
  hasten/data/fitting.py), item by item, in the DataLoader workers that read a Dataset's items.

`decide_target` makes the decision once, from the shapes of a sample of the items, with the lines that say what it
decided; `Target.apply` brings one image to it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from hasten.data.fitting import SQUASH, fit_pillow, mixed_sizes_side
from hasten.data.transforms import LUMA
from hasten.errors import DataError


@dataclass(frozen=True)
class Target:
    """The shape every image of a run's data is brought to: `channels` and `size` (height, width) where the data
    must change (None: as it comes), `fit` (data.resize) for the size, and `shape` (C, H, W), what every image is
    then expected to be (None: the first one's)."""

    channels: int | None = None
    size: tuple[int, int] | None = None
    fit: str = SQUASH
    shape: tuple[int, int, int] | None = None

    def apply(self, pixels: Tensor, where: str) -> Tensor:
        """One image (C, H, W), uint8 or float32, brought to the target; DataError naming `where` when its channels
        cannot be (2 or 4 channels asked to become something else are read as grey or colour plus alpha)."""
        if self.channels is not None and pixels.shape[0] != self.channels:
            pixels = to_channels(pixels, self.channels, where)
        if self.size is not None and tuple(pixels.shape[1:]) != self.size:
            pixels = fit_pillow(pixels, *self.size, self.fit)
        return pixels

    def resizes(self, shapes: list[tuple[int, int, int]]) -> bool:
        """Whether images of `shapes` are resized to reach the target (a run records Pillow as its resize then)."""
        return self.size is not None and any(tuple(shape[1:]) != self.size for shape in shapes)


def to_channels(pixels: Tensor, channels: int, where: str) -> Tensor:
    """(C, H, W) pixels with `channels` (1 or 3) channels: grey repeated, colour as its luma (uint8 rounded as
    transforms.set_channels does; floats kept unrounded); of 4 channels (RGBA) the alpha dropped, of 2 (grey and
    alpha) the grey kept, as Pillow's convert does."""
    have = pixels.shape[0]
    if channels not in (1, 3) or have not in (1, 2, 3, 4):
        raise DataError(f"{where}: an image of {have} channels cannot be read with {channels}; give 1 (grey) or 3 "
                        "(RGB) channels, or leave data.rgb unset")  # fmt: skip
    pixels = pixels[:3] if have == 4 else pixels[:1] if have == 2 else pixels
    if pixels.shape[0] == channels:
        return pixels
    if channels == 3:
        return pixels.expand(3, -1, -1).contiguous()
    grey = (pixels.float() * torch.tensor(LUMA).view(3, 1, 1)).sum(0, keepdim=True)
    return grey.round_().clamp_(0, 255).to(torch.uint8) if pixels.dtype == torch.uint8 else grey


def decide_target(
    shapes: list[tuple[int, int, int]], size: int | None, rgb: bool | None, fit: str = SQUASH
) -> tuple[Target, list[str]]:
    """The target for images whose sampled shapes (C, H, W) are `shapes`, under data.size (`size`), data.rgb (`rgb`)
    and data.resize (`fit`), with a line for each thing decided that the recipe did not say (the module docstring's
    rules)."""
    notes = []
    if size is None:
        side, note = mixed_sizes_side([(int(w), int(h)) for _, h, w in shapes])
        notes += [note] * bool(note)
    else:
        side = size
    counts = sorted({int(c) for c, _, _ in shapes})
    if rgb is not None:
        channels: int | None = 3 if rgb else 1
    elif len(counts) > 1:
        colour = sum(int(c) in (3, 4) for c, _, _ in shapes)
        channels = 3 if colour else 1
        kind = "RGB, the grey ones' channel repeated" if channels == 3 else "grey"
        notes.append(f"data.rgb: the images looked at have {' or '.join(map(str, counts))} channels ({colour} of "
                     f"{len(shapes)} in colour); all are read as {kind} (data.rgb=true|false chooses)")  # fmt: skip
    else:
        channels = None
    first = shapes[0] if shapes else None
    target_size = (side, side) if side is not None else None
    shape = None
    if first is not None:
        height, width = target_size or (int(first[1]), int(first[2]))
        shape = (channels or int(first[0]), height, width)
    return Target(channels, target_size, fit, shape), notes
