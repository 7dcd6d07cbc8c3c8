"""The textbook training loop, as a newcomer writes it from a PyTorch tutorial: the baseline every bench shows.

A per-sample `Dataset` (one image converted and normalised per `__getitem__`), `DataLoader(batch_size=32,
shuffle=True)` with its default single process and collate, Adam at 1e-3, fp32, no augmentation, no LR
schedule, `loss.item()` every step, and a test-set evaluation after each epoch. Same model and data as the
recipe it stands beside. It is kinder than the tutorial in one way: the images are already uint8 tensors in
memory, not PIL images decoded per sample, so the gap it shows is a lower bound.

Its run folder has the same files and columns as a hasten run (metrics.csv, summary.json with
time-to-accuracy over training seconds, evaluation excluded), so the bench tables and plots treat it alike.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from hasten.clock import Clock
from hasten.data import ImageDataset
from hasten.data.imagefolder import ImageFolder, read_into_memory
from hasten.data.loader import channel_stats
from hasten.engine.distributed import resolve_device
from hasten.engine.memory import peak_memory_bytes, reset_peak
from hasten.errors import HastenError
from hasten.models import build_model
from hasten.recipe.schema import Recipe, apply_overrides, dotted, to_yaml, validate
from hasten.run.assemble import seed_everything
from hasten.run.build import dataset
from hasten.run.resolve import run_dir
from hasten.run.trainer import METRICS
from hasten.runfolder.log import RunLog
from hasten.techniques.registry import SWITCHES

# textbook training as recipe overrides: Adam at 1e-3, a constant LR, no augmentation, no technique of the registry
# (hasten/techniques/registry.py) whatever the recipe turns on, but those that only make the same training faster.
# The naive loop trains this way, and benchmarks/generalization.py's plain baseline too (with hasten's loop and
# batch 64)
PLAIN_TRAINING = [
    "optim.name=adam",
    "optim.lr=0.001",
    "optim.base_batch=null",
    "optim.weight_decay=0",
    "schedule.warmup=0",
    "schedule.min_warmup_steps=0",
    *(switch.switched_off for switch in SWITCHES if not switch.speed),
]

# what the naive loop does, written as recipe overrides so its saved recipe.yaml says so: the speed techniques
# off too (fp32, no channels_last, no compile, no recomputation)
NAIVE_OVERRIDES = [
    "train.batch_size=32",
    "train.eval_batch_size=1000",
    *PLAIN_TRAINING,
    *(switch.switched_off for switch in SWITCHES if switch.speed),
    "train.accumulate=1",
]


def naive_recipe(recipe: Recipe, epochs: int | None = None) -> Recipe:
    """`recipe` (its data, model, seed, device, thresholds) with the naive loop's settings, for `epochs`.
    Settings the recipe has no key for are left out, so the naive recipe follows the recipe's version."""
    raw = recipe.model_dump(mode="json")

    def has(key: str) -> bool:
        try:
            dotted(raw, key)
        except KeyError:
            return False
        return True

    overrides = [o for o in NAIVE_OVERRIDES if has(o.partition("=")[0])] + (
        [f"train.epochs={epochs}"] if epochs else []
    )
    return validate(apply_overrides(raw, overrides), "naive recipe")


class PerSampleDataset(Dataset):
    """(image, label) one at a time: uint8 -> float in [0, 1] -> normalised, as torchvision's transforms do."""

    def __init__(self, images: Tensor, labels: Tensor, mean: Tensor, std: Tensor):
        self.images, self.labels = images, labels
        self.mean, self.std = mean.view(-1, 1, 1), std.view(-1, 1, 1)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        image = (self.images[index].float() / 255 - self.mean) / self.std
        return image, int(self.labels[index])


