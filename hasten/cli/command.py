"""What a `hasten` command is, declared once: its name, its one-line summary, its help, its arguments and the
function that runs it, in one `Command`; and what the commands share (the RECIPE and key=value arguments, the trust
flag, where a plot goes, how a summary is shown).

The parser (hasten/cli/parser.py) is built from these declarations alone: a new command is its handler, its
`Command` beside it, and its place in parser.COMMANDS; it is then listed, parsed, helped and dispatched, with no
second list to keep in step.
"""

from __future__ import annotations

import argparse
import json
import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console

from hasten.errors import HastenError

console = Console(stderr=True)


@dataclass(frozen=True)
class Argument:
    """One `add_argument` call, kept as data so a command's arguments stand in its declaration."""

    flags: tuple[str, ...]
    options: dict[str, Any] = field(default_factory=dict)

    def option_strings(self) -> list[str]:
        """The options it adds, as a user may type them (a --flag made boolean also adds --no-flag)."""
        names = [flag for flag in self.flags if flag.startswith("-")]
        if self.options.get("action") is argparse.BooleanOptionalAction:
            names += [f"--no-{flag[2:]}" for flag in names if flag.startswith("--")]
        return names


def arg(*flags: str, **options: Any) -> Argument:
    """An argument as `parser.add_argument(*flags, **options)` would add it."""
    return Argument(flags, options)


@dataclass(frozen=True)
class Command:
    """A `hasten` command: everything the parser, the command listing and the error handling know of it."""

    name: str
    summary: str  # one line in `hasten --help`'s listing
    description: str  # the paragraph under `hasten NAME --help`'s usage
    arguments: tuple[Argument, ...]
    run: Callable[[argparse.Namespace], int]  # the handler: the exit code
    notes: Callable[[], str] | None = None  # help's closing lines, written only when help is asked for
    resumable: bool = False  # a run stopped by a signal continues with `resume=auto` (its last line says so)

    def option_strings(self) -> list[str]:
        return ["-h", "--help", *(name for argument in self.arguments for name in argument.option_strings())]


TWO_COLUMNS = re.compile(r"\s*\S+(?: \S+)*\s{2,}(?=\S)")  # `  name    what it is`: up to the second column


class HelpFormatter(argparse.HelpFormatter):
    """argparse's help, except that text written as several lines keeps them, each still wrapped to the terminal
    (never inside a name like `seed-cnn-32`): a listing stays a listing, and a line laid out in two columns
    (`  name    what it is`) wraps under its second column. A one-line paragraph is filled as argparse fills it."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" not in text:
            return super()._fill_text(text, width, indent)
        lines = []
        for line in text.splitlines():
            own = indent + line[: len(line) - len(line.lstrip())]
            columns = TWO_COLUMNS.match(line)
            hanging = indent + " " * columns.end() if columns else own
            wrap = textwrap.TextWrapper(width, initial_indent=own, subsequent_indent=hanging, break_on_hyphens=False,
                                        break_long_words=False)  # fmt: skip
            lines.append(wrap.fill(line.strip()))
        return "\n".join(lines)


class CommandParser(argparse.ArgumentParser):
    """A command's parser. Its help's closing notes are written when help is formatted, not when the parser is
    built: the train command's name the shipped recipes, and reading those imports the recipe schema (and torch),
    which no other use of the parser should pay for."""

    def __init__(self, *args: Any, notes: Callable[[], str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, formatter_class=HelpFormatter, **kwargs)
        self.notes = notes

    def format_help(self) -> str:
        if self.notes is not None:
            self.epilog = self.notes()
        return super().format_help()


RECIPE_ARGUMENTS = arg("args", nargs="*", metavar="[RECIPE] [key=value ...]")

TRUST_HELP = (
    "import and run the model.target/data.target the source's recipe names (a run folder, checkpoint or export is "
    "data: without this flag hasten refuses to import code it names); only for files whose author you trust"
)


def split_recipe(args: list[str]) -> tuple[str | None, list[str]]:
    """The first positional without '=' is the recipe; the rest are overrides."""
    if args and "=" not in args[0]:
        return args[0], args[1:]
    stray = [a for a in args if "=" not in a]
    if stray:
        raise HastenError(f"expected key=value overrides after the recipe, got {stray[0]!r}")
    return None, args


def recipe_of(ns: argparse.Namespace) -> Any:
    """The command's recipe from its RECIPE and key=value arguments, validated: the prelude of every command that
    takes one, so recipe errors show before torch and the data are loaded."""
    from hasten.recipe.schema import load_recipe

    source, overrides = split_recipe(ns.args)
    return load_recipe(source, overrides)


def show(summary: dict[str, Any], as_table: bool, table: Any) -> None:
    """A finished run's summary: as a rich table with the progress bar on, else as JSON (for scripts)."""
    if as_table:
        Console().print(table(summary))
    else:
        print(json.dumps(summary, indent=2))


PLOT_SIGNATURE = b"atplotlib"  # in the first bytes of every PNG, PDF and SVG matplotlib writes (its Software tag)
PLOT_SUFFIXES = (".png", ".pdf", ".svg")  # the formats whose files carry that tag


def plot_path(given: str | None, default: Any) -> Any:
    """Where a command draws its plot: `--plot PATH` or the default in the run folder, `.png` added to a name
    without a suffix (as matplotlib would: the file checked is the file written); never one of a run's own files,
    nor an existing file that is not a plot drawn before (recognised by its contents, matplotlib's tag, not by its
    name: a text file called fake.png is the user's), nor a link, nor a format other than PLOT_SUFFIXES."""
    from pathlib import Path

    from hasten.runfolder.folder import RunFolderError, check_output

    path = Path(given) if given else Path(default)
    if path.is_dir():
        raise RunFolderError(f"--plot {path} is a folder; give the file to draw, e.g. {path / Path(default).name}")
    if not path.suffix:
        path = path.with_name(path.name + ".png")
    if path.suffix.lower() not in PLOT_SUFFIXES:
        raise RunFolderError(f"--plot {path}: draws {', '.join(PLOT_SUFFIXES)} files; give a path ending in one")
    check_output(path, overwrite=True, what="--plot")  # never a run's own file
    if (path.exists() or path.is_symlink()) and (path.is_symlink() or not drawn_before(path)):
        raise RunFolderError(
            f"--plot {path} exists and is not a plot hasten drew (it would be replaced): give another path"
        )
    return path


def drawn_before(path: Any) -> bool:
    """Whether `path` is a regular file holding a plot matplotlib drew: its tag within the first 4 KiB (PNG, SVG)
    or the last (a PDF's document information)."""
    try:
        with open(path, "rb") as file:
            head = file.read(4096)
            file.seek(max(0, file.seek(0, 2) - 4096))
            return PLOT_SIGNATURE in head or PLOT_SIGNATURE in file.read(4096)
    except OSError:
        return False
