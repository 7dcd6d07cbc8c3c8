"""`hasten gan`: a DCGAN (Radford et al., 2015) trained with two optimizers in fp32, bf16 or fp16.

Per batch of real images x and noise z (standard normal):
  D step: loss_D = BCE(D(x), r) + BCE(D(G(z)), 0), with G(z) detached, so only D gets gradients; r is
          train.real_label (1, or e.g. 0.9 for one-sided label smoothing, Salimans et al., 2016);
  G step: loss_G = BCE(D(G(z)), 1), the non-saturating loss (Goodfellow et al., 2014) the paper uses, with D's
          parameters frozen for the pass, so the backward pass computes no gradients for them.
Each network has its own Adam and its own precision object (hasten.engine.precision). In fp16 that is one dynamic
loss scaler (torch.amp.GradScaler) per network: each loss is scaled by its own network's scale and each step
checked for inf/NaN in that network's gradients only, so an overflow in D's step skips only D's step and
halves only D's scale, and the other way round. D returns logits and the sigmoid lives in the loss, computed
in fp32 outside autocast: no 16-bit binary cross-entropy, no dtype mismatch between the networks.

Each epoch: a PNG grid of samples from a fixed noise batch (run.dir/samples/epoch-NNN.png), a row of
metrics.csv and TensorBoard scalars (G and D losses, D's mean output on real and generated images, loss
scales, skipped steps, the Fréchet distance on hasten-classifier features), and a checkpoint of both
networks, both optimizers, both scalers, the position and the RNG states, from which `resume=auto`
continues as if never stopped. Quality measures live in hasten/experiments/frechet.py.

The run folder is kept as `hasten train` keeps it (docs/reliability.md): locked while the run writes, claimed by
the fresh-folder rule, and SIGINT/SIGTERM (hasten/run/signals.py, caught from the start to the summary) stop the run
at a step boundary after a checkpoint, exit 128 + the signal. A stop during the start-up, before the run wrote
anything, leaves the folder as it was (`resume=auto` starts afresh, saying so); one once the last epoch is done lets
the run finish.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from pydantic import TypeAdapter, ValidationError
from rich.console import Console
from rich.markup import escape
from torch import Tensor, nn

from hasten.data import ImageDataset, load_dataset
from hasten.data.loader import InMemoryLoader
from hasten.engine.distributed import resolve_device
from hasten.engine.memory import peak_memory_bytes, reset_peak
from hasten.engine.precision import Precision, make_precision
from hasten.errors import CheckpointError, RecipeError, schema_problems
from hasten.experiments.frechet import QualityProbe, quality_probe
from hasten.experiments.gan_report import (
    GanProgress,
    collapse_warning,
    generate,
    largest_class,
    save_class_histogram,
    save_grid,
    save_quality_plot,
)
from hasten.models.dcgan import SIZE, Discriminator, Generator, dcgan, padded
from hasten.progress import say
from hasten.recipe.gan import GanRecipe, gan_recipe_yaml
from hasten.run.assemble import seed_everything
from hasten.run.plan import Interrupted
from hasten.run.signals import StopRequest, handling_stop_signals
from hasten.runfolder.checkpoint import (
    latest_usable,
    load_checkpoint,
    prune,
    remove_stale_temporaries,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from hasten.runfolder.folder import RunLock, claim_fresh, refuse_taken
from hasten.runfolder.log import RunLog

METRICS = [
    "epoch", "step", "loss_d", "loss_g", "d_real", "d_fake", "train_seconds", "images_per_second",
    "loss_scale_d", "loss_scale_g", "skipped_d", "skipped_g", "frechet", "largest_class", "largest_share",
]  # fmt: skip
LOG_EVERY = 10  # steps between per-step TensorBoard scalars (reading a loss syncs the device)
Measured = tuple[float, dict[str, float]]  # (Fréchet distance, class distribution)


@dataclass
class GanParts:
    """Everything `build_gan` makes from a recipe."""

    recipe: GanRecipe
    device: torch.device
    data: ImageDataset
    loader: InMemoryLoader  # real images, padded, in [-1, 1]
    generator: Generator
    discriminator: Discriminator
    optimizer_g: torch.optim.Optimizer
    optimizer_d: torch.optim.Optimizer
    precision_g: Precision  # one per network: in fp16, each has its own loss scaler
    precision_d: Precision
    fixed_noise: Tensor  # the z of every epoch's sample grid


def build_gan(recipe: GanRecipe) -> GanParts:
    """Device, both precisions, the data (padded to 32x32, in [-1, 1]), both networks and optimizers, the grid's
    noise; errors in the recipe or the data surface here, before anything is written."""
    device = resolve_device(recipe.device)
    if recipe.train.threads:
        torch.set_num_threads(recipe.train.threads)
    scale = recipe.loss_scale
    precision_g, precision_d = (
        make_precision(recipe.precision, device, scale.init, scale.growth_interval) for _ in range(2)
    )
    seed_everything(recipe.seed)
    cfg = recipe.data
    data = load_dataset(cfg.name, cfg.root, download=cfg.download, synthetic_size=cfg.synthetic_size, seed=recipe.seed)
    channels, height, width = data.image_shape
    if height != width or height not in (28, SIZE):
        raise RecipeError(f"data.name: the DCGAN takes 28x28 or 32x32 images; {data.name} has {height}x{width}")
    images = data.train_images[: cfg.subset] if cfg.subset else data.train_images
    if len(images) < recipe.train.batch_size:
        raise RecipeError(f"train.batch_size: {recipe.train.batch_size} is more than the {len(images)} training images")
    half = torch.full((channels,), 0.5)  # (x / 255 - 0.5) / 0.5 maps pixels to [-1, 1]
    loader = InMemoryLoader(
        padded(images), data.train_labels[: len(images)], recipe.train.batch_size,
        mean=half, std=half, shuffle=True, seed=recipe.seed, drop_last=True, device=device,
    )  # fmt: skip
    generator, discriminator = (net.to(device) for net in dcgan(recipe.model.latent, recipe.model.width, channels))
    optimizer_g, optimizer_d = (
        torch.optim.Adam(net.parameters(), lr=recipe.optim.lr, betas=recipe.optim.betas)
        for net in (generator, discriminator)
    )
    noise = torch.Generator().manual_seed(recipe.seed)  # its own stream: the grid's z never depends on training
    fixed_noise = torch.randn(recipe.run.grid**2, recipe.model.latent, generator=noise).to(device)
    return GanParts(
        recipe, device, data, loader, generator, discriminator, optimizer_g, optimizer_d, precision_g, precision_d,
        fixed_noise,
    )  # fmt: skip


@contextlib.contextmanager
def frozen(module: nn.Module) -> Iterator[None]:
    """Inside the block, `module`'s parameters need no gradients (their flags are restored after)."""
    flags = [p.requires_grad for p in module.parameters()]
    module.requires_grad_(False)
    try:
        yield
    finally:
        for param, flag in zip(module.parameters(), flags, strict=True):
            param.requires_grad_(flag)


