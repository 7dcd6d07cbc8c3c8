"""What a trained model expects of an image, recorded so any image can be brought to it as training did.

Training sees uint8 images of one size and channel count (`data.size`, `data.rgb`, or as stored), scaled to
[0, 1] and normalised with the per-channel mean and std of the training images (`loader.channel_stats`).
`Preprocessing` holds those facts; it is written into summary.json and every export's metadata, and turns
an image file of any size and mode into the model's input the same way:

1. Pillow's `convert("L")` (ITU-R 601-2 luma, as `transforms.set_channels` uses) or `convert("RGB")` (grey
   repeated, alpha dropped), or for a model trained on arrays of 2 or 4 channels `convert("LA")` or
   `convert("RGBA")` (an image without alpha gets an opaque one);
2. when the size differs, brought to (height, width) as `data.resize` said (`fit`: squash, crop or pad,
   hasten/data/fitting.py) with a bilinear resize: torch's `interpolate` (antialiased when shrinking) as
   `transforms.resize_images` does for in-memory arrays, or Pillow's BILINEAR as the image folder reader and a
   user's list or Dataset of images of several sizes do;
3. uint8 (C, H, W) -> float / 255 -> (x - mean) / std per channel.
"""

from __future__ import annotations

import contextlib
import math
import sys
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy
import torch
from PIL import Image, ImageOps
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from torch import Tensor

from hasten.data.fitting import RESIZE_MODES, fit_pil, fit_pillow, fit_torch
from hasten.data.fitting import describe as describe_fit
from hasten.errors import DataError, schema_problems
from hasten.text import printable

RESIZERS = ("torch", "pillow")  # which bilinear resize training used (module docstring, step 2)
# the largest image side hasten trains on or converts images to (data.size, a run's recorded input size): a
# 2048 x 2048 RGB image is 50 MB as floats; a size read from a file beyond this is refused before any allocation
MAX_IMAGE_SIDE = 2048
PREDICT_BYTES = 1 << 28  # float bytes of images per forward pass in predict, at most


# what Pillow raises for an undecodable, truncated or hostile file, depending on the format plugin (the decompression
# bomb too, where it is not open_image's DataError): every reader of image files says it as a DataError naming the file
UNREADABLE = (OSError, ValueError, SyntaxError, Image.DecompressionBombError)


@contextlib.contextmanager
def open_image(path: str | Path) -> Iterator[Image.Image]:
    """`Image.open(path)`, where an image larger than Pillow's decompression-bomb limit (`Image.MAX_IMAGE_PIXELS`,
    read from the header before any pixel is decoded) is a DataError naming the file, not a warning and gigabytes
    of pixels."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            image = Image.open(path)
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
            raise DataError(
                f"{printable(str(path))}: refusing to decode it: {str(error).rstrip('.')} (Pillow's decompression-bomb "
                f"limit, {Image.MAX_IMAGE_PIXELS:,} pixels); resize it first"
            ) from None
    with image:
        yield image


EXIF_ORIENTATION = 0x0112  # the tag a camera or phone records how its photo is to be turned with (1: as stored)
TURNED = (5, 6, 7, 8)  # orientations that turn the image a quarter: its stored width is its height as shown


def orientation(image: Image.Image) -> int:
    """The image's EXIF orientation (1 where it has none or an invalid one): read from the header, no pixels."""
    try:
        value = image.getexif().get(EXIF_ORIENTATION, 1)
    except Exception:  # noqa: BLE001 - EXIF a camera wrote badly: the image as stored
        return 1
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


def shown_size(image: Image.Image) -> tuple[int, int]:
    """(width, height) as the image is shown, its EXIF orientation applied: what `upright` gives."""
    width, height = image.size
    return (height, width) if orientation(image) in TURNED else (width, height)


def upright(image: Image.Image) -> Image.Image:
    """`image` the way viewers show it: a phone's portrait photo is stored landscape with an EXIF orientation that
    says to turn it, and without this a folder of photos trains on some of them sideways or mirrored."""
    if orientation(image) == 1:
        return image
    return ImageOps.exif_transpose(image)


