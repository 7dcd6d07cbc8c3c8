"""The generalization suite's judgement and report (benchmarks/generalization.py runs it): the four targets per
cell, the table, the failing cells per target, the cost of the runs and of the whole grid, and the plot.

Targets, per (dataset, budget) cell, over the seeds (all four must hold for OK):
  (a) the default's worst seed >= the plain baseline's median - 2 points;
  (b) the default's spread over seeds (max - min) <= 5 points;
  (c) the default's median wall time (the whole process, command to exit) <= the plain baseline's;
  (d) no default seed at chance: below chance + 10% of (1 - chance), as hasten's own at-chance warning says,
      chance being the test set's largest class share (1/classes on a balanced test set).
A failed default run fails (a), (b) and (d); a cell with runs missing is `incomplete`, not OK.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hasten.run.verdicts import chance_line, learnt_late
from hasten.runfolder.log import write_atomic

MARGIN = 0.02  # (a): how far the default's worst seed may lag the plain median
SPREAD = 0.05  # (b): the most the default's seeds may spread
TARGETS = {
    "a": "worst default seed >= plain median - 2 points",
    "b": "default spread over seeds (max - min) <= 5 points",
    "c": "default median wall time <= plain median wall time",
    "d": "no default seed at chance",
}
EPS = 1e-9  # accuracies are exact fractions: a tie is not a failure
FULL_BUDGETS = (1, 3, 5, 10)
FULL_SEEDS = 5


def chance_threshold(chance: float) -> float:
    """Accuracy below which a run is at chance: hasten's own line (hasten.run.verdicts), chance being the test
    set's largest class share."""
    return chance_line(chance)


def _pts(value: float) -> str:
    return f"{100 * value:.1f}"


def judge(
    default: dict[int, float | None],
    plain: dict[int, float | None],
    default_wall: dict[int, float | None],
    plain_wall: dict[int, float | None],
    chance: float,
) -> dict[str, dict[str, Any]]:
    """The four targets on one cell: seed -> test accuracy (None: the run failed) and seed -> wall seconds of
    each arm. Returns target -> {"ok": True | False | None (cannot be judged), "text": what was compared}."""
    checks: dict[str, dict[str, Any]] = {}
    failed = sorted(seed for seed, accuracy in default.items() if accuracy is None)
    good = {seed: accuracy for seed, accuracy in default.items() if accuracy is not None}
    plain_good = [accuracy for accuracy in plain.values() if accuracy is not None]
    failed_text = f"default seed(s) {', '.join(map(str, failed))} failed"
    # (a)
    if not default:
        checks["a"] = {"ok": None, "text": "no default runs"}
    elif failed:
        checks["a"] = {"ok": False, "text": failed_text}
    elif not plain_good:
        checks["a"] = {"ok": None, "text": "no plain run finished"}
    else:
        limit = statistics.median(plain_good) - MARGIN
        worst = min(good.values())
        ok = worst >= limit - EPS
        text = f"worst {_pts(worst)} vs plain median {_pts(limit + MARGIN)} - 2 = {_pts(limit)}"
        checks["a"] = {"ok": ok, "text": text if ok else f"{text}: {_pts(limit - worst)} points short"}
    # (b)
    if failed:
        checks["b"] = {"ok": False, "text": failed_text}
    elif not good:
        checks["b"] = {"ok": None, "text": "no default runs"}
    else:
        spread = max(good.values()) - min(good.values())
        ok = spread <= SPREAD + EPS
        text = f"spread {_pts(spread)} over {len(good)} seed(s)"
        checks["b"] = {"ok": ok, "text": text if ok else f"{text}: {_pts(spread - SPREAD)} points over 5"}
    # (c)
    walls = [wall for seed, wall in default_wall.items() if wall is not None and default.get(seed) is not None]
    plain_walls = [wall for seed, wall in plain_wall.items() if wall is not None and plain.get(seed) is not None]
    if not walls or not plain_walls:
        checks["c"] = {"ok": None, "text": "no finished default or plain run to time"}
    else:
        mine, theirs = statistics.median(walls), statistics.median(plain_walls)
        ok = mine <= theirs
        text = f"median {mine:.1f} s vs plain {theirs:.1f} s ({mine / theirs:.2f}x)"
        checks["c"] = {"ok": ok, "text": text if ok else f"{text}: {mine - theirs:.1f} s slower"}
    # (d)
    threshold = chance_threshold(chance)
    low = {seed: accuracy for seed, accuracy in good.items() if accuracy < threshold - EPS}
    if not default:
        checks["d"] = {"ok": None, "text": "no default runs"}
    elif failed or low:
        parts = [failed_text] if failed else []
        if low:
            seeds = ", ".join(f"{seed} ({_pts(accuracy)})" for seed, accuracy in sorted(low.items()))
            parts.append(f"seed(s) {seeds} below {_pts(threshold)}")
        checks["d"] = {"ok": False, "text": "; ".join(parts)}
    else:
        checks["d"] = {"ok": True, "text": f"every seed >= {_pts(threshold)}"}
    return checks


