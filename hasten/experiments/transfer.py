"""`hasten transfer`: what pretrained features buy on a small dataset. Pretrain once on a large dataset, then
fine-tune on the first N training images of each class of a small one, for several N, beside training from
scratch with the same budget (same epochs, batch, optimizer and schedule); a table and a plot of test accuracy
against N.

Features learned on one image task carry over to another, most of all when the new task has little data
(Yosinski et al., "How transferable are features in deep neural networks?", 2014). Fine-tuning here follows
Howard & Ruder ("Universal Language Model Fine-tuning for Text Classification", 2018): a new head trained
alone first (`train.freeze_epochs`), then every layer with smaller LRs for earlier layers
(`optim.layer_lr_decay`); hasten/models/pretrained.py has the mechanics.

The recipe is the fine-tuning run (transfer-digits: scikit-learn's 8x8 digits upscaled to Fashion-MNIST's
28x28); its `transfer.pretrain` overrides turn it into the pretraining run, whose final weights
(`run.save_weights`) become `model.pretrained`, unless the recipe already names weights. `transfer.per_class`
lists the sizes. All runs go through the bench machinery (`run_grid`, `run_isolated`): a fresh process each.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hasten.errors import HastenError, RecipeError
from hasten.experiments.bench import Variant, run_grid, run_in_process, run_isolated, variant_recipe, write_results
from hasten.experiments.report import DASH, markdown_table, plot_curves
from hasten.models.pretrained import WEIGHTS_FILE
from hasten.recipe.schema import Recipe, apply_overrides, validate
from hasten.run.assemble import train_size
from hasten.run.build import dataset
from hasten.run.resolve import run_dir
from hasten.runfolder.folder import owned_output
from hasten.runfolder.log import write_atomic

# what the scratch arm turns off: it starts from random weights, so there is no head to train first
SCRATCH = ("model.pretrained=null", "train.freeze_epochs=0", "optim.layer_lr_decay=1")
# the pretraining run starts from the fine-tuning recipe with these, then the recipe's transfer.pretrain
PRETRAIN_BASE = (*SCRATCH, "data.per_class=null", "model.reset_head=false", "run.save_weights=true")

Log = Callable[[str], None]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def pretrain_recipe(recipe: Recipe, out: Path) -> Recipe:
    """The pretraining run: the recipe with `PRETRAIN_BASE` and its `transfer.pretrain` overrides."""
    overrides = [*PRETRAIN_BASE, *recipe.transfer.pretrain, f"name={recipe.name}-pretrain"]
    overrides += [f"run.dir={out / 'pretrain'}", "run.overwrite=true", "run.progress=false"]  # its own folder
    return validate(apply_overrides(recipe.model_dump(mode="json"), overrides), "transfer.pretrain")


def pretrain(recipe: Recipe, out: Path, *, isolate: bool = True, log: Log = _stderr) -> tuple[Path, dict[str, Any]]:
    """The pretrained weights and the pretraining run's summary. A finished pretraining of the same recipe in
    `out/pretrain` is reused (its resolved recipe is stamped beside the weights)."""
    pre = pretrain_recipe(recipe, out)
    folder = out / "pretrain"
    weights, stamp = folder / WEIGHTS_FILE, folder / "pretrain-recipe.json"
    stamped = pre.model_dump(mode="json")
    stamped["run"].pop("dir")  # the same pretraining copied to another output folder still counts
    wanted = json.dumps(stamped, sort_keys=True)
    if weights.is_file() and stamp.is_file() and stamp.read_text(errors="replace") == wanted:
        from hasten.use.load import read_summary

        try:  # checked before it is reused; an unreadable summary means pretraining again
            summary = read_summary(folder / "summary.json")
        except HastenError:
            summary = None
        if summary is not None and summary.test_accuracy is not None and "train_seconds" in (summary.model_extra or {}):
            log(f"pretraining: reusing {weights}")
            return weights, summary.model_dump()
    log(f"pretraining on {pre.data.name}, {pre.train.epochs} epochs -> {weights}")
    summary = run_isolated(pre, "recipe", None, folder) if isolate else run_in_process(pre, "recipe")
    write_atomic(stamp, wanted)
    log(f"pretraining: test accuracy {summary['test_accuracy']:.4f} in {summary['train_seconds']:.1f} s")
    return weights, summary


def transfer_variants(per_class: Sequence[int | None], weights: str, seeds: Sequence[int]) -> list[Variant]:
    """Both arms for every size and seed, named `per_class=N arm seed=S` (N `all` for the whole set)."""
    variants = []
    for n in per_class:
        size = "all" if n is None else str(n)
        for seed in seeds:
            common = (f"data.per_class={'null' if n is None else n}", f"seed={seed}")
            variants.append(Variant(f"per_class={size} scratch seed={seed}", (*common, *SCRATCH)))
            variants.append(
                Variant(f"per_class={size} pretrained seed={seed}", (*common, f"model.pretrained={weights}"))
            )
    return variants


def training_images(recipe: Recipe) -> tuple[int, int]:
    """(training images, classes) of the recipe's dataset after its data keys (per_class, subset)."""
    data = dataset(recipe)
    return train_size(data), data.num_classes


