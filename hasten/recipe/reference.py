"""The recipe-key reference, docs/reference.md, generated from the recipe schema so that it cannot drift from it.

`render()` walks the pydantic models of the training recipe (`hasten.recipe.schema.Recipe`) and of `hasten gan`'s recipe
(`hasten.recipe.gan.GanRecipe`): every field's dotted key, its type with the allowed values (Literal
choices, numeric bounds such as ge/lt), its default as the schema holds it, and its `Field(description=...)`;
one markdown table per section, nested sections recursively (a union of sections: a table per member). The output
depends on the schema alone: no timestamps, and no default is computed (a `default_factory` is not called), so
the page is the same on every machine and a test can compare it byte for byte (tests/recipe/test_reference.py).

    python -m hasten.recipe.reference [--check] [OUT]     # write OUT (docs/reference.md); --check: exit 1 if stale
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from hasten.recipe.gan import GanRecipe
from hasten.recipe.schema import Recipe

DEFAULT_OUT = Path("docs/reference.md")
# each recipe kind: the heading of its part, the sentence under it, its root model
RECIPES = (
    (
        "Training recipe",
        "Read by `hasten train` and the commands built on a training run: schedule, lr-find, batch-size, bench, "
        "sweep, transfer.",
        Recipe,
    ),
    ("GAN recipe", "Read by `hasten gan` (docs/gan.md): a DCGAN run, a recipe of its own.", GanRecipe),
)

INTRO = """\
# Recipe keys

Every key a recipe takes: its type or allowed values, its default and what it does. Set one in the recipe's YAML \
file or on the command line as a dotted override, `hasten train [RECIPE] key=value` (e.g. `hasten train \
fashion-fast optim.lr=0.2 data.augment.flip=false`; values are read as YAML: `true`, `null`, `[1, 2]`); \
`hasten gan` takes the GAN recipe's keys the same way.

This page is generated from the recipe schema (hasten/recipe/schema.py, hasten/recipe/gan.py): do not edit \
it; regenerate it with `make reference` (or `python -m hasten.recipe.reference`).
"""


@dataclass
class Table:
    """One section's table: its dotted key ("" at the top), the paragraph above it and one row per leaf key."""

    key: str
    intro: str
    rows: list[tuple[str, str, str, str]]  # key, type / allowed values, default, description


def _constraints(extras: tuple[Any, ...] | list[Any]) -> list[Any]:
    """The constraint objects of an Annotated type's extras (pydantic wraps them in a FieldInfo)."""
    found: list[Any] = []
    for extra in extras:
        found += extra.metadata if isinstance(extra, FieldInfo) else [extra]
    return found


def _number(value: Any) -> str:
    if isinstance(value, int) and value > 2**16 and value & (value - 1) == 0:  # 2**63, not 9223372036854775808
        return f"2**{value.bit_length() - 1}"
    return repr(value)


def _bounded(base: str, constraints: list[Any]) -> str:
    """`base` with its numeric bounds: `int >= 1`, `float > 0`, `float in [0, 1)`."""
    bounds: dict[str, Any] = {}
    for item in constraints:  # annotated_types' Ge, Gt, Le, Lt and Interval; validator functions have no bounds
        bounds |= {
            name: getattr(item, name) for name in ("ge", "gt", "le", "lt") if getattr(item, name, None) is not None
        }
    low = ("[", ">=", bounds["ge"]) if "ge" in bounds else ("(", ">", bounds["gt"]) if "gt" in bounds else None
    high = ("]", "<=", bounds["le"]) if "le" in bounds else (")", "<", bounds["lt"]) if "lt" in bounds else None
    if low and high:
        return f"{base} in {low[0]}{_number(low[2])}, {_number(high[2])}{high[0]}"
    if low or high:
        _, sign, value = low or high
        return f"{base} {sign} {_number(value)}"
    return base


def _value(value: Any) -> str:
    """A value as a user writes it in a recipe (YAML): `null`, `true`, `auto`, `[0.9, 0.999]`."""
    if isinstance(value, str):
        return f"`{value}`" if value else '`""`'
    if isinstance(value, tuple):
        value = list(value)
    return f"`{json.dumps(value, default=str)}`"  # a Path or an Enum as its text