def evaluate(model: nn.Module, loader: DataLoader, device: torch.device) -> tuple[float, float]:
    """Test loss and accuracy."""
    model.eval()
    loss_sum, correct, count = 0.0, 0, 0
    with torch.no_grad():
        for images, labels in loader:
            images, labels = images.to(device), labels.to(device)
            logits = model(images)
            loss_sum += nn.functional.cross_entropy(logits, labels, reduction="sum").item()
            correct += (logits.argmax(1) == labels).sum().item()
            count += len(labels)
    return loss_sum / count, correct / count


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_naive(recipe: Recipe, epochs: int | None = None, clock: Clock | None = None) -> dict[str, Any]:
    """Train `recipe`'s model on its data the textbook way for `epochs` (default: the recipe's); writes the run
    folder (`run.dir`) and returns the summary, with the same keys as `hasten.train`'s. Wall-clock times count
    from `clock`'s start (default: this call)."""
    clock = clock or Clock()
    recipe = naive_recipe(recipe, epochs)
    device = resolve_device(recipe.device)
    if recipe.train.threads:  # the machine's setting, not a technique: the same for every variant
        torch.set_num_threads(recipe.train.threads)
    seed_everything(recipe.seed)
    data = dataset(recipe)
    if isinstance(data, ImageFolder):  # a tutorial's loop holds a small folder in memory too; decoded once here
        data = read_into_memory(data)
    if not isinstance(data, ImageDataset):
        raise HastenError(f"data.name: the naive loop needs an in-memory dataset, not {recipe.data.name}")
    mean, std = channel_stats(data.train_images)
    train_set = PerSampleDataset(data.train_images, data.train_labels, mean, std)
    test_set = PerSampleDataset(data.test_images, data.test_labels, mean, std)
    train_loader = DataLoader(train_set, batch_size=recipe.train.batch_size, shuffle=True)
    test_loader = DataLoader(test_set, batch_size=recipe.train.eval_batch_size)
    model = build_model(recipe.model, data.image_shape, data.num_classes).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=recipe.optim.lr)
    loss_fn = nn.CrossEntropyLoss()

    log = RunLog(run_dir(recipe), tensorboard=False)
    log.write_recipe(
        "# the naive loop (hasten/experiments/naive.py); only data, model and epochs apply\n" + to_yaml(recipe)
    )
    log.start_metrics(METRICS)
    reset_peak(device)
    time_to_accuracy: dict[str, float | None] = {f"{t:.2f}": None for t in recipe.run.thresholds}
    time_to_accuracy_wall = dict(time_to_accuracy)
    train_seconds, best, step, curve = 0.0, 0.0, 0, []
    startup_seconds = round(clock.seconds(), 3)
    for epoch in range(1, recipe.train.epochs + 1):
        model.train()
        running_loss, correct, seen = 0.0, 0, 0
        _sync(device)
        epoch_started = time.perf_counter()
        for images, labels in train_loader:
            images, labels = images.to(device), labels.to(device)
            optimizer.zero_grad()
            logits = model(images)
            loss = loss_fn(logits, labels)
            loss.backward()
            optimizer.step()
            running_loss += loss.item() * len(labels)
            correct += (logits.argmax(1) == labels).sum().item()
            seen += len(labels)
            step += 1
        _sync(device)
        seconds = time.perf_counter() - epoch_started
        train_seconds += seconds
        test_loss, test_accuracy = evaluate(model, test_loader, device)
        wall = round(clock.seconds(), 3)
        for key, reached in time_to_accuracy.items():
            if reached is None and test_accuracy >= float(key):
                time_to_accuracy[key], time_to_accuracy_wall[key] = round(train_seconds, 3), wall
        curve.append([round(train_seconds, 3), step, round(test_accuracy, 6), wall])
        best = max(best, test_accuracy)
        row = {
            "epoch": epoch,
            "step": step,
            "lr": recipe.optim.lr,
            "train_loss": running_loss / seen,
            "train_accuracy": correct / seen,
            "test_loss": test_loss,
            "test_accuracy": test_accuracy,
            "train_seconds": round(train_seconds, 3),
            "images_per_second": seen / max(seconds, 1e-9),
            "loss_scale": 1.0,
        }
        log.epoch(row, step)
    summary = {
        "test_accuracy": row["test_accuracy"],
        "test_loss": row["test_loss"],
        "best_test_accuracy": best,
        "train_accuracy": row["train_accuracy"],
        "train_loss": row["train_loss"],
        "epochs": recipe.train.epochs,
        "steps": step,
        "skipped_steps": 0,
        "wall_seconds": round(clock.seconds(), 3),
        "train_seconds": round(train_seconds, 3),
        "images_per_second": round(len(train_set) * recipe.train.epochs / max(train_seconds, 1e-9), 1),
        "peak_memory_bytes": peak_memory_bytes(device),
        "time_to_accuracy": time_to_accuracy,
        "time_to_accuracy_wall": time_to_accuracy_wall,
        "startup_seconds": startup_seconds,
        "accuracy_curve": curve,
    }
    log.summary(summary)
    log.close()
    return summary | {"run_dir": str(log.dir), "lr": recipe.optim.lr}
