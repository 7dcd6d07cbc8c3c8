"""The `hasten` command line, built from the commands' declarations: argparse subparsers, one per command, each
parsing its own arguments intermixed, so options may stand before or after the recipe and the key=value overrides
(as with git and torchrun). A mistyped command or option is answered with the closest one, not a list.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Sequence

from hasten.cli.command import Command, CommandParser, HelpFormatter
from hasten.cli.data import DATA
from hasten.cli.experiments import BENCH, GAN, SWEEP, TRANSFER
from hasten.cli.train import TRAIN
from hasten.cli.tuning import BATCH_SIZE, LR_FIND, SCHEDULE
from hasten.cli.use import EVALUATE, EXPORT, PREDICT
from hasten.version import __version__

# the order of `hasten --help`'s listing: training first, then what shows a run before it trains, then the
# experiments, then what uses a trained model
COMMANDS: tuple[Command, ...] = (
    TRAIN, DATA, SCHEDULE, LR_FIND, BATCH_SIZE, BENCH, SWEEP, TRANSFER, GAN, EXPORT, EVALUATE, PREDICT
)  # fmt: skip
TOP_OPTIONS = ("-h", "--help", "--version")


class UsageError(Exception):
    """A command line that names no command or option hasten has: its message says the closest one; exit 2."""


def build() -> tuple[argparse.ArgumentParser, dict[str, CommandParser]]:
    """The top parser (`hasten --help`, `--version`) and each command's parser, by name."""
    width = max(len(command.name) for command in COMMANDS) + 2
    listing = "\n".join(f"  {command.name:<{width}}{command.summary}" for command in COMMANDS)
    top = argparse.ArgumentParser(
        prog="hasten",
        usage="%(prog)s [-h] [--version] COMMAND ...",
        description="Train neural networks fast and memory-efficiently, and measure what each technique buys.",
        epilog=f"commands:\n{listing}\n\nRun 'hasten COMMAND --help' for a command's options.",
        formatter_class=HelpFormatter,
    )
    top.add_argument("--version", action="version", version=f"hasten {__version__}")
    # argparse's own listing of subcommands misaligns names longer than its column ('batch-size'): the epilog
    # above lists them, from the same declarations
    subparsers = top.add_subparsers(prog="hasten", dest="command", parser_class=CommandParser, help=argparse.SUPPRESS)
    parsers = {}
    for command in COMMANDS:
        parser = subparsers.add_parser(command.name, description=command.description, notes=command.notes)
        for argument in command.arguments:
            parser.add_argument(*argument.flags, **argument.options)
        parsers[command.name] = parser
    return top, parsers


def parse(argv: Sequence[str]) -> tuple[Command, argparse.Namespace]:
    """The command `argv` names and its parsed arguments. `--help`, `--version` and argparse's own usage errors exit
    (SystemExit) as argparse does; a mistyped command or option raises UsageError, naming the closest."""
    argv = list(argv)
    top, parsers = build()
    by_name = {command.name: command for command in COMMANDS}
    if argv[0] in TOP_OPTIONS:
        top.parse_args(argv[:1])  # prints the help or the version and exits
    if argv[0].startswith("-"):
        raise UsageError(
            f"unknown option {argv[0]!r} before the command: 'hasten' itself takes only --help and --version, and a "
            "command's options come after its name, e.g. 'hasten train --devices 2'"
        )
    command = by_name.get(argv[0])
    if command is None:  # the closest command, not a list
        close = difflib.get_close_matches(argv[0], list(by_name), n=1, cutoff=0.5)
        hint = f"; did you mean 'hasten {close[0]}'?" if close else f"; the commands: {', '.join(by_name)}"
        raise UsageError(f"unknown command {argv[0]!r}{hint}")
    parser = parsers[command.name]
    ns, unknown = parser.parse_known_intermixed_args(argv[1:])
    options = [word.partition("=")[0] for word in unknown if word.startswith("-") and word != "-"]
    if options:
        known = command.option_strings()
        close = difflib.get_close_matches(options[0], known, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}?" if close else f"its options: {', '.join(known)}"
        raise UsageError(f"unknown option {options[0]!r} of 'hasten {command.name}'; {hint}")
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")  # a stray word: argparse's usage and exit 2
    return command, ns
