"""Procedural drawings for the generated sets (benchmarks/datasets.py): the first benchmark's arrows and shapes,
textures (stripes, checkers, dots, rings, crosshatch, spectral noise) and scenes (a horizon, clutter, one object).

Every function draws one image from a passed-in `numpy.random.Generator`, so a seed always gives the same image.
"""

from __future__ import annotations

import colorsys
import math

import numpy
from PIL import Image, ImageDraw


def noisy_image(pixels: numpy.ndarray, rng: numpy.random.Generator, noise: tuple[float, float]) -> Image.Image:
    """`pixels` (0-255 floats, H x W or H x W x 3) plus Gaussian noise of a std drawn in `noise`, as uint8."""
    pixels = pixels + rng.normal(0.0, rng.uniform(*noise), pixels.shape)
    return Image.fromarray(numpy.clip(pixels, 0, 255).round().astype(numpy.uint8))


# ---------------------------------------------------------------------------------------------------------------
# The first benchmark's arrows and shapes, as they were: same draws, same bytes.

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


# ---------------------------------------------------------------------------------------------------------------
# Textures

TEXTURE_SS = 2  # textures are evaluated on a grid this many times finer than the pixels, then box-filtered


def _grid(size: int) -> tuple[numpy.ndarray, numpy.ndarray]:
    """(x, y) of a supersampled `size` x `size` image, in output pixels from its centre (y grows downwards)."""
    n = size * TEXTURE_SS
    y, x = (numpy.mgrid[0:n, 0:n].astype(numpy.float64) + 0.5) / TEXTURE_SS - size / 2
    return x, y


def _downsample(values: numpy.ndarray, size: int) -> numpy.ndarray:
    return values.reshape(size, TEXTURE_SS, size, TEXTURE_SS).mean((1, 3))


def _waves(u: numpy.ndarray, period: float, rng: numpy.random.Generator) -> numpy.ndarray:
    """A periodic profile along `u` in [0, 1]: from a sine to a near-square wave, random phase."""
    sharpness = rng.uniform(0.8, 6.0)
    return 0.5 + 0.5 * numpy.tanh(sharpness * numpy.sin(2 * math.pi * u / period + rng.uniform(0, 2 * math.pi)))


def _rotated(x: numpy.ndarray, y: numpy.ndarray, degrees: float) -> tuple[numpy.ndarray, numpy.ndarray]:
    """Coordinates along and across the direction `degrees` (counter-clockwise from the x axis, image up)."""
    a = math.radians(degrees)
    return x * math.cos(a) - y * math.sin(a), x * math.sin(a) + y * math.cos(a)


def _spectral_noise(rng: numpy.random.Generator, n: int, low: float, high: float, power: float) -> numpy.ndarray:
    """Isotropic Gaussian noise on an n x n grid with amplitude ~ f**-power between `low` and `high` cycles
    per output pixel (0 elsewhere), scaled to unit std."""
    f = numpy.hypot(*numpy.meshgrid(numpy.fft.fftfreq(n), numpy.fft.fftfreq(n))) * TEXTURE_SS
    amplitude = numpy.where((f >= low) & (f <= high), numpy.maximum(f, 1e-3) ** -power, 0.0)
    field = numpy.fft.ifft2(numpy.fft.fft2(rng.normal(size=(n, n))) * amplitude).real
    return field / (field.std() + 1e-9)