def _accuracies(results: dict[str, Any]) -> dict[tuple[str, str], list[float]]:
    """Test accuracies by (size, arm), one per seed that finished."""
    found: dict[tuple[str, str], list[float]] = {}
    for variant in results["variants"]:
        size, arm, _ = (part.split("=", 1)[-1] for part in variant["name"].split(" "))
        runs = [r["summary"]["test_accuracy"] for r in variant["runs"] if "error" not in r]
        found.setdefault((size, arm), []).extend(runs)
    return found


def _cell(values: list[float]) -> str:
    if not values:
        return "failed"
    median = statistics.median(values)
    return f"{median:.4f}" if len(values) == 1 else f"{median:.4f} ({min(values):.3f}–{max(values):.3f})"


def transfer_report(
    recipe: Recipe,
    results: dict[str, Any],
    pretrained: dict[str, Any] | None,
    counts: dict[str, tuple[int, int]],
    out: Path,
) -> list[Path]:
    """transfer.md (table) and transfer.png (test accuracy against images per class, per arm and seed);
    `counts` holds (training images, classes) per size."""
    accuracies = _accuracies(results)
    sizes = list(counts)
    rows = []
    for size in sizes:
        scratch, tuned = accuracies.get((size, "scratch"), []), accuracies.get((size, "pretrained"), [])
        gain = statistics.median(tuned) - statistics.median(scratch) if scratch and tuned else None
        rows.append(
            [size, f"{counts[size][0]:,}", _cell(scratch), _cell(tuned), DASH if gain is None else f"{gain:+.4f}"]
        )
    headers = ["images per class", "training images", "from scratch", "pretrained", "gain"]
    seeds = sorted({v["name"].rsplit("=", 1)[-1] for v in results["variants"]}, key=int)
    lines = [f"# hasten transfer: {recipe.name}", ""]
    lines += [f"`{results['command']}`", ""] if results.get("command") else []
    if pretrained is not None:
        lines += [
            f"Pretrained on {pretrained.get('dataset', 'the pretraining set')}: test accuracy "
            f"{pretrained['test_accuracy']:.4f} after {pretrained['epochs']} epoch(s) "
            f"({pretrained['train_seconds']:.1f} s of training).",
            "",
        ]
    lines += [
        f"Fine-tuned on {recipe.data.name}: test accuracy after {recipe.train.epochs} epoch(s), the median over "
        f"seeds {', '.join(seeds)} (min–max in brackets). Both arms get the same epochs, batch, optimizer and "
        f"schedule; the pretrained arm also has train.freeze_epochs={recipe.train.freeze_epochs} and "
        f"optim.layer_lr_decay={recipe.optim.layer_lr_decay:g}.",
        "",
        markdown_table(headers, rows),
        "",
        "![test accuracy against images per class](transfer.png)",
        "",
    ]
    write_atomic(out / "transfer.md", "\n".join(lines))
    per_class = {size: counts[size][0] / counts[size][1] if size == "all" else float(size) for size in sizes}
    series = {}
    for arm, label in (("scratch", "from scratch"), ("pretrained", "pretrained")):
        by_seed: dict[str, list[list[float]]] = {}
        for variant in results["variants"]:
            size, this_arm, seed = (part.split("=", 1)[-1] for part in variant["name"].split(" "))
            for run in variant["runs"]:
                if this_arm == arm and "error" not in run:
                    by_seed.setdefault(seed, []).append([per_class[size], run["summary"]["test_accuracy"]])
        series[label] = [sorted(points) for points in by_seed.values()]
    plot = plot_curves(
        series,
        out / "transfer.png",
        xlabel="training images per class",
        ylabel="test accuracy",
        title=f"{recipe.name}: fine-tuned from pretrained weights vs from scratch",
    )
    return [out / "transfer.md", plot]


def transfer(
    recipe: Recipe,
    out: str | Path | None = None,
    *,
    seeds: Sequence[int] | None = None,
    isolate: bool = True,
    command: str | None = None,
    log: Log = _stderr,
) -> tuple[dict[str, Any], list[Path]]:
    """Pretrain (or take `model.pretrained`), fine-tune every size of `transfer.per_class` with and without the
    weights, once per seed, and write transfer.md, transfer.png, results.json and results.csv into `out`
    (default: the recipe's run folder). Returns the results and those files, in that order."""
    out = Path(out or run_dir(recipe))
    with owned_output(out, recipe.run.overwrite, "transfer"):  # locked, and never a training run's folder
        seeds = list(seeds) if seeds else [recipe.seed]
        if recipe.model.pretrained:
            weights, pretrained = recipe.model.pretrained, None
            log(f"using the recipe's model.pretrained={weights}; no pretraining run")
        elif recipe.transfer.pretrain:
            path, pretrained = pretrain(recipe, out, isolate=isolate, log=log)
            weights = str(path)
            pretrained = pretrained | {"dataset": pretrain_recipe(recipe, out).data.name}
        else:
            raise RecipeError("transfer: the recipe names no model.pretrained weights and no transfer.pretrain run")
        per_class = recipe.transfer.per_class
        variants = transfer_variants(per_class, weights, seeds)
        counts = {}
        for n in per_class:
            size = "all" if n is None else str(n)
            counts[size] = training_images(variant_recipe(recipe, Variant(size, (f"data.per_class={n or 'null'}",))))
        results = run_grid(
            recipe, variants, 1, out, warmup=False, isolate=isolate, measure_peak=False, command=command, log=log
        )
        files = transfer_report(recipe, results, pretrained, counts, out) + write_results(results, out)
        return results, files
