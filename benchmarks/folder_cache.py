"""An image folder read from its decode cache vs the same folder in memory (and decoded every epoch): epochs 2+,
and the data's share of a run's start-up, first run and later runs.

    python benchmarks/folder_cache.py [--images 2000] [--val 400] [--size 96] [--repeats 5] [--threads N]
                                      [--workers N] [--out bench/folder-cache] [--report docs/results/folder-cache.md]

Draws a folder of JPEGs (quality 90, each side 64-128 pixels, four classes of shapes on noisy backgrounds, so the
files decode like photos rather than flat drawings), then builds the worked example's run (recipe seed-cnn-32 at
`data.size`, batch 64, Adam, bf16) four ways: `data.in_memory=true` (decoded once into memory), `data.in_memory=
false` (the decode cache, `data.cache: auto`, with the workers hasten decides), the same with `--workers` workers,
and `data.in_memory=false data.cache=false` (every file decoded every epoch, in `--workers` workers; default: the
machine's rule for a folder). It measures, alternated in one sitting, after a warm-up epoch of each:

- data only: one epoch of each training loader with no model (reading or decoding, batching, normalisation);
- training epoch: one epoch end to end, one model's steps over each loader in turn (the same batches);
- start-up: opening the folder through the run's own `open_folder` and the normalisation statistics, for the
  in-memory path (decodes every file on every run), the cache's first run (decodes into it: the cache folder
  emptied first) and a later run (reads it), and the uncached stream (decodes its statistics' sample).

The cache lives in a temporary HASTEN_CACHE, never the user's. The files and the cache are in the page cache
throughout (a second run on the same machine); a cold disk is not measured. Medians and min-max over the repeats;
ratios are taken repeat by repeat (each against the in-memory time of the same round) and reported as median and
min-max. Writes results.json (with the machine, versions and load average) under --out and the report to
--report.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy
import torch
from PIL import Image, ImageDraw

from hasten.data.imagefolder import default_workers, folder_stats, read_into_memory
from hasten.data.loader import channel_stats
from hasten.experiments.interleave import rotated
from hasten.experiments.report import markdown_table
from hasten.recipe.schema import load_recipe
from hasten.run.build import build
from hasten.run.loading import open_folder
from hasten.run.plan import Plan
from hasten.run.trainer import Trainer
from hasten.runfolder.log import RunLog, environment, write_atomic

SHAPES = ("ellipse", "square", "triangle", "cross")


def draw_folder(root: Path, train: int, val: int, seed: int = 0) -> None:
    """`train` + `val` JPEGs (quality 90) spread over the SHAPES classes, each side 64-128 pixels."""
    rng = numpy.random.default_rng(seed)
    for split, count in (("train", train), ("val", val)):
        for i in range(count):
            label = i % len(SHAPES)
            folder = root / split / f"{label}-{SHAPES[label]}"
            folder.mkdir(parents=True, exist_ok=True)
            width, height = (int(side) for side in rng.integers(64, 129, size=2))
            corners = rng.integers(0, 256, (2, 2, 3)).astype(numpy.float32)  # a smooth colour ramp, then noise
            ys, xs = numpy.linspace(0, 1, height)[:, None, None], numpy.linspace(0, 1, width)[None, :, None]
            ramp = (corners[0, 0] * (1 - ys) * (1 - xs) + corners[0, 1] * (1 - ys) * xs + corners[1, 0] * ys * (1 - xs)
                    + corners[1, 1] * ys * xs)  # fmt: skip
            pixels = numpy.clip(ramp + rng.normal(0, 18, (height, width, 3)), 0, 255).astype(numpy.uint8)
            image = Image.fromarray(pixels)
            pen = ImageDraw.Draw(image)
            side = int(min(width, height) * rng.uniform(0.35, 0.7))
            x, y = int(rng.integers(0, width - side + 1)), int(rng.integers(0, height - side + 1))
            fill = tuple(int(c) for c in rng.integers(0, 256, 3))
            if SHAPES[label] == "ellipse":
                pen.ellipse((x, y, x + side, y + side), fill=fill)
            elif SHAPES[label] == "square":
                pen.rectangle((x, y, x + side, y + side), fill=fill)
            elif SHAPES[label] == "triangle":
                pen.polygon([(x, y + side), (x + side, y + side), (x + side // 2, y)], fill=fill)
            else:
                bar = max(side // 4, 2)
                pen.rectangle((x + (side - bar) // 2, y, x + (side + bar) // 2, y + side), fill=fill)
                pen.rectangle((x, y + (side - bar) // 2, x + side, y + (side + bar) // 2), fill=fill)
            image.save(folder / f"{i:05d}.jpg", quality=90)


def seconds(run) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def epoch(loader, step=None) -> None:
    for images, labels in loader:
        if step is not None:
            step(images, labels)


def cpu_model() -> tuple[str, bool]:
    """lscpu's model name (from /proc/cpuinfo) and whether the CPU has AVX512-BF16."""
    name, flags = "unknown", ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and name == "unknown":
                name = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = value
    except OSError:
        pass
    return name, "avx512_bf16" in flags.split()


