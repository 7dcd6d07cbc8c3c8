"""What an evaluation costs, and what its cheaper forms give up: measured on a finished run's checkpoint.

For the run's final checkpoint (its EMA weights where it had one), each way of evaluating is timed (median of
`--repeats`, in this process, one after another, interleaved over the repeats) and its test accuracy noted:

- the full evaluation: the run's test-time augmentation (flip x 3 shifts for fashion-fast: 6 views per image), in
  batches of 256 and of 1,024; the image and its mirror alone (2 views);
- one view of every test image (`train.mid_eval=plain`), in batches of 256 and 1,024, and one view of the first
  half / fifth of the test set;
- the EMA's batch-norm recalibration with 4,096, 2,048 and 1,024 images, at the training batch and in larger
  forward batches, and its effect on the accuracy (against the averaged running statistics, no recalibration).

    .venv/bin/python benchmarks/evaluation.py runs/fashion-fast --repeats 3 --out bench/evaluation

writes `evaluation.md` (a markdown table with the command) and `evaluation.json` to --out.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import yaml
from torch.optim.swa_utils import update_bn

from hasten.recipe.schema import Recipe
from hasten.run.assemble import bn_calibration
from hasten.run.build import build, trainer_for
from hasten.run.plan import Plan
from hasten.runfolder.checkpoint import checkpoints_in, load_checkpoint
from hasten.runfolder.log import RunLog, write_atomic


def joined_calibration(loader: Any, autocast: Any, images: int, batch: int) -> Any:
    """hasten.run.assemble.bn_calibration's pass, with consecutive training batches joined into forward batches of
    `batch` images."""

    def calibrate(module: torch.nn.Module) -> None:
        held: list[torch.Tensor] = []

        def joined() -> Any:
            for x, _ in itertools.islice(loader.batches(0), max(1, -(-images // loader.batch_size))):
                held.append(x)
                if sum(len(h) for h in held) >= batch:
                    yield torch.cat(held)
                    held.clear()
            if held:
                yield torch.cat(held)

        with autocast():
            update_bn(joined(), module)

    return calibrate


def timed(function: Any, repeats: int) -> tuple[float, Any]:
    """Median seconds of `repeats` calls and the last call's result."""
    seconds, result = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        result = function()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds), result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="a finished run folder (its recipe.yaml and newest checkpoint are used)")
    parser.add_argument("--checkpoint", help="another of the run's checkpoints (e.g. one from the middle of the run)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="bench/evaluation")
    ns = parser.parse_args()
    torch.set_num_threads(ns.threads)
    run = Path(ns.run)
    saved = yaml.safe_load((run / "recipe.yaml").read_text())
    saved["train"]["threads"] = ns.threads
    recipe = Recipe.model_validate(saved)
    parts = build(recipe)
    plan = Plan(
        recipe.train.epochs,
        len(parts.data.classes),
        tta_flip=recipe.train.tta_flip,
        tta_translate=recipe.train.tta_translate,
        progress=False,
        measure_step_memory=False,
    )
    trainer = trainer_for(parts, plan, RunLog(".", enabled=False))
    checkpoint = Path(ns.checkpoint) if ns.checkpoint else checkpoints_in(run / "checkpoints")[0]
    state = load_checkpoint(checkpoint)
    trainer.load_state_dict(state, "checkpoint")
    ema = parts.hooks.stateful.get("ema")
    rows: list[dict[str, Any]] = []

    def evaluation(name: str, tta: bool, images: int | None = None, batch: int | None = None,
                   translate: int | None = None) -> None:  # fmt: skip
        loader = trainer.test_loader
        full, batch_size, shift = (loader.images, loader.labels), loader.batch_size, plan.tta_translate
        if images:
            loader.images, loader.labels = full[0][:images], full[1][:images]
        loader.batch_size = batch or batch_size
        plan.tta_translate = shift if translate is None else translate
        try:
            seconds, (_, accuracy, _) = timed(lambda: trainer._measure(live=False, tta=tta), ns.repeats)
        finally:
            (loader.images, loader.labels), loader.batch_size, plan.tta_translate = full, batch_size, shift
        rows.append({"what": f"{name}, in batches of {batch or batch_size}", "seconds": seconds, "accuracy": accuracy,
                     "images": images or len(full[1])})  # fmt: skip

    # the EMA state as the checkpoint holds it: averaged running statistics, or calibrated ones where the checkpoint
    # was taken right after an evaluation (at an epoch's end)
    averaged = copy.deepcopy(ema.state_dict()) if ema is not None else None
    if ema is not None:
        ema.eval_model(trainer.model)  # calibrated once here, so the evaluations below time the evaluation alone
    views = (2 if plan.tta_flip else 1) * (3 if plan.tta_translate else 1)
    for batch in (256, 1024):
        evaluation(f"full evaluation: the run's TTA, {views} views (TTA)", tta=True, batch=batch)
        evaluation("one view, every test image (train.mid_eval=plain)", tta=False, batch=batch)
    if plan.tta_flip and plan.tta_translate:
        evaluation("the image and its mirror, 2 views (TTA)", tta=True, batch=256, translate=0)
    half = trainer.test_loader.num_samples // 2
    evaluation("one view, the first half of the test set", tta=False, images=half, batch=256)
    evaluation("one view, the first fifth of the test set", tta=False, images=half * 2 // 5, batch=256)
    if ema is not None:
        for images in (4096, 2048, 1024):
            for batch in (None, 1024):
                calibrate = (
                    bn_calibration(parts.train_loader, parts.precision.autocast, images)
                    if batch is None
                    else joined_calibration(parts.train_loader, parts.precision.autocast, images, batch)
                )

                def recalibrated(calibrate: Any = calibrate) -> None:
                    ema.load_state_dict(averaged)
                    calibrate(ema.averaged.module)

                seconds, _ = timed(recalibrated, ns.repeats)
                ema._calibrated_at = ema.updates  # calibrated: the evaluation below uses these statistics
                _, accuracy, _ = trainer._measure(live=False, tta=False)
                at = f"in batches of {batch}" if batch else f"at the training batch ({parts.train_loader.batch_size})"
                rows.append({"what": f"EMA BN recalibration, {images:,} images {at}", "seconds": seconds,
                             "accuracy": accuracy, "images": images})  # fmt: skip
        ema.load_state_dict(averaged)
        ema._calibrated_at = ema.updates  # the averaged running statistics as they are
        _, accuracy, _ = trainer._measure(live=False, tta=False)
        rows.append({"what": "the checkpoint's statistics as they are, one view", "seconds": 0.0,
                     "accuracy": accuracy, "images": 0})  # fmt: skip
    command = shlex.join([sys.executable.rsplit("/", 1)[-1], *sys.argv])
    lines = [
        "# What an evaluation costs",
        "",
        f"`{command}`",
        "",
        f"Run {run} ({recipe.name}, {saved['precision']}, channels_last {saved['train']['channels_last']}), "
        f"checkpoint {checkpoint.name} (epoch {trainer.state.epoch}); {ns.threads} torch thread(s); median of "
        f"{ns.repeats} repeat(s). Accuracy: one view "
        "unless the row says TTA; the recalibration rows' accuracy is that of one view after it.",
        "",
        "| what | images | seconds | test accuracy |",
        "| :--- | ---: | ---: | ---: |",
        *[f"| {r['what']} | {r['images']:,} | {r['seconds']:.2f} | {r['accuracy']:.4f} |" for r in rows],
        "",
    ]
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "evaluation.md", "\n".join(lines))
    write_atomic(out / "evaluation.json", json.dumps({"command": command, "rows": rows}, indent=2) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