@dataclass
class StepResult:
    loss_d: Tensor  # detached, fp32
    loss_g: Tensor
    d_real: Tensor  # D's mean probability that real images are real
    d_fake: Tensor  # ... that generated ones are, before D's step
    stepped_d: bool  # False when D's step was skipped for inf/NaN gradients
    stepped_g: bool


def gan_step(parts: GanParts, real: Tensor) -> StepResult:
    """One D step and one G step on a batch of real images in [-1, 1] (module docstring)."""
    generator, discriminator = parts.generator, parts.discriminator
    z = torch.randn(real.shape[0], parts.recipe.model.latent, device=real.device)
    ones, zeros = torch.ones(real.shape[0], device=real.device), torch.zeros(real.shape[0], device=real.device)
    with parts.precision_d.autocast():
        fake = generator(z)
        real_logits, fake_logits = discriminator(real).float(), discriminator(fake.detach()).float()
    real_targets = torch.full_like(ones, parts.recipe.train.real_label)  # below 1: one-sided label smoothing
    loss_d = F.binary_cross_entropy_with_logits(real_logits, real_targets) + F.binary_cross_entropy_with_logits(
        fake_logits, zeros
    )
    parts.optimizer_d.zero_grad(set_to_none=True)
    parts.precision_d.backward(loss_d)
    stepped_d = parts.precision_d.step(parts.optimizer_d)
    with frozen(discriminator), parts.precision_g.autocast():
        gen_logits = discriminator(fake).float()
    loss_g = F.binary_cross_entropy_with_logits(gen_logits, ones)
    parts.optimizer_g.zero_grad(set_to_none=True)
    parts.precision_g.backward(loss_g)
    stepped_g = parts.precision_g.step(parts.optimizer_g)
    return StepResult(
        loss_d.detach(), loss_g.detach(), torch.sigmoid(real_logits.detach()).mean(),
        torch.sigmoid(fake_logits.detach()).mean(), stepped_d, stepped_g,
    )  # fmt: skip


