"""The clock a user waits on: `hasten train fashion-fast` as a command, timed from outside, against a baseline.

Each run is a fresh process of `python -m hasten train RECIPE` started by this script, which notes the moment
just before it starts it; every time below counts from that moment. Three kinds of run, interleaved over
`--repeats` (the order rotated each repeat, so drift of a shared machine hits all alike):

- **before**: the baseline checkout (`--before`, a worktree of the commit to compare with, with its own venv);
- **first**: this checkout with an empty cache folder (`HASTEN_CACHE`): what `make demo` does on a fresh machine;
- **second**: this checkout again, right after its first run, with the cache that run left (the probe's result).

Per run: the whole command (start to exit), the training seconds (its summary.json), the wall-clock time to each
accuracy threshold and to the end of its first training step read from the run's TensorBoard events (their wall
times against the start; the same reading for every kind, so the baseline needs no change of its code), and for
this checkout's runs their own summary's `time_to_accuracy_wall` and `startup_seconds` beside. Then the targets:
the command's wall time over its training time (at most 1.15), the wall-clock time to 93% (the last of
`--thresholds`) over the baseline's (at
most 0.65, medians of the same repeats), and a second run's start-up over its first's (at most 0.5).

    .venv/bin/python benchmarks/wallclock.py --before /work/wt/clock-before --repeats 3 \\
        --out docs/results/wallclock.md train.threads=1
    .venv/bin/python benchmarks/wallclock.py --before 28eda3d --recipe seed-cnn-32 \\
        --thresholds 0.25,0.3 data.root=bench/data/letters      # a folder run, beside a commit

writes the report (markdown, with this command) to --out and every run's numbers beside it as JSON.

The regression guard (`make bench-guard BEFORE=REF`): the headline recipe and one folder run, each alternated with
the commit REF in one sitting. `--before` takes a checkout (its own .venv, else this one's Python) or a git
commit, checked out into a temporary worktree for the sitting. The report names the CPU kind (hasten.machine's
kernel set: avx2, avx512-bf16, amx, ...), the CPU time other work took during every run (a busy machine is
said loudly: its timings are noise), and each epoch's throughput and test accuracy per kind, so a change that is
slower on one machine kind is seen on that kind.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hasten.experiments.interleave import rotated
from hasten.machine import ActivityMeter, with_children_cpu_seconds
from hasten.machine import current as current_machine

ROOT = Path(__file__).resolve().parents[1]
THRESHOLDS = ("0.90", "0.91", "0.92", "0.93")
BUSY_LOAD = 1.5  # a load average at or above this around a run, where other work was not measured
# other processes' (and a hypervisor's other guests') CPU time during a run at or above this share of the machine's:
# the run shared its cores, its timing is noise. The load average cannot say this: it counts the run itself.
BUSY_OTHERS_SHARE = 0.1


def others_during(command: list[str], **run: Any) -> tuple[int, dict[str, float] | None]:
    """Run `command` (subprocess.run keywords in `run`); its exit code, and the CPU time other work took meanwhile:
    {"cpus": CPUs' worth of it, "share": of all the machine's CPU time}, None where /proc/stat cannot be read."""
    meter = ActivityMeter(own_clock=with_children_cpu_seconds)
    meter.start()
    code = subprocess.run(command, **run).returncode
    activity = meter.stop()
    if activity is None:
        return code, None
    return code, {"cpus": round(activity.others_cpus, 3), "share": round(activity.others_share, 3)}


def busy_line(runs: list[dict[str, Any]]) -> tuple[bool, str]:
    """Whether other work shared the machine during any run, and the report's line saying how much."""
    shares = [r["others"]["share"] for r in runs if r.get("others")]
    loads = [r[key] for r in runs for key in ("load_before", "load_after") if r.get(key) is not None]
    if shares:
        busy = max(shares) >= BUSY_OTHERS_SHARE
        line = (
            f"Other work during the runs (CPU time of other processes and guests, /proc/stat less this bench's "
            f"own): median {statistics.median(shares):.0%}, max {max(shares):.0%} of the machine's CPU time"
        )
        limit = f"{BUSY_OTHERS_SHARE:.0%} or more of its CPU time went to other work during a run"
    else:
        busy = max(loads, default=0.0) >= BUSY_LOAD
        line = (f"Load average (1 min) around the runs: median {statistics.median(loads):.2f}, max {max(loads):.2f}"
                if loads else "Other work on the machine: not recorded")  # fmt: skip
        limit = f"a load average of {BUSY_LOAD} or more"
    if busy:
        line = (f"**warning: the machine was busy** ({limit}, on {os.cpu_count()} CPUs): these timings are noise, "
                f"not a regression or a gain. {line}.")  # fmt: skip
    return busy, line


