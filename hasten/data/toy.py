"""Small generated image folders for the generalization benchmark (benchmarks/generalization.py): data the
default recipe was never tuned on, in the layout `data.name=imagefolder` reads (`ROOT/train/<class>/*.png`,
`ROOT/val/<class>/*.png`).

Three kinds, each drawn with Pillow from one seed, so a seed always writes the same bytes:

- `arrows`: greyscale arrows in 8 directions. A horizontal mirror turns "left" into "right" (and each
  diagonal into its mirror twin), so random horizontal flips destroy the labels: the case where a default of
  flips-on must not apply.
- `colours`: RGB shapes where the class is shape x colour (3 x 3). Brightness is drawn at random per image,
  so the grey level does not tell the colours apart: a model has to use the colour channels.
- `shapes`: greyscale circle / square / triangle / star / cross, filled or outlined, at random size,
  position and rotation; all five are mirror-symmetric as a set, so flips are harmless here.

Every image gets random position, size, rotation, stroke and Gaussian pixel noise, so a plain CNN learns
each set well above chance but not perfectly in one epoch. Drawn at 2x and downsampled (anti-aliased edges).
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy
from PIL import Image, ImageDraw

from hasten.errors import DataError

SUPERSAMPLE = 2  # drawn at this multiple of the final size, then downsampled: anti-aliased strokes

# class name -> direction of the arrow in degrees, counter-clockwise from "pointing right"
ARROW_ANGLES = {
    "0_right": 0,
    "1_up_right": 45,
    "2_up": 90,
    "3_up_left": 135,
    "4_left": 180,
    "5_down_left": 225,
    "6_down": 270,
    "7_down_right": 315,
}
# a horizontal mirror maps angle a to 180 - a: the class each class turns into under a flip
ARROW_MIRROR = {
    name: next(other for other, b in ARROW_ANGLES.items() if b == (180 - a) % 360) for name, a in ARROW_ANGLES.items()
}

COLOURS = {"red": (1.0, 0.15, 0.1), "green": (0.1, 0.85, 0.15), "blue": (0.15, 0.3, 1.0)}  # RGB direction
SHAPES = ("circle", "square", "triangle", "star", "cross")


def _polygon(kind: str, cx: float, cy: float, radius: float, angle: float) -> list[tuple[float, float]]:
    """Vertices of `kind` (square, triangle, star, cross) of circumradius `radius`, rotated by `angle` rad."""
    if kind == "square":
        points = [(math.cos(a), math.sin(a)) for a in (math.pi / 4 + k * math.pi / 2 for k in range(4))]
    elif kind == "triangle":
        points = [(math.cos(a), math.sin(a)) for a in (-math.pi / 2 + k * 2 * math.pi / 3 for k in range(3))]
    elif kind == "star":  # 5 points, inner radius 0.4
        points = [
            ((1.0 if k % 2 == 0 else 0.4) * math.cos(a), (1.0 if k % 2 == 0 else 0.4) * math.sin(a))
            for k, a in enumerate(-math.pi / 2 + k * math.pi / 5 for k in range(10))
        ]
    elif kind == "cross":  # a plus sign, arms 0.3 of the radius wide
        w = 0.3
        points = [(w, -1), (w, -w), (1, -w), (1, w), (w, w), (w, 1), (-w, 1), (-w, w), (-1, w), (-1, -w), (-w, -w)]
        points += [(-w, -1)]
    else:
        raise ValueError(f"unknown polygon kind {kind!r}")
    c, s = math.cos(angle), math.sin(angle)
    return [(cx + radius * (x * c - y * s), cy + radius * (x * s + y * c)) for x, y in points]


def _finish(canvas: Image.Image, size: int, noise: float, rng: numpy.random.Generator) -> Image.Image:
    """Downsample the supersampled drawing to `size` and add Gaussian pixel noise (std `noise`, 0-255 units)."""
    small = canvas.resize((size, size), Image.Resampling.BOX)
    pixels = numpy.asarray(small, dtype=numpy.float32)
    pixels = pixels + rng.normal(0.0, noise, pixels.shape)
    return Image.fromarray(numpy.clip(pixels, 0, 255).round().astype(numpy.uint8), small.mode)


def draw_arrow(angle_degrees: float, rng: numpy.random.Generator, size: int = 28) -> Image.Image:
    """A greyscale arrow pointing at `angle_degrees` (counter-clockwise from right, jittered by +-12 degrees),
    at a random position, length, stroke width and grey level, on a noisy dark background."""
    big = size * SUPERSAMPLE
    background = int(rng.integers(0, 60))
    canvas = Image.new("L", (big, big), background)
    draw = ImageDraw.Draw(canvas)
    angle = math.radians(angle_degrees + rng.uniform(-12, 12))
    length = rng.uniform(0.45, 0.8) * big
    cx, cy = (big / 2 + rng.uniform(-0.12, 0.12) * big for _ in range(2))
    dx, dy = math.cos(angle), -math.sin(angle)  # image y grows downwards
    tail = (cx - dx * length / 2, cy - dy * length / 2)
    tip = (cx + dx * length / 2, cy + dy * length / 2)
    ink = int(rng.integers(150, 256))
    stroke = 1 + int(rng.integers(2, 5))  # 3-5 px drawn at 2x: 1.5-2.5 px in the final image
    head = length * rng.uniform(0.3, 0.45)  # arrowhead length along the shaft
    spread = rng.uniform(0.35, 0.6)  # arrowhead half-width as a fraction of its length
    base = (tip[0] - dx * head, tip[1] - dy * head)
    draw.line([tail, base], fill=ink, width=stroke)
    wing = (-dy * head * spread, dx * head * spread)
    draw.polygon([tip, (base[0] + wing[0], base[1] + wing[1]), (base[0] - wing[0], base[1] - wing[1])], fill=ink)
    return _finish(canvas, size, rng.uniform(6, 18), rng)


def draw_shape(
    shape: str, rng: numpy.random.Generator, size: int = 28, colour: tuple[float, float, float] | None = None
) -> Image.Image:
    """`shape` (circle, square, triangle, star, cross) at a random size, position and rotation, filled or
    outlined. Greyscale at a random grey level; with `colour` (an RGB direction), RGB at a random brightness
    along it, on a random dark grey background."""
    big = size * SUPERSAMPLE
    if colour is None:
        mode, background, ink = "L", int(rng.integers(0, 70)), int(rng.integers(140, 256))
    else:
        grey = int(rng.integers(0, 70))
        brightness = rng.uniform(110, 255)  # random, so luma alone cannot tell red from green from blue
        mode, background = "RGB", (grey, grey, grey)
        ink = tuple(int(min(255, brightness * c + rng.uniform(-15, 15))) for c in colour)
    canvas = Image.new(mode, (big, big), background)
    draw = ImageDraw.Draw(canvas)
    radius = rng.uniform(0.2, 0.38) * big
    margin = radius + 1
    cx, cy = (rng.uniform(margin, big - margin) for _ in range(2))
    filled = rng.random() < 0.5
    stroke = 1 + int(rng.integers(2, 5))  # 3-5 px drawn at 2x: 1.5-2.5 px in the final image
    if shape == "circle":
        box = [cx - radius * 0.8, cy - radius * 0.8, cx + radius * 0.8, cy + radius * 0.8]  # same area as others
        if filled:
            draw.ellipse(box, fill=ink)
        else:
            draw.ellipse(box, outline=ink, width=stroke)
    else:
        points = _polygon(shape, cx, cy, radius, rng.uniform(0, 2 * math.pi))
        if filled:
            draw.polygon(points, fill=ink)
        else:
            draw.line([*points, points[0], points[1]], fill=ink, width=stroke, joint="curve")
    return _finish(canvas, size, rng.uniform(5, 15), rng)


def _write(
    root: str | Path,
    classes: dict[str, Callable[[numpy.random.Generator], Image.Image]],
    train_per_class: int,
    val_per_class: int,
    seed: int,
) -> dict[str, int]:
    """Draw each class's images (one generator per class and split, derived from `seed`, so a class's
    images do not depend on the other classes) into a staging folder, then move train/ and val/ into
    `root`. An existing train/ or val/ under `root` is an error: nothing the user had is overwritten."""
    root = Path(root).expanduser()
    existing = [str(root / s) for s in ("train", "val") if (root / s).exists()]
    if existing:
        raise DataError(f"{' and '.join(existing)} already exist(s); remove it or choose another folder")
    staging = root / f".toy-{os.getpid()}"
    counts = {"train": 0, "val": 0}
    try:
        for split_index, (split, count) in enumerate((("train", train_per_class), ("val", val_per_class))):
            for class_index, (name, draw) in enumerate(classes.items()):
                rng = numpy.random.default_rng([seed, split_index, class_index])
                folder = staging / split / name
                folder.mkdir(parents=True)
                for i in range(count):
                    draw(rng).save(folder / f"{i:05d}.png")
                counts[split] += count
        for split in ("train", "val"):
            (staging / split).rename(root / split)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return counts


def arrows(
    root: str | Path, seed: int = 0, train_per_class: int = 150, val_per_class: int = 50, size: int = 28
) -> dict[str, int]:
    """The mirror-sensitive set: greyscale arrows in 8 directions (`ARROW_ANGLES`); a horizontal flip turns a
    class into `ARROW_MIRROR[class]`. Returns the image count per split (default 1,200 train, 400 val)."""
    return _write(
        root,
        {name: (lambda rng, a=angle: draw_arrow(a, rng, size)) for name, angle in ARROW_ANGLES.items()},
        train_per_class,
        val_per_class,
        seed,
    )


def colours(
    root: str | Path, seed: int = 0, train_per_class: int = 120, val_per_class: int = 40, size: int = 32
) -> dict[str, int]:
    """The colour set: RGB circles, squares and triangles in red, green and blue; the class is shape x colour
    (9 classes, e.g. `red_circle`), at random brightness. Returns the image count per split."""
    classes = {
        f"{colour}_{shape}": (lambda rng, s=shape, c=rgb: draw_shape(s, rng, size, colour=c))
        for colour, rgb in COLOURS.items()
        for shape in ("circle", "square", "triangle")
    }
    return _write(root, classes, train_per_class, val_per_class, seed)


def shapes(
    root: str | Path, seed: int = 0, train_per_class: int = 200, val_per_class: int = 60, size: int = 28
) -> dict[str, int]:
    """Simple greyscale shapes: circle, square, triangle, star, cross (`SHAPES`) at random size, position
    and rotation, filled or outlined. Returns the image count per split (default 1,000 train, 300 val)."""
    classes = {f"{i}_{shape}": (lambda rng, s=shape: draw_shape(s, rng, size)) for i, shape in enumerate(SHAPES)}
    return _write(root, classes, train_per_class, val_per_class, seed)


KINDS: dict[str, Callable[..., dict[str, int]]] = {"arrows": arrows, "colours": colours, "shapes": shapes}


def make_toy(kind: str, root: str | Path, seed: int = 0, **sizes: int) -> dict[str, int]:
    """Write the generated set `kind` (arrows, colours, shapes) under `root`; DataError for an unknown kind."""
    if kind not in KINDS:
        raise DataError(f"toy data set {kind!r}: expected one of {', '.join(KINDS)}")
    return KINDS[kind](root, seed=seed, **sizes)