@dataclass
class GanState:
    """Where the run is; what a checkpoint holds besides the objects' own state_dicts (plain values only)."""

    epoch: int = 0  # epochs completed
    batch: int = 0  # batches completed in the current epoch
    step: int = 0  # batches trained: one D step and one G step each, taken or skipped
    skipped_d: int = 0
    skipped_g: int = 0
    train_seconds: float = 0.0
    sums: dict[str, float] = field(default_factory=dict)  # the current epoch so far: losses, D outputs, images
    history: list[dict[str, Any]] = field(default_factory=list)  # the metrics.csv rows so far


CHECKPOINT_KEYS = (
    "generator", "discriminator", "optimizer_g", "optimizer_d", "scaler_g", "scaler_d", "state", "rng", "recipe",
)  # fmt: skip


def checkpoint_state(parts: GanParts, state: GanState) -> dict[str, Any]:
    return {
        "generator": parts.generator.state_dict(),
        "discriminator": parts.discriminator.state_dict(),
        "optimizer_g": parts.optimizer_g.state_dict(),
        "optimizer_d": parts.optimizer_d.state_dict(),
        "scaler_g": parts.precision_g.state_dict(),
        "scaler_d": parts.precision_d.state_dict(),
        "state": asdict(state),
        "rng": rng_state(),
        "recipe": parts.recipe.model_dump(mode="json"),
    }


def check_resumable(recipe: GanRecipe, saved: dict[str, Any], path: Path) -> None:
    """A CheckpointError naming the file unless it is a `hasten gan` checkpoint of the same model and precision."""
    missing = [key for key in CHECKPOINT_KEYS if key not in saved]
    if missing:
        raise CheckpointError(f"resume: {path} is not a checkpoint of `hasten gan` (it has no {', '.join(missing)})")
    ours = recipe.model_dump(mode="json")
    for key in ("model", "precision"):
        if saved["recipe"][key] != ours[key]:
            raise CheckpointError(
                f"resume: {path} was trained with {key}={saved['recipe'][key]}, this recipe has {ours[key]}"
            )


def restore(parts: GanParts, saved: dict[str, Any], path: Path) -> GanState:
    """Load a checkpoint into `parts` (networks, optimizers, scalers, RNG); returns the run's position, its fields
    checked against GanState's types. Fails closed: whatever a malformed checkpoint makes loading raise is a
    CheckpointError naming the file."""
    check_resumable(parts.recipe, saved, path)
    try:
        state = TypeAdapter(GanState).validate_python(saved["state"])
    except ValidationError as error:
        raise CheckpointError(f"resume: {path}: state: {schema_problems(error)}") from None
    if min(state.epoch, state.batch, state.step, state.skipped_d, state.skipped_g) < 0:
        raise CheckpointError(f"resume: {path}: state: negative counts ({state.epoch}, {state.batch}, {state.step})")
    try:
        parts.generator.load_state_dict(saved["generator"])
        parts.discriminator.load_state_dict(saved["discriminator"])
        parts.optimizer_g.load_state_dict(saved["optimizer_g"])
        parts.optimizer_d.load_state_dict(saved["optimizer_d"])
        parts.precision_g.load_state_dict(saved["scaler_g"])
        parts.precision_d.load_state_dict(saved["scaler_d"])
        set_rng_state(saved["rng"])
    except Exception as error:  # noqa: BLE001 - a malformed checkpoint can break any step of the loading
        raise CheckpointError(f"resume: {path} does not fit this run: {type(error).__name__}: {error}") from None
    return state


