"""DCGAN in fp32, bf16 and fp16 on the same budget: images/s, peak step memory, the Fréchet distance
on hasten classifier features after the budget's epochs, and the sample grids side by side.

    .venv/bin/python benchmarks/gan.py            # the full run (~10 min on 2 busy CPU cores)
    .venv/bin/python benchmarks/gan.py --quick    # smoke run: synthetic data, tiny networks (~1 min)

The recipe is the shipped dcgan-fashion (width 32, batch 64, Adam 2e-4 with betas (0.5, 0.999)); the budget is
--epochs over the first --subset training images, from the same seed in every precision. The report has the
class mix of each precision's samples (the quality classifier's labels) and warns of mode collapse where one
class takes more than half.

1. The classifier behind the quality measure: the shipped fashion-fast recipe for --classifier-epochs, trained
   once into OUT/classifier and reused by later runs.
2. Speed and memory, in one process, every precision built from the same seed: a warm-up step each, one step
   each under hasten.engine.memory.measure_peak (peak tensor bytes of one D+G step above what was live before it),
   then --rounds rounds of one timed step per precision, interleaved round-robin so drift in the machine's load
   hits all alike. images/s comes from the fastest step (other processes only ever add time), the median
   beside it. A precision leaves the rounds once it has two timed steps and has used --probe-seconds: fp16
   on a CPU takes tens of seconds a step, as its convolutions have no fast fp16 kernels there.
3. Quality: each precision trained by `train_gan` on the budget, in its own run folder OUT/<precision> (grids,
   metrics.csv, checkpoints), unless its measured speed projects more than --max-train-seconds; then it is
   reported as not trained, with the projection. The Fréchet distance (hasten classifier features, not
   Inception FID) is of --samples generated images against as many test images, with the same classifier,
   sample count and noise for every precision; real training images against the test images give the floor.

Writes report.md (table, command, machine), results.json (everything, with the exact recipes) and grids.png
(real images, then each precision's last grid) into --out (default bench/gan).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

import torch
from PIL import Image

from hasten.engine.memory import measure_peak
from hasten.experiments.frechet import NAME, train_classifier
from hasten.experiments.gan import GanParts, build_gan, gan_step, train_gan
from hasten.experiments.gan_report import collapse_warning, save_grid
from hasten.experiments.report import DASH, format_bytes, markdown_table
from hasten.models.dcgan import padded, signed
from hasten.recipe.gan import GanRecipe, load_gan_recipe
from hasten.recipe.schema import Fp32WeightsPrecision
from hasten.runfolder.log import environment, write_atomic

PRECISIONS = list(get_args(Fp32WeightsPrecision))  # every mode the GAN takes
QUICK_GAN = [
    "data.name=synthetic",
    "data.synthetic_size=512",
    "model.width=8",
    "model.latent=16",
    "train.batch_size=32",
]
QUICK_CLASSIFIER = ["model.width=8", "train.batch_size=64", "data.augment.translate=0"]


@dataclass
class Probe:
    """One precision's speed and memory measurement."""

    precision: str
    parts: GanParts
    batches: Iterator[torch.Tensor]
    step_seconds: list[float] = field(default_factory=list)
    peak_step_bytes: int = 0

    def step(self) -> None:
        gan_step(self.parts, next(self.batches))

    def timed_step(self) -> None:
        sync(self.parts.device)
        started = time.perf_counter()
        self.step()
        sync(self.parts.device)
        self.step_seconds.append(time.perf_counter() - started)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def endless(parts: GanParts) -> Iterator[torch.Tensor]:
    """Real batches, epoch after epoch."""
    epoch = 0
    while True:
        parts.loader.set_epoch(epoch)
        for real, _ in parts.loader.batches():
            yield real
        epoch += 1


def probe(recipes: dict[str, GanRecipe], rounds: int, probe_seconds: float, log: Any) -> dict[str, Probe]:
    """Speed and memory of every precision (module docstring, step 2)."""
    probes = {}
    for name, recipe in recipes.items():
        parts = build_gan(recipe)
        probes[name] = Probe(name, parts, endless(parts))
    for p in probes.values():
        p.step()  # warm-up: first-call costs (oneDNN primitives, Adam's state, the scaler's first calibration)
    for p in probes.values():
        p.parts.optimizer_d.zero_grad(set_to_none=True)  # the last step's gradients freed before the probe
        p.parts.optimizer_g.zero_grad(set_to_none=True)
        with measure_peak(p.parts.device) as peak:
            p.step()
        p.peak_step_bytes = peak.bytes
        log(f"{p.precision}: peak step memory {format_bytes(peak.bytes)}")
    active = list(probes.values())
    for _ in range(rounds):
        for p in list(active):
            p.timed_step()
            if len(p.step_seconds) >= 2 and sum(p.step_seconds) >= probe_seconds:
                active.remove(p)
        if not active:
            break
    for p in probes.values():
        batch = p.parts.recipe.train.batch_size
        log(f"{p.precision}: {batch / min(p.step_seconds):,.0f} images/s best of {len(p.step_seconds)} steps")
    return probes


