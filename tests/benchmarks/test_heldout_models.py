"""The models the results pages name by `--model NAME=heldout_models:ATTR` (and the other model files of
benchmarks/) build as hasten builds a user's model and map a batch of the letters' images to one logit a class:
a page's command that names them still runs."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import torch

from hasten.models.user import check_model, shape_args
from hasten.recipe.trust import call_target

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
FILES = ("heldout_models", "heldout_families", "more_families")


def named() -> list[tuple[str, str]]:
    """(module, attribute) of every `--model NAME=MODULE:ATTR` the files' docstrings and the results pages give."""
    text = "".join((BENCHMARKS / f"{name}.py").read_text() for name in FILES)
    text += "".join(page.read_text() for page in (BENCHMARKS.parent / "docs" / "results").glob("*.md"))
    found = re.findall(rf"=({'|'.join(FILES)}):(\w+)", text)
    return sorted(set(found))


def test_the_pages_name_models_of_each_file():
    assert {module for module, _ in named()} == set(FILES)


@pytest.mark.parametrize(("module", "attribute"), named())
def test_each_named_model_builds_and_gives_a_logit_a_class(module, attribute, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    target = getattr(importlib.import_module(module), attribute)
    torch.manual_seed(0)
    model = call_target(target, {}, f"model.target={module}:{attribute}", **shape_args(target, (3, 32, 32), 10, "m"))
    check_model(model, (3, 32, 32), 10, torch.device("cpu"))  # a RecipeError naming what it returned otherwise
