"""What a GAN run shows: sample grids (PNG), the progress bar while it trains, and the results table."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from rich.markup import escape
from rich.table import Table
from torch import Tensor, nn

from hasten.progress import EpochBar

COLLAPSE_SHARE = 0.5  # default quality.collapse_share: one class above half of the samples is mode collapse


@torch.no_grad()
def generate(generator: nn.Module, noise: Tensor, batch: int = 500) -> Tensor:
    """G's images for `noise`, fp32, in [-1, 1], in batches of `batch`.

    Batch norm normalises with each batch's own statistics, as in training and as the reference DCGAN code
    samples, and leaves the running averages alone: early in a run those lag far behind (momentum 0.1 from
    mean 0, variance 1) and would make every image nearly the same grey.
    """
    norms = [m for m in generator.modules() if isinstance(m, nn.BatchNorm2d)]
    was_training, tracking = generator.training, [m.track_running_stats for m in norms]
    generator.train()
    for norm in norms:
        norm.track_running_stats = False  # in train mode: batch statistics, running averages not updated
    try:
        return torch.cat([generator(z).float() for z in noise.split(batch)])
    finally:
        for norm, flag in zip(norms, tracking, strict=True):
            norm.track_running_stats = flag
        generator.train(was_training)


def grid_image(images: Tensor, rows: int, pad: int = 2) -> np.ndarray:
    """`images` (N, C, H, W) in [-1, 1] tiled row by row, `pad` black pixels apart, as uint8 (H', W') for one
    channel or (H', W', 3); `rows` rows of ceil(N / rows) images."""
    n, channels, h, w = images.shape
    cols = -(-n // rows)
    canvas = torch.full((channels, rows * h + (rows + 1) * pad, cols * w + (cols + 1) * pad), -1.0)
    for i, image in enumerate(images.detach().float().cpu()):
        top, left = pad + (i // cols) * (h + pad), pad + (i % cols) * (w + pad)
        canvas[:, top : top + h, left : left + w] = image
    pixels = ((canvas.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    return pixels[0].numpy() if channels == 1 else pixels.permute(1, 2, 0).numpy()


def save_grid(images: Tensor, path: Path, rows: int) -> np.ndarray:
    """Write the grid of `images` to `path` as a PNG, one pixel per pixel (8x8 images of 32x32: 274x274 pixels),
    and return it."""
    pixels = grid_image(images, rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)
    return pixels


class GanProgress(EpochBar):
    """A rich progress bar per epoch (D and G losses so far, images/s), then one line per finished epoch."""

    def advance(self, batch: int, totals: Tensor, seen: int, started: float) -> None:
        """`totals` holds D's and G's losses summed over the `seen` images since `started`."""
        if not self.due(batch):
            return
        loss_d, loss_g = (totals[:2] / max(seen, 1)).tolist()
        rate = seen / max(time.perf_counter() - started, 1e-9)
        self.show(batch, f"D {loss_d:.3f}  G {loss_g:.3f}  {rate:,.0f} img/s")

    def end_epoch(self, row: dict[str, Any]) -> None:
        if self.enabled:
            frechet = f"  Fréchet {row['frechet']:.2f}" if row["frechet"] != "" else ""
            self.progress.console.print(
                f"epoch {row['epoch']:>2}  D {row['loss_d']:.3f}  G {row['loss_g']:.3f}  "
                f"D(x) {row['d_real']:.2f}  D(G(z)) {row['d_fake']:.2f}{frechet}  "
                f"{row['images_per_second']:,.0f} img/s  {row['train_seconds']:.1f} s",
                highlight=False,
            )


def largest_class(distribution: dict[str, float]) -> tuple[str, float]:
    """The class the classifier gives most samples to, and its share (the first such class on a tie)."""
    name = max(distribution, key=lambda key: distribution[key])
    return name, distribution[name]


def collapse_warning(distribution: dict[str, float], threshold: float = COLLAPSE_SHARE) -> str | None:
    """A warning naming the class when one class takes more than `threshold` of the samples, else None.

    Mode collapse (Goodfellow et al., 2014; Salimans et al., 2016): G maps most of z onto a few outputs. The
    class mix that the quality classifier gives the samples shows it directly.
    """
    if not distribution:
        return None
    name, share = largest_class(distribution)
    if share <= threshold:
        return None
    return (
        f"mode collapse: the classifier puts {share:.0%} of the generated samples in class {name!r} "
        f"(more than {threshold:.0%}; {1 / len(distribution):.0%} each if all {len(distribution)} were covered)"
    )


def histogram_lines(distribution: dict[str, float], width: int = 24) -> list[str]:
    """The class mix as text bars, one line per class in the classifier's order: `name  ████▌  12.3%`."""
    blocks = " ▏▎▍▌▋▊█"
    label = max((len(name) for name in distribution), default=0)
    lines = []
    for name, share in distribution.items():
        eighths = round(share * width * 8)
        bar = "█" * (eighths // 8) + (blocks[eighths % 8] if eighths % 8 else "")
        lines.append(f"{name:<{label}}  {bar:<{width}}  {share:6.1%}")
    return lines


def save_class_histogram(distribution: dict[str, float], path: Path, title: str, threshold: float) -> Path:
    """A bar chart of the share of generated samples per class (PNG), with the uniform share and the collapse
    threshold drawn as lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names, shares = list(distribution), list(distribution.values())
    fig, ax = plt.subplots(figsize=(6.4, 3.2))
    ax.bar(range(len(names)), [100 * s for s in shares], color="tab:blue")
    ax.axhline(100 / max(len(names), 1), color="gray", linestyle="--", linewidth=1, label="uniform")
    ax.axhline(100 * threshold, color="tab:red", linestyle=":", linewidth=1, label="collapse warning")
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("% of generated samples")
    ax.set_ylim(0, 100)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def save_quality_plot(
    history: list[dict[str, Any]], path: Path, title: str, floor: float | None, threshold: float, uniform: float
) -> Path | None:
    """Per epoch, the Fréchet distance (left, log scale, with the real-vs-real floor) and the largest class's share
    of the samples (right, with the collapse threshold and the `uniform` share); None when nothing was measured.
    Rows without a largest share (from a checkpoint written before that column existed) are left out of the right."""
    rows = [row for row in history if row.get("frechet") not in ("", None)]
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = [row["epoch"] for row in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3.2))
    left.plot(epochs, [float(row["frechet"]) for row in rows], marker="o", markersize=3)
    if floor:
        left.axhline(floor, color="gray", linestyle="--", linewidth=1, label=f"real vs real {floor:.2g}")
        left.legend(fontsize=8)
    left.set_yscale("log")
    left.set(xlabel="epoch", ylabel="Fréchet distance (classifier features)")
    shares = [
        (row["epoch"], 100 * float(row["largest_share"])) for row in rows if row.get("largest_share") not in ("", None)
    ]
    if shares:
        right.plot(*zip(*shares, strict=True), marker="o", markersize=3)
    right.axhline(100 * threshold, color="tab:red", linestyle=":", linewidth=1, label="collapse warning")
    right.axhline(100 * uniform, color="gray", linestyle="--", linewidth=1, label=f"uniform {uniform:.0%}")
    right.set(xlabel="epoch", ylabel="largest class, % of samples", ylim=(0, 100))
    right.legend(fontsize=8)
    from matplotlib.ticker import MaxNLocator

    for axis in (left, right):
        axis.grid(alpha=0.3, which="both")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs are whole numbers
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def results_table(summary: dict[str, Any]) -> Table:
    """The end-of-run table `hasten gan` prints."""
    table = Table(title=f"results ({summary['precision']})", show_header=False)
    table.add_row("epochs", f"{summary['epochs']} ({summary['steps']} steps)")
    table.add_row("losses", f"D {summary['loss_d']:.3f}  G {summary['loss_g']:.3f}")
    if "frechet_distance" in summary:
        quality = summary["quality"]
        table.add_row("Fréchet distance", f"{summary['frechet_distance']:.2f} ({quality['measure']})")
        table.add_row("  real vs real", f"{quality['real_train_vs_test']:.2f} (train vs test images, same count)")
        for i, line in enumerate(histogram_lines(summary["class_distribution"])):
            table.add_row("class mix" if i == 0 else "", escape(line))
        if summary.get("mode_collapse"):
            table.add_row("[bold yellow]warning", "[yellow]" + escape(summary["mode_collapse"]))
    if summary["skipped_steps_d"] or summary["skipped_steps_g"] or summary["precision"] == "fp16":
        table.add_row("loss scales", f"D {summary['loss_scale_d']:g}  G {summary['loss_scale_g']:g}")
        table.add_row("skipped steps", f"D {summary['skipped_steps_d']}  G {summary['skipped_steps_g']}")
    table.add_row("throughput", f"{summary['images_per_second']:,.0f} images/s")
    table.add_row("peak memory", f"{summary['peak_memory_bytes'] / 2**20:,.0f} MiB")
    table.add_row("wall time", f"{summary['wall_seconds']:.1f} s (training {summary['train_seconds']:.1f} s)")
    table.add_row("samples", summary["grid"])
    table.add_row("run folder", summary.get("run_dir", ""))
    return table