def wall_to(curve: Sequence[Sequence[float]] | None, accuracy: float) -> tuple[float, int] | None:
    """(wall seconds from the command, epoch) of the first epoch whose test accuracy reached `accuracy`, from a
    run's accuracy curve (per epoch: training seconds, step, test accuracy, wall seconds); None: never."""
    for epoch, point in enumerate(curve or [], start=1):
        if len(point) >= 4 and point[2] >= accuracy - EPS:
            return point[3], epoch
    return None


def slower_because(default: dict[str, Any], plain: dict[str, Any]) -> dict[str, Any]:
    """Why a cell's default took longer than the plain loop, in what the runs recorded: its optimizer steps
    against plain's at the same epochs (and the batches behind them), and when its runs passed the plain loop's
    median accuracy on the wall clock (what a user content with the plain loop's result waits for). Returns
    {"why": text, "to_plain": {seed: seconds or None}}; seeds without a recorded curve are left out."""
    parts = []
    steps = [v for v in default["steps"].values() if v]
    plain_steps = [v for v in plain["steps"].values() if v]
    if steps and plain_steps:
        ratio = statistics.median(steps) / statistics.median(plain_steps)
        batches = sorted({v for v in default["batch"].values() if v})
        batch_text = "/".join(map(str, batches)) or "?"
        plain_batch = "/".join(map(str, sorted({v for v in plain["batch"].values() if v}))) or "?"
        parts.append(f"{ratio:.1f}x plain's optimizer steps (batch {batch_text} against {plain_batch})")
    target = plain["accuracy_median"]
    reached: dict[int, tuple[float, int] | None] = {}
    if target is not None:
        reached = {seed: wall_to(curve, target) for seed, curve in default["curve"].items() if curve}
    if reached:
        times = [hit for hit in reached.values() if hit is not None]
        epochs = sorted({epoch for _, epoch in times})
        plain_wall = plain["wall_median"]
        if times:
            when = statistics.median(seconds for seconds, _ in times)
            at = f"epoch {epochs[0]}" if len(epochs) == 1 else f"epochs {epochs[0]}-{epochs[-1]}"
            side = "before" if when <= plain_wall else "after"
            parts.append(
                f"passed plain's median {_pts(target)}% at {when:.1f} s ({at}; {len(times)} of {len(reached)} "
                f"seeds), {side} plain's {plain_wall:.1f} s"
            )
        else:
            parts.append(f"no seed reached plain's median {_pts(target)}%")
    seconds = {seed: None if hit is None else hit[0] for seed, hit in reached.items()}
    return {"why": "; ".join(parts), "to_plain": seconds}


