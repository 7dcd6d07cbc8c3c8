"""Milliseconds per image of a recipe's model's forward pass in evaluation, by image side and batch, on this CPU
(channels_last, random images, the best of several passes, the batches interleaved): what
`train.eval_batch_size: auto`'s CPU limits were read from (hasten/tune/rules.py, docs/defaults.md).

    .venv/bin/python benchmarks/eval_batch.py                 # the default model, fp32, one thread; sides 28-96
    .venv/bin/python benchmarks/eval_batch.py 40 128          # other sides
    .venv/bin/python benchmarks/eval_batch.py --precision bf16 --threads 2 --recipe fashion-fast 28   # as that runs
    .venv/bin/python benchmarks/eval_batch.py --allocator-defaults 28   # glibc's allocator as it comes
    ONEDNN_MAX_CPU_ISA=AVX2 .venv/bin/python benchmarks/eval_batch.py   # an AVX2 CPU's kernels

The C allocator is set as a run sets it on this machine (hasten.machine.cpu_allocator: under glibc, a batch's
tensors kept in the heap), unless --allocator-defaults: with glibc's defaults every pass faults large batches'
activations in afresh, which weighs on them alone. `--precision bf16` runs the forward pass under bf16 autocast
as a bf16 run evaluates.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from hasten.engine.norms import folded_for_inference  # noqa: E402
from hasten.machine import apply_cpu_allocator, cpu_allocator  # noqa: E402
from hasten.machine import current as current_machine  # noqa: E402
from hasten.models import build_model  # noqa: E402
from hasten.recipe.schema import load_recipe  # noqa: E402

BATCHES = (16, 32, 64, 128, 256)
IMAGES = 1024
PASSES = 7


def per_image(side: int, recipe: str | None, channels: int, precision: str, passes: int) -> dict[int, float]:
    """Seconds per image at each batch of BATCHES, the best of `passes` passes over IMAGES images, of the recipe's
    model with its batch norms folded (as a CPU run evaluates it)."""
    model = build_model(load_recipe(recipe, []).model, (channels, side, side), 10).eval()
    model = folded_for_inference(model).to(memory_format=torch.channels_last)
    images = torch.randn(IMAGES, channels, side, side).contiguous(memory_format=torch.channels_last)
    autocast = torch.autocast("cpu", torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
    best = dict.fromkeys(BATCHES, float("inf"))
    with torch.no_grad(), autocast:
        for batch in BATCHES:  # a first pass at each batch: kernel selection, allocations
            model(images[:batch])
        for _ in range(passes):
            for batch in BATCHES:
                started = time.perf_counter()
                for first in range(0, IMAGES, batch):
                    model(images[first : first + batch]).float()
                best[batch] = min(best[batch], (time.perf_counter() - started) / IMAGES)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sides", nargs="*", type=int, help="image sides in pixels (default: 28 32 48 64 96)")
    parser.add_argument("--recipe", default=None, help="the recipe whose model is timed (default: the default recipe)")
    parser.add_argument("--channels", type=int, default=3, help="image channels (default 3)")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--passes", type=int, default=PASSES)
    parser.add_argument("--allocator-defaults", action="store_true", help="glibc's allocator as it comes")
    args = parser.parse_args(argv)
    if args.threads < 1 or args.passes < 1 or args.channels < 1 or any(side < 4 for side in args.sides):
        parser.error("--threads, --passes and --channels must be at least 1, every side at least 4")
    torch.set_num_threads(args.threads)
    machine = current_machine()
    settings = {} if args.allocator_defaults else cpu_allocator(machine, "cpu")
    taken = apply_cpu_allocator(settings)
    print(
        f"CPU: {machine.cpu} ({machine.kernels} kernels, {machine.cores} cores); {args.precision}, "
        f"{args.threads} thread(s), recipe {args.recipe or 'default'}, {args.channels} channel(s); "
        f"C allocator: {settings if taken else 'as it comes'}"
    )
    print("| side | " + " | ".join(str(batch) for batch in BATCHES) + " |")
    print("| --- |" + " --- |" * len(BATCHES))
    for side in args.sides or [28, 32, 48, 64, 96]:
        seconds = per_image(side, args.recipe, args.channels, args.precision, args.passes)
        fastest = min(seconds.values())
        cells = [f"**{1e3 * t:.3f}**" if t == fastest else f"{1e3 * t:.3f}" for t in seconds.values()]
        print(f"| {side} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
