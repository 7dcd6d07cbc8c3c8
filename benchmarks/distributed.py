"""Data-parallel training measured: 1 process against 2 (gloo), and what large global batches do to accuracy.

Part 1, one machine: the default recipe trained for the same epochs at the same global batch by 1 process
(batch B, torch's threads on both cores) and by 2 processes through `hasten train --devices 2` (B/2 each, one
thread each), side by side: training images/s, test accuracy, and the time one gradient all-reduce takes (a
tensor of the model's parameter count, all-reduced by 2 gloo processes, median of many) beside the step time.
On a 2-core CPU both runs share the same 2 cores, so this does not show a speed-up from more hardware: it
shows what splitting the work into processes costs (communication, one thread per process) against one
process using both cores, and that accuracy is unchanged. On a machine with N GPUs, N processes bring N
devices; the communication time is what to weigh against the step time there too.

Part 2, large batches (Goyal et al., 2017): accuracy after a fixed epoch budget at global batch 128, 512 and
2048, with the LR held at its batch-128 value and no warmup, against the linear scaling rule (LR x batch/128)
with a linear warmup over the first epoch. Cosine decay after the warmup in both, and no weight EMA (at batch
2048 the whole run is ~120 steps, within a 0.99 average's horizon). One process trains these:
the global batch, not the process count, sets the arithmetic (2 processes with B/2 each reproduce 1 with B,
tests/engine/test_distributed.py), and one process is the faster way to get these numbers on 2 cores.

    .venv/bin/python benchmarks/distributed.py            # ~10 min on 2 cores: results in bench/distributed/
    .venv/bin/python benchmarks/distributed.py --quick    # a smoke run: a small subset, 1 epoch
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HASTEN = [sys.executable, "-m", "hasten"]


def train(run_dir: Path, overrides: list[str], devices: int = 1) -> dict[str, Any]:
    """`hasten train fashion-fast OVERRIDES` (through torchrun's launcher with devices > 1); its summary."""
    run_dir.mkdir(parents=True, exist_ok=True)
    command = [*HASTEN, "train", "fashion-fast", *overrides, f"run.dir={run_dir}", "run.progress=false"]
    command += [f"--devices={devices}"] if devices > 1 else []
    with open(run_dir / "output.log", "w") as log:
        code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode
    if code != 0:
        sys.exit(f"failed (exit {code}): {' '.join(command)}; see {run_dir / 'output.log'}")
    return json.loads((run_dir / "summary.json").read_text()) | {"command": " ".join(command[2:])}


def allreduce_worker(out: str, numel: int, repeats: int) -> None:
    """In each of 2 processes (under torchrun): time all-reducing a gradient-sized fp32 tensor."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    grads = torch.randn(numel)
    times = []
    for i in range(repeats + 5):
        dist.barrier()
        started = time.perf_counter()
        dist.all_reduce(grads)
        if i >= 5:  # the first few set up connections and buffers
            times.append(time.perf_counter() - started)
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps({"numel": numel, "seconds": times}))
    dist.destroy_process_group()


def allreduce_seconds(out: Path, numel: int, repeats: int = 200) -> float:
    from hasten.engine.distributed import launch

    code = launch(2, ["--allreduce-worker", str(out), str(numel), str(repeats)], script=os.path.abspath(__file__))
    if code != 0:
        sys.exit(f"the all-reduce timing failed (exit {code})")
    return statistics.median(json.loads(out.read_text())["seconds"])


def parameter_count(overrides: list[str]) -> int:
    from hasten.models import build_model
    from hasten.recipe.schema import load_recipe

    recipe = load_recipe("fashion-fast", overrides)
    return sum(p.numel() for p in build_model(recipe.model, (1, 28, 28), 10).parameters())


def processes(out: Path, epochs: int, data: list[str]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Part 1: 1 process vs 2 at global batch 256; the all-reduce time of the model's gradients."""
    common = [*data, f"train.epochs={epochs}"]
    runs = [
        {"name": "1 process, batch 256, 2 threads"} | train(out / "one", [*common, "train.batch_size=256"]),
        {"name": "2 processes x batch 128, 1 thread each"}
        | train(out / "two", [*common, "train.batch_size=128", "train.threads=1"], devices=2),
    ]
    numel = parameter_count(common)
    seconds = allreduce_seconds(out / "allreduce.json", numel)
    step = 256 / runs[1]["images_per_second"]
    comm = {"parameters": numel, "allreduce_ms": seconds * 1e3, "step_ms_2proc": step * 1e3, "share": seconds / step}
    return runs, comm


LARGE_BATCHES = [128, 512, 2048]


def large_batch(out: Path, epochs: int, data: list[str]) -> list[dict[str, Any]]:
    """Part 2: the LR held at its batch-128 value without warmup, against linear scaling with warmup."""
    rules = {
        "LR 0.1 at every batch, no warmup": ["optim.base_batch=null", "schedule.warmup=0"],
        "linear scaling (0.1 per 128) + 1 epoch warmup": ["optim.base_batch=128", f"schedule.warmup={1 / epochs:.4f}"],
    }
    results = []
    for batch in LARGE_BATCHES:  # interleaved: both rules at one batch size before the next
        for rule, overrides in rules.items():
            changes = [*data, f"train.epochs={epochs}", f"train.batch_size={batch}", "optim.lr=0.1"]
            # no weight EMA: at batch 2048 the run has ~120 steps, and a 0.99 average would still hold the start
            changes += ["schedule.name=cosine", "tricks.ema=0", "train.threads=2", *overrides]
            summary = train(out / f"b{batch}-{'scaled' if 'linear' in rule else 'fixed'}", changes)
            results.append({"batch": batch, "rule": rule} | summary)
    return results


def report(runs: list[dict[str, Any]], comm: dict[str, Any], large: list[dict[str, Any]], command: str) -> str:
    from hasten.runfolder.log import environment

    env = environment()
    lines = [
        "# Data-parallel training: 1 process vs 2, and large global batches",
        "",
        f"`{command}` on {env['machine']}, {env['cpu_count']} CPU cores, torch {env['torch_version']}, "
        f"hasten {env['hasten_version']} (git {env['git_commit']}).",
        "",
        "## 1 process vs 2 gloo processes, same global batch (256), same epochs",
        "",
        "| run | images/s | training s | test accuracy |",
        "|---|---:|---:|---:|",
    ]
    for run in runs:
        lines.append(
            f"| {run['name']} | {run['images_per_second']:,.0f} | {run['train_seconds']:.1f} | "
            f"{run['test_accuracy']:.4f} |"
        )
    ratio = runs[1]["images_per_second"] / runs[0]["images_per_second"]
    lines += [
        "",
        f"2 processes / 1 process throughput: **{ratio:.2f}x**. One all-reduce of the model's "
        f"{comm['parameters']:,} fp32 gradients between the 2 gloo processes: **{comm['allreduce_ms']:.2f} ms** "
        f"(median), against a step of {comm['step_ms_2proc']:.1f} ms in the 2-process run: "
        f"{comm['share']:.1%} of the step if it did not overlap backward (DDP overlaps it with backward).",
        "",
        "Both runs share the same 2 cores: this measures the cost of splitting one machine's work into processes "
        "(communication, one thread each), not a speed-up from more hardware, which needs more devices.",
        "",
        f"## Large global batches: accuracy after {large[0]['epochs']} epochs",
        "",
        "| global batch | LR rule | peak LR | test accuracy | training s |",
        "|---:|---|---:|---:|---:|",
    ]
    for run in large:
        lines.append(
            f"| {run['batch']} | {run['rule']} | {run['lr']:.3g} | {run['test_accuracy']:.4f} | "
            f"{run['train_seconds']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--allreduce-worker":
        allreduce_worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="bench/distributed", help="output folder (default bench/distributed)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs of part 1 (default 2)")
    parser.add_argument("--large-epochs", type=int, default=4, help="epochs of part 2 (default 4)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 4096 images, 1 epoch each")
    args = parser.parse_args()
    out = Path(args.out)
    data = ["data.subset=4096", "data.test_subset=1024"] if args.quick else []
    epochs, large_epochs = (1, 1) if args.quick else (args.epochs, args.large_epochs)
    command = "python benchmarks/distributed.py" + " --quick" * args.quick
    runs, comm = processes(out, epochs, data)
    large = large_batch(out, large_epochs, data)
    text = report(runs, comm, large, command)
    (out / "report.md").write_text(text)
    (out / "results.json").write_text(
        json.dumps({"processes": runs, "allreduce": comm, "large_batch": large}, indent=2)
    )
    print(text)
    print(f"written: {out / 'report.md'}, {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
