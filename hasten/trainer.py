"""The training loop: small, readable, with a few fixed hook points.

Per batch: `on_batch` hooks (mixup, cutmix) take and return (images, soft targets); forward under the
precision's autocast; backward; the precision's step (which may skip on inf/NaN); the LR schedule advances
only when the step was taken; `after_step` hooks (EMA) see the model. Each epoch ends with an evaluation on
the test set, a row of metrics.csv and TensorBoard scalars.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from hasten.data.loader import InMemoryLoader
from hasten.memory import peak_memory_bytes, reset_peak
from hasten.precision import Precision
from hasten.progress import EpochProgress
from hasten.runlog import RunLog
from hasten.tricks import one_hot, smooth, soft_cross_entropy

BatchHook = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]
StepHook = Callable[[nn.Module], None]

METRICS = [
    "epoch",
    "step",
    "lr",
    "train_loss",
    "train_accuracy",
    "test_loss",
    "test_accuracy",
    "train_seconds",
    "images_per_second",
    "loss_scale",
]


@dataclass
class Plan:
    """What the loop is asked to do, apart from the objects it drives."""

    epochs: int
    num_classes: int
    label_smoothing: float = 0.0
    tta_flip: bool = False
    thresholds: Sequence[float] = (0.90, 0.91, 0.92, 0.93, 0.94)
    progress: bool = True


@dataclass
class Hooks:
    on_batch: list[BatchHook] = field(default_factory=list)
    after_step: list[StepHook] = field(default_factory=list)
    eval_model: Callable[[nn.Module], nn.Module] | None = None  # e.g. the EMA copy instead of the live model


@dataclass
class State:
    """Where the run is; what a checkpoint needs besides the objects' own state_dicts."""

    epoch: int = 0  # epochs completed
    batch: int = 0  # batches completed in the current epoch
    step: int = 0  # optimizer steps taken
    skipped_steps: int = 0
    train_seconds: float = 0.0
    time_to_accuracy: dict[str, float | None] = field(default_factory=dict)
    best_accuracy: float = 0.0


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Trainer:
    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        precision: Precision,
        loaders: tuple[InMemoryLoader, InMemoryLoader],
        plan: Plan,
        log: RunLog,
        hooks: Hooks | None = None,
    ):
        self.model, self.optimizer, self.scheduler, self.precision = model, optimizer, scheduler, precision
        self.train_loader, self.test_loader = loaders
        self.plan, self.log, self.hooks = plan, log, hooks or Hooks()
        self.device = next(model.parameters()).device
        self.state = State(time_to_accuracy={f"{t:.2f}": None for t in plan.thresholds})

    def train_step(self, images: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        """One optimizer step on one batch; returns the (detached) loss and the count of correct predictions."""
        y_soft = one_hot(labels, self.plan.num_classes)
        if self.plan.label_smoothing:
            y_soft = smooth(y_soft, self.plan.label_smoothing)
        for hook in self.hooks.on_batch:
            images, y_soft = hook(images, y_soft)
        with self.precision.autocast():
            logits = self.model(images)
            loss = soft_cross_entropy(logits, y_soft)
        self.optimizer.zero_grad(set_to_none=True)
        self.precision.backward(loss)
        if self.precision.step(self.optimizer):
            self.scheduler.step()
            self.state.step += 1
            for after in self.hooks.after_step:
                after(self.model)
        else:
            self.state.skipped_steps += 1
        return loss.detach(), (logits.detach().argmax(1) == labels).sum()

    @torch.no_grad()
    def evaluate(self) -> tuple[float, float]:
        """Test loss and accuracy over the whole test set."""
        model = self.hooks.eval_model(self.model) if self.hooks.eval_model else self.model
        was_training = model.training
        model.eval()
        loss_sum = torch.zeros((), device=self.device)
        correct = torch.zeros((), device=self.device, dtype=torch.long)
        count = 0
        for images, labels in self.test_loader:
            with self.precision.autocast():
                logits = model(images).float()
                if self.plan.tta_flip:
                    logits = (logits + model(images.flip(3)).float()) / 2
            loss_sum += torch.nn.functional.cross_entropy(logits, labels, reduction="sum")
            correct += (logits.argmax(1) == labels).sum()
            count += len(labels)
        model.train(was_training)
        return loss_sum.item() / count, correct.item() / count

    def train_epoch(self, bar: EpochProgress) -> dict[str, float]:
        self.model.train()
        self.train_loader.set_epoch(self.state.epoch)
        loss_sum = torch.zeros((), device=self.device)
        correct = torch.zeros((), device=self.device, dtype=torch.long)
        seen = 0
        _sync(self.device)
        started = time.perf_counter()
        for images, labels in self.train_loader.batches(self.state.batch):
            loss, right = self.train_step(images, labels)
            loss_sum += loss * len(labels)
            correct += right
            seen += len(labels)
            self.state.batch += 1
            if bar.due(self.state.batch):
                elapsed = time.perf_counter() - started
                bar.update(
                    self.state.batch,
                    loss=loss_sum.item() / seen,
                    accuracy=correct.item() / seen,
                    images_per_second=seen / max(elapsed, 1e-9),
                )
        _sync(self.device)
        seconds = time.perf_counter() - started
        self.state.train_seconds += seconds
        self.state.epoch += 1
        self.state.batch = 0
        return {
            "train_loss": loss_sum.item() / max(seen, 1),
            "train_accuracy": correct.item() / max(seen, 1),
            "images_per_second": seen / max(seconds, 1e-9),
        }

    def fit(self) -> dict[str, Any]:
        """Train for the planned epochs; returns the summary (also written to summary.json)."""
        reset_peak(self.device)
        started = time.perf_counter()
        self.log.start_metrics(METRICS)
        with EpochProgress(len(self.train_loader), enabled=self.plan.progress and self.log.enabled) as bar:
            while self.state.epoch < self.plan.epochs:
                bar.start_epoch(self.state.epoch + 1, self.plan.epochs)
                row = self.train_epoch(bar)
                test_loss, test_accuracy = self.evaluate()
                if not math.isfinite(row["train_loss"]):
                    bar.note(f"epoch {self.state.epoch}: training loss is {row['train_loss']}")
                for key in self.state.time_to_accuracy:
                    if self.state.time_to_accuracy[key] is None and test_accuracy >= float(key):
                        self.state.time_to_accuracy[key] = round(self.state.train_seconds, 3)
                self.state.best_accuracy = max(self.state.best_accuracy, test_accuracy)
                row.update(
                    epoch=self.state.epoch,
                    step=self.state.step,
                    lr=self.optimizer.param_groups[0]["lr"],
                    test_loss=test_loss,
                    test_accuracy=test_accuracy,
                    train_seconds=round(self.state.train_seconds, 3),
                    loss_scale=self.precision.loss_scale,
                )
                self.log.epoch(row, self.state.step)
                bar.end_epoch(row)
        return self.summary(row, time.perf_counter() - started)

    def summary(self, last: dict[str, float], wall_seconds: float) -> dict[str, Any]:
        """The run's results; `wall_seconds` counts evaluation too, `train_seconds` only the training steps."""
        images = len(self.train_loader) and self.train_loader.shard_size * self.state.epoch
        summary = {
            "test_accuracy": last["test_accuracy"],
            "test_loss": last["test_loss"],
            "best_test_accuracy": self.state.best_accuracy,
            "train_accuracy": last["train_accuracy"],
            "train_loss": last["train_loss"],
            "epochs": self.state.epoch,
            "steps": self.state.step,
            "skipped_steps": self.state.skipped_steps,
            "wall_seconds": round(wall_seconds, 3),
            "train_seconds": round(self.state.train_seconds, 3),
            "images_per_second": round(images / max(self.state.train_seconds, 1e-9), 1),
            "peak_memory_bytes": peak_memory_bytes(self.device),
            "time_to_accuracy": dict(self.state.time_to_accuracy),
        }
        self.log.summary(summary)
        return summary
