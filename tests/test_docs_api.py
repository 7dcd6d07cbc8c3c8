"""docs/api.md's examples run: every ```python block of it is executed, as a user would run it, in a fresh folder,
with quick settings added to each `hasten.train` call (one epoch, fp32, no start-up probe), and what it printed about
is checked. A block whose first line is `# file: NAME.py` is a module the others import: it is written, not run."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch
import yaml

import hasten
from hasten.use.result import Trained

API = Path(__file__).resolve().parents[1] / "docs" / "api.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
HEADING = re.compile(r"^### (.+)$", re.MULTILINE)
FILE = re.compile(r"^# file: (\S+\.py)\n")
# appended to every hasten.train call of the examples (later overrides win): seconds, not minutes
QUICK = ["train.epochs=1", "precision=fp32", "train.channels_last=false", "train.batch_size=32", "data.workers=0",
         "run.progress=false", "run.tensorboard=false"]  # fmt: skip
DIGITS = [str(d) for d in range(10)]


def blocks() -> tuple[dict[str, str], list[tuple[str, str]]]:
    """The page's module files ({name: source}) and its examples ([(the ### heading above it, source)])."""
    text = API.read_text(encoding="utf-8")
    headings = [(m.start(), m.group(1)) for m in HEADING.finditer(text)]
    files, examples = {}, []
    for match in BLOCK.finditer(text):
        code = match.group(1)
        named = FILE.match(code)
        if named:
            files[named.group(1)] = code
            continue
        above = [title for start, title in headings if start < match.start()]
        examples.append((above[-1] if above else "", code))
    return files, examples


def recorded(run: str) -> dict:
    return yaml.safe_load(Path(run, "recipe.yaml").read_text())


def arrays(ns: dict) -> None:
    assert [p.label for p in ns["predictions"]] and len(ns["predictions"]) == 8
    assert all(p.label in ns["names"] for p in ns["predictions"]) and ns["result"].classes == ns["names"]
    assert ns["probabilities"].shape == (8, 10)
    torch.testing.assert_close(ns["probabilities"].sum(1), torch.ones(8))
    assert recorded("runs/arrays")["data"]["val_fraction"] == 0.2


def dataset(ns: dict) -> None:
    pre = ns["result"]["preprocessing"]
    assert (pre["height"], pre["width"], pre["fit"], pre["resize"]) == (16, 16, "pad", "pillow")
    assert recorded("runs/scans")["data"]["resize"] == "pad" and recorded("runs/scans")["data"]["size"] == 16
    assert ns["result"].predict([ns["image"]])[0].label in DIGITS


def folder(ns: dict) -> None:
    pre = ns["result"]["preprocessing"]
    assert (pre["height"], pre["fit"]) == (16, "crop")  # the median of the shorter sides: two in three are 16
    assert recorded("runs/photos")["data"]["size"] == 16 and ns["result"]["classes"] == DIGITS
    assert len(ns["model"].predict(["photos/val/0/0.png"], top_k=3)[0].top) == 3


def registered(ns: dict) -> None:
    assert ns["result"]["dataset"]["test_size"] == 360 and Path("digits.safetensors").is_file()
    assert ns["model"].classes == DIGITS and ns["model"].preprocessing.height == 8


def own_object(ns: dict) -> None:
    assert type(ns["result"].model.model).__name__ == "SmallNet"
    assert recorded("runs/small-instance")["model"]["name"] == "object"
    assert ns["model"].predict(ns["data"][0][:4])[0].label in DIGITS


def own_import(ns: dict) -> None:
    assert recorded("runs/imported")["model"]["target"] == "mynets:SmallNet"
    assert ns["model"].model.features[0].out_channels == 8


CHECKS = {
    "Arrays: numpy or torch, (x, y) and (x, y, class names)": arrays,
    "A torch Dataset, of images of mixed sizes": dataset,
    "An image folder": folder,
    "A registered dataset": registered,
    "Your own model, as an object": own_object,
    "Your own model, by import path": own_import,
}


def test_every_kind_of_data_has_its_example():
    files, examples = blocks()
    assert [heading for heading, _ in examples] == list(CHECKS) and list(files) == ["mynets.py"]


@pytest.mark.parametrize("heading", list(CHECKS))
def test_the_example_runs(heading, tmp_path, monkeypatch):
    files, examples = blocks()
    code = dict(examples)[heading]
    for name, source in files.items():
        (tmp_path / name).write_text(source, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    real = hasten.train

    def quick(recipe: object = None, overrides: list[str] | None = None, *, model: object = None,
              data: object = None, loss: object = None) -> dict:  # fmt: skip
        return real(recipe, [*(overrides or []), *QUICK], model=model, data=data, loss=loss)

    monkeypatch.setattr(hasten, "train", quick)
    namespace = {"__name__": "__main__"}
    try:
        exec(compile(code, f"{API.name}: {heading}", "exec"), namespace)  # noqa: S102 - the page's own example
    finally:
        for name in files:
            sys.modules.pop(name.removesuffix(".py"), None)
    for value in namespace.values():  # every result is a finished run's, with its folder
        if isinstance(value, Trained):
            assert 0 <= value["test_accuracy"] <= 1 and (value.run_dir / "summary.json").is_file()
    CHECKS[heading](namespace)