def short_because(default: dict[str, Any], plain: dict[str, Any], classes: int) -> dict[str, Any]:
    """Why a cell's worst default seed fell short, where its runs show it: it was at chance late in its run
    (hasten's own end-of-run warning says so to the user: `learnt_late`), and how the plain loop did on the same
    seed (the same initial weights and data order)."""
    finished = {seed: accuracy for seed, accuracy in default["accuracy"].items() if accuracy is not None}
    if not finished:
        return {}
    worst = min(finished, key=lambda seed: finished[seed])
    parts = []
    late = learnt_late(default["curve"].get(worst) or [], classes)
    if late is not None:
        until, total = late
        parts.append(f"seed {worst} was at chance until step {until:,} of {total:,} ({until / total:.0%})")
    theirs = plain["accuracy"].get(worst)
    if theirs is not None:
        parts.append(f"plain's seed {worst}: {_pts(theirs)}%")  # the same initial weights and order are slow for both
    return {"why": "; ".join(parts)} if parts else {}


def verdict(checks: dict[str, dict[str, Any]], complete: bool) -> str:
    """OK when all four targets hold on every planned run, FAIL when one does not, else incomplete."""
    if any(check["ok"] is False for check in checks.values()):
        return "FAIL" if complete else "FAIL (incomplete)"
    if complete and all(check["ok"] for check in checks.values()):
        return "OK"
    return "incomplete"


def _stats(values: Sequence[float | None]) -> dict[str, float | None]:
    finished = [v for v in values if v is not None]
    if not finished:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(finished), "min": min(finished), "max": max(finished)}


def cells(runs: list[dict[str, Any]], shares: dict[str, list[float]]) -> list[dict[str, Any]]:
    """One row per (dataset, budget), in the order the runs were planned: each arm's accuracies (median, min, max
    over seeds) and median wall and training seconds, the default's recorded epochs, the targets, the verdict."""
    rows = []
    for name, budget in dict.fromkeys((r["dataset"], r["budget"]) for r in runs):
        mine = [r for r in runs if r["dataset"] == name and r["budget"] == budget]
        chance = max(shares[name])
        row: dict[str, Any] = {"dataset": name, "budget": budget, "chance": chance, "classes": len(shares[name])}
        for arm in ("default", "plain", "naive"):
            arm_runs = [r for r in mine if r["arm"] == arm]
            made = [r for r in arm_runs if not r.get("missing")]
            row[arm] = {
                "seeds": [r["seed"] for r in arm_runs],
                "accuracy": {r["seed"]: r.get("test_accuracy") for r in made},
                "wall": {r["seed"]: r.get("process_seconds") for r in made},
                "missing": [r["seed"] for r in arm_runs if r.get("missing")],
                "errors": sorted({r["error"] for r in made if r.get("error")}),
                "warnings": sorted({str(w) for r in made for w in (r.get("warnings") or [])}),
                "epochs": sorted({r["epochs"] for r in made if r.get("epochs") is not None}),
                "steps": {r["seed"]: r.get("steps") for r in made},
                "batch": {r["seed"]: r.get("global_batch") for r in made},
                "curve": {r["seed"]: r.get("accuracy_curve") for r in made},
            }
            row[arm] |= {f"accuracy_{k}": v for k, v in _stats(list(row[arm]["accuracy"].values())).items()}
            row[arm]["wall_median"] = _stats(list(row[arm]["wall"].values()))["median"]
            row[arm]["train_seconds_median"] = _stats([r.get("train_seconds") for r in made])["median"]
        default, plain = row["default"], row["plain"]
        row["epochs"] = sorted(
            {r.get("recorded_epochs") or r.get("epochs") for r in mine if r["arm"] == "default"} - {None}
        )
        row["targets"] = judge(default["accuracy"], plain["accuracy"], default["wall"], plain["wall"], chance)
        if row["targets"]["c"]["ok"] is False:
            row["targets"]["c"] |= slower_because(default, plain)
        if row["targets"]["a"]["ok"] is False:
            row["targets"]["a"] |= short_because(default, plain, row["classes"])
        complete = not default["missing"] and not plain["missing"]
        row["verdict"] = verdict(row["targets"], complete)
        rows.append(row)
    return rows


