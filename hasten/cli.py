"""The `hasten` command: the only module that knows about argv.

Options may stand before or after the recipe and the `key=value` overrides, as with git and torchrun.
Exit codes: 0 success; 2 usage, recipe, data or checkpoint error (message names the field or file);
130 after SIGINT.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

import hasten
from hasten.errors import HastenError

console = Console(stderr=True)


def _split_recipe(args: list[str]) -> tuple[str | None, list[str]]:
    """The first positional without '=' is the recipe; the rest are overrides."""
    if args and "=" not in args[0]:
        return args[0], args[1:]
    stray = [a for a in args if "=" not in a]
    if stray:
        raise HastenError(f"expected key=value overrides after the recipe, got {stray[0]!r}")
    return None, args


def _format_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def results_table(summary: dict[str, Any]) -> Table:
    table = Table(title="results", show_header=False)
    table.add_row("test accuracy", f"{summary['test_accuracy']:.4f}")
    table.add_row("epochs", str(summary["epochs"]))
    table.add_row("wall time", f"{summary['wall_seconds']:.1f} s (training {summary['train_seconds']:.1f} s)")
    table.add_row("throughput", f"{summary['images_per_second']:,.0f} images/s")
    table.add_row("peak memory", _format_bytes(summary["peak_memory_bytes"]))
    for threshold, seconds in summary["time_to_accuracy"].items():
        table.add_row(f"time to {float(threshold):.0%}", "not reached" if seconds is None else f"{seconds:.1f} s")
    table.add_row("run folder", summary.get("run_dir", ""))
    return table


def cmd_train(ns: argparse.Namespace) -> int:
    from hasten.config import load_recipe

    source, overrides = _split_recipe(ns.args)
    recipe = load_recipe(source, overrides)  # recipe errors show before torch and the data are loaded
    from hasten.build import train

    summary = train(recipe)
    if recipe.run.progress:
        Console().print(results_table(summary))
    else:
        print(json.dumps(summary, indent=2))
    return 0


def cmd_data(ns: argparse.Namespace) -> int:
    from hasten.data import fetch, info

    if ns.action == "fetch":
        print(fetch(ns.name, ns.root))
    else:
        print(json.dumps(info(ns.name, ns.root), indent=2, default=str))
    return 0


SUMMARIES = {
    "train": "train a recipe",
    "data": "fetch a dataset, or show what is on disk",
}


def commands() -> dict[str, argparse.ArgumentParser]:
    """One parser per command; each parses its own arguments intermixed, so options may come anywhere."""
    train = argparse.ArgumentParser(
        prog="hasten train",
        description="Train RECIPE (a YAML path or a shipped recipe name) with dotted "
        "key=value overrides, e.g. 'hasten train fashion-fast precision=bf16 optim.lr=0.2'.",
    )
    train.add_argument("args", nargs="*", metavar="[RECIPE] [key=value ...]")
    train.set_defaults(run=cmd_train)

    data = argparse.ArgumentParser(prog="hasten data", description="Fetch a dataset, or show what is on disk.")
    data.add_argument("action", choices=["fetch", "info"])
    data.add_argument("name", help="dataset name, e.g. fashion-mnist")
    data.add_argument("--root", help="folder that holds (or will hold) the dataset's files")
    data.set_defaults(run=cmd_data)
    return {"train": train, "data": data}


def top_parser(parsers: dict[str, argparse.ArgumentParser]) -> argparse.ArgumentParser:
    listing = "\n".join(f"  {name:<12}{SUMMARIES[name]}" for name in parsers)
    top = argparse.ArgumentParser(
        prog="hasten",
        description="Train neural networks fast and memory-efficiently, and measure what each technique buys.",
        epilog=f"commands:\n{listing}\n\nRun 'hasten COMMAND --help' for a command's options.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    top.add_argument("--version", action="version", version=f"hasten {hasten.__version__}")
    top.add_argument("command", choices=list(parsers), metavar="COMMAND")
    top.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    parsers = commands()
    top = top_parser(parsers).parse_args(argv)
    ns = parsers[top.command].parse_intermixed_args(top.rest)
    try:
        return ns.run(ns)
    except HastenError as error:
        console.print(f"[red]error:[/red] {escape(str(error))}", highlight=False, soft_wrap=True)
        return error.exit_code
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/yellow]")
        return 130


if __name__ == "__main__":
    sys.exit(main())