def _is_section(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _members(annotation: Any) -> list[Any]:
    """The members of a union (`X | Y`, Optional[X]); [annotation] for any other type."""
    return list(get_args(annotation)) if get_origin(annotation) in (Union, types.UnionType) else [annotation]


def describe_type(annotation: Any, constraints: list[Any] | None = None) -> str:
    """A type as the reference shows it: `int >= 1 or auto`, `one of sgd, adamw`, `list of str or null`."""
    constraints = constraints or []
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return describe_type(args[0], constraints + _constraints(args[1:]))
    if origin in (Union, types.UnionType):
        parts = [describe_type(member, constraints) for member in args if member is not type(None)]
        return " or ".join(parts + (["`null`"] if type(None) in args else []))
    if origin is Literal:
        choices = ", ".join(_value(choice) for choice in args)
        return f"one of {choices}" if len(args) > 1 else choices
    if origin in (list, set, frozenset) or (origin is tuple and len(args) == 2 and args[1] is Ellipsis):
        item = describe_type(args[0])
        return f"list of ({item})" if " or " in item else f"list of {item}"
    if origin is tuple:
        items = [describe_type(arg) for arg in args]
        if len(items) == 2 and items[0] == items[1]:
            return f"pair of {items[0]}"
        return f"list of {len(items)}: " + "; ".join(items)
    if origin is dict:
        return "mapping" if args[1] is Any else f"mapping of {describe_type(args[0])} to {describe_type(args[1])}"
    if annotation is Any:
        return "any value"
    if _is_section(annotation):  # inside a container or union: its keys have their own table
        return f"section ({annotation.__name__})"
    if annotation is type(None):
        return "`null`"
    if isinstance(annotation, type):
        return _bounded(annotation.__name__, constraints)
    raise TypeError(f"recipe reference: no way to show the type {annotation!r}; teach describe_type it")


def describe_default(info: FieldInfo) -> str:
    """The default as the schema holds it; never computed, so no machine's values reach the page."""
    if info.default_factory is not None:
        return "computed when the recipe is made"
    if info.is_required():
        return "required"
    if isinstance(info.default, BaseModel):
        return f"a {type(info.default).__name__} section"
    return _value(info.default)


def _cell(text: str) -> str:
    """Plain text made safe in a markdown table cell: `<name>` kept (not read as HTML), no stray emphasis."""
    for char in "\\*<~|":
        text = text.replace(char, "\\" + char)
    return " ".join(text.split())


def _doc(model: type[BaseModel]) -> str:
    own = model.__dict__.get("__doc__")  # not Section's: every section class would show it
    return inspect.cleandoc(own) if own else ""


def tables(model: type[BaseModel], prefix: str = "", intro: str = "") -> Iterator[Table]:
    """`model`'s table (its leaf keys, in schema order), then each of its sections' tables, depth first."""
    rows, nested = [], []
    for name, info in model.model_fields.items():
        key = prefix + name
        sections = [member for member in _members(info.annotation) if _is_section(member)]
        if _is_section(info.annotation):  # what the field says of this use of the section, then what the class says
            nested.append((key, info.annotation, "\n\n".join(filter(None, [info.description, _doc(info.annotation)]))))
            continue
        if sections:  # a union of sections (discriminated or not): a row here, each member's keys in its own table
            where = f" (by `{key}.{info.discriminator}`)" if isinstance(info.discriminator, str) else ""
            intro_of = f"`{key}` as a {{name}} section{where}."
            nested += [(key, section, intro_of.format(name=section.__name__)) for section in sections]
        type_text = describe_type(info.annotation, _constraints(info.metadata))
        rows.append((f"`{key}`", type_text, describe_default(info), _cell(info.description or "")))
    yield Table(prefix.rstrip("."), intro, rows)
    for key, section, section_intro in nested:
        yield from tables(section, key + ".", section_intro)


def _markdown(table: Table, level: str) -> list[str]:
    lines = [f"{level} `{table.key}`" if table.key else f"{level} Top-level keys", ""]
    if table.intro:
        lines += [table.intro, ""]
    if table.rows:
        lines += ["| Key | Type / allowed values | Default | Description |", "| --- | --- | --- | --- |"]
        lines += [f"| {' | '.join(row)} |" for row in table.rows]
        lines.append("")
    return lines


def render() -> str:
    """The whole reference page, the same on every machine."""
    lines = [INTRO]
    for title, sentence, root in RECIPES:
        lines += [f"## {title}", "", sentence, ""]
        for table in tables(root):
            lines += _markdown(table, "###")
    return "\n".join(lines).rstrip("\n") + "\n"


def regenerate(out: Path = DEFAULT_OUT) -> str:
    """The command that rewrites `out`, for the messages of a stale page."""
    if out == DEFAULT_OUT:
        return "make reference (or python -m hasten.recipe.reference)"
    return f"python -m hasten.recipe.reference {out.as_posix()}"


def key_count() -> int:
    """How many keys the page lists (every recipe kind's leaf keys)."""
    return sum(len(table.rows) for _, _, root in RECIPES for table in tables(root))


def write_or_check(out: Path, page: str, check: bool, source: str, regenerate: str, wrote: str) -> int:
    """A generated page's command: write `page` to `out` (saying `wrote`), or with `check` write nothing and exit 1
    when `out` is missing or differs, naming `source` (what it is generated from) and the `regenerate` command."""
    if check:
        try:
            current = out.read_text(encoding="utf-8")
        except OSError:
            current = None
        if current != page:
            state = "is missing" if current is None else f"is out of date with {source}"
            print(f"{out} {state}: regenerate it with {regenerate}", file=sys.stderr)
            return 1
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8", newline="\n")
    print(f"wrote {out} ({wrote})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hasten.recipe.reference",
        description="Write the recipe-key reference generated from the schema.",
    )
    parser.add_argument("out", nargs="?", type=Path, default=DEFAULT_OUT, help=f"the page (default: {DEFAULT_OUT})")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when OUT differs from the schema")
    args = parser.parse_args(argv)
    return write_or_check(
        args.out, render(), args.check, "the recipe schema", regenerate(args.out), f"{key_count()} keys"
    )


if __name__ == "__main__":
    sys.exit(main())
