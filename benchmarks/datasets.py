"""Generated image folders for the generalization suite (benchmarks/generalization.py): data no default was tuned
on, written in the layout `data.name=imagefolder` reads (`ROOT/train/<class>/*.png|jpg`, `ROOT/val/<class>/...`).

Every set is drawn with Pillow and numpy from one seed: a seed writes the same bytes every time on one machine
(Pillow's rasteriser and encoders and numpy's generator make the bytes; ROOT/dataset.json records their versions
and a SHA-256 of every file, so runs on two machines can tell whether they saw the same data). Each class and
split draws from its own generator (`numpy.random.default_rng([seed, split, class, stream])`, the stream the
set's own), so a class's images depend neither on the other classes nor on the counts, and no two sets share
images. Fonts are the DejaVu, STIX and Computer Modern faces that matplotlib (a hasten dependency) ships, so every
machine with hasten installed has the same font files.

`REGISTRY` maps each name to its generator (docs/generalization.md shows a contact sheet of each):

- `letters`: 10 mirror-sensitive glyph classes (b d p q F J L N R S: a mirror turns b into d and p into q, and the
  other six into no class) in 15 fonts, rotated +-20 degrees, shifted, scaled, random foreground and background
  colours with a luma contrast of at least 0.3, Gaussian pixel noise; 32x32 RGB PNG, 120 train / 40 val a class.
- `letters-jpeg`: the same glyphs as JPEGs of random width and height in 48-96 px on gradient-and-blotch
  backgrounds with noise, quality 60-95, read at `data.size=64`; 250 train / 50 val a class.
- `glyphs-100`: 100 classes (26 capitals, 15 small letters whose shape differs from their capital's, digits 2-9,
  51 symbols, mirror pairs among them: b/d, ( and ), [ and ], { and }, < and >, <= and >=) in the 10 fonts that
  draw every one, rotated +-15 degrees; 32 px RGB, 40 train / 10 val a class.
- `imbalanced`: the letters, training counts falling geometrically from 300 to 30 (10:1), 40 val a class.
- `few-shot`: digits 0-9 drawn like the letters, 20 train / 40 val a class.
- `textures-grey`: 10 procedural textures (stripes at 0, 45, 90 and 135 degrees, checkers, dot lattices,
  rings, crosshatch, low-pass blobs, band-pass grain) at random scale, phase, contrast and lighting, with noise;
  the two diagonals are each other's mirror image. 32 px greyscale, 120 / 40 a class.
- `textures-colour`: 5 patterns x 2 colour pairings (complementary hues, about 180 degrees apart, or analogous
  hues, 30-60 degrees apart, at a random base hue): the pairing, not a colour, is part of the class. 32 px RGB.
- `scenes`: a horizon (sky and ground colours varying), clutter (clouds, stones, grass) and one of 10 objects
  (house, tree, pine, car, person, flower, boat, bird, mushroom, lamp) at a random place, size, colour and
  facing; 40 px RGB, 120 / 40 a class. Mirror-invariant: a flip keeps every class.
- `arrows`, `colours`, `shapes`: the first generalization benchmark's sets, unchanged (8 mirror-sensitive arrow
  directions, shape x colour, five shapes), so results that name them stay comparable.

    .venv/bin/python -m benchmarks.datasets letters DIR          # write one set under DIR/letters
    .venv/bin/python -m benchmarks.datasets all DIR --sheets     # every set, and a contact sheet of each
    .venv/bin/python -m benchmarks.datasets all DIR --overview docs/generalization-datasets.png  # the docs' sheet
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import shutil
import sys
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib
import numpy
import PIL
from PIL import Image, ImageDraw, ImageFont

from benchmarks.glyphs import DIGITS, FONT_DIR, GLYPHS_100, LETTERS, SYMBOL_FONTS, draw_glyph, draw_glyph_photo
from benchmarks.procedural import (
    ARROW_ANGLES,
    COLOUR_PATTERNS,
    COLOURS,
    GREY_TEXTURES,
    PAIRINGS,
    SCENE_OBJECTS,
    SHAPES,
    draw_arrow,
    draw_colour_texture,
    draw_grey_texture,
    draw_scene,
    draw_shape,
)
from hasten.errors import DataError

VERSION = 1  # of the generators: bump when a set's images change, so a stale folder is noticed, not trusted
MANIFEST = "dataset.json"

Draw = Callable[[numpy.random.Generator], Image.Image]
Save = Callable[[Image.Image, Path, numpy.random.Generator], None]


def _save_png(image: Image.Image, path: Path, rng: numpy.random.Generator) -> None:
    image.save(path)


def _save_jpeg(image: Image.Image, path: Path, rng: numpy.random.Generator) -> None:
    image.save(path, quality=int(rng.integers(60, 96)))  # a camera's or a web page's compression


def folder_digest(root: Path) -> str:
    """SHA-256 over every image file under ROOT/train and ROOT/val: relative path and bytes, in sorted order."""
    sha = hashlib.sha256()
    for path in sorted(p for split in ("train", "val") for p in (root / split).rglob("*") if p.is_file()):
        sha.update(str(path.relative_to(root)).encode())
        sha.update(path.read_bytes())
    return sha.hexdigest()


def _write(
    root: str | Path,
    classes: dict[str, Draw],
    train_per_class: int | list[int],
    val_per_class: int | list[int],
    seed: int,
    suffix: str = ".png",
    save: Save = _save_png,
    stream: int = 0,
) -> dict[str, int]:
    """Draw each class's images (one generator per class and split, derived from `seed` and the set's own
    `stream`, so two sets drawn alike never share images) into a staging folder, then move train/ and val/ into
    `root`. A count is one number for every class or one per class. An existing train/ or val/ under `root` is
    an error: nothing the user had is overwritten."""
    root = Path(root).expanduser()
    existing = [str(root / s) for s in ("train", "val") if (root / s).exists()]
    if existing:
        raise DataError(f"{' and '.join(existing)} already exist(s); remove it or choose another folder")
    staging = root / f".generating-{os.getpid()}"
    counts = {"train": 0, "val": 0}
    try:
        for split_index, (split, per_class) in enumerate((("train", train_per_class), ("val", val_per_class))):
            for class_index, (name, draw) in enumerate(classes.items()):
                rng = numpy.random.default_rng([seed, split_index, class_index] + ([stream] if stream else []))
                folder = staging / split / name
                folder.mkdir(parents=True)
                count = per_class if isinstance(per_class, int) else per_class[class_index]
                for i in range(count):
                    save(draw(rng), folder / f"{i:05d}{suffix}", rng)
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
    classes = {name: (lambda rng, a=angle: draw_arrow(a, rng, size)) for name, angle in ARROW_ANGLES.items()}
    return _write(root, classes, train_per_class, val_per_class, seed)


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


def _glyph_classes(chars: str, draw: Callable[[str, numpy.random.Generator], Image.Image]) -> dict[str, Draw]:
    """Class folder name -> draw, numbered so the sorted folders keep `chars`' order; a folder name is the
    character's Unicode name, since file systems fold case (b and B) and forbid / and \\."""
    width = len(str(len(chars) - 1))
    names = [unicodedata.name(c).lower().replace("latin ", "").replace("letter ", "").replace(" ", "-") for c in chars]
    return {
        f"{i:0{width}d}_{name}": (lambda rng, c=c: draw(c, rng))
        for i, (c, name) in enumerate(zip(chars, names, strict=True))
    }