def _acc(arm: dict[str, Any]) -> str:
    if arm["accuracy_median"] is None:
        return "failed" if arm["accuracy"] else "not run"
    spread = f" ({_pts(arm['accuracy_min'])}-{_pts(arm['accuracy_max'])})" if len(arm["accuracy"]) > 1 else ""
    return _pts(arm["accuracy_median"]) + spread


def _wall(arm: dict[str, Any]) -> str:
    return "-" if arm["wall_median"] is None else f"{arm['wall_median']:.1f}"


def _epochs(row: dict[str, Any]) -> str:
    if row["budget"] != "recipe":
        return row["budget"]
    epochs = row["epochs"]
    shown = "?" if not epochs else str(epochs[0]) if len(epochs) == 1 else f"{epochs[0]}-{epochs[-1]}"
    return f"recipe: {shown}"


def _verdict_text(row: dict[str, Any]) -> str:
    failing = [
        f"{t}: {c['text']}" + (f" ({c['why']})" if c.get("why") else "")
        for t, c in row["targets"].items()
        if c["ok"] is False
    ]
    if row["verdict"] == "OK":
        return "OK"
    missing = len(row["default"]["missing"]) + len(row["plain"]["missing"])
    note = [f"{missing} run(s) missing"] if missing else []
    return f"**{row['verdict']}** " + "; ".join(failing + note)


def estimate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The seconds the runs took (each distinct run once) and, per dataset, the whole grid's (FULL_SEEDS seeds x
    FULL_BUDGETS and the recipe's own epochs x 3 arms) from a fit of wall = fixed + per_epoch x epochs per arm
    over this report's runs; None for an arm run at fewer than two budgets."""
    distinct = {r["key"]: r for r in runs if r.get("key") and r.get("process_seconds") is not None}
    spent = sum(r["process_seconds"] for r in distinct.values())
    per_dataset: dict[str, Any] = {}
    for name in dict.fromkeys(r["dataset"] for r in distinct.values()):
        mine = [r for r in distinct.values() if r["dataset"] == name]
        recipe_epochs = sorted(
            {r.get("recorded_epochs") for r in mine if r["budget"] == "recipe" and r["arm"] == "default"} - {None}
        )
        budgets = sorted(set(FULL_BUDGETS) | set(recipe_epochs[:1]))
        total, fits = 0.0, {}
        for arm in ("default", "plain", "naive"):
            points = [
                (r["epochs"] or r["recorded_epochs"], r["process_seconds"])
                for r in mine
                if r["arm"] == arm and (r["epochs"] or r.get("recorded_epochs"))
            ]
            if len({e for e, _ in points}) < 2:
                total = None
                break
            fixed, per_epoch = _line(points)
            if per_epoch <= 0:  # (runs at other loads or from other passes): a line that says nothing of the grid
                total = None
                break
            fits[arm] = {"fixed_seconds": round(fixed, 1), "seconds_per_epoch": round(per_epoch, 2)}
            total += FULL_SEEDS * sum(fixed + per_epoch * e for e in budgets)
        if total is not None and total <= 0:
            total = None
        per_dataset[name] = {"fits": fits, "full_grid_seconds": None if total is None else round(total)}
    return {"seconds_spent": round(spent), "datasets": per_dataset}


def _line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares intercept and slope through (x, y) points."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    slope, intercept = statistics.linear_regression(xs, ys)
    return intercept, slope


