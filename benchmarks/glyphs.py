"""Glyph drawings for the generated sets (benchmarks/datasets.py): a character in one of several fonts, rotated,
stretched, scaled and placed at random, in an ink colour that contrasts with its background, with noise.

Fonts are the DejaVu, STIX and Computer Modern faces matplotlib (a hasten dependency) ships: every machine with
hasten installed has the same font files, where a system font folder may be missing or hold other versions.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import matplotlib
import numpy
from PIL import Image, ImageDraw, ImageFont

from benchmarks.procedural import noisy_image
from hasten.errors import DataError

FONT_DIR = Path(matplotlib.get_data_path()) / "fonts" / "ttf"
# sans, mono and serif faces in regular, bold and slanted cuts, and three Computer Modern faces (letters and
# digits only: their symbol slots hold other glyphs)
LETTER_FONTS = (
    "DejaVuSans", "DejaVuSans-Bold", "DejaVuSans-Oblique", "DejaVuSansMono", "DejaVuSansMono-Bold", "DejaVuSerif",
    "DejaVuSerif-Bold", "DejaVuSerif-Italic", "STIXGeneral", "STIXGeneralBol", "STIXGeneralItalic", "cmr10",
    "cmss10", "cmtt10", "cmb10",
)  # fmt: skip
SYMBOL_FONTS = LETTER_FONTS[:10]  # the faces that draw every glyph of GLYPHS_100
GLYPH_PIXELS = 96  # font size glyphs are rasterised at before rotation and scaling
LETTERS = "bdpqFJLNRS"  # b<->d and p<->q under a mirror; a mirrored F J L N R S is no letter
DIGITS = "0123456789"
# 100 classes whose shapes differ at any scale: capitals, the small letters unlike their capital (no c o s u v w
# x z k l p), digits 2-9 (0 and 1 look like O and I), ASCII and Latin-1 symbols, a few Greek and math signs
GLYPHS_100 = (
    "ABCDEFGHIJKLMNOPQRSTUVWXYZ" "abdefghijmnqrty" "23456789" "!#$%&()*+/:<=>?@[\\]^{}~" "§¶©±µ¿£¥€¢ßÆ÷"
    "ΩΣΔΦΨΓλθπ∞√∫≠≤≥"
)  # fmt: skip
MIN_CONTRAST = 0.3  # luma difference between a glyph and its background, as a fraction of full scale


@functools.lru_cache(maxsize=64)
def _font(name: str) -> ImageFont.FreeTypeFont:
    path = FONT_DIR / f"{name}.ttf"
    if not path.is_file():
        raise DataError(f"font {path} not found (matplotlib ships it; reinstall matplotlib)")
    return ImageFont.truetype(str(path), GLYPH_PIXELS)


@functools.lru_cache(maxsize=4096)
def glyph_mask(char: str, font: str) -> Image.Image:
    """`char` in `font` as a tight greyscale coverage mask ("L", 255 = ink), rasterised at GLYPH_PIXELS."""
    canvas = Image.new("L", (4 * GLYPH_PIXELS, 3 * GLYPH_PIXELS), 0)
    ImageDraw.Draw(canvas).text((GLYPH_PIXELS, GLYPH_PIXELS), char, font=_font(font), fill=255)
    box = canvas.getbbox()
    if box is None:
        raise DataError(f"font {font} draws nothing for {char!r}")
    return canvas.crop(box)


def glyph_coverage(
    char: str,
    font: str,
    rng: numpy.random.Generator,
    width: int,
    height: int,
    scale: tuple[float, float] = (0.5, 0.9),
    rotate: float = 20.0,
) -> numpy.ndarray:
    """Where `char` covers a `height` x `width` image (float32 in [0, 1]): rotated by up to `rotate` degrees,
    stretched by up to 15% on one axis, its longer side `scale` of the image's shorter side, at a random place
    that keeps it whole. Drawn at 4x and box-filtered down (anti-aliased)."""
    ss = 4
    glyph = glyph_mask(char, font).rotate(rng.uniform(-rotate, rotate), Image.Resampling.BICUBIC, expand=True)
    glyph = glyph.crop(glyph.getbbox())
    stretch = rng.uniform(0.85, 1.15)
    w0, h0 = glyph.width * stretch, glyph.height / stretch
    factor = rng.uniform(*scale) * min(width, height) * ss / max(w0, h0)
    factor = min(factor, width * ss / w0, height * ss / h0)
    w, h = max(1, round(w0 * factor)), max(1, round(h0 * factor))
    canvas = Image.new("L", (width * ss, height * ss), 0)
    place = (int(rng.integers(0, width * ss - w + 1)), int(rng.integers(0, height * ss - h + 1)))
    canvas.paste(glyph.resize((w, h), Image.Resampling.LANCZOS), place)
    return numpy.asarray(canvas.resize((width, height), Image.Resampling.BOX), dtype=numpy.float32) / 255


def luma(rgb: numpy.ndarray) -> numpy.ndarray:
    """ITU-R BT.601 luma of RGB values (last axis), in their units."""
    return rgb @ numpy.array([0.299, 0.587, 0.114])


def _ink_for(backgrounds: numpy.ndarray, rng: numpy.random.Generator) -> numpy.ndarray | None:
    """A random RGB colour (0-255) brighter or darker than every colour in `backgrounds` by MIN_CONTRAST of
    full-scale luma; None when none is possible."""
    lumas = luma(backgrounds)
    room = [(0.0, lumas.min() - 255 * MIN_CONTRAST), (lumas.max() + 255 * MIN_CONTRAST, 255.0)]
    room = [(low, high) for low, high in room if high > low]
    if not room:
        return None
    low, high = room[int(rng.integers(len(room)))]
    for _ in range(100):  # a random hue at a luma in range
        colour = rng.uniform(0, 255, 3)
        if low <= luma(colour) <= high:
            return colour
    return numpy.full(3, (low + high) / 2)


def _colours(rng: numpy.random.Generator, count: int) -> tuple[numpy.ndarray, numpy.ndarray]:
    """`count` background colours (their luma within 0.3 of each other) and an ink colour that contrasts with
    all of them."""
    while True:
        first = rng.uniform(0, 255, 3)
        backgrounds = numpy.stack(
            [first] + [numpy.clip(first + rng.normal(0, 45, 3), 0, 255) for _ in range(count - 1)]
        )
        if numpy.ptp(luma(backgrounds)) <= 255 * 0.3 and (ink := _ink_for(backgrounds, rng)) is not None:
            return backgrounds, ink


def draw_glyph(
    char: str,
    rng: numpy.random.Generator,
    size: int = 32,
    fonts: tuple[str, ...] = LETTER_FONTS,
    rotate: float = 20.0,
) -> Image.Image:
    """`char` in a random font of `fonts` on a plain background: random ink and background colours at least
    MIN_CONTRAST apart in luma, rotated, shifted and scaled (`glyph_coverage`), Gaussian noise of std 4-24."""
    font = fonts[int(rng.integers(len(fonts)))]
    (background,), ink = _colours(rng, 1)
    coverage = glyph_coverage(char, font, rng, size, size, rotate=rotate)[..., None]
    return noisy_image(background + (ink - background) * coverage, rng, (4, 24))


def _smooth_field(rng: numpy.random.Generator, width: int, height: int, cells: int) -> numpy.ndarray:
    """Random smooth variation over a `height` x `width` image: a `cells` x `cells` grid of N(0, 1) values,
    bicubically upsampled."""
    grid = rng.normal(0.0, 1.0, (cells, cells)).astype(numpy.float32)
    return numpy.asarray(Image.fromarray(grid, "F").resize((width, height), Image.Resampling.BICUBIC))


def draw_glyph_photo(char: str, rng: numpy.random.Generator, fonts: tuple[str, ...] = LETTER_FONTS) -> Image.Image:
    """`char` as a user's photo-like file: 48-96 px wide and high (each drawn apart), on a linear gradient
    between two colours with smooth blotches, Gaussian noise of std 3-15; the glyph's longer side 0.4-0.85 of
    the shorter image side."""
    width, height = (int(v) for v in rng.integers(48, 97, 2))
    font = fonts[int(rng.integers(len(fonts)))]
    (start, end), ink = _colours(rng, 2)
    angle = rng.uniform(0, 2 * math.pi)
    y, x = numpy.mgrid[0:height, 0:width].astype(numpy.float32)
    along = x * math.cos(angle) + y * math.sin(angle)
    along = (along - along.min()) / max(float(numpy.ptp(along)), 1.0)
    background = start + (end - start) * along[..., None]
    blotches = _smooth_field(rng, width, height, int(rng.integers(3, 7)))[..., None] * rng.uniform(4, 14, 3)
    coverage = glyph_coverage(char, font, rng, width, height, scale=(0.4, 0.85))[..., None]
    return noisy_image(background + blotches + (ink - background - blotches) * coverage, rng, (3, 15))
