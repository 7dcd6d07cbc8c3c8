"""The progress bar of a training run (rich): loss, accuracy and images/s while an epoch runs, then one line
per finished epoch, so the terminal keeps the history."""

from __future__ import annotations

from types import TracebackType
from typing import Any, Self

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class EpochBar:
    """A rich bar over one epoch's batches with a line of text beside it, redrawn every `every` batches (reading
    losses syncs the device: not every batch); the base of the classifier's and the GAN's progress."""

    def __init__(
        self, batches: int, *, enabled: bool = True, updates_per_epoch: int = 20, console: Console | None = None
    ):
        self.batches, self.enabled = batches, enabled
        self.every = max(1, batches // updates_per_epoch)
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[text]}"),
            TimeElapsedColumn(),
            console=console or Console(stderr=True),
            transient=True,
            disable=not enabled,
        )
        self.task: Any = None

    def __enter__(self) -> Self:
        self.progress.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.progress.__exit__(kind, value, tb)

    def start_epoch(self, epoch: int, epochs: int) -> None:
        if self.task is not None:
            self.progress.remove_task(self.task)
        self.task = self.progress.add_task(f"epoch {epoch}/{epochs}", total=self.batches, text="")

    def due(self, batch: int) -> bool:
        return self.enabled and (batch % self.every == 0 or batch == self.batches)

    def show(self, batch: int, text: str) -> None:
        if self.task is not None:
            self.progress.update(self.task, completed=batch, text=text)


class EpochProgress(EpochBar):
    """The classifier's: loss, accuracy and images/s so far in the epoch; a line per finished epoch."""

    def update(self, batch: int, *, loss: float, accuracy: float, images_per_second: float) -> None:
        self.show(batch, f"loss {loss:.4f}  acc {accuracy:.4f}  {images_per_second:,.0f} img/s")

    def end_epoch(self, row: dict[str, Any]) -> None:
        if self.enabled:
            self.progress.console.print(
                f"epoch {row['epoch']:>2}  train {row['train_loss']:.3f} {row['train_accuracy']:.2%}  "
                f"test {row['test_loss']:.3f} [bold]{row['test_accuracy']:.2%}[/bold]  "
                f"{row['images_per_second']:,.0f} img/s  {row['train_seconds']:.1f} s",
                highlight=False,
            )

    def note(self, text: str) -> None:
        if self.enabled:
            self.progress.console.print(f"[yellow]{text}")
