"""docs/techniques.md, the docs' list of techniques, written from the registry (hasten/techniques/registry.py):
`python -m hasten.techniques.docs [--check] [OUT]` (`make reference`); tests/techniques/test_registry.py fails
when the page is stale."""

from __future__ import annotations

import sys
from pathlib import Path

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


def main(argv: list[str]) -> int:
    """`python -m hasten.techniques.registry [--check] [OUT]`: write the page, or exit 1 when it is stale."""
    check = "--check" in argv
    out = Path(next((a for a in argv if a != "--check"), PAGE))
    page = render()
    if check:
        current = out.read_text(encoding="utf-8") if out.is_file() else None
        if current != page:
            print(f"{out} is out of date with hasten/techniques/registry.py: regenerate it with make reference",
                  file=sys.stderr)  # fmt: skip
            return 1
        return 0
    out.write_text(page, encoding="utf-8", newline="\n")
    print(f"wrote {out} ({len(SWITCHES)} switches)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
