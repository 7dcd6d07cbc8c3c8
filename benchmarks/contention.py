"""Training while another process holds a core: OpenMP threads that spin while they wait against threads that sleep.

    python benchmarks/contention.py [--repeats 3] [--busy 0,1] [--workloads small,folder,headline]
                                    [--out bench/contention] [--report docs/results/contention.md]

On a CPU, torch's intra-op threads (GNU OpenMP) meet at a barrier after every parallel region. Where
OMP_WAIT_POLICY is unset, a thread that arrives first spins for GOMP_SPINCOUNT=300,000 iterations (about 3 ms) before
it sleeps; while another process holds a core, the thread it waits for is not running, and the spinner takes the core
that thread needs. Threads that sleep at once (OMP_WAIT_POLICY=PASSIVE) do not, but pay a wake-up at every barrier
on an idle machine. This benchmark runs the same `hasten train` commands in four arms, alternated in one sitting:

- spin: GOMP_SPINCOUNT=300000 in the environment (libgomp's own default, which hasten then leaves as it is: what a
  plain PyTorch script gets);
- passive: OMP_WAIT_POLICY=PASSIVE (a waiting thread sleeps at once);
- brief: OMP_WAIT_POLICY=PASSIVE with GOMP_SPINCOUNT=10000 (a spin of about 0.1 ms, then sleep: a middle way);
- hasten: the environment without OMP_WAIT_POLICY and GOMP_SPINCOUNT (what `hasten train` decides: passive where
  other processes kept half a core or more busy as it started, else the default);

each with `--busy` competing processes (a Python loop each, started before the run and ended after it: 0 is the idle
machine). Workloads: `small`, the default recipe on scikit-learn's digits at batch 32 for 3 epochs; `folder`, the
default recipe on a drawn folder of 300 + 100 grey 28 px glyphs at batch 32 for 6 epochs (the size of a user's first
folder); `headline`, fashion-fast for one epoch. Per run: training milliseconds per optimizer step and the wall
seconds from the command (summary.json), test accuracy. The busy loops start before the run, so `hasten` sees
them as it starts. Medians and min-max over the repeats; the ratios are taken round by round (each arm over
hasten). Writes results.json (machine, versions, load averages) under --out and the report to --report.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hasten.experiments.interleave import rotated
from hasten.experiments.report import markdown_table
from hasten.machine import current
from hasten.runfolder.log import environment, write_atomic

ARMS = {
    "spin": {"GOMP_SPINCOUNT": "300000"},  # libgomp's default: spin about 3 ms, then sleep
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},  # sleep at once
    "brief": {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "10000"},  # spin about 0.1 ms, then sleep
    "hasten": {},  # what the `hasten` command decides (hasten/threads.py)
}
WORKLOADS = {
    "small": ["data.name=digits", "train.epochs=3", "train.batch_size=32"],
    "folder": ["data.name=imagefolder", "data.root={folder}", "train.epochs=6", "train.batch_size=32"],
    "headline": ["fashion-fast", "train.epochs=1"],
}
BUSY_LOOP = "while True: pass"


def draw_glyphs(root: Path, train: int = 30, val: int = 10) -> None:
    """Ten classes of digits drawn in DejaVu Sans, 28 px grey, jittered in place and size: `train` + `val` a class."""
    import numpy
    from PIL import Image, ImageDraw, ImageFont

    rng = numpy.random.default_rng(0)
    font_path = next(Path("/usr/share/fonts").rglob("DejaVuSans.ttf"), None)
    for split, count in (("train", train), ("val", val)):
        for digit in range(10):
            folder = root / split / str(digit)
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                size = int(rng.integers(16, 24))
                font = ImageFont.truetype(str(font_path), size) if font_path else ImageFont.load_default()
                image = Image.new("L", (28, 28))
                ImageDraw.Draw(image).text((int(rng.integers(2, 10)), int(rng.integers(0, 6))), str(digit), 255, font)
                image.save(folder / f"{i}.png")


def run(workload: list[str], arm: dict[str, str], busy: int, folder: Path, run_dir: Path) -> dict:
    """One `hasten train` of `workload` in `arm`'s environment beside `busy` competing loops: its summary's times."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")} | arm
    command = [sys.executable, "-m", "hasten", "train", *(word.format(folder=folder) for word in workload)]
    command += [f"run.dir={run_dir}", "run.progress=false", "seed=0"]
    loops = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(busy)]
    time.sleep(0.5 if loops else 0)  # the loops spinning before the command starts (and looks)
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True)
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    shutil.rmtree(run_dir)
    return {
        "ms_per_step": 1000 * summary["train_seconds"] / summary["steps"],
        "wall_seconds": summary["wall_seconds"],
        "test_accuracy": summary["test_accuracy"],
        "steps": summary["steps"],
    }


