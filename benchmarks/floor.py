"""A recipe against its FLOP floor on this machine: the matmul peak in the run's precision, the recipe's FLOP per
training image and for its whole budget, the seconds that budget takes at the peak (the floor), and the bare step's
images/s and share of the peak (the training step alone on one batch in memory: hasten.experiments.bench).

    .venv/bin/python benchmarks/floor.py fashion-fast precision=fp32 train.channels_last=true   # an AVX2 run's choice
    .venv/bin/python benchmarks/floor.py fashion-fast precision=bf16 train.channels_last=true   # a Zen 4's

Give the precision and layout the run took (summary.json): `auto` here would probe again. A run's time to accuracy
over the floor is the ratio the speed targets read (docs/results/). The C allocator is set as a run sets it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from hasten.engine.precision import compute_dtype  # noqa: E402
from hasten.experiments.bench import bare_step_images_per_second, flops_per_image  # noqa: E402
from hasten.experiments.flops import matmul_peak  # noqa: E402
from hasten.machine import apply_cpu_allocator, cpu_allocator  # noqa: E402
from hasten.machine import current as current_machine  # noqa: E402
from hasten.recipe.schema import load_recipe  # noqa: E402
from hasten.run.assemble import train_size  # noqa: E402
from hasten.run.build import dataset  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("overrides", nargs="*", help="key=value; give precision and train.channels_last")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=4, help="bare-step timings of 20 steps each")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    recipe = load_recipe(args.recipe, args.overrides)
    if "auto" in (recipe.precision, recipe.train.channels_last):
        parser.error("give precision and train.channels_last as the run took them (its summary.json)")
    apply_cpu_allocator(cpu_allocator(current_machine(), "cpu"))
    peak, size = matmul_peak(compute_dtype(recipe.precision), torch.device("cpu"), min_seconds=2.0)
    per_image = flops_per_image(recipe)
    epochs = recipe.train.epochs
    images = train_size(dataset(recipe)) * epochs if isinstance(epochs, int) else None
    rates = [bare_step_images_per_second(recipe, steps=20) for _ in range(args.rounds)]
    rate = statistics.median(rates)
    print(f"machine: {current_machine().describe()}, {args.threads} threads")
    print(f"{recipe.precision} matmul peak: {peak / 1e9:.1f} GFLOP/s ({size}x{size})")
    print(f"FLOP per training image (forward and backward): {per_image / 1e6:.2f} M")
    if images:
        total = per_image * images
        print(f"{epochs} epochs, {images:,} images: {total / 1e12:.2f} TFLOP, {total / peak:.1f} s at the peak (floor)")
    print(f"bare step: {', '.join(f'{r:,.0f}' for r in rates)} images/s; median {rate:,.0f}, "
          f"{rate * per_image / peak:.1%} of the peak")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
