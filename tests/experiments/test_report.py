"""hasten.experiments.report: markdown tables, metrics.csv reading, PNG plots, and a bench report drawn from results
alone (no run folders, nothing trained)."""

from __future__ import annotations

import copy

from hasten.experiments.report import (
    DASH,
    bench_markdown,
    format_bytes,
    format_seconds,
    markdown_table,
    plot_bars,
    plot_curves,
    write_bench_report,
)
from hasten.runfolder.log import read_metrics

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _variant(name, kind, times, images_per_second, curve, speedup=None):
    runs = [
        {
            "repeat": i + 1,
            "summary": {"time_to_accuracy": {"0.90": t, "0.93": None}},
            "curve": curve,
        }
        for i, t in enumerate(times)
    ]
    reached = [t for t in times if t is not None]

    def spread(value):
        return {"median": value, "min": value * 0.9, "max": value * 1.1}

    return {
        "name": name,
        "kind": kind,
        "overrides": [] if kind == "naive" else [f"precision={name}"],
        "precision": "fp32",
        "epochs": 2,
        "runs": runs,
        "stats": {
            "runs": len(runs),
            "failed": 0,
            "test_accuracy": spread(0.91),
            "train_seconds": spread(10.0),
            "wall_seconds": spread(12.0),
            "images_per_second": spread(images_per_second),
            "peak_memory_bytes": spread(300 * 2**20),
            "achieved_flops_per_second": spread(2e10),
            "peak_fraction": spread(0.5),
            "time_to_accuracy": {
                "0.90": {"median": reached[0] if reached else None, "min": None, "max": None, "reached": len(reached)},
                "0.93": {"median": None, "min": None, "max": None, "reached": 0},
            },
        },
        "speedup_vs_naive": {"0.90": speedup, "0.93": None},
    }


RESULTS = {
    "name": "tiny",
    "command": "hasten bench tiny --vary precision=fp32,bf16",
    "started": "2026-01-01T00:00:00+00:00",
    "finished": "2026-01-01T00:01:00+00:00",
    "repeats": 1,
    "warmup": True,
    "isolated": True,
    "thresholds": ["0.90", "0.93"],
    "machine": {"cpu_model": "Test CPU", "cpu_count": 2, "torch_version": "2.13.0", "hasten_version": "0.1.0"},
    "matmul_peak": {"fp32": {"flops_per_second": 4e10, "size": 2048}},
    "variants": [
        _variant("naive", "naive", [40.0], 100.0, [[20.0, 0.85], [40.0, 0.905]]),
        _variant("bf16", "recipe", [8.0], 1000.0, [[4.0, 0.89], [8.0, 0.91]], speedup=5.0),
    ],
}


def test_markdown_table_aligns_and_escapes():
    table = markdown_table(["a", "b"], [["x|y", "1"]])
    assert table.splitlines() == ["| a | b |", "| :--- | ---: |", "| x\\|y | 1 |"]


def test_formatting():
    assert format_bytes(512) == "512 B" and format_bytes(3 * 2**20) == "3.0 MiB" and format_bytes(None) == DASH
    assert format_seconds(None) == DASH and format_seconds(1.234) == "1.23 s" and format_seconds(42.42) == "42.4 s"


def test_read_metrics(tmp_path):
    (tmp_path / "metrics.csv").write_text("epoch,train_seconds,test_accuracy,loss_scale\n1,2.5,0.8,\n2,5.0,0.9,\n")
    assert read_metrics(tmp_path) == [
        {"epoch": 1.0, "train_seconds": 2.5, "test_accuracy": 0.8},
        {"epoch": 2.0, "train_seconds": 5.0, "test_accuracy": 0.9},
    ]
    assert read_metrics(tmp_path / "missing") == []


def test_plots_are_pngs(tmp_path):
    curves = plot_curves(
        {"a": [[[1, 0.5], [2, 0.9]]], "b": [[[10, 0.6], [40, 0.95]], []]},
        tmp_path / "c.png",
        xlabel="s",
        ylabel="acc",
        title="t",
        hlines=[0.9],
    )
    bars = plot_bars({"a": {"median": 2, "min": 1, "max": 3}, "b": None}, tmp_path / "b.png", ylabel="x", title="t")
    assert curves.read_bytes().startswith(PNG_MAGIC) and bars.read_bytes().startswith(PNG_MAGIC)


def test_bench_markdown_headline_and_speedup():
    text = bench_markdown(RESULTS)
    assert text.startswith("# hasten bench: tiny")
    assert "`hasten bench tiny --vary precision=fp32,bf16`" in text
    assert "Test CPU" in text and "fp32 40.0 GFLOP/s (2048²)" in text
    row = next(line for line in text.splitlines() if line.startswith("| bf16 |"))
    assert "8.00 s (5.0x)" in row and DASH in row  # 93% never reached
    assert "50%" in row and "1,000" in row
    assert "## Spread" not in text  # one repeat: no spread to show
    assert "- **naive**: the textbook loop" in text


def test_bench_report_from_results_alone_with_spread(tmp_path):
    results = copy.deepcopy(RESULTS)
    results["repeats"] = 3
    results["variants"][1]["stats"]["time_to_accuracy"]["0.90"] |= {"min": 7.0, "max": 9.0, "reached": 1}
    files = write_bench_report(results, tmp_path)
    assert {f.name for f in files} == {"report.md", "accuracy_vs_time.png", "images_per_second.png", "peak_memory.png"}
    text = (tmp_path / "report.md").read_text()
    assert "## Spread over repeats" in text and "7.0–9.0" in text and "0/1" in text
