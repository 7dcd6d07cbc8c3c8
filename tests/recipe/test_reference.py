"""docs/reference.md, the recipe-key reference, is what the schema renders now, and it lists every key.

The keys are found here by a walk of the pydantic models of its own, not by the generator's, so a key the
generator skipped would be caught.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, get_args

from pydantic import BaseModel, Field

from hasten.recipe import reference as recipe_reference
from hasten.recipe.gan import GanRecipe
from hasten.recipe.schema import OptimConfig, Recipe

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference.md"
GAN_PART = "\n## GAN recipe\n"


def _page() -> str:
    return PAGE.read_text(encoding="utf-8")


def _leaf_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    keys = []
    for name, info in model.model_fields.items():
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            keys += _leaf_keys(info.annotation, f"{prefix}{name}.")
        else:
            keys.append(prefix + name)
    return keys


def _row(text: str, key: str) -> str:
    rows = [line for line in text.splitlines() if line.startswith(f"| `{key}` |")]
    assert len(rows) == 1, f"{key}: {len(rows)} rows in the reference"
    return rows[0]


def test_reference_is_current():
    assert PAGE.is_file(), f"{PAGE} is missing: generate it with {recipe_reference.regenerate()}"
    assert _page() == recipe_reference.render(), (
        f"{PAGE} is stale: it differs from what the recipe schema renders; regenerate it with "
        f"{recipe_reference.regenerate()} and commit it"
    )


def test_every_leaf_key_is_listed():
    training, gan = _page().split(GAN_PART)
    for part, root in ((training, Recipe), (gan, GanRecipe)):
        keys = _leaf_keys(root)
        missing = [key for key in keys if f"| `{key}` |" not in part]
        assert not missing, f"{root.__name__} keys missing from {PAGE.name}: {missing}"
    assert recipe_reference.key_count() == len(_leaf_keys(Recipe)) + len(_leaf_keys(GanRecipe))


def test_a_choice_field_shows_its_choices():
    choices = get_args(OptimConfig.model_fields["name"].annotation)
    assert "sgd" in choices and "muon" in choices  # the real Literal field, not a copy of it
    row = _row(_page().split(GAN_PART)[0], "optim.name")
    for choice in choices:
        assert f"`{choice}`" in row
    assert "`adamw`" in row.split(" | ")[2]  # the default column: what `hasten train` runs


def test_bounds_and_auto_are_shown():
    row = _row(_page(), "data.augment.translate")
    assert "int >= 0 or `auto`" in row
    assert "float in [0, 0.5]" in _row(_page(), "data.augment.translate_max_fraction")


class _Conv(BaseModel):
    kind: Literal["conv"] = "conv"
    width: int = Field(32, ge=1, description="channels")


class _Dense(BaseModel):
    kind: Literal["dense"] = "dense"
    units: int = Field(128, description="outputs")


class _Toy(BaseModel):
    layer: _Conv | _Dense = Field(_Conv(), discriminator="kind", description="one layer")
    cache: str = Field(default_factory=lambda: str(Path.home()), description="a machine's folder")


def test_union_of_sections_and_computed_default():
    tables = {table.intro: table for table in recipe_reference.tables(_Toy)}
    top = tables[""]
    layer_row, cache_row = top.rows
    assert layer_row[0] == "`layer`" and "section (_Conv) or section (_Dense)" in layer_row[1]
    assert cache_row[2] == "computed when the recipe is made"  # not this machine's home folder
    conv = tables["`layer` as a _Conv section (by `layer.kind`)."]
    assert [row[0] for row in conv.rows] == ["`layer.kind`", "`layer.width`"]
    assert conv.rows[1][1] == "int >= 1"
    assert any(row[0] == "`layer.units`" for table in tables.values() for row in table.rows)