def classifier(args: argparse.Namespace, gan_overrides: list[str], out: Path, log: Any) -> tuple[Path, float]:
    recipe = load_gan_recipe("dcgan-fashion", gan_overrides)
    # no train.threads: main sets them for the whole process, so the cached classifier does not depend on them
    overrides = [
        f"data.name={recipe.data.name}",
        f"data.synthetic_size={recipe.data.synthetic_size}",
        "seed=0",
        f"train.epochs={args.classifier_epochs}",
        "run.progress=false",
        "run.tensorboard=false",
        *(QUICK_CLASSIFIER if args.quick else []),
    ]
    started = time.perf_counter()
    path, accuracy, reused = train_classifier("fashion-fast", overrides, out / "classifier")
    how = "reused" if reused else f"trained in {time.perf_counter() - started:.0f} s"
    log(f"classifier {path}: test accuracy {accuracy:.4f} ({how})")
    return path, accuracy


def result_of(p: Probe, max_train_seconds: float, log: Any) -> dict[str, Any]:
    """Train the precision on the budget when its speed allows; its row of results."""
    recipe = p.parts.recipe
    batch, steps = recipe.train.batch_size, recipe.train.epochs * len(p.parts.loader)
    median = statistics.median(p.step_seconds)
    row: dict[str, Any] = {
        "step_seconds": p.step_seconds,
        "images_per_second_best": batch / min(p.step_seconds),
        "images_per_second_median": batch / median,
        "peak_step_bytes": p.peak_step_bytes,
        "projected_train_seconds": steps * median,
        "recipe": recipe.model_dump(mode="json"),
    }
    if steps * median > max_train_seconds:
        log(f"{p.precision}: not trained, {steps} steps would take ~{steps * median / 60:.0f} min")
        return row | {"trained": False}
    log(f"{p.precision}: training {steps} steps")
    summary = train_gan(recipe)
    curve = [float(r["frechet"]) for r in summary_rows(Path(summary["run_dir"])) if r["frechet"]]
    return row | {"trained": True, "summary": summary, "frechet_per_epoch": curve}