def write_report(results: dict[str, Any], path: Path) -> str:
    """report.md: the command and how it ran, the table, failing cells per target, cost, warnings and errors."""
    rows, runs = results["cells"], results["runs"]
    verdicts = [row["verdict"] for row in rows]
    made = [r for r in runs if not r.get("missing") and r.get("process_seconds") is not None]
    loads = [r["load_before"] for r in made if r.get("load_before") is not None]
    env = results["environment"]
    how = f"{results['jobs']} run(s) at once, train.threads={results['threads']} each" + (
        " (a faster, noisier pass: wall times are not those of one run alone)" if results["jobs"] > 1 else ""
    )
    lines = [
        "# Generalization suite",
        "",
        f"Command: `{results['command']}`",
        "",
        f"Recipe under test: {results['recipe']}. Seeds {', '.join(map(str, results['seeds']))}; budgets "
        f"{', '.join(results['budgets'])} (epochs; recipe: the recipe's own). Ran {how}, on {env.get('machine')} "
        f"({env.get('cpu_count')} CPUs), torch {env.get('torch_version')}, hasten {env.get('hasten_version')} "
        f"(commit {env.get('git_commit') or 'unknown'})"
        + (
            f"; load average before each run: median {statistics.median(loads):.1f}, max {max(loads):.1f}"
            if loads
            else ""
        )
        + ".",
        "",
        "Arms: **default** (the recipe, only the data and the budget given), **plain** (the same model, Adam 1e-3, "
        "constant LR, batch 64, no tricks, augmentation or TTA, fp32, no probe), **naive** (the textbook loop: "
        "batch 32, Adam 1e-3, fp32). Accuracy: test accuracy in percent, median (min-max) over seeds. Wall: median "
        "seconds of the whole process, command to exit.",
        "",
        "Targets: " + "; ".join(f"({t}) {text}" for t, text in TARGETS.items()) + ".",
        "",
        f"**{verdicts.count('OK')} of {len(rows)} cells OK**"
        + "".join(f", {verdicts.count(v)} {v}" for v in ("FAIL", "FAIL (incomplete)", "incomplete") if v in verdicts)
        + ".",
        "",
        "| target | failing cells |",
        "| --- | ---: |",
        *(
            f"| ({t}) {text} | {sum(1 for r in rows if r['targets'][t]['ok'] is False)} |"
            for t, text in TARGETS.items()
        ),
        "",
        "| dataset | epochs | chance | default | plain | naive | wall s default / plain / naive | verdict |",
        "| --- | --- | ---: | --- | --- | ---: | --- | --- |",
    ]
    for r in rows:
        naive = "not run" if r["naive"]["accuracy_median"] is None else _pts(r["naive"]["accuracy_median"])
        lines.append(
            f"| {r['dataset']} | {_epochs(r)} | {_pts(r['chance'])} | {_acc(r['default'])} | {_acc(r['plain'])} "
            f"| {naive} | {_wall(r['default'])} / {_wall(r['plain'])} / {_wall(r['naive'])} | {_verdict_text(r)} |"
        )
    fashion = [r for r in rows if r["dataset"] == "fashion-full"]
    if fashion:
        lines += ["", "Fashion-MNIST, the data the recipes were tuned on (target: 93% within the recipe's budget, "
                  "the time to 93% no longer than today's):", ""]  # fmt: skip
        for r in fashion:
            mine = [
                run
                for run in runs
                if (run["dataset"], run["budget"], run["arm"]) == ("fashion-full", r["budget"], "default")
            ]
            times = [run.get("seconds_to_93") for run in mine if not run.get("missing")]
            reached = [t for t in times if t is not None]
            median = f", median {statistics.median(reached):.1f} training seconds to 93%" if reached else ""
            lines.append(f"- {_epochs(r)} epochs: {len(reached)} of {len(times)} default seeds reach 93%{median}")
    lines += ["", "## Datasets", ""]
    for name, note in results["datasets"].items():
        text = note.get("generated") or (
            "an image folder of your own (--folder)" if note.get("folder") else "registered dataset"
        )
        if note.get("test_subset"):
            text += f"; judged on the first {note['test_subset']:,} test images"
        if note.get("sha256"):
            text += f"; images SHA-256 {note['sha256'][:16]}"
        lines.append(f"- `{name}`: {text} (`{' '.join(note['overrides'])}`)")
    cost = estimate(runs)
    reused = sum(1 for r in made if r.get("reused_from_other_code"))
    reused_text = f"; {reused} baseline run(s) reused from other hasten source" if reused else ""
    hours = cost["seconds_spent"] / 3600
    lines += [
        "",
        "## Cost",
        "",
        f"These runs took {hours:.2f} h of process time (each distinct run once){reused_text}.",
    ]
    full = {name: d["full_grid_seconds"] for name, d in cost["datasets"].items()}
    if any(v is not None for v in full.values()):
        lines += ["Whole grid (5 seeds x budgets 1, 3, 5, 10 and the recipe's x 3 arms), from a fit of wall = fixed + "
                  "per epoch x epochs to these runs:", ""]  # fmt: skip
        lines += [f"- {name}: {v / 3600:.2f} h" for name, v in full.items() if v is not None]
    notes = [
        f"- {r['dataset']} {_epochs(r)} {arm}: {kind}: {text[:300]}"
        for r in rows
        for arm in ("default", "plain", "naive")
        for kind, texts in (("error", r[arm]["errors"]), ("warning", r[arm]["warnings"] if arm == "default" else []))
        for text in texts
    ]
    lines += ["", "## Errors, and the default's warnings", "", *(notes or ["none"]), ""]
    lines += ["![default against plain: accuracy and wall time](generalization.png)", ""]
    text = "\n".join(lines)
    write_atomic(path, text)
    return text