def texture_pattern(
    kind: str, rng: numpy.random.Generator, size: int = 32, angle: float | None = None
) -> numpy.ndarray:
    """A `size` x `size` pattern in [0, 1] of `kind`: stripes (lines along `angle` degrees counter-clockwise from
    horizontal, jittered by +-12; random when None), checkers, dots, rings, crosshatch, blobs (low-pass noise,
    thresholded softly) or grain (band-pass noise); periods 3.5-9 px, lattices at a random rotation, stripes
    slightly wavy."""
    x, y = _grid(size)
    period = rng.uniform(3.5, 9.0)
    turn = rng.uniform(0, 180) if angle is None else angle + rng.uniform(-12, 12)
    u, v = _rotated(x, y, turn)
    if kind == "stripes":
        wobble = rng.uniform(0, 1.2) * numpy.sin(2 * math.pi * u / rng.uniform(14, 40) + rng.uniform(0, 6.3))
        pattern = _waves(v + wobble, period, rng)  # lines along `turn`
    elif kind == "checkers":
        phase = rng.uniform(0, 2 * math.pi, 2)
        product = numpy.sin(math.pi * u / period + phase[0]) * numpy.sin(math.pi * v / period + phase[1])
        pattern = 0.5 + 0.5 * numpy.tanh(rng.uniform(2, 8) * product)
    elif kind == "dots":
        spacing, radius = period * 1.2, period * 1.2 * rng.uniform(0.18, 0.35)
        du = (u + rng.uniform(0, spacing)) % spacing - spacing / 2
        dv = (v + rng.uniform(0, spacing)) % spacing - spacing / 2
        pattern = 0.5 + 0.5 * numpy.tanh(3.0 * (radius - numpy.hypot(du, dv)))
    elif kind == "rings":
        cx, cy = rng.uniform(-0.4, 0.4, 2) * size
        pattern = _waves(numpy.hypot(x - cx, y - cy), period, rng)
    elif kind == "crosshatch":
        width = rng.uniform(0.12, 0.3) * period
        lines = [numpy.abs((w + rng.uniform(0, period)) % period - period / 2) for w in (u, v)]
        pattern = numpy.maximum(*(0.5 + 0.5 * numpy.tanh(2.0 * (width - (period / 2 - d))) for d in lines))
    elif kind == "blobs":
        field = _spectral_noise(rng, size * TEXTURE_SS, 0.03, 0.12, 1.5)
        pattern = 0.5 + 0.5 * numpy.tanh(rng.uniform(1.5, 5.0) * (field - rng.uniform(-0.4, 0.4)))
    elif kind == "grain":
        field = _spectral_noise(rng, size * TEXTURE_SS, 0.18, 0.5, 0.0)
        pattern = 0.5 + 0.5 * numpy.tanh(rng.uniform(0.8, 2.0) * field)
    else:
        raise ValueError(f"unknown texture kind {kind!r}")
    return _downsample(pattern, size)


# class -> (kind, stripe angle in degrees counter-clockwise; None: any)
GREY_TEXTURES = {
    "0_stripes-0": ("stripes", 0.0),
    "1_stripes-45": ("stripes", 45.0),
    "2_stripes-90": ("stripes", 90.0),
    "3_stripes-135": ("stripes", 135.0),
    "4_checkers": ("checkers", None),
    "5_dots": ("dots", None),
    "6_rings": ("rings", None),
    "7_crosshatch": ("crosshatch", None),
    "8_blobs": ("blobs", None),
    "9_grain": ("grain", None),
}
TEXTURE_MIRROR = {"1_stripes-45": "3_stripes-135", "3_stripes-135": "1_stripes-45"}  # a flip swaps the diagonals


def draw_grey_texture(kind: str, angle: float | None, rng: numpy.random.Generator, size: int = 32) -> Image.Image:
    """A greyscale texture: the pattern at a random contrast (50-200 grey levels) and mean, under a random linear
    lighting gradient, with Gaussian noise of std 5-30."""
    pattern = texture_pattern(kind, rng, size, angle if kind == "stripes" else None)
    contrast = rng.uniform(50, 200)
    mean = rng.uniform(contrast / 2, 255 - contrast / 2)
    x, y = _grid(size)
    light = _downsample(x * rng.normal(0, 1.2) + y * rng.normal(0, 1.2), size)
    pixels = mean + contrast * (pattern - 0.5) + light + rng.normal(0, rng.uniform(5, 30), (size, size))
    return Image.fromarray(numpy.clip(pixels, 0, 255).round().astype(numpy.uint8), "L")


COLOUR_PATTERNS = ("stripes", "checkers", "dots", "rings", "blobs")
PAIRINGS = {"complementary": (155.0, 205.0), "analogous": (30.0, 60.0)}  # hue difference, degrees


def draw_colour_texture(kind: str, pairing: str, rng: numpy.random.Generator, size: int = 32) -> Image.Image:
    """The pattern in two colours whose hues differ by PAIRINGS[pairing] (the base hue, saturations 0.45-1 and
    values 0.35-1 random, so no one colour tells a class), with Gaussian noise of std 5-25."""
    pattern = texture_pattern(kind, rng, size)[..., None]
    low, high = PAIRINGS[pairing]
    hue = rng.uniform(0, 1)
    second = (hue + rng.choice([-1, 1]) * rng.uniform(low, high) / 360) % 1
    pair = [
        numpy.array(colorsys.hsv_to_rgb(h, rng.uniform(0.45, 1), rng.uniform(0.35, 1))) * 255 for h in (hue, second)
    ]
    pixels = pair[0] + (pair[1] - pair[0]) * pattern + rng.normal(0, rng.uniform(5, 25), (size, size, 3))
    return Image.fromarray(numpy.clip(pixels, 0, 255).round().astype(numpy.uint8))