def summary_rows(run_dir: Path) -> list[dict[str, str]]:
    import csv

    with open(run_dir / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def table(results: dict[str, dict[str, Any]]) -> str:
    base = results.get("fp32", {})
    rows = []
    for name, r in results.items():
        s = r.get("summary", {})
        ratio = r["images_per_second_best"] / base["images_per_second_best"] if base else None
        memory_ratio = r["peak_step_bytes"] / base["peak_step_bytes"] if base and base["peak_step_bytes"] else None
        top = max(s["class_distribution"].items(), key=lambda kv: kv[1]) if s else None
        rows.append([
            name,
            f"{r['images_per_second_best']:,.0f}",
            f"{r['images_per_second_median']:,.0f}",
            DASH if ratio is None else f"{ratio:.2f}x",
            format_bytes(r["peak_step_bytes"]),
            DASH if memory_ratio is None else f"{memory_ratio:.2f}x",
            f"{s['frechet_distance']:.1f}" if s else f"not trained (~{r['projected_train_seconds'] / 60:.0f} min)",
            f"{top[0]} {top[1]:.0%}" if top else DASH,
            f"{s['skipped_steps_d']} / {s['skipped_steps_g']}" if s else DASH,
            f"{s['loss_scale_d']:g} / {s['loss_scale_g']:g}" if s and name == "fp16" else DASH,
            f"{s['train_seconds']:.0f} s" if s else DASH,
        ])  # fmt: skip
    headers = [
        "precision", "images/s (best)", "median", "vs fp32", "peak step memory", "vs fp32", "Fréchet ↓",
        "largest class", "skipped D / G", "loss scale D / G", "training",
    ]  # fmt: skip
    return markdown_table(headers, rows)


def class_table(results: dict[str, dict[str, Any]]) -> str:
    """Share of each trained precision's samples per class (the quality classifier's labels), one row a class."""
    trained = {name: r["summary"]["class_distribution"] for name, r in results.items() if r["trained"]}
    if not trained:
        return ""
    classes = list(next(iter(trained.values())))
    rows = [[name, *(f"{mix[name]:.1%}" for mix in trained.values())] for name in classes]
    return markdown_table(["class", *trained], rows)


def collapse_lines(results: dict[str, dict[str, Any]]) -> list[str]:
    """A warning line per trained precision whose samples collapsed onto one class."""
    lines = []
    for name, r in results.items():
        warning = collapse_warning(r["summary"]["class_distribution"]) if r["trained"] else None
        if warning:
            lines.append(f"**Warning ({name})**: {warning}.")
    return lines


def grids_figure(results: dict[str, dict[str, Any]], real_grid: Path, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("real (first 64 training images)", real_grid)]
    for name, r in results.items():
        if r["trained"]:
            s = r["summary"]
            title = f"{name}: Fréchet {s['frechet_distance']:.1f}, {r['images_per_second_best']:,.0f} img/s"
            panels.append((title, Path(s["grid"])))
        else:
            panels.append((f"{name}: not trained (~{r['projected_train_seconds'] / 60:.0f} min)", None))
    fig, axes = plt.subplots(1, len(panels), figsize=(3.3 * len(panels), 3.6))
    for ax, (title, grid) in zip(axes, panels, strict=True):
        if grid is not None:
            ax.imshow(Image.open(grid), cmap="gray", vmin=0, vmax=255)
        else:
            ax.text(0.5, 0.5, "too slow here:\nno fast fp16\nconvolutions on CPU", ha="center", va="center")
        ax.set_title(title, fontsize=8)
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="synthetic data, tiny networks, one thread")
    parser.add_argument("--out", default="bench/gan")
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--epochs", type=int, default=3, help="the budget: epochs over --subset images")
    parser.add_argument("--subset", type=int, default=8192, help="the budget: first N training images")
    parser.add_argument("--samples", type=int, default=2000, help="generated and test images per Fréchet estimate")
    parser.add_argument("--classifier-epochs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5, help="timed steps per precision, round-robin")
    parser.add_argument("--probe-seconds", type=float, default=40.0, help="stop timing a precision after this")
    parser.add_argument("--max-train-seconds", type=float, default=300.0, help="train only what fits in this")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="more overrides of the GAN recipe")
    args = parser.parse_args(argv)
    if args.quick:
        args.epochs, args.subset, args.samples, args.classifier_epochs, args.threads = 2, 256, 128, 1, 1
        args.rounds, args.probe_seconds = 3, 5.0
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()

    def log(text: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f} s] {text}", flush=True)

    gan_overrides = [
        *(QUICK_GAN if args.quick else []), "seed=0", f"data.subset={args.subset}", f"train.epochs={args.epochs}",
        f"quality.samples={args.samples}", "run.progress=false", "run.tensorboard=false",
        *([f"train.threads={args.threads}"] if args.threads else []), *args.overrides,
    ]  # fmt: skip
    weights, accuracy = classifier(args, gan_overrides, out, log)
    recipes = {
        name: load_gan_recipe("dcgan-fashion", [*gan_overrides, f"quality.classifier={weights}",
                                                f"precision={name}", f"run.dir={out / name}",
                                                "run.overwrite=true"])  # the benchmark owns its folders
        for name in args.precisions.split(",")
    }  # fmt: skip
    probes = probe(recipes, args.rounds, args.probe_seconds, log)
    real_grid = out / "real.png"
    data = next(iter(probes.values())).parts.data
    save_grid(signed(padded(data.train_images[:64])), real_grid, rows=8)
    results = {}
    for name in list(probes):
        p = probes.pop(name)  # the other probes' networks can go while this one trains
        results[name] = result_of(p, args.max_train_seconds, log)
    figure = grids_figure(results, real_grid, out / "grids.png")
    floor = next((r["summary"]["quality"]["real_train_vs_test"] for r in results.values() if r["trained"]), None)
    command = shlex.join([".venv/bin/python", "benchmarks/gan.py", *(argv if argv is not None else sys.argv[1:])])
    report = "\n".join([
        f"# DCGAN: fp32 vs bf16 vs fp16 ({'quick' if args.quick else 'full'} run)", "",
        f"Command: `{command}`", "",
        f"Budget: {args.epochs} epochs over the first {args.subset} training images, batch "
        f"{next(iter(recipes.values())).train.batch_size}, seed 0. Fréchet: {NAME}; {args.samples} generated vs "
        f"{args.samples} test images; classifier fashion-fast, {args.classifier_epochs} epochs, test accuracy "
        f"{accuracy:.4f}; floor (real training vs test images): {DASH if floor is None else f'{floor:.1f}'}.", "",
        table(results), "",
        *collapse_lines(results), "",
        "Generated samples per class (the quality classifier's labels; 10% each when every class is covered):", "",
        class_table(results), "",
        f"Machine: {environment()['machine']}, {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}, "
        f"load average {os.getloadavg()[0]:.1f}; wall time {time.perf_counter() - started:.0f} s. Grids: {figure}", "",
    ])  # fmt: skip
    write_atomic(out / "report.md", report)
    everything = {"command": command, "environment": environment(), "load_average": os.getloadavg(),
                  "classifier": {"weights": str(weights), "test_accuracy": accuracy}, "results": results}  # fmt: skip
    write_atomic(out / "results.json", json.dumps(everything, indent=2, default=str) + "\n")
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