def eight_bit(image: Image.Image) -> Image.Image:
    """`image` with pixels of more than 8 bits brought to 8 by their type's range, where Pillow's `convert` clips:
    every value of a 16-bit grey PNG, TIFF or PGM over 255 became 255 (the image white) and a float image in 0..1
    became 0 (black). 16-bit pixels ("I;16" and its byte orders, and "I", as Pillow reads 16-bit files on some
    versions and 32-bit integer TIFFs) are divided by 257 (65,535 -> 255), clipped to 0..255; float pixels ("F") are
    multiplied by 255 where all of the image lies in 0..1, else taken as 0..255 and clipped. Other modes are left
    as they are."""
    if image.mode not in ("I", "F") and not image.mode.startswith("I;16"):
        return image
    values = numpy.asarray(image, dtype=numpy.float64)
    if image.mode == "F":
        values = numpy.nan_to_num(values, nan=0.0, posinf=255.0, neginf=0.0)
        scale = 255.0 if values.size and values.min() >= 0 and values.max() <= 1 else 1.0
    else:
        scale = 1 / 257
    return Image.fromarray(numpy.clip(numpy.rint(values * scale), 0, 255).astype(numpy.uint8), "L")


UNITS = ("pixels", "fraction", "own")  # what a run's training images were in (units_of)
# Pillow's modes by channel count: what an image file is converted to for a model trained on such images
MODES = {"L": 1, "LA": 2, "RGB": 3, "RGBA": 4}
MODE_OF = {channels: mode for mode, channels in MODES.items()}