def resume_point(recipe: GanRecipe, folder: Path) -> tuple[Path, dict[str, Any]] | None:
    """The checkpoint `resume` names: `auto` is the newest complete one in `folder` (None when there is none)."""
    if recipe.resume is None:
        return None
    if recipe.resume == "auto":
        return latest_usable(folder)
    path = Path(recipe.resume)
    return path, load_checkpoint(path, require_digest=True)


def save(parts: GanParts, state: GanState, folder: Path) -> Path:
    path = save_checkpoint(checkpoint_state(parts, state), folder / f"step-{state.step}.pt")
    prune(folder, parts.recipe.run.keep, protect=(path,))
    return path


def train_epoch(parts: GanParts, state: GanState, log: RunLog, bar: Any, stop: StopRequest | None = None) -> bool:
    """Train the rest of the current epoch (from batch `state.batch`), accumulating into `state.sums`. Returns
    whether the epoch is complete: False when `stop` was asked for, seen before a step (a step boundary)."""
    parts.loader.set_epoch(state.epoch)
    parts.generator.train()
    parts.discriminator.train()
    keys = ("loss_d", "loss_g", "d_real", "d_fake")
    totals = torch.zeros(len(keys), device=parts.device, dtype=torch.float64)  # summed over images
    seen = 0
    if parts.device.type == "cuda":
        torch.cuda.synchronize(parts.device)
    started = time.perf_counter()
    try:
        for real, _ in parts.loader.batches(state.batch):
            if stop is not None and stop.signum is not None:
                return False
            result = gan_step(parts, real)
            values = torch.stack([result.loss_d, result.loss_g, result.d_real, result.d_fake])
            totals += values.double() * len(real)
            seen += len(real)
            state.batch, state.step = state.batch + 1, state.step + 1
            state.skipped_d += not result.stepped_d
            state.skipped_g += not result.stepped_g
            if state.step % LOG_EVERY == 0:
                log.scalar("loss_d_per_step", float(result.loss_d), state.step)
                log.scalar("loss_g_per_step", float(result.loss_g), state.step)
            bar.advance(state.batch, totals, seen, started)
    finally:  # also on a stop: the checkpoint written then keeps the partial epoch
        if parts.device.type == "cuda":
            torch.cuda.synchronize(parts.device)
        seconds = time.perf_counter() - started
        state.train_seconds += seconds
        for key, total in zip((*keys, "images", "seconds"), (*totals.tolist(), seen, seconds), strict=True):
            state.sums[key] = state.sums.get(key, 0.0) + total
    return True


def epoch_row(parts: GanParts, state: GanState, measured: Measured | None) -> dict[str, Any]:
    top = largest_class(measured[1]) if measured else ("", "")
    images = max(state.sums.get("images", 0.0), 1.0)
    row: dict[str, Any] = {k: state.sums.get(k, 0.0) / images for k in ("loss_d", "loss_g", "d_real", "d_fake")}
    return row | {
        "epoch": state.epoch,
        "step": state.step,
        "train_seconds": round(state.train_seconds, 3),
        "images_per_second": round(images / max(state.sums.get("seconds", 0.0), 1e-9), 1),
        "loss_scale_d": parts.precision_d.loss_scale,
        "loss_scale_g": parts.precision_g.loss_scale,
        "skipped_d": state.skipped_d,
        "skipped_g": state.skipped_g,
        "frechet": "" if measured is None else round(measured[0], 4),
        "largest_class": top[0],  # the class the quality classifier gives most samples: mode collapse shows here
        "largest_share": top[1],
    }


