"""Milliseconds per image of the default model's forward pass in evaluation, by image side and batch, on this CPU
(fp32, channels_last, one thread, 1,024 random images, the best of 7 passes, the batches interleaved): what
`train.eval_batch_size: auto`'s CPU limits were read from (hasten/tune/rules.py, docs/defaults.md).

    .venv/bin/python benchmarks/eval_batch.py                 # sides 28, 32, 48, 64, 96
    .venv/bin/python benchmarks/eval_batch.py 40 128          # other sides
    .venv/bin/python benchmarks/eval_batch.py --allocator-defaults 28   # glibc's allocator as it comes

The C allocator is set as a run sets it on this machine (hasten.machine.cpu_allocator: under glibc, a batch's
tensors kept in the heap), unless --allocator-defaults: with glibc's defaults every pass faults large batches'
activations in afresh, which weighs on them alone.
"""

from __future__ import annotations

import sys
import time

import torch

from hasten.machine import apply_cpu_allocator, cpu_allocator
from hasten.machine import current as current_machine
from hasten.models import build_model
from hasten.recipe.schema import load_recipe

BATCHES = (16, 32, 64, 128, 256)
IMAGES = 1024
PASSES = 7


def per_image(side: int) -> dict[int, float]:
    """Seconds per image at each batch of BATCHES, the best of PASSES passes over IMAGES images."""
    model = build_model(load_recipe(None, []).model, (3, side, side), 10).eval().to(memory_format=torch.channels_last)
    images = torch.randn(IMAGES, 3, side, side).contiguous(memory_format=torch.channels_last)
    best = dict.fromkeys(BATCHES, float("inf"))
    with torch.no_grad():
        for batch in BATCHES:  # a first pass at each batch: kernel selection, allocations
            model(images[:batch])
        for _ in range(PASSES):
            for batch in BATCHES:
                started = time.perf_counter()
                for first in range(0, IMAGES, batch):
                    model(images[first : first + batch])
                best[batch] = min(best[batch], (time.perf_counter() - started) / IMAGES)
    return best


def main(argv: list[str]) -> None:
    torch.set_num_threads(1)
    defaults = "--allocator-defaults" in argv
    settings = {} if defaults else cpu_allocator(current_machine(), "cpu")
    taken = apply_cpu_allocator(settings)
    print(f"C allocator: {settings if taken else 'as it comes'}")
    sides = [int(side) for side in argv if side != "--allocator-defaults"] or [28, 32, 48, 64, 96]
    print("| side | " + " | ".join(str(batch) for batch in BATCHES) + " |")
    print("| --- |" + " --- |" * len(BATCHES))
    for side in sides:
        seconds = per_image(side)
        fastest = min(seconds.values())
        cells = [f"**{1e3 * t:.3f}**" if t == fastest else f"{1e3 * t:.3f}" for t in seconds.values()]
        print(f"| {side} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