def letters(root: str | Path, seed: int = 0, train_per_class: int = 120, val_per_class: int = 40) -> dict[str, int]:
    """LETTERS in LETTER_FONTS, 32x32 RGB PNG (`draw_glyph`); default 1,200 train, 400 val."""
    return _write(root, _glyph_classes(LETTERS, draw_glyph), train_per_class, val_per_class, seed, stream=1)


def letters_jpeg(
    root: str | Path, seed: int = 0, train_per_class: int = 250, val_per_class: int = 50
) -> dict[str, int]:
    """LETTERS as JPEGs of 48-96 px a side, quality 60-95 (`draw_glyph_photo`); default 2,500 train, 500 val."""
    classes = _glyph_classes(LETTERS, draw_glyph_photo)
    return _write(root, classes, train_per_class, val_per_class, seed, suffix=".jpg", save=_save_jpeg, stream=2)


def glyphs_100(root: str | Path, seed: int = 0, train_per_class: int = 40, val_per_class: int = 10) -> dict[str, int]:
    """GLYPHS_100 in SYMBOL_FONTS, rotated +-15 degrees, 32 px RGB; default 4,000 train, 1,000 val."""
    draw = functools.partial(draw_glyph, fonts=SYMBOL_FONTS, rotate=15.0)
    classes = _glyph_classes(GLYPHS_100, lambda c, rng: draw(c, rng))
    return _write(root, classes, train_per_class, val_per_class, seed, stream=3)