# ---------------------------------------------------------------------------------------------------------------
# Scenes

SCENE_OBJECTS = ("house", "tree", "pine", "car", "person", "flower", "boat", "bird", "mushroom", "lamp")


def _hsv(rng: numpy.random.Generator, hue: tuple[float, float], sat: tuple[float, float], val: tuple[float, float]):
    """An RGB tuple (0-255) from a hue, saturation and value drawn in the given ranges (hue in turns, wrapping)."""
    r, g, b = colorsys.hsv_to_rgb(rng.uniform(*hue) % 1, rng.uniform(*sat), rng.uniform(*val))
    return int(255 * r), int(255 * g), int(255 * b)


def _random_colour(rng: numpy.random.Generator) -> tuple[int, int, int]:
    return _hsv(rng, (0, 1), (0.3, 1), (0.25, 1))


def _draw_object(draw: ImageDraw.ImageDraw, kind: str, x: float, base: float, h: float, facing: int, rng) -> None:
    """`kind` standing on (x, base) (its foot, canvas pixels), `h` pixels high, facing left (-1) or right (1),
    in random colours."""
    body, other, dark = _random_colour(rng), _random_colour(rng), _hsv(rng, (0, 1), (0, 0.5), (0.05, 0.3))

    def box(x0, y0, x1, y1):  # in units of h, x mirrored by facing
        xs = sorted((x + facing * x0 * h, x + facing * x1 * h))
        return [xs[0], base - y1 * h, xs[1], base - y0 * h]

    def poly(points):
        return [(x + facing * px * h, base - py * h) for px, py in points]

    line = max(1, round(h / 14))
    if kind == "house":
        draw.rectangle(box(-0.4, 0, 0.4, 0.6), fill=body)
        draw.polygon(poly([(-0.5, 0.6), (0.5, 0.6), (0, 1.0)]), fill=other)
        draw.rectangle(box(0.1, 0, 0.25, 0.3), fill=dark)
    elif kind == "tree":
        draw.rectangle(box(-0.06, 0, 0.06, 0.45), fill=dark)
        draw.ellipse(box(-0.35, 0.35, 0.35, 1.0), fill=body)
    elif kind == "pine":
        draw.rectangle(box(-0.05, 0, 0.05, 0.2), fill=dark)
        for k in range(3):
            draw.polygon(poly([(-0.38 + 0.08 * k, 0.15 + 0.27 * k), (0.38 - 0.08 * k, 0.15 + 0.27 * k),
                               (0, 0.5 + 0.25 * k)]), fill=body)  # fmt: skip
    elif kind == "car":  # 2.2 h long: h is its height
        draw.rectangle(box(-1.0, 0.2, 1.0, 0.6), fill=body)
        draw.polygon(poly([(-0.6, 0.6), (0.3, 0.6), (0.05, 1.0), (-0.45, 1.0)]), fill=body)
        draw.rectangle(box(0.7, 0.4, 1.0, 0.55), fill=other)  # headlight: the car's front
        for wheel in (-0.6, 0.6):
            draw.ellipse(box(wheel - 0.22, 0, wheel + 0.22, 0.44), fill=dark)
    elif kind == "person":
        draw.ellipse(box(-0.12, 0.76, 0.12, 1.0), fill=other)
        draw.line(poly([(0, 0.76), (0, 0.35)]), fill=body, width=2 * line)
        draw.line(poly([(-0.25, 0.5), (0, 0.65), (0.3, 0.6)]), fill=body, width=line)
        draw.line(poly([(-0.18, 0), (0, 0.35), (0.2, 0)]), fill=dark, width=line)
    elif kind == "flower":
        draw.line(poly([(0, 0), (0.05, 0.7)]), fill=_hsv(rng, (0.2, 0.4), (0.5, 1), (0.3, 0.8)), width=line)
        for k in range(6):
            a = k * math.pi / 3
            px, py = 0.05 + 0.18 * math.cos(a), 0.75 + 0.18 * math.sin(a)
            draw.ellipse(box(px - 0.12, py - 0.12, px + 0.12, py + 0.12), fill=body)
        draw.ellipse(box(-0.04, 0.66, 0.14, 0.84), fill=other)
    elif kind == "boat":
        draw.polygon(poly([(-0.8, 0.3), (0.8, 0.3), (0.55, 0), (-0.55, 0)]), fill=body)
        draw.line(poly([(0, 0.3), (0, 1.0)]), fill=dark, width=line)
        draw.polygon(poly([(0.05, 0.38), (0.05, 0.98), (0.6, 0.38)]), fill=other)
    elif kind == "bird":  # wings spread, flying towards `facing`
        draw.line(poly([(-0.6, 0.7), (-0.25, 0.4), (0, 0.5), (0.25, 0.4), (0.6, 0.75)]), fill=body, width=2 * line)
        draw.polygon(poly([(0, 0.45), (0.22, 0.55), (0, 0.55)]), fill=body)
    elif kind == "mushroom":
        draw.rectangle(box(-0.12, 0, 0.12, 0.55), fill=other)
        draw.chord(box(-0.45, 0.35, 0.45, 1.15), 180, 360, fill=body)
    elif kind == "lamp":
        draw.line(poly([(0, 0), (0, 0.85), (0.3, 0.9)]), fill=dark, width=line)
        draw.ellipse(box(0.2, 0.72, 0.42, 0.94), fill=_hsv(rng, (0.1, 0.18), (0.2, 0.8), (0.85, 1)))
    else:
        raise ValueError(f"unknown scene object {kind!r}")


