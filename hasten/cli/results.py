"""A finished training run's results as the terminal shows them: one table that fits 80 columns, with the times to
accuracy that mean something for the run's data."""

from __future__ import annotations

from typing import Any

from rich.table import Table

NEAR_MISS = 0.01  # a threshold above the run's best accuracy is still shown when the run came this close to it
OF_BEST = (0.5, 0.75, 0.9, 0.95, 0.99)  # where no threshold is near: times to these fractions of the best


def results_table(summary: dict[str, Any]) -> Table:
    """A finished run's results, in 80 columns: accuracy, the wall clock (from the command's start) and where it
    went, throughput, memory, and the time to each accuracy threshold that means something for this run's data:
    those it reached or came within a point of; where there are none (other data than the thresholds were set for),
    the time to 90% and 99% of the run's own best accuracy. Times to accuracy are on the wall clock, the training
    seconds beside them."""
    from hasten.engine.memory import format_bytes
    from hasten.progress import WIDTH

    rows = [
        ("test accuracy", f"{summary['test_accuracy']:.4f}"),
        ("epochs", str(summary["epochs"])),
        ("wall time", f"{summary['wall_seconds']:.1f} s from the command's start"),
        ("  training", f"{summary['train_seconds']:.1f} s"),
    ]
    if summary.get("startup_seconds") is not None:
        rows.append(("  start-up", f"{summary['startup_seconds']:.1f} s (to the first training step)"))
    if summary.get("eval_seconds") is not None:
        rows.append(("  evaluation", f"{summary['eval_seconds']:.1f} s"))
    rows += [
        ("throughput", f"{summary['images_per_second']:,.0f} images/s"),
        ("peak memory", format_bytes(summary["peak_memory_bytes"])),
    ]
    rows += [(label, "not reached" if train is None else _two_clocks(wall, train))
             for label, wall, train in times_to_accuracy(summary)]  # fmt: skip
    rows.append(("run folder", summary.get("run_dir", "")))
    labels = max(len(label) for label, _ in rows)
    table = Table(title="results", show_header=False)
    table.add_column(no_wrap=True)
    table.add_column(overflow="fold", max_width=WIDTH - 7 - labels)  # 7: the borders and padding of two columns
    for label, value in rows:
        table.add_row(label, value)
    return table


def _two_clocks(wall: float | None, train: float) -> str:
    return f"{wall:.1f} s (training {train:.1f} s)" if wall is not None else f"training {train:.1f} s"


def times_to_accuracy(summary: dict[str, Any]) -> list[tuple[str, float | None, float | None]]:
    """(label, wall seconds, training seconds) of the results table's time-to-accuracy rows (see results_table)."""
    best = summary.get("best_test_accuracy") or summary["test_accuracy"]
    walls = summary.get("time_to_accuracy_wall") or {}
    rows = [
        (f"time to {float(key):.0%}", walls.get(key), train)
        for key, train in summary["time_to_accuracy"].items()
        if float(key) <= best + NEAR_MISS
    ]
    if rows:
        return rows
    milestones = summary.get("time_to_fraction_of_best")
    if milestones is None:  # a summary written before runs recorded them: from the curve
        from hasten.run.state import time_to_fraction_of_best

        milestones = time_to_fraction_of_best(summary.get("accuracy_curve") or [], OF_BEST)
    for key, reached in milestones.items():
        if float(key) in OF_BEST:
            label = f"time to {float(key):.0%} of best ({reached['accuracy']:.1%})"
            rows.append((label, reached.get("wall_seconds"), reached.get("train_seconds")))
    return rows
