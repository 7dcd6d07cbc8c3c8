"""One report from two passes of the generalization suite: the default arm of the cells a later pass ran (after a
change to the default's rules) beside the plain and naive runs of an earlier pass, where the later pass ran the
default alone (`--arms default`). Only the default arm is taken from the later pass; the report says which cells
and which commands made each. With `--cells`, every arm of each cell the later pass ran is taken from it (a change
that moved the default's epochs moves the baselines', which run at them).

    .venv/bin/python benchmarks/generalization_merge.py bench/models/results.json bench/models-bn/results.json \\
        --out bench/models-merged
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import generalization_report as report  # noqa: E402


def merged(earlier: dict, later: dict, whole_cells: bool = False) -> dict:
    """`earlier`'s runs, with the default arm of every cell `later` ran replaced by `later`'s default runs (with
    `whole_cells`, every arm of those cells by `later`'s)."""
    taken = ("default", "plain", "naive") if whole_cells else ("default",)
    redone = {run["dataset"] for run in later["runs"] if run["arm"] == "default"}
    runs = [r for r in earlier["runs"] if not (r["arm"] in taken and r["dataset"] in redone)]
    runs += [r for r in later["runs"] if r["arm"] in taken and r["dataset"] in redone]
    order = {cell["dataset"]: i for i, cell in enumerate(earlier["cells"])}
    runs.sort(key=lambda r: (order.get(r["dataset"], len(order)), r["seed"]))
    # what a cell reads of the class shares: the largest (chance) and their count
    shares = {cell["dataset"]: [cell["chance"]] + [0.0] * (cell["classes"] - 1)
              for cell in (*earlier["cells"], *later["cells"])}  # fmt: skip
    result = dict(earlier)
    result["runs"], result["cells"] = runs, report.cells(runs, shares)
    which = "every arm" if whole_cells else "the default arm"
    result["command"] = f"{earlier['command']}; {which} of {', '.join(sorted(redone))}: {later['command']}"
    plain_epochs = {(r["dataset"], r["seed"]): r.get("epochs") for r in runs if r["arm"] == "plain"}
    result["epochs_differ"] = [
        f"{r['dataset']} seed {r['seed']}: default {r.get('recorded_epochs')}, plain and naive "
        f"{plain_epochs.get((r['dataset'], r['seed']))}"
        for r in later["runs"]
        if not whole_cells
        and r["arm"] == "default"
        and r.get("recorded_epochs") != plain_epochs.get((r["dataset"], r["seed"]))
    ]
    result["passes"] = {
        "earlier": earlier["environment"].get("git_commit"),
        "later": later["environment"].get("git_commit"),
    }
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("earlier", help="results.json of the pass whose plain and naive runs are kept")
    parser.add_argument("later", help="results.json of the pass whose default runs replace the earlier's")
    parser.add_argument("--out", required=True)
    parser.add_argument("--cells", action="store_true", help="take every arm of the cells the later pass ran")
    args = parser.parse_args(argv)
    earlier, later = (json.loads(Path(p).read_text()) for p in (args.earlier, args.later))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = merged(earlier, later, args.cells)
    (out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    report.plot(result["cells"], out / "generalization.png")
    text = report.write_report(result, out / "report.md")
    if result["epochs_differ"]:  # the baselines ran at the epochs the earlier pass's default chose
        text += (
            "\nRuns whose default (later pass) chose other epochs than the earlier pass's default, at whose epochs "
            "plain and naive ran: " + "; ".join(result["epochs_differ"]) + ".\n"
        )
        (out / "report.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