def spread(values: list[float], digits: int = 1) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--busy", default="0,1", help="competing busy processes, a comma-separated list (0: idle)")
    parser.add_argument("--workloads", default="small,folder,headline", help=f"of {', '.join(WORKLOADS)}")
    parser.add_argument("--out", default="bench/contention")
    parser.add_argument("--report", default="docs/results/contention.md")
    args = parser.parse_args(argv)
    busy_levels = [int(level) for level in args.busy.split(",")]
    workloads = args.workloads.split(",")
    unknown = [name for name in workloads if name not in WORKLOADS]
    if unknown:
        parser.error(f"--workloads: {', '.join(unknown)}: not one of {', '.join(WORKLOADS)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    results: list[dict] = []
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "glyphs"
        draw_glyphs(folder)
        cells = [(name, busy) for name in workloads for busy in busy_levels]
        for repeat in range(args.repeats):
            for name, busy in cells:
                for arm in rotated(list(ARMS), repeat):
                    row = run(WORKLOADS[name], ARMS[arm], busy, folder, Path(scratch) / "run")
                    row |= {"workload": name, "busy": busy, "arm": arm, "repeat": repeat}
                    print(json.dumps(row), file=sys.stderr)
                    results.append(row)
    load_after = os.getloadavg()
    machine = current()
    write_atomic(out / "results.json", json.dumps({
        "machine": machine.record(),
        "environment": environment(), "load_before": load_before, "load_after": load_after, "results": results,
    }, indent=2))  # fmt: skip
    rows = []
    others = [arm for arm in ARMS if arm != "hasten"]
    for name, busy in ((name, busy) for name in workloads for busy in busy_levels):
        cell = {arm: [r for r in results if (r["workload"], r["busy"], r["arm"]) == (name, busy, arm)] for arm in ARMS}
        row = [name, str(busy)]
        row += [spread([r["ms_per_step"] for r in cell[arm]]) for arm in ARMS]
        for arm in others:  # round by round: each arm's run over the hasten arm's run of the same round
            ratios = [a["ms_per_step"] / h["ms_per_step"] for a, h in zip(cell[arm], cell["hasten"], strict=True)]
            row.append(spread(ratios, 2))
        row += [spread([r["wall_seconds"] for r in cell[arm]]) for arm in ARMS]
        row += [spread([100 * r["test_accuracy"] for r in cell[arm]]) for arm in ARMS]
        rows.append(row)
    header = ["workload", "busy", *(f"{arm} ms/step" for arm in ARMS), *(f"{arm} / hasten" for arm in others),
              *(f"{arm} wall s" for arm in ARMS), *(f"{arm} acc %" for arm in ARMS)]  # fmt: skip
    table = markdown_table(header, rows)
    report = Path(args.report)
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(
        "# Training beside a busy process: threads that spin against threads that sleep\n\n"
        f"Machine: {machine.cpu} ({machine.kernels} kernels), {machine.cores} cores. "
        f"Load average before {load_before[0]:.2f}, after {load_after[0]:.2f}. "
        f"{args.repeats} rounds, arms alternated.\n\n"
        f"    python benchmarks/contention.py --repeats {args.repeats} --busy {args.busy} "
        f"--workloads {args.workloads}\n\n"
        f"{table}\n"
    )
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
