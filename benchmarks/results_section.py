"""The Results section of docs/benchmarks.md, generated from the benchmark outputs in bench/ (nothing typed by hand).

    .venv/bin/python benchmarks/results_section.py        # after the benchmarks below have run

Reads bench/headline (hasten bench fashion-fast --also fashion-sprint), bench/fashion-94, bench/peers (make
bench-peers) and bench/distributed (benchmarks/distributed.py); copies their reports and the accuracy-vs-time
plot into docs/results/ (bench/ itself is not kept in git), and rewrites the part of docs/benchmarks.md between
the `<!-- results:begin -->` and `<!-- results:end -->` markers. A benchmark that has not run is left out, saying
so. Links in the section are relative to docs/, where the page is.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

from hasten.experiments.report import bench_table

ROOT = Path(__file__).resolve().parents[1]
BENCH, DOCS = ROOT / "bench", ROOT / "docs" / "results"
PAGE = ROOT / "docs" / "benchmarks.md"  # the page that holds the section; its links are relative to its folder
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
COMMANDS = {
    "headline": "hasten bench fashion-fast --also fashion-sprint --naive-epochs 3 --repeats 2 --out bench/headline",
    "fashion-94": "hasten bench fashion-94 --no-naive --no-warmup --repeats 1 --out bench/fashion-94",
    "peers": 'make bench-peers PEERS_ARGS="--repeats 2"',
    "distributed": "python benchmarks/distributed.py",
}


def load(name: str) -> dict[str, Any] | None:
    path = BENCH / name / "results.json"
    return json.loads(path.read_text()) if path.is_file() else None


def machine_line(results: dict[str, Any]) -> str:
    m = results.get("machine", {})
    cpu = m.get("cpu_model") or m.get("machine") or "unknown CPU"
    when = (results.get("finished") or "")[:10]
    threads = f" ({m['torch_threads']} torch threads)" if m.get("torch_threads") else ""
    return f"{cpu}, {m.get('cpu_count', '?')} cores{threads}, torch {m.get('torch_version', '?')}, measured {when}"


def after_title(report: Path) -> str:
    """A report's text without its first heading line."""
    lines = report.read_text().splitlines()
    return "\n".join(lines[1:] if lines and lines[0].startswith("# ") else lines).strip()


PLOT_LINK = re.compile(r"!\[[^\]]*\]\(([^)\s]+\.png)\)")


def copy_report(source: Path, target: Path, plots: dict[str, str]) -> None:
    """A bench report copied into docs/results/ with its plot links fixed: a plot kept beside it (`plots`: the
    bench's file name -> its name in docs/results/) is linked by its kept name, and the line of any other plot
    (bench/ is not in git) is left out, so the copy never links to a missing file."""
    lines = []
    for line in source.read_text().splitlines():
        links = PLOT_LINK.findall(line)
        if any(name not in plots for name in links):
            continue
        for name in links:
            line = line.replace(f"]({name})", f"]({plots[name]})")
        lines.append(line)
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip() + "\n"
    target.write_text(text)


def section() -> str:
    DOCS.mkdir(parents=True, exist_ok=True)
    parts = [BEGIN, "## Results", ""]
    headline = load("headline")
    if headline is None:
        parts += ["`bench/headline` has not been run here: `" + COMMANDS["headline"] + "`.", ""]
    else:
        shutil.copy(BENCH / "headline" / "accuracy_vs_time.png", DOCS / "headline-accuracy-vs-time.png")
        plots = {"accuracy_vs_time.png": "headline-accuracy-vs-time.png"}
        copy_report(BENCH / "headline" / "report.md", DOCS / "headline.md", plots)
        parts += [
            "The textbook loop, `fashion-fast` and the shortest recipe to 91%, side by side in one run "
            f"({headline['repeats']} repeats, interleaved, medians; each run in its own process):",
            "",
            "```",
            COMMANDS["headline"],
            "```",
            "",
            bench_table(headline, "train"),
            "",
            f"Machine: {machine_line(headline)}. Times are training seconds until the test accuracy (checked "
            "after each epoch, on all 10,000 test images) first reached the threshold; (Nx) is the speed-up "
            "over the naive loop; of bare step: the run's images/s over its training step's alone "
            "(training / wall time). Full report with the spread over repeats and the recipes: "
            "[docs/results/headline.md](results/headline.md).",
            "",
            "![test accuracy against training time](results/headline-accuracy-vs-time.png)",
            "",
        ]
    f94 = load("fashion-94")
    if f94 is not None:
        copy_report(BENCH / "fashion-94" / "report.md", DOCS / "fashion-94.md", {})
        parts += ["94% needs a wider network and longer training (`fashion-94`):", "", "```", COMMANDS["fashion-94"]]
        parts += ["```", "", bench_table(f94, "train"), ""]
    peers = BENCH / "peers" / "report.md"
    if peers.is_file():
        copy_report(peers, DOCS / "peers.md", {})
        parts += ["### Against PyTorch Lightning", "", "```", COMMANDS["peers"], "```", "", after_title(peers), ""]
    distributed = BENCH / "distributed" / "report.md"
    if distributed.is_file():
        copy_report(distributed, DOCS / "distributed.md", {})
        parts += [
            "### One process against two, and large batches",
            "",
            f"`{COMMANDS['distributed']}`: [docs/results/distributed.md](results/distributed.md).",
            "",
        ]
    parts.append(END)
    return "\n".join(parts)


def main() -> int:
    text = PAGE.read_text()
    page = PAGE.relative_to(ROOT)
    if BEGIN not in text or END not in text:
        sys.exit(f"{page} has no {BEGIN} ... {END} block to fill")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    PAGE.write_text(head + section() + tail)
    print(f"{page} results section rewritten; reports in {DOCS.relative_to(ROOT)}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
