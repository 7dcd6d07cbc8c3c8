"""What `hasten.train` returns: the run's summary, and the model it trained, yours to use.

`Trained` is the summary dict (what summary.json holds; `result["test_accuracy"]` reads as before) with the trained
model beside it, in evaluation form, as `hasten.load` gives it from the run folder: the weights the run evaluated
(the EMA copy where tricks.ema was on) and the preprocessing the run recorded, so that

    result = hasten.train(None, ["data.val_fraction=0.2"], model=MyNet, data=(images, labels))
    result.predict(["cat.png"])               # files or uint8 arrays, converted as training did
    result.evaluate((test_images, test_labels))
    result.export("model.onnx")

work for a model and data given as Python objects too (a file cannot hold those: the network trained is handed
to the loader here, never imported from a name).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy
import torch
from torch import nn

from hasten.errors import DataError
from hasten.models.copying import copy_model
from hasten.use.load import checked_top_k


def class_names(labels: Any) -> list[str] | None:
    """Labels given as class names (strings, as training takes them), else None (numbers, or nothing to read)."""
    if isinstance(labels, torch.Tensor):
        return None
    try:
        values = numpy.asarray(labels, dtype=object).reshape(-1)
    except (TypeError, ValueError):
        return None
    if not len(values) or not all(isinstance(value, str) for value in values):
        return None
    return [str(value) for value in values]


class Trained(dict):
    """The summary of a finished run (this dict) and the trained model, loaded when first used."""

    def __init__(self, summary: dict[str, Any], model: Any = None):
        super().__init__(summary)
        # the network the run trained: the user's nn.Module (copied: loading the evaluated weights into it must
        # not change theirs), the class or function that made it, or None for the recipe's own model
        self._network = copy_model(model) if isinstance(model, nn.Module) else model
        self._loaded: Any = None

    @property
    def summary(self) -> dict[str, Any]:
        """The summary as a plain dict (what summary.json holds)."""
        return dict(self)

    @property
    def run_dir(self) -> Path:
        return Path(self["run_dir"])

    @property
    def model(self) -> Any:
        """The trained model in evaluation form (hasten.use.load.Predictor): an nn.Module, normalised images in,
        logits out, with `predict`, `probabilities`, `classes` and `preprocessing`."""
        if self._loaded is None:
            from hasten.use.load import load

            self._loaded = load(self.run_dir, model=self._network)
        return self._loaded

    @property
    def classes(self) -> list[str]:
        return list(self.model.classes)

    def predict(self, images: Any, top_k: int = 1) -> list[Any]:
        """One prediction per image (file paths, PIL images or uint8 arrays), converted as training did."""
        return self.model.predict(images, top_k=top_k)

    def probabilities(self, images: Any) -> torch.Tensor:
        return self.model.probabilities(images)

    def evaluate(self, data: Any = None, top_k: int = 5) -> dict[str, Any]:
        """Accuracy of the trained model: with `data` an (images, labels) pair (uint8 images, and labels, as
        training took them: class indices, whole-number floats, one-hot rows or class names), on that data, as the
        run evaluates (its test-time augmentation); without, on the run's own test data, as `hasten evaluate` does
        (which a run trained on Python objects cannot reread: give it `data`)."""
        top_k = checked_top_k(top_k)
        if data is None:
            from hasten.use.evaluate import evaluate

            return evaluate(self.run_dir, top_k=top_k)
        if not (isinstance(data, tuple | list) and len(data) == 2):
            raise DataError("evaluate: data must be an (images, labels) pair, or nothing for the run's own test data")
        from hasten.data.user import as_labels

        images, given = data
        names = class_names(given)
        if names is not None:  # class names, as training takes them: their indices among the run's classes
            index = {name: i for i, name in enumerate(self.classes)}
            if unknown := sorted({name for name in names if name not in index}):
                raise DataError(f"evaluate: label {unknown[0]!r} is not one of the class names {self.classes} "
                                f"({len(unknown)} such)")  # fmt: skip
            given = [index[name] for name in names]
        probabilities = self.probabilities(images)
        # as training reads labels: whole-number floats, one-hot rows, each a class index of this model
        labels = as_labels(given, len(probabilities), "evaluate: labels", len(self.classes))
        correct = probabilities.argmax(1) == labels
        k = min(top_k, probabilities.shape[1])
        in_top = (probabilities.topk(k, dim=1).indices == labels[:, None]).any(1)
        return {
            "images": len(labels),
            "accuracy": correct.float().mean().item(),
            f"top{k}_accuracy": in_top.float().mean().item(),
        }

    def export(self, out: str | Path, fmt: str | None = None, *, overwrite: bool = False) -> Path:
        """Write the trained model with its preprocessing and classes (hasten export): .safetensors or .onnx."""
        from hasten.use.export import export

        return export(
            self.run_dir, out, fmt, overwrite=overwrite, model=self._network, overwrite_flag="overwrite=True"
        )[0]