TARGETS = {"wall_over_train": 1.15, "to_93_over_before": 0.65, "second_startup_over_first": 0.5}


def board_events(run_dir: Path) -> dict[str, list[tuple[float, int, float]]]:
    """Every scalar of the run's TensorBoard events: tag -> [(wall time, step, value)]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    found: dict[str, list[tuple[float, int, float]]] = {}
    for events in sorted((run_dir / "tensorboard").glob("events.out.tfevents.*")):
        accumulator = EventAccumulator(str(events), size_guidance={"scalars": 0})
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            found.setdefault(tag, []).extend((e.wall_time, e.step, e.value) for e in accumulator.Scalars(tag))
    return found


def one_run(
    kind: str,
    tree: Path,
    python: Path,
    recipe: str,
    overrides: list[str],
    out: Path,
    cache: Path,
    thresholds: tuple[str, ...] = THRESHOLDS,
) -> dict:
    run_dir = out / "runs" / kind
    command = [str(python), "-m", "hasten", "train", recipe, *overrides, f"run.dir={run_dir}", "run.overwrite=true"]
    env = os.environ | {"HASTEN_CACHE": str(cache), "PYTHONPATH": str(tree)}
    log = out / f"{kind}.log"
    load_before = os.getloadavg()[0]
    with open(log, "w") as stream:
        started = time.time()
        code, others = others_during(command, cwd=tree, env=env, stdout=stream, stderr=subprocess.STDOUT)
        ended = time.time()
    if code != 0:
        raise SystemExit(f"{kind}: exit {code}; see {log}")
    summary = json.loads((run_dir / "summary.json").read_text())
    events = board_events(run_dir)
    accuracy = sorted(events.get("test_accuracy", []))
    first_step = min((e for e in events.get("train_loss_per_step", [])), default=None)
    return {
        "kind": kind,
        "command": shlex.join(command),
        "wall_seconds": round(ended - started, 3),
        "train_seconds": summary["train_seconds"],
        "test_accuracy": summary["test_accuracy"],
        "precision": summary.get("precision"),
        "channels_last": summary.get("channels_last"),
        # from the events, the same reading for every kind of run
        "to_first_step": round(first_step[0] - started, 3) if first_step else None,
        "to_accuracy": {
            t: next((round(w - started, 3) for w, _, v in accuracy if v >= float(t)), None) for t in thresholds
        },
        # the run's own account (this checkout's runs only)
        "summary_to_accuracy_wall": summary.get("time_to_accuracy_wall"),
        "summary_startup_seconds": summary.get("startup_seconds"),
        "summary_startup": summary.get("startup"),
        "summary_wall_seconds": summary.get("wall_seconds"),
        "eval_seconds": summary.get("eval_seconds"),
        "run_dir": str(run_dir),
        "load_before": round(load_before, 2),
        "load_after": round(os.getloadavg()[0], 2),
        "others": others,
        "per_epoch": per_epoch(run_dir),
    } | from_summary(summary, thresholds)


def per_epoch(run_dir: Path) -> list[dict[str, float]]:
    """Each epoch's training throughput and test accuracy, from the run's metrics.csv (both versions write it)."""
    import csv

    path = run_dir / "metrics.csv"
    if not path.is_file():
        return []
    with open(path, newline="") as stream:
        rows = list(csv.DictReader(stream))

    def number(row: dict[str, str], key: str) -> float | None:
        try:
            return float(row[key])
        except (KeyError, TypeError, ValueError):
            return None

    return [{"epoch": int(float(row["epoch"])), "images_per_second": number(row, "images_per_second"),
             "test_accuracy": number(row, "test_accuracy")} for row in rows if row.get("epoch")]  # fmt: skip


def from_summary(summary: dict[str, Any], thresholds: tuple[str, ...] = THRESHOLDS) -> dict[str, Any]:
    """What every kind's summary.json says: the training seconds to each threshold (both versions record the
    fixed 90-94% ones; another threshold has none there)."""
    return {"train_to_accuracy": {t: (summary.get("time_to_accuracy") or {}).get(t) for t in thresholds}}


def parse_thresholds(text: str) -> tuple[str, ...]:
    """`--thresholds 0.3,0.35`: test accuracies (fractions, ascending) the report times; the last is the one the
    targets compare with the baseline's."""
    try:
        values = sorted(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated accuracies, e.g. 0.90,0.93") from None
    if not values or not all(0 < v <= 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: accuracies are fractions in (0, 1], e.g. 0.90,0.93")
    return tuple(f"{v:.2f}" for v in values)


def spread(values: list[float]) -> dict[str, float] | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def cell(value: dict[str, float] | None, digits: int = 1) -> str:
    if not value:
        return "—"
    return f"{value['median']:.{digits}f} ({value['min']:.{digits}f}–{value['max']:.{digits}f})"


def report(runs: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    kinds = ("before", "first", "second")
    by = {k: [r for r in runs if r["kind"] == k] for k in kinds}
    thresholds = tuple(meta.get("thresholds") or THRESHOLDS)
    top = thresholds[-1]  # the accuracy the targets time against the baseline's
    name = f"{float(top):.0%}"

    for run in runs:  # the wall clock to the top threshold that was start-up, probe and evaluations
        wall, train = run["to_accuracy"].get(top), run["train_to_accuracy"].get(top)
        run["not_training_to_top"] = round(wall - train, 3) if wall is not None and train is not None else None

    def stat(kind: str, key: str, sub: str | None = None) -> dict[str, float] | None:
        return spread([(r[key] or {}).get(sub) if sub else r[key] for r in by[kind]])

    rows = ["| | before | first (empty cache) | second (cached) |", "| :--- | ---: | ---: | ---: |"]
    lines = {
        "command, start to exit (s)": ("wall_seconds", None),
        "training (s, summary.json)": ("train_seconds", None),
        "start to the end of the first training step (s)": ("to_first_step", None),
        **{f"start to {float(t):.0%} test accuracy (s)": ("to_accuracy", t) for t in thresholds},
        f"training seconds to {name} (summary.json)": ("train_to_accuracy", top),
        f"of the start to {name}, not training (s)": ("not_training_to_top", None),
        "evaluation (s, summary.json)": ("eval_seconds", None),
        "start-up to the first step (s, summary.json)": ("summary_startup_seconds", None),
    }
    for label, (key, sub) in lines.items():
        rows.append(f"| {label} | " + " | ".join(cell(stat(k, key, sub)) for k in kinds) + " |")
    accuracy = " | ".join(cell(stat(k, "test_accuracy"), 4) for k in kinds)
    rows.append(f"| test accuracy | {accuracy} |")

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a and b else None

    pairs = list(zip(by["before"], by["first"], by["second"], strict=False))  # the runs of one repeat
    ratios = {
        "first: command over training": spread([ratio(f["wall_seconds"], f["train_seconds"]) for _, f, _ in pairs]),
        "second: command over training": spread([ratio(s["wall_seconds"], s["train_seconds"]) for _, _, s in pairs]),
        f"first: to {name} over before's": spread(
            [ratio(f["to_accuracy"].get(top), b["to_accuracy"].get(top)) for b, f, _ in pairs]
        ),  # fmt: skip
        f"second: to {name} over before's": spread(
            [ratio(s["to_accuracy"].get(top), b["to_accuracy"].get(top)) for b, _, s in pairs]
        ),  # fmt: skip
        "second's start-up over first's (to the first step)": spread(
            [ratio(s["to_first_step"], f["to_first_step"]) for _, f, s in pairs]
        ),
    }
    asked = {
        "first: command over training": TARGETS["wall_over_train"],
        "second: command over training": TARGETS["wall_over_train"],
        f"first: to {name} over before's": TARGETS["to_93_over_before"],
        f"second: to {name} over before's": TARGETS["to_93_over_before"],
        "second's start-up over first's (to the first step)": TARGETS["second_startup_over_first"],
    }
    target_rows = [
        "| ratio (per repeat, then median and range) | measured | asked | met |",
        "| :--- | ---: | ---: | --- |",
    ]
    for name, value in ratios.items():
        met = "—" if not value else "yes" if value["median"] <= asked[name] else "no"
        target_rows.append(f"| {name} | {cell(value, 3)} | ≤ {asked[name]} | {met} |")
    epochs = sorted({e["epoch"] for r in runs for e in r.get("per_epoch") or []})
    epoch_rows = ["| epoch | images/s: " + " | images/s: ".join(kinds) + " | accuracy: " + " | accuracy: ".join(kinds)
                  + " |", "| ---: |" + " ---: |" * (2 * len(kinds))]  # fmt: skip
    for epoch in epochs:

        def at(kind: str, key: str, epoch: int = epoch) -> dict[str, float] | None:
            return spread([e[key] for r in by[kind] for e in r.get("per_epoch") or [] if e["epoch"] == epoch])

        speeds = " | ".join(cell(at(k, "images_per_second"), 0) for k in kinds)
        accuracies = " | ".join(cell(at(k, "test_accuracy"), 4) for k in kinds)
        epoch_rows.append(f"| {epoch} | {speeds} | {accuracies} |")
    _, load_line = busy_line(runs)
    startup = [r["summary_startup"] for r in by["first"] + by["second"] if r.get("summary_startup")]
    phases = list(dict.fromkeys(phase for s in startup for phase in s))  # in the order the start-up passes them
    startup_rows = [
        "| start-up phase (s, summary.json) | first (empty cache) | second (cached) |",
        "| :--- | ---: | ---: |",
    ]
    for phase in phases:
        cells = [cell(spread([(r["summary_startup"] or {}).get(phase) for r in by[k]]), 2) for k in ("first", "second")]
        startup_rows.append(f"| {phase} | {' | '.join(cells)} |")
    return "\n".join(
        [
            f"# The clock a user waits on: `hasten train {meta['recipe']}`, before and now",
            "",
            f"`{meta['command']}`",
            "",
            f"{meta['repeats']} repeat(s), interleaved (order rotated each repeat; first and second back to back), "
            f"{meta['started']} to {meta['finished']}. Machine: {meta['machine']}; CPU kind: "
            f"**{meta.get('cpu_kind', 'not recorded')}**. "
            f"Baseline: `{meta['before_commit']}`; now: `{meta['after_commit']}`. "
            f"Every run: `python -m hasten train {meta['recipe']} {' '.join(meta['overrides'])}`, a fresh process; "
            "times from the moment this script started it. "
            "Median (min–max) over the repeats.",
            "",
            load_line,
            "",
            *rows,
            "",
            "Each epoch, median (min–max) over the repeats (metrics.csv):",
            "",
            *epoch_rows,
            "",
            "Times to accuracy and to the first step are read from each run's TensorBoard events (their wall times "
            "against the process's start), for the baseline and now alike; the summary.json rows are the runs' own "
            "account (this checkout only: the baseline has none). Start-up: from the command's start to its first "
            "training step.",
            "",
            *target_rows,
            "",
            *startup_rows,
            "",
        ]
    )


def baseline_tree(before: str, work: Path, name: str = "before-tree") -> Path:
    """--before as a checkout: a folder as it is, or a commit of this repository checked out (detached) into the
    worktree `work/name` for the sitting (made once: a later call for the same name reuses it)."""
    path = Path(before)
    if path.is_dir():
        return path.resolve()
    tree = work / name
    if tree.is_dir():
        return tree
    made = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), before],
                          capture_output=True, text=True)  # fmt: skip
    if made.returncode != 0:
        raise SystemExit(f"{before}: neither a folder nor a commit of {ROOT}: {made.stderr.strip()}")
    return tree