def plot(rows: list[dict[str, Any]], path: Path) -> Path:
    """Two panels, one point per cell: the default's median accuracy against the plain baseline's (bars: min to
    max over seeds), and the default's median wall time against plain's; below the diagonal the default wins
    time, above it the default wins accuracy."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (acc_ax, wall_ax) = plt.subplots(1, 2, figsize=(13, 6))
    acc_ax.plot([0, 100], [0, 100], color="grey", lw=1, ls="--", label="default = plain")
    walls = []
    for r in rows:
        d, p = r["default"], r["plain"]
        colour, marker = ("tab:green", "o") if r["verdict"] == "OK" else ("tab:red", "x")
        label = f"{r['dataset']}/{r['budget']}"
        if d["accuracy_median"] is not None and p["accuracy_median"] is not None:
            x, y = 100 * p["accuracy_median"], 100 * d["accuracy_median"]
            acc_ax.errorbar(x, y, yerr=[[y - 100 * d["accuracy_min"]], [100 * d["accuracy_max"] - y]],
                            xerr=[[x - 100 * p["accuracy_min"]], [100 * p["accuracy_max"] - x]],
                            color=colour, marker=marker, ms=5, lw=0.8, capsize=2)  # fmt: skip
            acc_ax.annotate(label, (x, y), fontsize=6, alpha=0.8)
        if d["wall_median"] and p["wall_median"]:
            wall_ax.scatter(p["wall_median"], d["wall_median"], color=colour, marker=marker)
            wall_ax.annotate(label, (p["wall_median"], d["wall_median"]), fontsize=6, alpha=0.8)
            walls += [p["wall_median"], d["wall_median"]]
    acc_ax.set(xlabel="plain baseline test accuracy (%)", ylabel="default test accuracy (%)", xlim=(0, 100),
               ylim=(0, 100), title="Accuracy per cell (median, min-max over seeds; red x: not OK)")  # fmt: skip
    acc_ax.legend(loc="upper left")
    if walls:
        low, high = min(walls) / 1.3, max(walls) * 1.3
        wall_ax.plot([low, high], [low, high], color="grey", lw=1, ls="--", label="default = plain")
        wall_ax.set(xscale="log", yscale="log", xlim=(low, high), ylim=(low, high))
        for axis in (wall_ax.xaxis, wall_ax.yaxis):
            axis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
            axis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        wall_ax.legend(loc="upper left")
    wall_ax.set(xlabel="plain baseline wall seconds (median)", ylabel="default wall seconds (median)",
                title="Wall time per cell, command to exit (above the diagonal: slower)")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