def draw_scene(kind: str, rng: numpy.random.Generator, size: int = 40) -> Image.Image:
    """A horizon at 30-70% of the height, a sky gradient and a ground colour drawn at random, 2-5 pieces of
    clutter (clouds, stones, grass), and one `kind` of SCENE_OBJECTS at a random place, size (25-60% of the
    height; birds in the sky, smaller), colour and facing. Drawn at 4x, box-filtered, noise of std 3-12."""
    ss = 4
    n = size * ss
    horizon = rng.uniform(0.3, 0.7) * n
    top, low = _hsv(rng, (0.5, 0.7), (0.1, 0.8), (0.5, 1)), _hsv(rng, (-0.1, 0.7), (0, 0.6), (0.55, 1))
    ground = _hsv(rng, (0.05, 0.4), (0.2, 0.8), (0.2, 0.7))
    t = numpy.clip(numpy.arange(n) / horizon, 0, 1)[:, None, None]
    sky = numpy.array(top) * (1 - t) + numpy.array(low) * t
    canvas = Image.fromarray(numpy.broadcast_to(sky, (n, n, 3)).astype(numpy.uint8))
    draw = ImageDraw.Draw(canvas)
    draw.rectangle([0, horizon, n, n], fill=ground)
    for _ in range(int(rng.integers(2, 6))):
        piece = rng.choice(["cloud", "stone", "grass"])
        cx = rng.uniform(0, n)
        if piece == "cloud":
            cy, w = rng.uniform(0, horizon * 0.8), rng.uniform(0.15, 0.4) * n
            draw.ellipse([cx - w / 2, cy - w / 6, cx + w / 2, cy + w / 6], fill=_hsv(rng, (0, 1), (0, 0.1), (0.8, 1)))
        elif piece == "stone":
            cy, w = rng.uniform(horizon, n), rng.uniform(0.04, 0.12) * n
            draw.ellipse([cx - w, cy - w / 2, cx + w, cy + w / 2], fill=_hsv(rng, (0, 1), (0, 0.3), (0.2, 0.8)))
        else:
            cy = rng.uniform(horizon, n)
            for k in range(4):
                draw.line([(cx + k * 3, cy), (cx + k * 3 + rng.uniform(-4, 4), cy - rng.uniform(4, 14))],
                          fill=_hsv(rng, (0.2, 0.4), (0.4, 1), (0.2, 0.8)), width=2)  # fmt: skip
    facing = 1 if rng.random() < 0.5 else -1
    if kind == "bird":
        h = rng.uniform(0.12, 0.3) * n
        x, base = rng.uniform(0.2, 0.8) * n, rng.uniform(h, max(h + 1, horizon))
    else:
        h = rng.uniform(0.25, 0.6) * n * (0.6 if kind == "car" else 1.0)
        half = h * (1.1 if kind == "car" else 0.6)
        x = rng.uniform(half, n - half)
        base = rng.uniform(horizon + 0.05 * n, n) if horizon + 0.05 * n < n else n - 1
        base = min(base, n - 1)
    _draw_object(draw, kind, x, base, h, facing, rng)
    pixels = numpy.asarray(canvas.resize((size, size), Image.Resampling.BOX), dtype=numpy.float32)
    return noisy_image(pixels, rng, (3, 12))