class PreprocessingRecord(BaseModel):
    """The preprocessing as summary.json and export metadata store it (`Preprocessing.to_dict`), checked before
    use: sides within MAX_IMAGE_SIDE, one finite mean and one finite, positive std per channel."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    mode: Literal["L", "LA", "RGB", "RGBA"]
    height: Annotated[int, Field(ge=1, le=MAX_IMAGE_SIDE)]
    width: Annotated[int, Field(ge=1, le=MAX_IMAGE_SIDE)]
    mean: list[float]
    std: list[Annotated[float, Field(gt=0)]]
    resize: Literal[RESIZERS] = "torch"
    fit: Literal[RESIZE_MODES] = "squash"  # data.resize; a record from before it was recorded: squash, as then
    units: Literal[UNITS] = "pixels"  # what the images trained on were in (units_of); a record from before: pixels
    value_range: tuple[float, float] | None = None  # float training images' smallest and largest value

    @model_validator(mode="after")
    def _one_per_channel(self) -> PreprocessingRecord:
        channels = MODES[self.mode]
        if len(self.mean) != channels or len(self.std) != channels:
            raise ValueError(f"mean and std: one value per channel of mode {self.mode} ({channels}), got "
                             f"{len(self.mean)} and {len(self.std)}")  # fmt: skip
        return self


@dataclass(frozen=True)
class Preprocessing:
    """The input a model was trained on: Pillow mode, size, normalisation, and the resize training used (which
    library's bilinear resize, and how the aspect ratio is treated: `fit`, the run's data.resize)."""

    mode: str  # Pillow's: "L" (1 channel), "LA" (2: grey and alpha), "RGB" (3) or "RGBA" (4)
    height: int
    width: int
    mean: tuple[float, ...]  # per channel, in [0, 1] units
    std: tuple[float, ...]
    resize: str = "torch"  # "torch": interpolate, antialiased when shrinking; "pillow": Image.resize BILINEAR
    fit: str = "squash"  # data.resize: squash, crop or pad (hasten/data/fitting.py)
    units: str = "pixels"  # the training images': pixels 0..255, a fraction 0..1 of them, or the user's own (units_of)
    value_range: tuple[float, float] | None = None  # float training images' smallest and largest value

    @property
    def channels(self) -> int:
        return MODES[self.mode]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"channels": self.channels, "steps": self.describe()}

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "metadata") -> Preprocessing:
        """The preprocessing saved by `to_dict`, checked by PreprocessingRecord; ValueError naming `source` and the
        field when it does not fit (a size out of range, a std of 0, a count of means that is not the channels')."""
        try:
            record = PreprocessingRecord.model_validate(raw)
        except ValidationError as error:
            raise ValueError(f"{source}: {schema_problems(error, 'preprocessing.')}") from None
        return cls(record.mode, record.height, record.width, tuple(record.mean), tuple(record.std), record.resize,
                   record.fit, record.units, record.value_range)  # fmt: skip

    def describe(self) -> str:
        """The exact steps, in words, for code that is not hasten (an ONNX runtime, another language)."""
        resize = (
            "torch.nn.functional.interpolate(mode='bilinear', align_corners=False, antialias=True when shrinking), "
            "rounded back to uint8"
            if self.resize == "torch"
            else "PIL.Image.resize(..., Image.Resampling.BILINEAR)"
        )
        normalised = f"x = (x - mean) / std per channel with mean={list(self.mean)} std={list(self.std)}"
        if self.units == "own":
            low, high = self.value_range or (math.nan, math.nan)
            return (
                f"float32 images (N, {self.channels}, {self.height}, {self.width}) as the user's code made the "
                f"training images (values {low:g} to {high:g}; no image file maps to them); x = images / 255; "
                f"{normalised}"
            )
        pixels = f"uint8 array (N, {self.channels}, {self.height}, {self.width})"
        scaled = (
            "x = pixels / 255 / 255 (the training images were floats in [0, 1])"
            if self.fraction
            else "x = pixels / 255"
        )
        return (
            f"Pillow convert('{self.mode}'); if not {self.width}x{self.height} pixels, "
            f"{describe_fit(self.fit, self.height, self.width)}, bilinear ({resize}); {pixels}; {scaled}; {normalised}"
        )

    @property
    def fraction(self) -> bool:
        """Whether the training images were floats in [0, 1]: a file's pixels / 255 are what it saw."""
        return self.units == "fraction"

    def in_units(self, images: Tensor) -> Tensor:
        """A batch (uint8 pixels, or floats as the user gives them) in the units training's images were in:
        pixels / 255 as float where those were floats in [0, 1]; DataError for pixels where the user's code
        made them (normalised floats: no pixel maps to them)."""
        if images.is_floating_point():
            self.warn_scale(images)
            return images
        if self.units == "pixels":
            return images
        if self.fraction:
            return images.float().div_(255)
        low, high = self.value_range or (math.nan, math.nan)
        raise DataError(
            f"images: this model trained on float images of values {low:.3g} to {high:.3g}, as your code made them "
            "(normalised, or on a scale other than 0..1 and 0..255): image files and uint8 pixels cannot be brought "
            "to them; give float images (N, C, H, W) made the same way"
        )

    def warn_scale(self, images: Tensor) -> None:
        """Print scale_warning's line, if any (loud: answers for images on the wrong scale look like answers)."""
        said = self.scale_warning(images)
        if said:
            print(f"warning: {said}", file=sys.stderr)

    def scale_warning(self, images: Tensor) -> str | None:
        """What is wrong with float images given on another scale than training's, or None: floats in [0, 1] to a
        model trained on pixels 0..255 (every image then looks black to it), floats past 1.5 (pixels) to one trained
        on fractions in [0, 1], and floats beyond twice the span of the user's own training range."""
        if not images.numel():
            return None
        low, high = float(images.min()), float(images.max())
        if self.units == "pixels" and high <= 1.0 and high > 0:
            return (f"images are floats in {low:.3g}..{high:.3g}, but this model trained on pixels 0..255: multiply "
                    "them by 255 (or give uint8 pixels), or every image reads as nearly black")  # fmt: skip
        if self.units == "fraction" and high > 1.5:
            return (f"images are floats up to {high:.3g}, but this model trained on floats in [0, 1]: divide pixels "
                    "by 255 (or give them as uint8, which are divided for you)")  # fmt: skip
        if self.units == "own" and self.value_range is not None:
            lo, hi = self.value_range
            span = max(hi - lo, 1e-6)
            if high > hi + span or low < lo - span:
                return (f"images hold values {low:.3g}..{high:.3g}, far outside the {lo:.3g}..{hi:.3g} the model "
                        "trained on: make them as the training images were made")  # fmt: skip
        return None

    def image(self, image: Image.Image) -> Tensor:
        """A Pillow image as the uint8 (C, H, W) tensor training would have seen (steps 1 and 2)."""
        converted = eight_bit(upright(image)).convert(self.mode)
        if self.resize == "pillow":
            return torch.from_numpy(fit_pil(converted, self.height, self.width, self.fit))
        pixels = numpy.array(converted, dtype=numpy.uint8)  # a copy: torch wants a writable array
        tensor = torch.from_numpy(pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1).copy())
        return fit_torch(tensor[None], self.height, self.width, self.fit)[0]

    def read(self, path: str | Path) -> Tensor:
        """An image file as uint8 (C, H, W); DataError naming the file when it is not an image."""
        try:
            with open_image(path) as image:
                return self.image(image)
        except UNREADABLE as error:
            raise DataError(
                f"{printable(str(path))}: cannot read as an image ({type(error).__name__}: {error})"
            ) from None

    def batch(self, images: Sequence[Any] | Tensor | numpy.ndarray) -> Tensor:
        """uint8 (N, C, H, W) from image paths, Pillow images, or uint8 arrays/tensors in the model's mode, in any
        layout training takes (see `_array`); arrays of another size are resized. Float arrays come back as
        float32, at the model's size only (`in_units` says what they are taken as)."""
        if isinstance(images, (Tensor, numpy.ndarray)):
            return self._array(images)
        if isinstance(images, (str, Path, Image.Image)):
            images = [images]
        items = []
        for n, item in enumerate(images):
            if isinstance(item, (str, Path)):
                items.append(self.read(item))
            elif isinstance(item, Image.Image):
                items.append(self.image(item))
            else:
                pixels = self._array(item)
                if len(pixels) != 1:
                    raise DataError(f"images[{n}]: {tuple(torch.as_tensor(item).shape)} is {len(pixels)} images, "
                                    "where a list holds one image per item")  # fmt: skip
                items.append(pixels[0])
        if not items:
            raise DataError("no images to predict on")
        return torch.stack(items)

    def _array(self, array: Tensor | numpy.ndarray) -> Tensor:
        """uint8 pixels in the layouts training takes: (N, C, H, W) or (N, H, W, C), one image (C, H, W) or
        (H, W, C), and for grey images (N, H, W) or one (H, W). A grey model given (H, W, C) with C a colour image's
        channel count (2 to 4) and W not its width is refused: one colour image and C-pixel-wide grey images read
        alike, and taking it for either would answer something the user did not ask."""
        tensor = torch.as_tensor(array)
        given = tuple(tensor.shape)
        if (
            tensor.dim() == 3
            and self.channels == 1
            and given[0] != 1
            and given[-1] in (2, 3, 4)
            and given[-1] != self.width
        ):
            raise DataError(
                f"images: {given} reads as one image of {given[0]} x {given[1]} pixels in {given[2]} channels, or "
                f"as {given[0]} grey images of {given[1]} x {given[2]} pixels; this model takes grey images (mode L, "
                f"{self.height} x {self.width}): give one image as (H, W), several as (N, H, W) or (N, 1, H, W)"
            )
        if tensor.dim() == 2 and self.channels == 1:  # one grey image
            tensor = tensor[None, None]
        elif tensor.dim() == 3 and tensor.shape[0] != self.channels and tensor.shape[-1] == self.channels:
            tensor = tensor.permute(2, 0, 1)[None]  # one image, channels last
        elif tensor.dim() == 3 and self.channels == 1 and tensor.shape[0] != 1:
            tensor = tensor[:, None]  # grey images (N, H, W), as training takes them
        elif tensor.dim() == 3:
            tensor = tensor[None]
        elif tensor.dim() == 4 and tensor.shape[1] != self.channels and tensor.shape[-1] == self.channels:
            tensor = tensor.permute(0, 3, 1, 2)  # channels last
        floats = tensor.is_floating_point()
        if not (tensor.dtype == torch.uint8 or floats) or tensor.dim() != 4 or tensor.shape[1] != self.channels:
            c = self.channels
            shapes = (
                "(N, H, W), (N, 1, H, W) or one image (H, W)"
                if c == 1
                else f"(N, {c}, H, W), (N, H, W, {c}) or one image ({c}, H, W) or (H, W, {c})"
            )
            raise DataError(
                f"images: expected uint8 pixels {shapes} (mode {self.mode}) or file paths, got {tensor.dtype} {given}"
            )
        if floats:
            check_finite(tensor, "images", "predicting")
        if tuple(tensor.shape[2:]) != (self.height, self.width):
            if floats:  # resizing rounds to uint8 pixels, which float images are not
                raise DataError(
                    f"images: float images of {tuple(tensor.shape[2:])} pixels where the model takes "
                    f"{self.height} x {self.width}: give them at that size, or as uint8 pixels, which are resized"
                )
            tensor = self.fitted(tensor.cpu())
        return tensor.float() if floats else tensor

    def fitted(self, images: Tensor) -> Tensor:
        """uint8 (N, C, H, W) brought to the model's size as training brought its images (step 2): the same
        library's resize, the same fit."""
        if self.resize == "pillow":
            return torch.stack([fit_pillow(image, self.height, self.width, self.fit) for image in images])
        return fit_torch(images, self.height, self.width, self.fit)

    def normalise(self, images: Tensor) -> Tensor:
        """uint8 (N, C, H, W) -> float32, scaled to [0, 1] and normalised per channel (step 3); float images are
        divided by 255 the same way (their mean and std were measured in those units)."""
        mean = torch.tensor(self.mean, device=images.device).view(1, -1, 1, 1)
        std = torch.tensor(self.std, device=images.device).view(1, -1, 1, 1)
        return images.float().div(255).sub_(mean).div_(std)  # div: a new tensor, so floats given are left as they are