def geometric_counts(largest: int, smallest: int, classes: int) -> list[int]:
    """Per-class counts falling geometrically from `largest` to `smallest`."""
    return [round(largest * (smallest / largest) ** (k / (classes - 1))) for k in range(classes)]


def imbalanced(
    root: str | Path, seed: int = 0, largest: int = 300, smallest: int = 30, val_per_class: int = 40
) -> dict[str, int]:
    """The letters with training counts from `largest` (b) down to `smallest` (S), geometrically; val balanced."""
    counts = geometric_counts(largest, smallest, len(LETTERS))
    return _write(root, _glyph_classes(LETTERS, draw_glyph), counts, val_per_class, seed, stream=4)


def few_shot(root: str | Path, seed: int = 0, train_per_class: int = 20, val_per_class: int = 40) -> dict[str, int]:
    """DIGITS drawn like the letters, 20 training images a class; default 200 train, 400 val."""
    return _write(root, _glyph_classes(DIGITS, draw_glyph), train_per_class, val_per_class, seed, stream=5)


def textures_grey(
    root: str | Path, seed: int = 0, train_per_class: int = 120, val_per_class: int = 40
) -> dict[str, int]:
    """GREY_TEXTURES, 32 px greyscale PNG; default 1,200 train, 400 val."""
    classes = {name: (lambda rng, k=k, a=a: draw_grey_texture(k, a, rng)) for name, (k, a) in GREY_TEXTURES.items()}
    return _write(root, classes, train_per_class, val_per_class, seed, stream=6)


def textures_colour(
    root: str | Path, seed: int = 0, train_per_class: int = 120, val_per_class: int = 40
) -> dict[str, int]:
    """COLOUR_PATTERNS x PAIRINGS (10 classes), 32 px RGB PNG; default 1,200 train, 400 val."""
    classes = {
        f"{i * len(PAIRINGS) + j}_{kind}-{pairing}": (lambda rng, k=kind, p=pairing: draw_colour_texture(k, p, rng))
        for i, kind in enumerate(COLOUR_PATTERNS)
        for j, pairing in enumerate(PAIRINGS)
    }
    return _write(root, classes, train_per_class, val_per_class, seed, stream=7)


def scenes(root: str | Path, seed: int = 0, train_per_class: int = 120, val_per_class: int = 40) -> dict[str, int]:
    """SCENE_OBJECTS in scenes (`draw_scene`), 40 px RGB PNG; default 1,200 train, 400 val."""
    classes = {f"{i}_{kind}": (lambda rng, k=kind: draw_scene(k, rng)) for i, kind in enumerate(SCENE_OBJECTS)}
    return _write(root, classes, train_per_class, val_per_class, seed, stream=8)


