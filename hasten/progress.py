"""What a run shows in the terminal (rich): a bar over each epoch with loss, accuracy, images/s and the time left
in the whole run; a second bar while an evaluation runs, so no second passes in silence; one line per finished
epoch, so the terminal keeps the history; and `say`, hasten's notes, wrapped to fit 80 columns between words
(never inside a number or a path).
"""

from __future__ import annotations

import contextlib
import sys
import textwrap
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any, Self, TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from hasten.text import printable

WIDTH = 80  # columns every line hasten prints fits in: the narrowest terminal in common use


def wrap(text: str, width: int = WIDTH, indent: str = "  ") -> list[str]:
    """`text` as lines of at most `width` columns, broken between words only (a word longer than a line stays
    whole, on its own line), continuation lines indented by `indent`; each line of a multi-line text on its own."""
    lines: list[str] = []
    for line in text.splitlines() or [""]:
        lines += textwrap.wrap(
            line, width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False
        ) or [""]
    return lines


def say(text: str, file: TextIO | None = None) -> None:
    """A note of hasten's on stderr (the opening lines, the probe, warnings), wrapped to fit 80 columns. Names in it
    (a run folder's, a file's, a class's) are shown as text: control characters escaped (hasten.text.printable),
    the note's own line breaks kept."""
    print("\n".join(wrap(printable(text, keep="\n"))), file=file or sys.stderr, flush=True)


@contextlib.contextmanager
def step_shown(text: str, enabled: bool = True) -> Iterator[None]:
    """A live step on stderr while the block runs (a spinner, `text` and the seconds so far), where stderr is a
    terminal and `enabled`; it leaves no line behind (what it did is said after). Elsewhere nothing is drawn."""
    console = Console(stderr=True)
    if not (enabled and console.is_terminal):
        yield
        return
    short = wrap(text, WIDTH - 12)[0]
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console,
                  transient=True) as bar:  # fmt: skip
        bar.add_task(short, total=None)
        yield


# loggers of libraries whose warnings speak of their internals, not of the user's run: torch's ONNX exporter lists
# the torchvision operators it cannot register ("torchvision is not installed. Skipping torchvision::nms")
QUIET_LOGGERS = ("torch.onnx._internal.exporter._registration",)


def _errors_only(record: Any) -> bool:
    return record.levelno >= 40  # logging.ERROR


def quiet_third_party() -> None:
    """Keep notices that mean nothing to a user of hasten out of its output: FutureWarnings and
    DeprecationWarnings raised outside hasten (a library warning another library about an API it calls), and all
    but the errors of QUIET_LOGGERS (a filter on each: torch resets their levels when it is imported). hasten's
    own warnings, and every error, still show."""
    import logging
    import warnings

    for category in (FutureWarning, DeprecationWarning):
        warnings.filterwarnings("ignore", category=category)
        warnings.filterwarnings("default", category=category, module=r"hasten(\.|$)")  # checked first: hasten's own
    for name in QUIET_LOGGERS:
        logger = logging.getLogger(name)
        if _errors_only not in logger.filters:
            logger.addFilter(_errors_only)


