"""`hasten sweep`: a recipe trained over a grid of values (`--vary model.width=1,2,4,8`), each run's summary and
per-epoch metrics collected into a table, and plots of train and test error against the varied key and
against epochs.

Made for double descent (Nakkiran et al., "Deep Double Descent: Where Bigger Models and More Data Hurt",
2019). Model-wise: with label noise (`data.label_noise`), test error falls, then rises as the model becomes
just large enough to fit the noisy training set (the interpolation threshold, where train error reaches
about 0), then falls again beyond it. Epoch-wise: a large model's test error can fall, rise while it
memorises the noisy labels, and fall again ("training longer"). Without label noise the peak is much weaker.

The runs go through the bench machinery (`hasten.experiments.bench.run_grid`): the same variant folders
under `OUT/runs/`, a fresh process per run, results.json and results.csv; this module adds the sweep's
table (sweep.md) and plots.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hasten.errors import RecipeError
from hasten.experiments.bench import Variant, grid_variants, parse_vary, run_grid, variant_recipe, write_results
from hasten.experiments.report import DASH, markdown_table, plot_curves
from hasten.models import build_model
from hasten.recipe.schema import Recipe, parse_value
from hasten.run.build import dataset
from hasten.run.resolve import run_dir
from hasten.runfolder.folder import owned_output
from hasten.runfolder.log import read_metrics, write_atomic

INTERPOLATED = 0.01  # train error at or below this counts as fitting the (noisy) training set


Shapes = dict[str, tuple[tuple[int, int, int], int]]


def parameter_count(recipe: Recipe, shapes: Shapes) -> int:
    """Parameters of the recipe's model; `shapes` caches (image shape, classes) per data section, so the
    dataset is read once however many model sizes the sweep tries."""
    key = json.dumps(recipe.data.model_dump(mode="json"), sort_keys=True)
    if key not in shapes:
        data = dataset(recipe)
        shapes[key] = (data.image_shape, data.num_classes)
    shape, classes = shapes[key]
    return sum(p.numel() for p in build_model(recipe.model, shape, classes).parameters())


def _numeric(values: Sequence[str]) -> list[float] | None:
    parsed = [parse_value(v) for v in values]
    ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in parsed)
    return [float(v) for v in parsed] if ok else None


def sweep_rows(results: dict[str, Any], recipe: Recipe) -> list[dict[str, Any]]:
    """One row per grid point: its values, parameter count, final train/test error, best test error and the
    per-epoch curves (from its metrics.csv)."""
    shapes: Shapes = {}
    rows = []
    for variant in results["variants"]:
        values = dict(override.split("=", 1) for override in variant["overrides"])
        run = variant["runs"][0]
        row: dict[str, Any] = {"name": variant["name"], "values": values, "run_dir": run["run_dir"]}
        try:
            variant_obj = Variant(variant["name"], tuple(variant["overrides"]), variant["kind"])
            row["parameters"] = parameter_count(variant_recipe(recipe, variant_obj), shapes)
        except Exception:  # a variant that cannot even be built failed its run too; the table says so
            row["parameters"] = None
        if "error" in run:
            rows.append(row | {"error": run["error"].splitlines()[0]})
            continue
        summary = run["summary"]
        epochs = read_metrics(run["run_dir"])
        row |= {
            "train_error": 1 - summary["train_accuracy"],
            "test_error": 1 - summary["test_accuracy"],
            "best_test_error": 1 - summary["best_test_accuracy"],
            "test_loss": summary["test_loss"],
            "epochs": summary["epochs"],
            "train_seconds": summary["train_seconds"],
            "curve": [[r["epoch"], 1 - r["train_accuracy"], 1 - r["test_accuracy"]] for r in epochs],
        }
        rows.append(row)
    return rows


def findings(rows: list[dict[str, Any]], key: str) -> list[str]:
    """Plain sentences about the curves: where test error peaks against `key`, where train error first reaches
    ~0, and for the last grid point (the largest model) the shape of its test error over epochs."""
    done = [r for r in rows if "error" not in r]
    if len(done) < 2:
        return []
    lines = []
    peak = max(done, key=lambda r: r["test_error"])
    best = min(done, key=lambda r: r["test_error"])
    lines.append(
        f"Test error against {key}: highest {peak['test_error']:.3f} at {key}={peak['values'][key]}, lowest "
        f"{best['test_error']:.3f} at {key}={best['values'][key]}."
    )
    fitted = [r for r in done if r["train_error"] <= INTERPOLATED]
    if fitted:
        lines.append(
            f"Train error first at or below {INTERPOLATED:.0%} (the training set, noisy labels included, is "
            f"fitted) at {key}={fitted[0]['values'][key]}."
        )
    else:
        lowest = min(done, key=lambda r: r["train_error"])
        lines.append(
            f"No run fitted the training set: train error stays above {INTERPOLATED:.0%} (lowest "
            f"{lowest['train_error']:.3f}, at {key}={lowest['values'][key]})."
        )
    curve = done[-1]["curve"]
    if len(curve) >= 3:
        tests = [c[2] for c in curve]
        low = min(range(len(tests)), key=tests.__getitem__)
        high_after = max(range(low, len(tests)), key=tests.__getitem__)
        line = f"Over epochs at {done[-1]['name']}: test error lowest {tests[low]:.3f} at epoch {curve[low][0]:.0f}"
        if high_after > low:
            line += f", then up to {tests[high_after]:.3f} (epoch {curve[high_after][0]:.0f}), final {tests[-1]:.3f}"
        lines.append(line + f" (first epoch {tests[0]:.3f}).")
    return lines


def sweep_table(rows: list[dict[str, Any]], keys: Sequence[str]) -> str:
    headers = [*keys, "parameters", "train error", "test error", "best test error", "test loss", "epochs", "time"]
    lines = []
    for row in rows:
        cells = [row["values"][k] for k in keys]
        cells.append(DASH if row.get("parameters") is None else f"{row['parameters']:,}")
        if "error" in row:
            lines.append([*cells, "failed", *[DASH] * 5])
            continue
        cells += [f"{row[k]:.4f}" for k in ("train_error", "test_error", "best_test_error", "test_loss")]
        cells += [str(row["epochs"]), f"{row['train_seconds']:.1f} s"]
        lines.append(cells)
    return markdown_table(headers, lines)


def sweep_plots(rows: list[dict[str, Any]], vary: Sequence[tuple[str, list[str]]], out: Path, name: str) -> list[Path]:
    """error_vs_<key>.png (train and test error against the first varied key, one line per combination of the
    others) and test_error_vs_epoch.png / train_error_vs_epoch.png (one line per grid point)."""
    key, values = vary[0]
    numbers = _numeric(values)
    position = {v: (numbers[i] if numbers else float(i)) for i, v in enumerate(values)}
    series: dict[str, list[list[list[float]]]] = {}
    for row in rows:
        if "error" in row:
            continue
        rest = " ".join(f"{k.rsplit('.', 1)[-1]}={row['values'][k]}" for k, _ in vary[1:])
        x = position[row["values"][key]]
        for kind in ("train", "test"):
            label = f"{kind} error" + (f" ({rest})" if rest else "")
            series.setdefault(label, [[]])[0].append([x, row[f"{kind}_error"]])
    leaf = key.rsplit(".", 1)[-1]
    xlabel = key if numbers else f"{key} (" + ", ".join(f"{i}: {v}" for i, v in enumerate(values)) + ")"
    written = [
        plot_curves(
            series, out / f"error_vs_{leaf}.png", xlabel=xlabel, ylabel="error", title=f"{name}: error against {key}"
        )
    ]
    for kind, column in (("test", 2), ("train", 1)):
        curves = {r["name"]: [[[c[0], c[column]] for c in r["curve"]]] for r in rows if "error" not in r}
        written.append(
            plot_curves(
                curves,
                out / f"{kind}_error_vs_epoch.png",
                xlabel="epoch",
                ylabel=f"{kind} error",
                title=f"{name}: {kind} error after each epoch",
            )
        )
    return written


def sweep(
    recipe: Recipe,
    vary: Sequence[str] = (),
    out: str | Path | None = None,
    *,
    isolate: bool = True,
    command: str | None = None,
    log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
) -> tuple[list[dict[str, Any]], list[Path]]:
    """Run the grid (`vary`, else the recipe's `sweep.vary`) once per point, then write results.json,
    results.csv, sweep.md and the plots into `out` (default: the recipe's run folder). Returns the rows and
    the files written."""
    items = list(vary) or list(recipe.sweep.vary)
    if not items:
        raise RecipeError("sweep: nothing to vary; give --vary KEY=V1,V2 (or sweep.vary in the recipe)")
    parsed = parse_vary(items)
    variants = grid_variants(parsed)  # a grid beyond MAX_GRID_POINTS is refused before the folder is touched
    out = Path(out or run_dir(recipe))
    with owned_output(out, recipe.run.overwrite, "sweep"):  # locked, and never a training run's folder
        results = run_grid(
            recipe, variants, 1, out, warmup=False, isolate=isolate, measure_peak=False, command=command, log=log
        )
        rows = sweep_rows(results, recipe)
        keys = [k for k, _ in parsed]
        text = [f"# hasten sweep: {recipe.name}", ""]
        text += [f"`{command}`", ""] if command else []
        where = "each in its own process" if isolate else "in one process"
        text += [
            f"{len(rows)} runs, one per grid point, {where} ({results['started']} to {results['finished']}). "
            "Errors are 1 - accuracy after the last epoch; train error is on the training labels as trained "
            "(label noise included), averaged over the last epoch as the model learned; best test error is the "
            "lowest after any epoch.",
            "",
            sweep_table(rows, keys),
            "",
            *[f"- {row['name']} failed: {row['error']}" for row in rows if "error" in row],
            *[f"- {line}" for line in findings(rows, keys[0])],
            "",
        ]
        files = write_results(results, out) + sweep_plots(rows, parsed, out, recipe.name)
        text += [f"![{p.stem.replace('_', ' ')}]({p.name})\n" for p in files if p.suffix == ".png"]
        write_atomic(out / "sweep.md", "\n".join(text))
        return rows, [out / "sweep.md", *files]
