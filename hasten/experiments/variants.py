"""Variants of a recipe for benchmarks and sweeps: `--vary KEY=V1,V2` grids, one-change-at-a-time
ablations, other recipes (`--also RECIPE`, as the overrides that turn the base into them), and the built-in
naive loop, each a `Variant` (a name and recipe overrides).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hasten.errors import RecipeError
from hasten.recipe.schema import Recipe, apply_overrides, dotted, load_recipe, parse_value, validate
from hasten.techniques.registry import SWITCHES

NAIVE = "naive"
# grid points of one `--vary` grid (bench, sweep), each a training run: a 100 x 100 sweep is far beyond any study's;
# the count is checked before the grid is listed, as a few --vary items of many values multiply into astronomy
MAX_GRID_POINTS = 10_000

# `--ablate` without `--vary`: each technique the recipe switches on, switched off alone (KEY, OFF), in the order
# of the registry of techniques, which every technique is listed in
ABLATIONS = [(switch.key, switch.off) for switch in SWITCHES]


@dataclass(frozen=True)
class Variant:
    """One column of a bench: recipe overrides on top of the base recipe, or the naive loop."""

    name: str
    overrides: tuple[str, ...] = ()
    kind: str = "recipe"  # "recipe": hasten's loop (hasten.run.build.train); "naive": the textbook loop


def split_values(text: str) -> list[str]:
    """`a,b,[1,2]` -> ['a', 'b', '[1,2]']: commas split values except inside brackets or braces."""
    values, depth, current = [], 0, ""
    for char in text:
        depth += char in "[{("
        depth -= char in "]})"
        if char == "," and depth == 0:
            values.append(current.strip())
            current = ""
        else:
            current += char
    values.append(current.strip())
    return values


def parse_vary(items: Sequence[str]) -> list[tuple[str, list[str]]]:
    """`--vary KEY=V1,V2` items -> [(KEY, [V1, V2])]; a malformed item is an error naming it."""
    parsed = []
    for item in items:
        key, sep, text = item.partition("=")
        values = split_values(text) if sep else []
        if not key or not sep or not all(values):
            raise RecipeError(f"--vary {item!r}: write KEY=VALUE1,VALUE2, e.g. --vary precision=fp32,bf16")
        parsed.append((key, values))
    return parsed


def _labels(keys: Sequence[str]) -> dict[str, str]:
    """Short names for variant labels: the last part of each key (the last two for a bare `name`), the whole
    key where two would clash."""
    leaves = [".".join(key.split(".")[-2:]) if key.endswith(".name") else key.rsplit(".", 1)[-1] for key in keys]
    return {key: leaf if leaves.count(leaf) == 1 else key for key, leaf in zip(keys, leaves, strict=True)}


def lookup(recipe: Recipe, key: str) -> Any:
    """The value of dotted `key` in the recipe (as YAML would write it); KeyError when there is none."""
    return dotted(recipe.model_dump(mode="json"), key)


def grid_variants(vary: Sequence[tuple[str, list[str]]]) -> list[Variant]:
    """Every combination of the varied values, one variant each; more than MAX_GRID_POINTS is a RecipeError."""
    points = math.prod(len(values) for _, values in vary)
    if points > MAX_GRID_POINTS:
        sizes = " x ".join(f"{len(values):,} ({key})" for key, values in vary)
        raise RecipeError(
            f"--vary: a grid of {sizes} = {points:,} runs, more than the {MAX_GRID_POINTS:,} one grid may have; "
            "vary fewer values at once"
        )
    labels = _labels([key for key, _ in vary])
    variants = []
    for combination in itertools.product(*(values for _, values in vary)):
        overrides = tuple(f"{key}={value}" for (key, _), value in zip(vary, combination, strict=True))
        name = " ".join(f"{labels[key]}={value}" for (key, _), value in zip(vary, combination, strict=True))
        variants.append(Variant(name, overrides))
    return variants


def ablation_variants(recipe: Recipe, vary: Sequence[tuple[str, list[str]]]) -> list[Variant]:
    """The recipe as is, then one change at a time: each varied value (or, with none given, each of
    `ABLATIONS` that the recipe has switched on), skipping values the recipe already has."""
    changes = [(key, value) for key, values in vary for value in values] if vary else ABLATIONS
    labels = _labels([key for key, _ in changes])
    variants = [Variant(recipe.name)]
    for key, value in changes:
        try:
            current = lookup(recipe, key)
        except KeyError:
            if vary:
                raise RecipeError(f"--vary {key}: the recipe has no such key") from None
            continue  # a technique this version of the recipe does not have
        if current != parse_value(value):
            variants.append(Variant(f"{labels[key]}={value}", (f"{key}={value}",)))
    return variants


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}: sections become dotted keys; lists and values stay whole."""
    if not isinstance(node, dict) or not node:
        return {prefix: node}
    flat: dict[str, Any] = {}
    for key, value in node.items():
        flat |= _flatten(value, f"{prefix}.{key}" if prefix else key)
    return flat


def recipe_variant(base: Recipe, other: Recipe) -> Variant:
    """`other` as a variant of `base`: the overrides (one per differing key, values as JSON, which YAML reads
    back exactly) that turn the one into the other. The run folder is not carried over."""
    mine, theirs = _flatten(base.model_dump(mode="json")), _flatten(other.model_dump(mode="json"))
    keys = [k for k in theirs if k != "run.dir" and (k not in mine or mine[k] != theirs[k])]
    return Variant(other.name, tuple(f"{k}={json.dumps(theirs[k])}" for k in keys))


def plan_variants(
    recipe: Recipe, vary: Sequence[str] = (), ablate: bool = False, naive: bool = True, also: Sequence[str] = ()
) -> list[Variant]:
    """The variants `hasten bench` runs: the naive loop (first, when asked, and not for image folders), then
    the grid of `--vary` values, or with `ablate` the recipe and one change at a time; else the recipe alone;
    then each recipe of `also` (a name or YAML path), run as the base with the overrides that make it."""
    others = [recipe_variant(recipe, load_recipe(source)) for source in also]  # their errors first
    parsed = parse_vary(vary)
    if ablate:
        variants = ablation_variants(recipe, parsed)
    elif parsed:
        variants = grid_variants(parsed)
    else:
        variants = [Variant(recipe.name)]
    naive = naive and recipe.data.name != "imagefolder"  # the naive loop is for in-memory datasets
    named = {v.name for v in variants}
    clashes = [v.name for v in others if v.name in named or v.name == NAIVE]
    if clashes or len({v.name for v in others}) < len(others):
        raise RecipeError(f"--also {', '.join(clashes) or 'a recipe twice'}: each variant needs its own name")
    return ([Variant(NAIVE, kind="naive")] if naive else []) + variants + others


def variant_recipe(recipe: Recipe, variant: Variant, run_dir: Path | None = None) -> Recipe:
    """The base recipe with the variant's overrides, quiet, writing into `run_dir`."""
    overrides = [*variant.overrides, "run.progress=false"] + ([f"run.dir={run_dir}"] if run_dir else [])
    return validate(apply_overrides(recipe.model_dump(mode="json"), overrides), f"variant {variant.name!r}")


def slug(text: str) -> str:
    """A folder name for a variant: letters, digits and `=._-`; the rest become `_`."""
    return "".join(c if c.isalnum() or c in "=._-" else "_" for c in text)[:80]