def check_finite(pixels: Tensor, where: str, use: str) -> None:
    """DataError naming `where` when float pixels (N, ...) hold NaN or infinity, which would surface as a diverged
    loss in training and as a prediction of probability NaN; `use`: what they are to be replaced before."""
    finite = torch.isfinite(pixels)
    if not bool(finite.all()):
        bad = ~finite
        kinds = [name for name, hit in (("NaN", torch.isnan(pixels).any()), ("inf", torch.isinf(pixels).any())) if hit]
        first = int(bad.reshape(len(pixels), -1).any(1).nonzero()[0]) if pixels.dim() > 1 and len(pixels) else 0
        raise DataError(
            f"{where}: {int(bad.sum()):,} pixel value(s) are {' and '.join(kinds)} (first in image {first}); "
            f"replace them (e.g. numpy.nan_to_num) before {use}"
        )


def units_of(value_range: tuple[float, float] | None) -> str:
    """What a run's training images were in, from the smallest and largest value of its float images (None: uint8
    pixels): "pixels" (0..255, reaching past 127 as photos do), "fraction" (floats in [0, 1], ToTensor's and many
    users' habit: a file's pixels / 255), or "own" (anything else: normalised by the user's code, or another scale
    such as scikit-learn's digits' 0..16, which no file's pixels map to: refused rather than guessed)."""
    if value_range is None:
        return "pixels"
    low, high = value_range
    if low >= 0 and high <= 1:
        return "fraction"
    return "pixels" if low >= 0 and 127 < high <= 255 else "own"


