"""docs/techniques.md, the docs' list of techniques, written from the registry (hasten/techniques/registry.py):
`python -m hasten.techniques.docs [--check] [OUT]` (`make reference`); tests/techniques/test_registry.py fails
when the page is stale."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hasten.recipe.reference import write_or_check
from hasten.techniques.registry import SWITCHES, technique_of

PAGE = Path("docs/techniques.md")


def render() -> str:
    """docs/techniques.md: every switch of the table, in its order, the same on every machine."""
    lines = [
        "# Techniques",
        "",
        "Every technique hasten has, from its registry (hasten/techniques/registry.py): the recipe key that turns it",
        "on, the value that turns it off, an example value that turns it on, and what it does. `hasten bench",
        "--ablate` switches off, one at a time, each one a recipe has on, in this order. *speed*: it computes the",
        "same training faster or in less memory rather than changing what is trained. Every key's type and default:",
        "[the recipe-key reference](reference.md). Generated: `make reference` rewrites this page.",
        "",
        "| key | off | on, e.g. | technique | what it does |",
        "| --- | --- | --- | --- | --- |",
    ]
    for item in SWITCHES:
        owner = technique_of(item.key)
        kind = f"`{owner.__name__}`" if owner else ("*speed*" if item.speed else "the run's own setting")
        if owner and item.speed:
            kind += ", *speed*"
        lines.append(f"| `{item.key}` | `{item.off}` | `{item.on}` | {kind} | {item.what.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hasten.techniques.docs", description="Write the list of techniques from the registry."
    )
    parser.add_argument("out", nargs="?", type=Path, default=PAGE, help=f"the page (default: {PAGE})")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when OUT differs from the registry")
    args = parser.parse_args(argv)
    again = "make reference" if args.out == PAGE else f"python -m hasten.techniques.docs {args.out.as_posix()}"
    source = "hasten/techniques/registry.py"
    return write_or_check(args.out, render(), args.check, source, again, f"{len(SWITCHES)} switches")


if __name__ == "__main__":
    sys.exit(main())
