"""One report from two passes of the generalization suite: the default arm of the cells a later pass ran (after a
change to the default's rules) beside the plain and naive runs of an earlier pass, where the later pass ran the
default alone (`--arms default`). Only the default arm is taken from the later pass; the report says which cells
and which commands made each.

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


def merged(earlier: dict, later: dict) -> dict:
    """`earlier`'s runs, with the default arm of every cell `later` ran replaced by `later`'s default runs."""
    redone = {run["dataset"] for run in later["runs"] if run["arm"] == "default"}
    runs = [r for r in earlier["runs"] if not (r["arm"] == "default" and r["dataset"] in redone)]
    runs += [r for r in later["runs"] if r["arm"] == "default"]
    order = {cell["dataset"]: i for i, cell in enumerate(earlier["cells"])}
    runs.sort(key=lambda r: (order.get(r["dataset"], len(order)), r["seed"]))
    shares = {cell["dataset"]: [cell["chance"]] * cell["classes"] for cell in earlier["cells"]}  # balanced test sets
    result = dict(earlier)
    result["runs"], result["cells"] = runs, report.cells(runs, shares)
    result["command"] = f"{earlier['command']}; the default arm of {', '.join(sorted(redone))}: {later['command']}"
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
    args = parser.parse_args(argv)
    earlier, later = (json.loads(Path(p).read_text()) for p in (args.earlier, args.later))
    unbalanced = [c["dataset"] for c in earlier["cells"] if abs(c["chance"] * c["classes"] - 1) > 1e-6]
    if unbalanced:
        parser.error(f"test sets not balanced ({', '.join(unbalanced)}): chance needs each class's share")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = merged(earlier, later)
    (out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    report.plot(result["cells"], out / "generalization.png")
    print(report.write_report(result, out / "report.md"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
