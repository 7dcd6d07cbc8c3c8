"""hasten beside PyTorch Lightning: the same recipe trained by each, time to accuracy side by side.

    pip install -e '.[peers]'     # Lightning, kept out of the main install
    python benchmarks/peers/lightning_fashion.py [RECIPE] [key=value ...] [--repeats N] [--out DIR]
    make bench-peers              # installs the extra, then runs this on fashion-fast

The Lightning side is what a competent Lightning user writes for the recipe: the same model
(`hasten.models.build_model`), the same data as uint8 tensors in a `TensorDataset` behind a
`DataLoader(batch_size, shuffle=True)` (Lightning's usual input path: per-sample indexing and collate),
the recipe's batched flip/translate augmentation and normalisation in `training_step`, the same optimizer,
LR scaling, no-bias-decay groups, schedule (stepped after every optimizer step), label smoothing / mixup /
EMA hooks and loss, `Trainer(precision="bf16-mixed")` for bf16, channels_last when the recipe asks, and a
test-set evaluation after every epoch. So the comparison measures the loop and the input pipeline, not the
techniques. Time is kept as hasten keeps it: training seconds (evaluation excluded) at the end of each epoch.

Each run is a fresh process (`--only lightning|hasten`); the two alternate over the repeats after a warm-up.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from hasten.data.loader import Augment, channel_stats
from hasten.engine.distributed import resolve_device
from hasten.engine.memory import peak_memory_bytes, reset_peak
from hasten.engine.schedules import scheduler
from hasten.experiments.report import format_bytes, format_seconds, markdown_table
from hasten.models import build_model
from hasten.recipe.schema import PrecisionName, Recipe, apply_overrides, dotted, load_recipe, validate
from hasten.run.assemble import optimizer as make_optimizer
from hasten.run.assemble import scaled_lr, seed_everything, tricks
from hasten.run.build import dataset
from hasten.run.loading import eval_batch_size
from hasten.techniques import one_hot, param_groups, soft_cross_entropy

# Lightning's name for each of hasten's modes (PRECISION_MODES)
LIGHTNING_PRECISION: dict[PrecisionName, str] = {
    "fp32": "32-true",
    "bf16": "bf16-mixed",
    "fp16": "16-mixed",
    "fp16-master": "16-mixed",
}


# what hasten's start-up probe decides when left `auto`, and where its summary records the choice: Lightning has no
# probe, so both frameworks train as the warm-up's hasten run decided on this machine
PROBED = {"precision": "precision", "train.channels_last": "channels_last"}  # recipe key -> summary.json key


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_lightning(recipe: Recipe) -> dict[str, Any]:
    """The recipe trained by Lightning's Trainer; a summary with hasten's keys (and the accuracy curve)."""
    try:
        import lightning.pytorch as pl
    except ImportError:
        sys.exit("Lightning is not installed: pip install -e '.[peers]'")
    warnings.filterwarnings("ignore", ".*does not have many workers.*")  # in-memory tensors: workers only cost
    warnings.filterwarnings("ignore", ".*treespec.*")  # a deprecation inside Lightning, not ours
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # no banner of accelerators and tips

    fields = type(recipe.train).model_fields  # settings this script does not carry over to Lightning
    left_out = ("accumulate", "compile", "checkpoint_activations", "freeze_epochs")
    unmatched = [f"train.{k}" for k in left_out if k in fields and getattr(recipe.train, k) != fields[k].default]
    unmatched += ["fp16 master weights (runs as 16-mixed)"] * (recipe.precision == "fp16-master")
    if unmatched:
        print(f"note: the Lightning side leaves out {', '.join(unmatched)}", file=sys.stderr)
    device = resolve_device(recipe.device)
    if recipe.train.threads:
        torch.set_num_threads(recipe.train.threads)
    seed_everything(recipe.seed)
    data = dataset(recipe)
    mean, std = (s.view(1, -1, 1, 1) for s in channel_stats(data.train_images))
    train_loader = DataLoader(
        TensorDataset(data.train_images, data.train_labels), batch_size=recipe.train.batch_size, shuffle=True
    )
    eval_batch = eval_batch_size(recipe, device, tuple(data.test_images.shape[1:]))  # hasten's, as hasten's run has it
    test_loader = DataLoader(TensorDataset(data.test_images, data.test_labels), batch_size=eval_batch)
    steps = recipe.train.epochs * len(train_loader)
    aug = recipe.data.augment
    augment = Augment(aug.flip, aug.translate) if (aug.flip or aug.translate) else None
    memory_format = torch.channels_last if recipe.train.channels_last else torch.contiguous_format

    class Classifier(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = build_model(recipe.model, data.image_shape, data.num_classes).to(memory_format=memory_format)
            self.hooks, _ = tricks(recipe, self.model)
            self.correct, self.count = 0, 0
            self.generator: torch.Generator | None = None

        def prepare(self, images: torch.Tensor) -> torch.Tensor:
            x = (images.float() / 255 - mean.to(images.device)) / std.to(images.device)
            return x.contiguous(memory_format=memory_format)

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
            images, labels = batch
            if augment is not None:
                if self.generator is None:
                    self.generator = torch.Generator(device=images.device).manual_seed(recipe.seed)
                images = augment(images, self.generator)
            images, y_soft = self.prepare(images), one_hot(labels, data.num_classes)
            for hook in self.hooks.on_batch:
                images, y_soft = hook(images, y_soft)
            return soft_cross_entropy(self.model(images), y_soft)

        def on_train_batch_end(self, outputs: Any, batch: Any, index: int) -> None:
            self.schedule.step()
            for after in self.hooks.after_step:
                after(self.model)

        def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> None:
            images, labels = batch
            model = self.hooks.eval_model(self.model) if self.hooks.eval_model else self.model
            images = self.prepare(images)
            logits = model(images).float()
            if recipe.train.tta_flip:
                logits = (logits + model(images.flip(3)).float()) / 2
            self.correct += int((logits.argmax(1) == labels).sum())
            self.count += len(labels)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            groups = param_groups(self.model, recipe.optim.weight_decay, recipe.optim.no_bias_decay)
            optimizer = make_optimizer(recipe.optim, groups, scaled_lr(recipe.optim, recipe.train.batch_size))
            self.schedule = scheduler(optimizer, recipe.schedule, steps)  # hasten's: LR and momentum per step
            return optimizer

    class Clock(pl.Callback):
        """Training seconds (validation excluded) and the test accuracy after each epoch."""

        def __init__(self) -> None:
            self.train_seconds, self.started, self.curve = 0.0, None, []

        def on_train_epoch_start(self, trainer: Any, module: Classifier) -> None:
            _sync(device)
            self.started = time.perf_counter()

        def on_validation_epoch_start(self, trainer: Any, module: Classifier) -> None:
            _sync(device)
            if self.started is not None:
                self.train_seconds += time.perf_counter() - self.started
                self.started = None
            module.correct, module.count = 0, 0

        def on_validation_epoch_end(self, trainer: Any, module: Classifier) -> None:
            self.curve.append([round(self.train_seconds, 3), module.correct / max(module.count, 1)])

    clock, module = Clock(), Classifier()
    trainer = pl.Trainer(
        max_epochs=recipe.train.epochs,
        accelerator="gpu" if device.type == "cuda" else "cpu",
        devices=1,
        precision=LIGHTNING_PRECISION[recipe.precision],
        callbacks=[clock],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    reset_peak(device)
    started = time.perf_counter()
    trainer.fit(module, train_loader, test_loader)
    wall_seconds = time.perf_counter() - started
    time_to_accuracy = {
        f"{t:.2f}": next((s for s, accuracy in clock.curve if accuracy >= t), None) for t in recipe.run.thresholds
    }
    return {
        "test_accuracy": clock.curve[-1][1],
        "epochs": recipe.train.epochs,
        "wall_seconds": round(wall_seconds, 3),
        "train_seconds": round(clock.train_seconds, 3),
        "images_per_second": round(len(data.train_labels) * recipe.train.epochs / clock.train_seconds, 1),
        "peak_memory_bytes": peak_memory_bytes(device),
        "time_to_accuracy": time_to_accuracy,
        "curve": clock.curve,
    }


def train_hasten(recipe: Recipe, run_dir: Path) -> dict[str, Any]:
    from hasten.run.build import train
    from hasten.runfolder.log import read_metrics

    # the bench's own folder under --out: a second bench into the same --out replaces it (the old files moved aside)
    changes = [f"run.dir={run_dir}", "run.progress=false", "run.overwrite=true"]
    summary = train(validate(apply_overrides(recipe.model_dump(mode="json"), changes)))
    curve = [[row["train_seconds"], row["test_accuracy"]] for row in read_metrics(run_dir)]
    return summary | {"curve": curve}


def run_isolated(framework: str, args: list[str], out: Path, tag: str) -> dict[str, Any]:
    """One run of `framework` in a fresh process; its summary."""
    result = out / f"{framework}-{tag}.json"
    command = [sys.executable, __file__, *args, "--only", framework, "--result", str(result), "--out", str(out)]
    subprocess.run(command, check=True)
    return json.loads(result.read_text())


def table(runs: dict[str, list[dict[str, Any]]], thresholds: list[str]) -> str:
    """Medians over repeats: accuracy, time to each threshold, throughput, memory, wall time."""
    rows = []
    for framework, summaries in runs.items():

        def median(key: str, summaries: list[dict[str, Any]] = summaries) -> float:
            return statistics.median(s[key] for s in summaries)

        cells = [framework, f"{median('test_accuracy'):.4f}"]
        for t in thresholds:
            times = [s["time_to_accuracy"][t] for s in summaries]
            ordered = sorted(x if x is not None else float("inf") for x in times)
            value = statistics.median(ordered)
            cells.append(format_seconds(None if value == float("inf") else value))
        cells += [f"{median('images_per_second'):,.0f}", format_bytes(median("peak_memory_bytes"))]
        cells.append(format_seconds(median("wall_seconds")))
        rows.append(cells)
    headers = ["framework", "test acc.", *[f"to {float(t):.0%}" for t in thresholds]]
    return markdown_table(headers + ["images/s", "peak memory", "wall time"], rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("args", nargs="*", metavar="[RECIPE] [key=value ...]", default=[])
    parser.add_argument("--repeats", type=int, default=3, help="runs of each framework (default 3)")
    parser.add_argument("--out", default="bench/peers", help="output folder (default bench/peers)")
    parser.add_argument("--no-warmup", action="store_true", help="skip the warm-up run")
    parser.add_argument("--only", choices=["lightning", "hasten"], help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    ns = parser.parse_intermixed_args()
    source = ns.args[0] if ns.args and "=" not in ns.args[0] else None
    overrides = ns.args[1:] if source else ns.args
    recipe = load_recipe(source, overrides)
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)

    if ns.only:  # a worker: one run, its summary to --result
        run_dir = Path(ns.result).with_suffix("")
        summary = train_lightning(recipe) if ns.only == "lightning" else train_hasten(recipe, run_dir)
        Path(ns.result).write_text(json.dumps(summary, indent=2) + "\n")
        return 0

    dumped = recipe.model_dump(mode="json")
    probed = [key for key in PROBED if dotted(dumped, key) == "auto"]
    if probed and ns.no_warmup:
        parser.error(f"{', '.join(probed)}=auto: hasten's warm-up run decides them for both frameworks (Lightning "
                     f"has no probe); drop --no-warmup or give each a value")  # fmt: skip
    chosen: list[str] = []
    if not ns.no_warmup:
        print("warm-up: hasten, 1 epoch (not recorded)", file=sys.stderr)
        warmup = run_isolated("hasten", [*ns.args, "train.epochs=1"], out, "warmup")
        chosen = [f"{key}={str(warmup[PROBED[key]]).lower()}" for key in probed]  # decided once, used by both
        if chosen:
            print(f"as hasten decided on this machine, for both frameworks: {' '.join(chosen)}", file=sys.stderr)
    runs: dict[str, list[dict[str, Any]]] = {"hasten": [], "lightning": []}
    for repeat in range(ns.repeats):
        for framework in ("lightning", "hasten") if repeat % 2 == 0 else ("hasten", "lightning"):
            summary = run_isolated(framework, [*ns.args, *chosen], out, f"r{repeat + 1}")
            runs[framework].append(summary)
            print(
                f"{framework} r{repeat + 1}: accuracy {summary['test_accuracy']:.4f}, "
                f"{summary['images_per_second']:,.0f} images/s, time to accuracy {summary['time_to_accuracy']}",
                file=sys.stderr,
            )
    thresholds = [f"{t:.2f}" for t in recipe.run.thresholds]
    text = table(runs, thresholds)
    command = " ".join(["python", "benchmarks/peers/lightning_fashion.py", *ns.args, f"--repeats={ns.repeats}"])
    command += f" (both frameworks at {' '.join(chosen)}, as hasten decided)" if chosen else ""
    from hasten.experiments.bench import machine

    results = {"command": command, "recipe": recipe.model_dump(mode="json"), "machine": machine(), "runs": runs}
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    intro = f"# hasten vs PyTorch Lightning: {recipe.name}\n\n`{command}`, median of {ns.repeats} run(s)\n\n"
    (out / "report.md").write_text(intro + text + "\n")
    print(text)
    print(f"\nwritten: {out / 'report.md'}, {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
