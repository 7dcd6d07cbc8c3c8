"""How an image of one size is brought to the size a run trains on (`data.resize`), the same way wherever it comes
from (an image file, an item of a user's list or Dataset, an in-memory array) and wherever it goes (training,
`predict`, an export's recorded preprocessing):

- `squash`: resized to the target height x width, the aspect ratio not kept;
- `crop`: resized so it covers the target (its shorter side to the target's), the overhang cut off equally on
  both sides: the centre is kept, as torchvision's `Resize(size)` + `CenterCrop(size)` do;
- `pad`: resized so it fits inside the target (its longer side to the target's), the rest filled with zeros
  (black), the image centred.

The resampling is a library's bilinear one, never written here: Pillow's `Image.resize(BILINEAR)` for files and
items, torch's `interpolate` (antialiased when shrinking) for whole in-memory arrays, as before; what this module
adds is the geometry (`fitted_size`, `place`), pure and shared by both.
"""

from __future__ import annotations

import numpy
import torch
from PIL import Image
from torch import Tensor

RESIZE_MODES = ("squash", "crop", "pad")  # data.resize's values; the first is the default (what folders always did)
SQUASH = "squash"


def fitted_size(height: int, width: int, target_height: int, target_width: int, fit: str) -> tuple[int, int]:
    """(height, width) an image of `height` x `width` is resized to before `place` crops or pads it to the target:
    the target itself for squash; the aspect ratio kept, covering the target for crop and inside it for pad."""
    if fit not in RESIZE_MODES:
        raise ValueError(f"data.resize: {fit!r} is not one of {', '.join(RESIZE_MODES)}")
    if fit == SQUASH:
        return target_height, target_width
    scale = (max if fit == "crop" else min)(target_height / height, target_width / width)
    fitted = (max(1, round(height * scale)), max(1, round(width * scale)))
    if fit == "crop":  # never short of the target along either side, whatever the rounding
        return max(fitted[0], target_height), max(fitted[1], target_width)
    return min(fitted[0], target_height), min(fitted[1], target_width)


def place(pixels: Tensor | numpy.ndarray, target_height: int, target_width: int) -> Tensor | numpy.ndarray:
    """`pixels` (..., H, W) centred in a target_height x target_width frame: the overhang cut off (crop), the rest
    filled with zeros (pad), the extra pixel of an odd difference at the bottom or right. A tensor or numpy array
    of any dtype, returned as the same kind."""
    height, width = pixels.shape[-2:]
    if height > target_height or width > target_width:  # crop first: a side may be cut while the other is padded
        top, left = max(height - target_height, 0) // 2, max(width - target_width, 0) // 2
        pixels = pixels[..., top : top + min(height, target_height), left : left + min(width, target_width)]
        height, width = pixels.shape[-2:]
    if (height, width) == (target_height, target_width):
        return pixels
    frame_shape = (*pixels.shape[:-2], target_height, target_width)
    if isinstance(pixels, Tensor):
        frame = torch.zeros(frame_shape, dtype=pixels.dtype, device=pixels.device)
    else:
        frame = numpy.zeros(frame_shape, dtype=pixels.dtype)
    top, left = (target_height - height) // 2, (target_width - width) // 2
    frame[..., top : top + height, left : left + width] = pixels
    return frame


def fit_pil(image: Image.Image, height: int, width: int, fit: str) -> numpy.ndarray:
    """A Pillow image (already in the mode training reads, "L" or "RGB") as uint8 (C, height, width): resized with
    Pillow's BILINEAR as `fit` says, then cropped or padded. An image of the target size is not resampled."""
    resized_height, resized_width = fitted_size(image.height, image.width, height, width, fit)
    if image.size != (resized_width, resized_height):
        image = image.resize((resized_width, resized_height), Image.Resampling.BILINEAR)
    pixels = numpy.array(image, dtype=numpy.uint8)  # a copy: Pillow's own buffer is read-only
    pixels = pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)
    return numpy.ascontiguousarray(place(pixels, height, width))


def fit_pillow(pixels: Tensor, height: int, width: int, fit: str) -> Tensor:
    """One image as (C, H, W), uint8 or float32, brought to (C, height, width) with Pillow, channel by channel (as
    mode "L" for uint8, which gives the pixels an RGB resize gives; as "F" for floats, kept unrounded)."""
    resized_height, resized_width = fitted_size(int(pixels.shape[-2]), int(pixels.shape[-1]), height, width, fit)
    if tuple(pixels.shape[-2:]) != (resized_height, resized_width):
        mode, dtype = ("L", numpy.uint8) if pixels.dtype == torch.uint8 else ("F", numpy.float32)
        planes = [
            numpy.asarray(Image.fromarray(numpy.ascontiguousarray(plane, dtype=dtype), mode).resize(
                (resized_width, resized_height), Image.Resampling.BILINEAR))
            for plane in pixels.numpy()
        ]  # fmt: skip
        pixels = torch.from_numpy(numpy.stack(planes))
    return place(pixels, height, width).contiguous()


def fit_torch(images: Tensor, height: int, width: int, fit: str) -> Tensor:
    """uint8 (N, C, H, W) images brought to (height, width) with torch's bilinear `interpolate` (antialiased when
    shrinking, rounded back to uint8), then cropped or padded; images of the target size come back as they are."""
    resized = fitted_size(int(images.shape[-2]), int(images.shape[-1]), height, width, fit)
    if tuple(images.shape[-2:]) != resized:
        shrink = resized[0] < images.shape[-2] or resized[1] < images.shape[-1]
        images = torch.nn.functional.interpolate(
            images.float(), size=resized, mode="bilinear", align_corners=False, antialias=shrink
        )
        images = images.round_().clamp_(0, 255).to(torch.uint8)
    return place(images, height, width)


def describe(fit: str, height: int, width: int) -> str:
    """`fit` in words, for an export's preprocessing steps and the run's opening lines."""
    if fit == "crop":
        return f"resize keeping the aspect ratio so the shorter side covers {width}x{height}, then centre-crop"
    if fit == "pad":
        return f"resize keeping the aspect ratio so the longer side fits {width}x{height}, then pad with zeros, centred"
    return f"resize to {width}x{height} (aspect ratio not kept)"


def mixed_sizes_side(sizes: list[tuple[int, int]]) -> tuple[int | None, str]:
    """The square side images without `data.size` are resized to when they, (width, height) as read from a folder's
    headers or a user's items, come in several sizes: the median shorter side (so a typical image is shrunk along
    its longer side only), with the line that says so; (None, "") when they all have one size, which is then kept."""
    distinct = sorted(set(sizes))
    if len(distinct) <= 1:
        return None, ""
    side = int(numpy.median([min(width, height) for width, height in sizes]))
    widths, heights = [w for w, _ in distinct], [h for _, h in distinct]
    return side, (
        f"data.size: the images come in {len(distinct)} sizes ({min(widths)}-{max(widths)} x {min(heights)}-"
        f"{max(heights)} pixels); each is resized to {side}x{side}, the median shorter side (data.size=N chooses)"
    )