def preprocessing_for(
    image_shape: Sequence[int],
    mean: Tensor,
    std: Tensor,
    *,
    resizer: str = "torch",
    fit: str = "squash",
    value_range: tuple[float, float] | None = None,
) -> Preprocessing:
    """The preprocessing of a run whose images are `image_shape` (C, H, W), normalised with `mean`/`std`;
    `resizer`: the library training resized with (`resizer_of` its data), `fit`: its data.resize, `value_range`:
    its float images' smallest and largest value (None: uint8 pixels)."""
    channels, height, width = (int(v) for v in image_shape)
    if channels not in MODE_OF:
        raise DataError(f"images with {channels} channels: no image file holds them (1 to 4: {', '.join(MODES)})")
    return Preprocessing(
        mode=MODE_OF[channels],
        height=height,
        width=width,
        mean=tuple(float(v) for v in mean.flatten().cpu()),
        std=tuple(float(v) for v in std.flatten().cpu()),
        resize=resizer,
        fit=fit,
        units=units_of(value_range),
        value_range=value_range,
    )


def resizer_of(data: Any) -> str:
    """Which library's resize brought a run's data to its size: Pillow for an image folder (streamed or decoded
    into memory) and for a user's list or Dataset whose images it resized (their `resizer`), else torch (in-memory
    arrays, the registry's datasets)."""
    return getattr(data, "resizer", None) or ("pillow" if getattr(data, "root", None) is not None else "torch")


def held_out_split(data: Any) -> str:
    """The split a run's test_* metrics are measured on: an image folder's (streamed or decoded into memory) val/
    or test/, the first found; "test" for everything else."""
    folder = getattr(data, "root", None)
    return next((s for s in ("val", "test") if folder is not None and (Path(folder) / s).is_dir()), "test")


def dataset_summary(data: Any, train_loader: Any, test_loader: Any, fit: str = "squash") -> dict[str, Any]:
    """What summary.json records of a run's data, so its folder alone says what a later user needs: the class
    names (label i is classes[i]), the split sizes, the split each accuracy was measured on, the preprocessing
    (`fit`: the run's data.resize)."""
    test_split = held_out_split(data)
    return {
        "classes": list(data.classes),
        "dataset": {
            "name": getattr(data, "name", None),
            "train_size": train_loader.num_samples,
            "test_size": test_loader.num_samples,
            "test_split": test_split,
        },
        # keyed by split, not by metric: scripts find the metrics themselves once in summary.json
        "accuracy_measured_on": {
            "test": f"{test_split} split, {test_loader.num_samples} images, the evaluated weights (test_accuracy, "
            "best_test_accuracy: its best epoch, test_loss, time_to_accuracy)",
            "train": "training split, running during the last epoch: augmented, live weights (train_accuracy, "
            "train_loss)",
        },
        # images of more than 4 channels have no Pillow mode to read files into: no preprocessing to record
        "preprocessing": preprocessing_for(
            data.image_shape,
            train_loader.mean,
            train_loader.std,
            resizer=resizer_of(data),
            fit=fit,
            value_range=getattr(data, "value_range", None),
        ).to_dict()
        if data.image_shape[0] in MODE_OF
        else None,
    }
