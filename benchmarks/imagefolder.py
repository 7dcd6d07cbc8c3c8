"""Image-folder DataLoader path vs the in-memory path, on the same images: images/s and where the time goes.

    python benchmarks/imagefolder.py [--limit 10000] [--workers 0,1,2] [--repeats 3] [--out bench/imagefolder]

Writes a 32x32 RGB image folder from Fashion-MNIST (`hasten data make-folder`, the first --limit training
images and 2000 test images), then measures, for the worked example's model and settings (recipe
seed-cnn-32: batch 64, Adam, bf16):

- data only: one epoch through the folder loader with no model (Pillow decode, resize when needed, batching,
  normalisation), for each worker count; and the same through the in-memory loader (index slices of one
  uint8 tensor);
- compute only: training steps on one batch held fixed (forward, backward, optimizer step), no data loading;
- training epoch: one epoch end to end, folder loader (each worker count) vs in-memory loader.

Discipline after airbench: a warm-up epoch of each path first, then `--repeats` rounds with the variants
interleaved, median and min-max reported; the recipe, versions, machine and load average saved with the
numbers in results.json, and a markdown table in report.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from hasten.data.imagefolder import image_folder_loaders, open_image_folder, read_into_memory
from hasten.data.loader import InMemoryLoader
from hasten.data.makefolder import make_folder
from hasten.experiments.interleave import rotated
from hasten.experiments.report import markdown_table
from hasten.recipe.schema import load_recipe, to_yaml
from hasten.run.build import build
from hasten.run.plan import Plan
from hasten.run.trainer import Trainer
from hasten.runfolder.log import RunLog, environment, write_atomic


def epoch_seconds(loader, step=None) -> float:
    """Seconds for one pass over `loader`, calling `step(images, labels)` on each batch when given."""
    started = time.perf_counter()
    for images, labels in loader:
        if step is not None:
            step(images, labels)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=10000, help="training images in the folder (default 10000)")
    parser.add_argument("--workers", default="0,1,2", help="DataLoader worker counts to try (default 0,1,2)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--folder", help="an existing 32x32 RGB image folder to use instead of writing one")
    parser.add_argument("--out", default="bench/imagefolder")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (train.threads; default: torch's)")
    args = parser.parse_args(argv)
    workers = [int(w) for w in args.workers.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(args.folder or Path(scratch) / "fashion-32")
        if not args.folder:
            print(f"writing {args.limit} + test images into {folder} ...", file=sys.stderr)
            made = time.perf_counter()
            make_folder("fashion-mnist", folder, size=32, rgb=True, limit=args.limit)
            print(f"  {time.perf_counter() - made:.1f} s", file=sys.stderr)
        overrides = [f"data.root={folder}", "data.test_subset=2000", "run.progress=false"]
        recipe = load_recipe("seed-cnn-32", overrides + ([f"train.threads={args.threads}"] if args.threads else []))
        parts = build(recipe)  # model, optimizer, precision exactly as the recipe makes them
        data = open_image_folder(folder, size=32, rgb=True)
        in_memory = read_into_memory(data)
        images, labels = in_memory.train_images, in_memory.train_labels
        mean, std = parts.train_loader.mean.flatten(), parts.train_loader.std.flatten()
        batch = recipe.train.batch_size
        memory = InMemoryLoader(images, labels, batch, mean=mean, std=std, shuffle=True, seed=recipe.seed)
        folders = {w: image_folder_loaders(data, batch, 1000, seed=recipe.seed, workers=w)[0] for w in workers}
        loop = Trainer(
            parts.model,
            parts.optimizer,
            parts.scheduler,
            parts.precision,
            (memory, memory),
            Plan(epochs=1, num_classes=data.num_classes, progress=False),
            RunLog(out, enabled=False),
            parts.hooks,
        )
        fixed_x, fixed_y = next(iter(memory))
        steps_per_epoch = len(memory)

        def compute_epoch() -> float:
            started = time.perf_counter()
            for _ in range(steps_per_epoch):
                loop.train_step(fixed_x, fixed_y)
            return time.perf_counter() - started

        def named(w: int) -> str:
            return f"folder, {w} worker" + ("" if w == 1 else "s")

        variants = {"data only: in-memory": lambda: epoch_seconds(memory)}
        variants |= {f"data only: {named(w)}": (lambda w=w: epoch_seconds(folders[w])) for w in workers}
        variants["compute only (one batch, no loading)"] = compute_epoch
        variants["training epoch: in-memory"] = lambda: epoch_seconds(memory, loop.train_step)
        variants |= {
            f"training epoch: {named(w)}": (lambda w=w: epoch_seconds(folders[w], loop.train_step)) for w in workers
        }
        print("warm-up ...", file=sys.stderr)
        for measure in variants.values():
            measure()
        seconds: dict[str, list[float]] = {name: [] for name in variants}
        for repeat in range(args.repeats):
            for name in rotated(list(variants), repeat):
                seconds[name].append(variants[name]())
                print(f"r{repeat + 1} {name}: {seconds[name][-1]:.2f} s", file=sys.stderr)

    count = len(labels)
    rows, results = [], {}
    for name, values in seconds.items():
        rates = [count / s for s in values]
        results[name] = {"seconds": values, "images_per_second": statistics.median(rates)}
        spread = f"{min(rates):,.0f}–{max(rates):,.0f}"
        rows.append([name, f"{statistics.median(values):.2f}", f"{statistics.median(rates):,.0f}", spread])
    table = markdown_table([f"per epoch of {count} images", "seconds", "images/s", "images/s min–max"], rows)
    env = environment() | {"load_average": os.getloadavg(), "torch_threads": torch.get_num_threads()}
    command = "python benchmarks/imagefolder.py " + " ".join(argv if argv is not None else sys.argv[1:])
    write_atomic(
        out / "results.json",
        json.dumps({"command": command, "results": results, "environment": env, "recipe": to_yaml(recipe)}, indent=2),
    )
    report = [
        "# Image folder vs in memory (recipe seed-cnn-32, 32x32 RGB Fashion-MNIST)",
        "",
        f"`{command}`; median of {args.repeats} after a warm-up; {env['cpu_count']} CPUs, "
        f"{env['torch_threads']} torch threads, load average {env['load_average'][0]:.1f} at the end.",
        "",
        table,
        "",
    ]
    write_atomic(out / "report.md", "\n".join(report))
    print("\n".join(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
