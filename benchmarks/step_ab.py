"""A recipe's whole training step (the loop's `train_step`: precision, optimizer, EMA and every hook) under two
sets of overrides, A and B, built in one process and alternated in blocks of steps: the ratio B/A per round.

    .venv/bin/python benchmarks/step_ab.py --a model.pool_first=false --b model.pool_first=true \\
        precision=bf16 train.channels_last=true                  # fashion-fast's step, its two stage orders
    ONEDNN_MAX_CPU_ISA=AVX2 .venv/bin/python benchmarks/step_ab.py --a model.pool_first=false \\
        --b model.pool_first=true precision=fp32 train.channels_last=false    # an AVX2 CPU's kernels

On a shared machine, whole runs alternated in separate processes differ by 10% or more from one to the next; steps
alternated in one process, on the same batch, see the same drift, so their per-round ratio is what a change
buys. Both arms train on the recipe's first batch from their own initial weights; the data path, evaluation and
start-up are not in it (time whole runs for those: benchmarks/wallclock.py, benchmarks/commits.py).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hasten.experiments.bench import bare_step  # noqa: E402
from hasten.machine import current as current_machine  # noqa: E402
from hasten.recipe.schema import load_recipe  # noqa: E402


def arm(recipe_name: str, overrides: list[str]):
    """The recipe's bare step with `overrides` (hasten.experiments.bench.bare_step), warmed up by 5 steps."""
    return bare_step(load_recipe(recipe_name, overrides), warmup=5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="key=value overrides for both arms")
    parser.add_argument("--recipe", default="fashion-fast")
    parser.add_argument("--a", action="append", default=[], help="an override of arm A (the reference); repeatable")
    parser.add_argument("--b", action="append", required=True, help="an override of arm B; repeatable")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--steps", type=int, default=10, help="steps per arm per round")
    ns = parser.parse_args(argv)
    arms = {"A": arm(ns.recipe, [*ns.overrides, *ns.a]), "B": arm(ns.recipe, [*ns.overrides, *ns.b])}
    seconds: dict[str, list[float]] = {"A": [], "B": []}
    for round_ in range(ns.rounds):
        for name in ("A", "B") if round_ % 2 == 0 else ("B", "A"):
            trainer, images, labels, sync = arms[name]
            sync()
            started = time.perf_counter()
            for _ in range(ns.steps):
                trainer.train_step(images, labels)
            sync()
            seconds[name].append((time.perf_counter() - started) / ns.steps)
    ratios = [b / a for a, b in zip(seconds["A"], seconds["B"], strict=True)]
    low, _, high = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios[0], None, ratios[0])
    batch = len(arms["A"][2])
    machine = current_machine()
    print(f"recipe {ns.recipe} {' '.join(ns.overrides)}; A: {' '.join(ns.a) or '(as is)'}; B: {' '.join(ns.b)}")
    kind = f"{machine.cpu} ({machine.kernels} kernels, {machine.cores} cores)"
    print(f"CPU kind: {kind}; {ns.rounds} rounds of {ns.steps} steps")
    for name in ("A", "B"):
        median = statistics.median(seconds[name])
        print(f"{name}: {1000 * median:.1f} ms a step, {batch / median:,.0f} images/s (median)")
    print(f"B / A step time per round: median {statistics.median(ratios):.3f}, quartiles {low:.3f}-{high:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