def clock_text(seconds: float) -> str:
    """Seconds as m:ss, or h:mm:ss from an hour."""
    whole = max(0, round(seconds))
    hours, rest = divmod(whole, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class EpochBar:
    """A rich bar over one epoch's batches with a line of text beside it, redrawn every `every` batches (reading
    losses syncs the device: not every batch); the base of the classifier's and the GAN's progress."""

    def __init__(
        self, batches: int, *, enabled: bool = True, updates_per_epoch: int = 20, console: Console | None = None
    ):
        self.batches, self.enabled = batches, enabled
        self.every = max(1, batches // updates_per_epoch)
        self.progress = Progress(
            *self.columns(),
            console=console or Console(stderr=True),
            transient=True,
            disable=not enabled,
        )
        self.task: Any = None

    def columns(self) -> tuple[str | ProgressColumn, ...]:
        return (
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[text]}"),
            TimeElapsedColumn(),
        )

    def __enter__(self) -> Self:
        self.progress.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.progress.__exit__(kind, value, tb)

    def start_epoch(self, epoch: int, epochs: int) -> None:
        if self.task is not None:
            self.progress.remove_task(self.task)
        self.task = self.progress.add_task(f"epoch {epoch}/{epochs}", total=self.batches, text="", eta="")

    def due(self, batch: int) -> bool:
        return self.enabled and (batch % self.every == 0 or batch == self.batches)

    def show(self, batch: int, text: str) -> None:
        if self.task is not None:
            self.progress.update(self.task, completed=batch, text=text)

    def print(self, text: str, **options: Any) -> None:
        """A line above the bar (the terminal keeps it); `text` fits 80 columns already."""
        if self.enabled:
            self.progress.console.print(text, highlight=False, soft_wrap=True, **options)


class EpochProgress(EpochBar):
    """The classifier's: loss, accuracy and images/s so far in the epoch and the run's time left (ETA); a bar per
    evaluation; a line per finished epoch. Every line fits 80 columns."""

    def columns(self) -> tuple[str | ProgressColumn, ...]:
        return (
            TextColumn("[bold]{task.description}"),
            BarColumn(bar_width=12),  # the row fits 80 columns: 9 + 12 + 9 + 34 + 11, and the gaps
            MofNCompleteColumn(),
            TextColumn("{task.fields[text]}"),
            TextColumn("{task.fields[eta]}"),
        )

    def update(
        self, batch: int, *, loss: float, accuracy: float, images_per_second: float, eta_seconds: float | None = None
    ) -> None:
        self.show(batch, f"loss {loss:.3f} acc {accuracy:.2%} {images_per_second:,.0f} img/s")
        if self.task is not None:
            self.progress.update(self.task, eta="" if eta_seconds is None else f"ETA {clock_text(eta_seconds)}")

    @contextlib.contextmanager
    def evaluation(self, text: str, batches: int) -> Iterator[Callable[[], None]]:
        """A bar over an evaluation's batches, shown while it runs; yields the function that advances it."""
        if not self.enabled:
            yield lambda: None
            return
        task = self.progress.add_task("evaluate", total=max(batches, 1), text=text, eta="")
        try:
            yield lambda: self.progress.advance(task)
        finally:
            self.progress.remove_task(task)

    def end_epoch(self, row: dict[str, Any], views: int = 1, wall_seconds: float | None = None) -> None:
        self.print(epoch_line(row, views, wall_seconds))

    def note(self, text: str) -> None:
        for line in wrap(text):
            self.print(f"[yellow]{escape(line)}")


def epoch_line(row: dict[str, Any], views: int = 1, wall_seconds: float | None = None) -> str:
    """An epoch's line (rich markup), at most 80 columns: training loss and accuracy, the test accuracy ("(TTA)":
    an evaluation over several views of each test image), images/s, the training seconds so far and the wall
    clock since the command started (images/s is left out where the line would not fit)."""
    parts = [
        f"epoch {row['epoch']:>2}",
        f"train {row['train_loss']:.3f} {row['train_accuracy']:.1%}",
        f"test [bold]{row['test_accuracy']:.2%}[/bold]" + (" (TTA)" if views > 1 else ""),
        f"{row['images_per_second']:,.0f} img/s",
        f"{row['train_seconds']:.1f} s",
        *([f"{clock_text(wall_seconds)} wall"] if wall_seconds is not None else []),
    ]
    line = "  ".join(parts)
    if len(line) - len("[bold][/bold]") > WIDTH:
        line = "  ".join(parts[:3] + parts[4:])
    return line


def escape(text: str) -> str:
    from rich.markup import escape as rich_escape

    return rich_escape(text)