def end_epoch(
    parts: GanParts, state: GanState, probe: QualityProbe | None, log: RunLog, folder: Path
) -> tuple[dict[str, Any], Measured | None, Path]:
    """After an epoch: quality (when due), the sample grid, the metrics row, the checkpoint (its path returned)."""
    recipe = parts.recipe
    state.epoch, state.batch = state.epoch + 1, 0
    due = probe is not None and (recipe.quality.every_epoch or state.epoch == recipe.train.epochs)
    measured = probe.measure(generate(parts.generator, probe.noise)) if due else None
    row = epoch_row(parts, state, measured)
    state.history.append(row)
    state.sums = {}
    pixels = save_grid(
        generate(parts.generator, parts.fixed_noise),
        folder / "samples" / f"epoch-{state.epoch:03d}.png",
        recipe.run.grid,
    )
    log.epoch(row, state.step)
    if log.writer is not None:
        log.writer.add_image("samples", pixels, state.step, dataformats="HW" if pixels.ndim == 2 else "HWC")
    return row, measured, save(parts, state, folder / "checkpoints")


def train_gan(recipe: GanRecipe, trust_code: bool = False) -> dict[str, Any]:
    """Train the GAN recipe; writes the run folder (module docstring) and returns the summary. The folder is
    locked while the run writes it and obeys the fresh-folder rule, as `hasten train`'s (hasten/runfolder/folder.py).
    `trust_code`: a classifier file's recipe may name a model.target to import (hasten/recipe/trust.py).
    SIGINT/SIGTERM, from here to the summary, stop the run with `Interrupted` (module docstring)."""
    console = Console(stderr=True)
    folder = Path(recipe.run.dir or Path("runs") / recipe.name)
    stop = StopRequest()
    with handling_stop_signals(stop.request):
        if recipe.resume is None and not recipe.run.overwrite:
            refuse_taken(folder)  # before the data is read: checked again when claimed, under the lock
        parts = build_gan(recipe)
        with RunLock(folder):
            return _train_gan_locked(recipe, parts, folder, console, trust_code, stop)


STARTUP = "during start-up, before the run wrote anything"  # (Interrupted's `when`) the folder is as it was


def _train_gan_locked(
    recipe: GanRecipe, parts: GanParts, folder: Path, console: Console, trust_code: bool, stop: StopRequest
) -> dict[str, Any]:
    checkpoints = folder / "checkpoints"
    state, found = GanState(), resume_point(recipe, checkpoints)
    if found:
        check_resumable(recipe, found[1], found[0])  # before anything in the run folder is overwritten
    else:  # a fresh run never mixes with another run's files (a classifier's, an earlier GAN's)
        claim_fresh(folder, recipe.run.overwrite, resuming=recipe.resume == "auto")
        if recipe.resume == "auto":
            say(f"resume=auto: no checkpoint in {checkpoints} yet; starting afresh")
    # the probe (which may train a classifier, in hasten's cache) before the run writes its own files: a stop in
    # it, as anywhere before them, leaves the folder as it was
    try:
        probe: QualityProbe | None = (
            quality_probe(recipe, parts.data, parts.device, folder, console, trust_code)
            if recipe.quality.enabled
            else None
        )
    except Interrupted as stopped:  # the classifier's training stopped (its own handlers caught the signal)
        raise Interrupted(stopped.signum, None, f"{STARTUP} (while training the quality classifier)") from None
    if stop.signum is not None:
        raise Interrupted(stop.signum, None, STARTUP)
    # from here on a stop is a checkpoint at the next step boundary (the first one: step 0, before any step)
    log = RunLog(folder, tensorboard=recipe.run.tensorboard)
    log.write_recipe(gan_recipe_yaml(recipe))
    remove_stale_temporaries(checkpoints)
    if found:
        state = restore(parts, found[1], found[0])
        say(f"resuming from {found[0]} (epoch {state.epoch}, batch {state.batch})")
    else:
        seed_everything(recipe.seed)  # the noise stream starts the same whether or not a classifier was trained
    log.start_metrics(METRICS)
    for row in state.history:
        log.epoch(row, row["step"])
    reset_peak(parts.device)
    started = time.perf_counter()
    measured: Measured | None = None
    try:
        with GanProgress(len(parts.loader), enabled=recipe.run.progress and log.enabled, console=console) as bar:
            while state.epoch < recipe.train.epochs:
                bar.start_epoch(state.epoch + 1, recipe.train.epochs)
                if not train_epoch(parts, state, log, bar, stop):
                    raise Interrupted(stop.signum or signal.SIGTERM, save(parts, state, checkpoints))
                row, measured, path = end_epoch(parts, state, probe, log, folder)
                bar.end_epoch(row)
                warn_collapse(console, measured, recipe.quality.collapse_share, f"epoch {state.epoch}")
                if stop.signum is not None and state.epoch < recipe.train.epochs:  # (after the last: the run ends)
                    raise Interrupted(stop.signum, path)
        if probe is not None and measured is None:  # resumed with nothing left to train
            measured = probe.measure(generate(parts.generator, probe.noise))
            warn_collapse(console, measured, recipe.quality.collapse_share, "end of run")
    finally:
        log.close()
    return summarise(parts, state, log, probe, measured, time.perf_counter() - started)


