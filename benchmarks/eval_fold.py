"""The evaluation's forward pass with and without batch norm folded into the convolutions
(hasten.engine.norms.folded_for_inference), alternated in one process: images/s of each and the fold's own cost.

    .venv/bin/python benchmarks/eval_fold.py                       # fashion-fast's ResNet, batch 64, bf16
    .venv/bin/python benchmarks/eval_fold.py --recipe default --size 32 --channels 3 --precision fp32

One thread by default (as the runs' evaluations on a 2-core machine share it with nothing else); the batch-norm
statistics are set away from their initial values so that folding changes the weights.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hasten.engine.norms import folded_for_inference  # noqa: E402
from hasten.models import build_model  # noqa: E402
from hasten.recipe.schema import load_recipe  # noqa: E402


def seconds_per_batch(model: torch.nn.Module, images: torch.Tensor, precision: str, repeats: int) -> float:
    autocast = torch.autocast("cpu", torch.bfloat16) if precision == "bf16" else nullcontext()
    started = time.perf_counter()
    with torch.no_grad(), autocast:
        for _ in range(repeats):
            model(images)
    return (time.perf_counter() - started) / repeats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="fashion-fast")
    parser.add_argument("--size", type=int, default=28)
    parser.add_argument("--channels", type=int, default=1)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    recipe = load_recipe(args.recipe, [])
    model = build_model(recipe.model, (args.channels, args.size, args.size), 10)
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 2.0)
    model = model.to(memory_format=torch.channels_last).eval()
    started = time.perf_counter()
    folded = folded_for_inference(model)
    fold_ms = (time.perf_counter() - started) * 1000
    images = torch.randn(args.batch, args.channels, args.size, args.size).to(memory_format=torch.channels_last)
    for candidate in (model, folded, model, folded):  # warm-up
        seconds_per_batch(candidate, images, args.precision, 3)
    times: dict[str, list[float]] = {"as trained": [], "folded": []}
    for _ in range(args.rounds):
        times["as trained"].append(seconds_per_batch(model, images, args.precision, 20))
        times["folded"].append(seconds_per_batch(folded, images, args.precision, 20))
    print(f"{args.recipe}, {args.size} px x {args.channels}, batch {args.batch}, {args.precision}, "
          f"{args.threads} thread(s); folding took {fold_ms:.0f} ms")  # fmt: skip
    for name, values in times.items():
        print(f"{name}: {args.batch / statistics.median(values):,.0f} images/s (median of {args.rounds})")
    print(f"folded / as trained: {statistics.median(times['as trained']) / statistics.median(times['folded']):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