def contact_sheet(root: str | Path, path: str | Path, per_class: int = 10, split: str = "train", cell: int = 40,
                  max_classes: int = 20) -> Path:  # fmt: skip
    """A PNG of the first `per_class` images of each class (the first `max_classes` classes) of the folder at
    `root`, one row per class named on the left, every image scaled to `cell` pixels (nearest neighbour)."""
    folders = sorted(p for p in (Path(root) / split).iterdir() if p.is_dir())[:max_classes]
    label_width = 150
    sheet = Image.new("RGB", (label_width + per_class * (cell + 2), len(folders) * (cell + 2)), (255, 255, 255))
    draw = ImageDraw.Draw(sheet)
    label = ImageFont.truetype(str(FONT_DIR / "DejaVuSans.ttf"), 11)
    for row, folder in enumerate(folders):
        y = row * (cell + 2)
        draw.text((2, y + cell // 2 - 6), folder.name[:24], font=label, fill=(0, 0, 0))
        for column, file in enumerate(sorted(folder.iterdir())[:per_class]):
            with Image.open(file) as image:
                tile = image.convert("RGB").resize((cell, cell), Image.Resampling.NEAREST)
            sheet.paste(tile, (label_width + column * (cell + 2), y))
    path = Path(path)
    sheet.save(path, optimize=True)
    return path


def overview(roots: dict[str, Path], path: str | Path, columns: int = 14, cell: int = 40) -> Path:
    """One PNG row per set (name -> folder): its training images taking the classes in turn, `cell` pixels each,
    the set's name on the left; saved with a 256-colour palette, small enough for the docs."""
    label_width = 120
    sheet = Image.new("RGB", (label_width + columns * (cell + 2), len(roots) * (cell + 2)), (255, 255, 255))
    draw = ImageDraw.Draw(sheet)
    label = ImageFont.truetype(str(FONT_DIR / "DejaVuSans.ttf"), 12)
    for row, (name, root) in enumerate(roots.items()):
        y = row * (cell + 2)
        draw.text((2, y + cell // 2 - 7), name, font=label, fill=(0, 0, 0))
        folders = sorted(p for p in (Path(root) / "train").iterdir() if p.is_dir())
        for column in range(columns):
            if len(folders) > columns:  # spread over all the classes
                folder, index = folders[column * len(folders) // columns], 0
            else:
                folder, index = folders[column % len(folders)], column // len(folders)
            file = sorted(folder.iterdir())[index]
            with Image.open(file) as image:
                tile = image.convert("RGB").resize((cell, cell), Image.Resampling.NEAREST)
            sheet.paste(tile, (label_width + column * (cell + 2), y))
    path = Path(path)
    sheet.quantize(256, dither=Image.Dither.NONE).save(path, optimize=True)
    return path


@dataclass(frozen=True)
class GeneratedSet:
    """One generated dataset: its generator (`make(root, seed=0, **sizes) -> image counts per split`), its
    class count, the data.* overrides it is read with, and whether a horizontal mirror may change a class."""

    make: Callable[..., dict[str, int]]
    classes: int
    mirror_sensitive: bool
    read: tuple[str, ...] = ()
    summary: str = field(default="", compare=False)


REGISTRY: dict[str, GeneratedSet] = {
    "letters": GeneratedSet(letters, 10, True, summary="b d p q F J L N R S, 15 fonts, 32 px RGB, 1,200 / 400"),
    "letters-jpeg": GeneratedSet(letters_jpeg, 10, True, ("data.size=64",),
                                 "the letters as 48-96 px JPEGs on gradients, read at 64 px, 2,500 / 500"),
    "glyphs-100": GeneratedSet(glyphs_100, 100, True, summary="100 glyph classes, 10 fonts, 32 px RGB, 4,000 / 1,000"),
    "imbalanced": GeneratedSet(imbalanced, 10, True,
                               summary="the letters, 300 down to 30 a class (10:1), 40 a class to test"),
    "few-shot": GeneratedSet(few_shot, 10, True,
                             summary="digits 0-9 like the letters, 20 a class to train, 40 to test"),
    "textures-grey": GeneratedSet(textures_grey, 10, True, summary="10 procedural textures, 32 px grey"),
    "textures-colour": GeneratedSet(textures_colour, 10, False,
                                    summary="5 patterns x 2 hue pairings, 32 px RGB, 1,200 / 400"),
    "scenes": GeneratedSet(scenes, 10, False, summary="10 objects in procedural scenes, 40 px RGB, 1,200 / 400"),
    "arrows": GeneratedSet(arrows, 8, True, summary="8 arrow directions, 28 px grey, 1,200 / 400"),
    "colours": GeneratedSet(colours, 9, False, summary="circle/square/triangle x red/green/blue, 32 px, 1,080 / 360"),
    "shapes": GeneratedSet(shapes, 5, False, summary="5 grey shapes, 28 px, 1,000 / 300"),
}  # fmt: skip


def manifest(root: str | Path) -> dict | None:
    """ROOT/dataset.json as written by `generate`, or None when there is none."""
    path = Path(root) / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else None


def generate(name: str, root: str | Path, seed: int = 0, **sizes: int) -> dict:
    """Write the generated set `name` under `root` (train/, val/) and ROOT/dataset.json: the name, seed, sizes,
    VERSION, image counts, the Pillow, numpy and matplotlib versions that made the bytes, and the folder's
    SHA-256. DataError for an unknown name or an existing train/ or val/. Returns the manifest."""
    if name not in REGISTRY:
        raise DataError(f"generated data set {name!r}: expected one of {', '.join(REGISTRY)}")
    root = Path(root).expanduser()
    counts = REGISTRY[name].make(root, seed=seed, **sizes)
    record = {
        "name": name,
        "seed": seed,
        "sizes": sizes,
        "version": VERSION,
        "counts": counts,
        "pillow": PIL.__version__,
        "numpy": numpy.__version__,
        "matplotlib": matplotlib.__version__,
        "sha256": folder_digest(root),
    }
    tmp = root / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(root / MANIFEST)
    return record


def ensure(name: str, root: str | Path, seed: int = 0) -> dict:
    """The set `name` at `root`: generated when the folder has none, reused when its manifest says it is this
    set, seed and VERSION at the default sizes; a DataError naming the folder otherwise (it is not replaced)."""
    root = Path(root)
    found = manifest(root)
    if found is None and not (root / "train").exists():
        return generate(name, root, seed)
    expected = {"name": name, "seed": seed, "sizes": {}, "version": VERSION}
    if found is None or any(found.get(key) != value for key, value in expected.items()):
        raise DataError(
            f"{root}: holds {'no dataset.json' if found is None else _describe(found)}, not {_describe(expected)}; "
            "remove the folder to have it generated again"
        )
    return found


def _describe(record: dict) -> str:
    sizes = f" sizes {record['sizes']}" if record.get("sizes") else ""
    return f"{record.get('name')} seed {record.get('seed')} version {record.get('version')}{sizes}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", help=f"comma-separated, or all: {', '.join(REGISTRY)}")
    parser.add_argument("out", help="folder that receives one subfolder per set")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sheets", action="store_true", help="also OUT/<name>.png: a contact sheet of each set")
    parser.add_argument("--overview", metavar="PNG", help="also one contact sheet of every set written, a row each")
    args = parser.parse_args(argv)
    names = list(REGISTRY) if args.names == "all" else [n for n in args.names.split(",") if n]
    try:
        for name in names:
            record = generate(name, Path(args.out) / name, args.seed)
            print(
                f"{name}: {record['counts']['train']} train, {record['counts']['val']} val -> {Path(args.out) / name}"
            )
            if args.sheets:
                print(f"  {contact_sheet(Path(args.out) / name, Path(args.out) / f'{name}.png')}")
        if args.overview:
            print(overview({name: Path(args.out) / name for name in names}, args.overview))
    except DataError as error:
        print(f"error: {error}", file=sys.stderr)
        return error.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