def python_of(tree: Path) -> Path:
    """The tree's own .venv's Python, else this one (each run puts the tree first on PYTHONPATH)."""
    own = tree / ".venv" / "bin" / "python"
    return own if own.is_file() else Path(sys.executable)


def cpu_kind() -> str:
    """The CPU as hasten's machine rules read it: its name and kernel set (avx2, avx512-bf16, amx, ...)."""
    identity = current_machine().identity()
    return f"{identity.get('cpu')} ({identity.get('kernels')} kernels, {identity.get('cores')} cores)"


def git_commit(tree: Path) -> str:
    out = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short=10", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()  # fmt: skip
    return out.stdout.strip() + (" (with uncommitted changes)" if dirty else "")


def absolute_root(override: str) -> str:
    """`data.root=bench/data/letters` -> the absolute path, where that folder exists relative to here."""
    key, _, value = override.partition("=")
    if key == "data.root" and value and not Path(value).is_absolute() and Path(value).exists():
        return f"{key}={Path(value).resolve()}"
    return override


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="key=value overrides for every run, e.g. train.threads=1")
    before_help = "the baseline: a checkout (its own .venv, else this Python) or a git commit of this repository"
    parser.add_argument("--before", required=True, help=before_help)
    parser.add_argument("--recipe", default="fashion-fast")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="bench/wallclock/report.md", help="the report (markdown); JSON beside it")
    parser.add_argument(
        "--thresholds",
        type=parse_thresholds,
        default=THRESHOLDS,
        help="test accuracies to time, comma-separated (default 0.90,0.91,0.92,0.93); the last is compared with "
        "the baseline's: set them to what a folder run reaches",
    )
    parser.add_argument("--redo", metavar="JSON", help="write the report again from a finished bench's JSON")
    ns = parser.parse_args()
    if ns.redo:  # the runs' folders are still there: what a newer report reads of their summaries is read again
        saved = json.loads(Path(ns.redo).read_text())
        for run in saved["runs"]:
            folder = Path(run.get("run_dir") or shlex.split(run["command"])[-2].removeprefix("run.dir="))
            thresholds = tuple(saved["meta"].get("thresholds") or THRESHOLDS)
            summary = json.loads((folder / "summary.json").read_text())
            run |= {"run_dir": str(folder)} | from_summary(summary, thresholds)
        Path(ns.out).write_text(report(saved["runs"], saved["meta"]))
        Path(ns.out).with_suffix(".json").write_text(json.dumps(saved, indent=2) + "\n")
        print(Path(ns.out).read_text())
        return 0
    out_file = Path(ns.out)
    # every run starts in its own tree: a folder named relative to here is named absolutely, the same for both
    ns.overrides = [absolute_root(o) for o in ns.overrides]
    work = Path(tempfile.mkdtemp(prefix="hasten-wallclock-"))
    before = baseline_tree(ns.before, work)
    trees = {"before": (before, python_of(before)), "now": (ROOT, python_of(ROOT))}
    meta = {
        "command": shlex.join(["python", *sys.argv]),
        "repeats": ns.repeats,
        "recipe": ns.recipe,
        "overrides": ns.overrides,
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "before_commit": git_commit(before),
        "after_commit": git_commit(ROOT),
        "cpu_kind": cpu_kind(),
        "thresholds": list(ns.thresholds),
    }
    try:
        meta["machine"] = next(
            line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ) + f", {os.cpu_count()} CPUs"  # fmt: skip
    except (OSError, StopIteration):
        pass
    runs: list[dict[str, Any]] = []
    try:
        for repeat in range(ns.repeats):
            for which in rotated(["before", "now"], repeat):
                tree, python = trees[which]
                if which == "before":
                    kinds = [("before", work / f"r{repeat}-before-cache")]
                else:  # a fresh cache, then the same one again
                    cache = work / f"r{repeat}-cache"
                    kinds = [("first", cache), ("second", cache)]
                for kind, cache in kinds:
                    out = work / f"r{repeat + 1}"
                    out.mkdir(parents=True, exist_ok=True)
                    record = one_run(kind, tree, python, ns.recipe, ns.overrides, out, cache, ns.thresholds)
                    record["repeat"] = repeat + 1
                    runs.append(record)
                    to_top = record["to_accuracy"][ns.thresholds[-1]]
                    to_top = to_top if to_top is None else round(to_top, 1)
                    seconds = f"{record['wall_seconds']:.1f} s command, {record['train_seconds']:.1f} s"
                    print(f"r{repeat + 1} {kind}: {seconds} "
                          f"training, to {float(ns.thresholds[-1]):.0%}: {to_top} s, first step at "
                          f"{record['to_first_step']} s", file=sys.stderr, flush=True)  # fmt: skip
            meta["finished"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
            out_file.parent.mkdir(parents=True, exist_ok=True)  # after every repeat: a stopped bench leaves its numbers
            out_file.write_text(report(runs, meta))
            out_file.with_suffix(".json").write_text(json.dumps({"meta": meta, "runs": runs}, indent=2) + "\n")
    finally:  # a failed run too: the sitting's own checkout of a commit goes
        if before.parent == work:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(before)], capture_output=True)
    print(out_file.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