def median_spread(values: list[float], digits: int = 2) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=2000, help="training JPEGs (default 2000)")
    parser.add_argument("--val", type=int, default=400, help="held-out JPEGs (default 400)")
    parser.add_argument("--size", type=int, default=96, help="data.size the run reads them at (default 96)")
    parser.add_argument("--workers", type=int, help="data.workers of the worker paths (default: the machine's rule)")
    parser.add_argument("--threads", type=int, help="train.threads (default: torch's)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--folder", help="an existing image folder to use instead of drawing one")
    parser.add_argument("--out", default="bench/folder-cache")
    parser.add_argument("--report", default="docs/results/folder-cache.md")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as scratch:
        os.environ["HASTEN_CACHE"] = str(Path(scratch) / "cache")  # never the user's cache
        folder = Path(args.folder or Path(scratch) / "shapes")
        if not args.folder:
            print(f"drawing {args.images} + {args.val} JPEGs into {folder} ...", file=sys.stderr)
            print(f"  {seconds(lambda: draw_folder(folder, args.images, args.val)):.1f} s", file=sys.stderr)
        files = sorted(folder.rglob("*.jpg"))
        file_bytes = sum(p.stat().st_size for p in files)
        base = [f"data.root={folder}", f"data.size={args.size}", "run.progress=false", "train.min_steps_per_epoch=0"]
        base += [f"train.threads={args.threads}"] if args.threads else []
        workers = default_workers() if args.workers is None else args.workers
        many = f"{workers} worker" + ("" if workers == 1 else "s")
        streamed = [*base, "data.in_memory=false"]
        recipes = {
            "in memory": load_recipe("seed-cnn-32", [*base, "data.in_memory=true"]),
            "decode cache": load_recipe("seed-cnn-32", streamed),  # data.workers as hasten decides it
            f"decode cache, {many}": load_recipe("seed-cnn-32", [*streamed, f"data.workers={workers}"]),
            f"decoded each epoch, {many}": load_recipe(
                "seed-cnn-32", [*streamed, "data.cache=false", f"data.workers={workers}"]
            ),
        }
        parts = {name: build(recipe) for name, recipe in recipes.items()}  # the loaders each run trains from
        model = parts["in memory"]
        chosen = parts["decode cache"].recipe.data.workers
        loop = Trainer(model.model, model.optimizer, model.scheduler, model.precision,
                       (model.train_loader, model.test_loader), Plan(epochs=1, num_classes=len(SHAPES),
                       progress=False), RunLog(out, enabled=False), model.hooks)  # fmt: skip
        loaders = {name: p.train_loader for name, p in parts.items()}
        count = loaders["in memory"].num_samples
        epochs_run = dict.fromkeys(loaders, 0)

        def next_epoch(name: str, step=None) -> float:
            epochs_run[name] += 1
            loaders[name].set_epoch(epochs_run[name])
            return seconds(lambda: epoch(loaders[name], step))

        def start_memory() -> None:
            data = read_into_memory(open_folder(recipes["in memory"], folder), workers)
            channel_stats(data.train_images)

        def start_cached(first: bool) -> None:
            if first:
                shutil.rmtree(Path(scratch) / "cache" / "folders")
            data = open_folder(recipes["decode cache"], folder)
            assert data.train.cached is not None
            folder_stats(data)

        def start_streamed() -> None:
            folder_stats(open_folder(recipes[f"decoded each epoch, {many}"], folder))

        variants = {f"data only: {name}": (lambda name=name: next_epoch(name)) for name in loaders}
        variants |= {
            f"training epoch: {name}": (lambda name=name: next_epoch(name, loop.train_step)) for name in loaders
        }
        variants |= {
            "start-up: in memory (decodes every run)": lambda: seconds(start_memory),
            "start-up: decode cache, first run (decodes into it)": lambda: seconds(lambda: start_cached(True)),
            "start-up: decode cache, later run (reads it)": lambda: seconds(lambda: start_cached(False)),
            "start-up: decoded each epoch (statistics' sample)": lambda: seconds(start_streamed),
        }
        print("warm-up ...", file=sys.stderr)
        for name in loaders:
            next_epoch(name, loop.train_step)  # epoch 1 of each path, and the persistent workers started
        times: dict[str, list[float]] = {name: [] for name in variants}
        for repeat in range(args.repeats):
            for name in rotated(list(variants), repeat):
                times[name].append(variants[name]())
                print(f"r{repeat + 1} {name}: {times[name][-1]:.3f} s", file=sys.stderr)
        cache_bytes = sum(p.stat().st_size for p in (Path(scratch) / "cache" / "folders").glob("*.npy"))

    load_after = os.getloadavg()
    rows, results = [], {}
    for name, values in times.items():
        kind, _, path = name.partition(": ")
        reference = times.get(f"{kind}: in memory (decodes every run)" if kind == "start-up" else f"{kind}: in memory")
        ratios = [v / r for v, r in zip(values, reference, strict=True)] if reference else []
        rate = "" if kind == "start-up" else f"{statistics.median(count / v for v in values):,.0f}"
        vs = median_spread(ratios) + "x" if ratios and reference is not values else "1 (reference)"
        rows.append([kind, path, median_spread(values, 3), rate, vs])
        results[name] = {"seconds": values, "ratio_to_in_memory": ratios}
    name, bf16 = cpu_model()
    env = environment() | {"cpu_model": name, "avx512_bf16": bf16, "torch_threads": torch.get_num_threads(),
                           "load_average_before": load_before, "load_average_after": load_after}  # fmt: skip
    command = "python benchmarks/folder_cache.py " + " ".join(argv if argv is not None else sys.argv[1:])
    facts = dict(images=count, held_out=args.val, size=args.size, workers=workers, cache_workers=chosen,
                 jpeg_bytes=file_bytes, cache_bytes=cache_bytes, files=len(files))  # fmt: skip
    write_atomic(out / "results.json", json.dumps({"command": command, "results": results, "facts": facts,
                                                   "environment": env}, indent=2))  # fmt: skip
    threads_note = (
        " (`--threads`: on cores shared with other work, one thread keeps torch's threads from waiting on each other "
        "whenever another process holds a core)"
        if args.threads
        else ""
    )
    zen = " (Zen 4 or later)" if bf16 and name.startswith("AMD") else ""

    def ratio(row: str) -> str:
        return median_spread(results[row]["ratio_to_in_memory"]) + "x"

    reading = (
        f"Reading: epochs 2+ from the decode cache took {ratio('data only: decode cache')} the in-memory time "
        f"without a model and {ratio('training epoch: decode cache')} with the model's steps (the target: within "
        f"1.2x); decoding every epoch took {ratio(f'data only: decoded each epoch, {many}')} and "
        f"{ratio(f'training epoch: decoded each epoch, {many}')}. A later run's data start-up read the cache in "
        f"{statistics.median(times['start-up: decode cache, later run (reads it)']):.3f} s where the in-memory path "
        f"decodes every file on every run ({statistics.median(times['start-up: in memory (decodes every run)']):.3f} "
        "s). A training epoch hides whatever the data path costs below the step's time (the workers decode on other "
        "cores while the step runs); the data-only rows are what a faster step, a GPU's, would see."
    )
    table = markdown_table(["measured", "path", "seconds, median (min–max)", "images/s", "vs in memory"], rows)
    report = [
        "# An image folder from its decode cache vs in memory",
        "",
        f"`{command}` (from the repository root, `PYTHONPATH=.`), alternated in one sitting: {args.repeats} round(s), "
        "each variant once a round in a rotated order, after a warm-up epoch of each path.",
        "",
        f"The folder: {len(files):,} JPEGs (quality 90, each side 64-128 pixels, four classes of shapes on noisy "
        f"backgrounds, {file_bytes / 2**20:.1f} MiB), {count:,} of them training images, read at {args.size}x"
        f"{args.size} RGB: a decode cache of {cache_bytes / 2**20:.1f} MiB. The run: recipe seed-cnn-32 (batch 64, "
        f"Adam, bf16), {torch.get_num_threads()} torch thread(s){threads_note}. `decode cache` is the run as hasten "
        "decides it "
        f"(`data.workers` unset: {chosen}, the map's rows copied in the main process); the paths named with "
        f"workers set `data.workers={workers}` (this machine's default for a folder).",
        "",
        f"Machine: {name} (`lscpu` model name), AVX512-BF16 {'present' if bf16 else 'absent'}{zen}, "
        f"{os.cpu_count()} CPUs, shared with other work while this ran: load average {load_before[0]:.2f} before, "
        f"{load_after[0]:.2f} after. torch {torch.__version__}.",
        "",
        table,
        "",
        reading,
        "",
        'Epoch rows are epochs 2 and later of each path (its first was the warm-up). "vs in memory" is each round\'s '
        "time over the in-memory path's time in the same round: median (min–max) over the rounds. Start-up is the "
        "data's part of a run's start: the run's own `open_folder` (scan, headers, and the cache: decoded into, or "
        "checked by every file's size and modification time and mapped) and the normalisation statistics (in "
        "memory: of every training image; from the folder: of a 1,000-image sample, read from the cache where there "
        "is one). The files and the cache stayed in the page cache: a cold disk is not measured.",
        "",
    ]
    Path(args.report).parent.mkdir(parents=True, exist_ok=True)
    write_atomic(Path(args.report), "\n".join(report))
    print("\n".join(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
