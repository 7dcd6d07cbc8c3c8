"""How often the start-up probe's choice flips: the precision, layout and batch the default recipe decides on this
machine, over repeated cold starts (a fresh probe cache each), on an idle machine and with a second process busy
on every core, and what a run started later on an idle machine reads from a cache the busy one filled.

Each trial is its own process that builds the run (`hasten.run.build.build`: data, model, the probe, the batch
timing) and prints what it decided, so the same script measures any checkout (`--root`): the code before a change
and after it, one after the other in one sitting.

    .venv/bin/python benchmarks/probe_stability.py                          # this checkout, 5 trials a condition
    .venv/bin/python benchmarks/probe_stability.py --root /tmp/before --trials 5 --label before
    .venv/bin/python benchmarks/probe_stability.py data.subset=10000        # overrides for the recipe

The busy process is torch multiplying 1024x1024 matrices on as many threads as the machine has cores, started a
second before each trial and stopped after it. Prints a table and writes it, with every trial's lines, to
bench/probe-stability/<label>.json.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TRIAL = """
import json, sys, time
from hasten.recipe.schema import load_recipe
from hasten.run.build import build
started = time.perf_counter()
recipe = load_recipe(None, sys.argv[1:])
parts = build(recipe)
chosen = parts.recipe
print("CHOICE " + json.dumps({"precision": chosen.precision, "channels_last": chosen.train.channels_last,
                               "batch": chosen.train.batch_size, "seconds": time.perf_counter() - started}))
"""

BUSY = """
import os, time, torch
torch.set_num_threads(os.cpu_count() or 1)
a = torch.randn(1024, 1024)
end = time.time() + 600
while time.time() < end:
    a = (a @ a).clamp_(-1, 1)
"""


def trial(python: str, root: Path, cache: Path, overrides: list[str], busy: bool) -> dict:
    env = {**os.environ, "HASTEN_CACHE": str(cache), "PYTHONPATH": str(root)}
    loader = subprocess.Popen([python, "-c", BUSY]) if busy else None
    try:
        if loader:
            time.sleep(1.0)
        done = subprocess.run([python, "-c", TRIAL, *overrides], cwd=root, env=env, capture_output=True, text=True,
                              timeout=600)  # fmt: skip
    finally:
        if loader:
            loader.kill()
            loader.wait()
    line = next((line for line in done.stdout.splitlines() if line.startswith("CHOICE ")), None)
    if line is None:
        return {"error": done.stderr[-2000:]}
    found = json.loads(line[len("CHOICE ") :])
    found["lines"] = [line for line in done.stderr.splitlines() if "auto" in line or "probe" in line or "kept" in line]
    return found


def key(found: dict) -> str:
    if "error" in found:
        return "failed"
    return f"{found['precision']}{' channels_last' if found['channels_last'] else ''} batch {found['batch']}"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to measure (default: this one)")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--label", default="this")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    overrides = ["run.progress=false", "run.tensorboard=false", *args.overrides]
    results: dict[str, list[dict]] = collections.defaultdict(list)
    for condition, busy in (("cold, idle", False), ("cold, busy", True)):
        for _ in range(args.trials):
            with tempfile.TemporaryDirectory() as cache:
                results[condition].append(trial(args.python, args.root, Path(cache), overrides, busy))
            print(condition, key(results[condition][-1]), flush=True)
    # a cache filled while the machine was busy, then read by runs on an idle machine
    with tempfile.TemporaryDirectory() as cache:
        results["busy first, cache kept"].append(trial(args.python, args.root, Path(cache), overrides, True))
        for _ in range(2):
            results["idle after it, same cache"].append(trial(args.python, args.root, Path(cache), overrides, False))
    print(f"\n{args.label} ({args.root}):\n\n| condition | trials | choices |\n| --- | --- | --- |")
    for condition, found in results.items():
        counts = collections.Counter(key(f) for f in found)
        print(f"| {condition} | {len(found)} | {'; '.join(f'{k} x{n}' for k, n in counts.most_common())} |")
    out = ROOT / "bench" / "probe-stability"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.label}.json").write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