def warn_collapse(console: Console, measured: Measured | None, threshold: float, when: str) -> None:
    """Print the mode-collapse warning (stderr) when one class takes more than `threshold` of the samples."""
    warning = collapse_warning(measured[1], threshold) if measured else None
    if warning:
        console.print(
            f"[bold yellow]warning[/bold yellow] ({when}): {escape(warning)}", highlight=False, soft_wrap=True
        )


def summarise(
    parts: GanParts,
    state: GanState,
    log: RunLog,
    probe: QualityProbe | None,
    measured: Measured | None,
    wall_seconds: float,
) -> dict[str, Any]:
    last = state.history[-1] if state.history else {}
    images = state.step * parts.recipe.train.batch_size
    summary: dict[str, Any] = {
        "precision": parts.recipe.precision,
        "epochs": state.epoch,
        "steps": state.step,
        **{key: last.get(key) for key in ("loss_d", "loss_g", "d_real", "d_fake")},
        "skipped_steps_d": state.skipped_d,
        "skipped_steps_g": state.skipped_g,
        "loss_scale_d": parts.precision_d.loss_scale,
        "loss_scale_g": parts.precision_g.loss_scale,
        "wall_seconds": round(wall_seconds, 3),
        "train_seconds": round(state.train_seconds, 3),
        "images_per_second": round(images / max(state.train_seconds, 1e-9), 1),
        "peak_memory_bytes": peak_memory_bytes(parts.device),
        "grid": str(log.dir / "samples" / f"epoch-{state.epoch:03d}.png"),
    }
    if probe is not None and measured is not None:
        threshold = parts.recipe.quality.collapse_share
        name, share = largest_class(measured[1])
        summary |= {
            "frechet_distance": measured[0],
            "class_distribution": measured[1],
            "largest_class": {"name": name, "share": share},
            "mode_collapse": collapse_warning(measured[1], threshold),  # None when no class takes more
            "quality": probe.info,
        }
        if log.enabled:
            title = f"generated samples per class after epoch {state.epoch} ({probe.info['samples']} samples)"
            path = save_class_histogram(measured[1], log.dir / "class_histogram.png", title, threshold)
            summary["class_histogram"] = str(path)
            floor = probe.info.get("real_train_vs_test")
            title = f"{parts.recipe.name} ({parts.recipe.precision}): sample quality per epoch"
            uniform = 1 / max(len(probe.classes), 1)
            plot = save_quality_plot(state.history, log.dir / "quality.png", title, floor, threshold, uniform)
            if plot is not None:
                summary["quality_plot"] = str(plot)
    log.summary(summary)
    return summary | {"run_dir": str(log.dir)}
