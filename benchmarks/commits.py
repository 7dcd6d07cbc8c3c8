"""Several commits side by side, alternated in one sitting: per-epoch training throughput and test accuracy of one
`hasten train` command at each, for a bisect on the machine at hand.

Each commit is checked out (detached) into a worktree under --work for the sitting, and run as a fresh process of
`python -m hasten train RECIPE OVERRIDES` with that tree first on PYTHONPATH (this venv's Python: the commits must
run on today's packages). Each round runs every commit once, the order rotated a step each round, so a shared
machine's drift falls on all alike; the CPU time other work took during every run is in the table (/proc/stat less
this bench's own children's), and a run during which it reached BUSY_OTHERS_SHARE of the machine is marked busy (its
timing is noise). Throughput and accuracy are read from each run's metrics.csv, which every version writes.

    .venv/bin/python benchmarks/commits.py 28eda3d 773fbdd a86495c HEAD --rounds 2 \\
        --out bench/commits/report.md train.epochs=1 precision=bf16 train.channels_last=false

A commit is anything `git worktree add` takes (a hash, a tag, HEAD); "." runs this checkout as it is.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from benchmarks.wallclock import (  # noqa: E402
    BUSY_OTHERS_SHARE,
    baseline_tree,
    busy_line,
    cpu_kind,
    git_commit,
    others_during,
)


def checkout(commit: str, work: Path) -> Path:
    """A worktree of `commit` under `work` (made once; "." is this checkout)."""
    return ROOT if commit == "." else baseline_tree(commit, work, f"tree-{commit}")


def epochs_of(run_dir: Path) -> tuple[list[float], list[float]]:
    """(images/s, test accuracy) per epoch, from the run's metrics.csv."""
    with open(run_dir / "metrics.csv", newline="") as stream:
        rows = [row for row in csv.DictReader(stream) if row.get("epoch")]
    return (
        [round(float(row["images_per_second"])) for row in rows],
        [round(100 * float(row["test_accuracy"]), 2) for row in rows],
    )


def one_run(commit: str, tree: Path, recipe: str, overrides: list[str], run_dir: Path) -> dict:
    command = [sys.executable, "-m", "hasten", "train", recipe, *overrides, f"run.dir={run_dir}", "run.overwrite=true"]
    load_before = os.getloadavg()[0]
    started = time.time()
    log = run_dir.parent / f"{run_dir.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as stream:
        env = os.environ | {"PYTHONPATH": str(tree)}
        code, others = others_during(command, cwd=tree, env=env, stdout=stream, stderr=subprocess.STDOUT)
    wall = time.time() - started
    load_after = os.getloadavg()[0]
    if code != 0:
        raise SystemExit(f"{commit}: exit {code}: {shlex.join(command)}; see {log}")
    throughput, accuracy = epochs_of(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "commit": commit,
        "wall_seconds": round(wall, 1),
        "train_seconds": summary.get("train_seconds"),
        "eval_seconds": summary.get("eval_seconds"),
        "images_per_second": throughput,
        "test_accuracy": accuracy,
        "precision": summary.get("precision"),
        "channels_last": summary.get("channels_last"),
        "load": [round(load_before, 2), round(load_after, 2)],
        "others": others,
    }


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def report(runs: list[dict], commits: list[str], meta: dict) -> str:
    busy, busy_said = busy_line(runs)
    lines = [
        f"# {meta['recipe']} at {len(commits)} commits, alternated", "", f"`{meta['command']}`", "",
        f"CPU: {meta['cpu']}; {meta['rounds']} round(s), the order rotated each round.", "", busy_said, "",
        "| commit | round | images/s per epoch | test accuracy per epoch (%) | training s | evaluation s "
        "| command to exit s | precision, channels_last | other work (share of the CPU time) |",
        "| --- | ---: | --- | --- | ---: | ---: | ---: | --- | ---: |",
    ]  # fmt: skip
    for run in sorted(runs, key=lambda r: (commits.index(r["commit"]), r["round"])):
        share = (run.get("others") or {}).get("share")
        other = "-" if share is None else f"{share:.0%}{' **busy**' if share >= BUSY_OTHERS_SHARE else ''}"
        lines.append(
            f"| {run['commit']} ({run['tree_commit']}) | {run['round']} | "
            f"{', '.join(f'{v:,}' for v in run['images_per_second'])} | "
            f"{', '.join(f'{v:.2f}' for v in run['test_accuracy'])} | {run['train_seconds']:.1f} | "
            f"{_seconds(run.get('eval_seconds'))} | {run['wall_seconds']:.1f} | {run['precision']}, "
            f"{run['channels_last']} | {other} |"
        )
    lines += ["", "| commit | median images/s (all epochs, all rounds) |", "| --- | ---: |"]
    for commit in commits:
        values = [v for r in runs if r["commit"] == commit for v in r["images_per_second"]]
        lines.append(f"| {commit} | {statistics.median(values):,.0f} |" if values else f"| {commit} | - |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("commits", nargs="+", help="commits to run ('.': this checkout); overrides after them")
    parser.add_argument("--recipe", default="fashion-fast")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--work", default="bench/commits/work", help="worktrees, and run folders under runs/OUT's stem")
    parser.add_argument("--out", default="bench/commits/report.md", help="the report (markdown); JSON beside it")
    args = parser.parse_intermixed_args()
    if not 1 <= args.rounds <= 20:
        parser.error(f"--rounds {args.rounds}: between 1 and 20")
    commits = [c for c in args.commits if "=" not in c]
    overrides = [c for c in args.commits if "=" in c]
    work, out = Path(args.work).resolve(), Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    trees = {commit: checkout(commit, work) for commit in commits}
    runs: list[dict] = []
    for round_ in range(args.rounds):
        shift = round_ % len(commits)
        for commit in commits[shift:] + commits[:shift]:
            run = one_run(
                commit, trees[commit], args.recipe, overrides, work / "runs" / out.stem / f"{commit}-{round_}"
            )
            run |= {"round": round_, "tree_commit": git_commit(trees[commit])}
            print(json.dumps(run), flush=True)
            runs.append(run)
    meta = {
        "recipe": args.recipe,
        "rounds": args.rounds,
        "cpu": cpu_kind(),
        "command": shlex.join(["python", "benchmarks/commits.py", *sys.argv[1:]]),
    }
    out.write_text(report(runs, commits, meta))
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "runs": runs}, indent=1))
    print(f"report: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
