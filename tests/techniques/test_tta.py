"""Translate TTA (train.tta_translate, hasten/techniques/tta.py): exact logits on a hand-made linear model, the shift
against the loader's training translate, the trainer's evaluation, evaluate, predict and exports with it, and its
validation against the image side."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from torch import nn

import hasten
from hasten.data import load_dataset
from hasten.data.loader import InMemoryLoader, translate
from hasten.errors import RecipeError
from hasten.recipe.schema import load_recipe
from hasten.run.build import build, trainer_for
from hasten.run.plan import Plan
from hasten.runfolder.log import RunLog
from hasten.techniques.tta import black_fill, shift, tta_logits
from hasten.use.evaluate import evaluate
from hasten.use.export import export
from tests.tiny import tiny_recipe


def picker() -> nn.Module:
    """Logit 0 reads pixel (0, 0) of a 3x3 image, logit 1 pixel (1, 2)."""
    model = nn.Sequential(nn.Flatten(), nn.Linear(9, 2, bias=False))
    with torch.no_grad():
        model[1].weight.zero_()
        model[1].weight[0, 0] = 1
        model[1].weight[1, 5] = 1
    return model


def test_tta_logits_exact_values_on_a_linear_model():
    x = torch.arange(9.0).view(1, 1, 3, 3)
    model, fill = picker(), torch.tensor(-1.0)
    assert torch.equal(tta_logits(model, x, False, 0), torch.tensor([[0.0, 5.0]]))
    assert torch.equal(tta_logits(model, x, True, 0), torch.tensor([[1.0, 4.0]]))  # mirror: pixels (0, 2), (1, 0)
    # (+1, +1): pixel (0, 0) is the fill, (1, 2) was (0, 1) = 1; (-1, -1): (0, 0) was (1, 1) = 4, (1, 2) the fill
    expected = torch.tensor([[0 / 2 + (-1 + 4) / 4, 5 / 2 + (1 - 1) / 4]])  # 0.75, 2.5
    assert torch.equal(tta_logits(model, x, False, 1, fill), expected)
    # each of the three also averaged with its mirror: (1, 4), (-1, 0) and (1.5, 3)
    expected = torch.tensor([[1 / 2 + (-1 + 1.5) / 4, 4 / 2 + (0 + 3) / 4]])  # 0.625, 2.75
    assert torch.equal(tta_logits(model, x, True, 1, fill), expected)


def test_shift_is_the_training_translate_of_the_normalised_images():
    pixels = torch.randint(1, 256, (3, 2, 6, 5), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    mean, std = torch.tensor([0.3, 0.6]), torch.tensor([0.2, 0.4])
    test = InMemoryLoader(pixels, torch.zeros(3, dtype=torch.long), 3, mean=mean, std=std)
    fill = black_fill(mean, std)
    for dy, dx in ((2, 2), (-2, -2), (1, -2), (0, 1)):
        trained = test.normalise(translate(pixels, torch.tensor([[dy, dx]] * 3), pad=2))
        assert torch.equal(shift(test.normalise(pixels), dy, dx, fill), trained)
    assert torch.equal(fill, test.normalise(torch.zeros((1, 2, 1, 1), dtype=torch.uint8)))


def tiny(run_dir, *extra: str) -> list[str]:
    # fp32, 64 images in batches of 32, evaluated 8 at a time; translate and channels_last as the default recipe has
    # them (auto: no shift in runs under 5 epochs; channels_last probed at start-up)
    return tiny_recipe(run_dir, "data.synthetic_size=64", "data.augment.translate=auto", "precision=fp32",
                       "train.channels_last=auto", "train.batch_size=32", "train.eval_batch_size=8", "train.epochs=1",
                       "run.tensorboard=false", *extra)  # fmt: skip


@pytest.mark.numerics
def test_the_trainer_evaluates_with_the_shifted_copies(tmp_path):
    parts = build(load_recipe(None, tiny(tmp_path / "run", "train.tta_translate=2")))
    model, loader = parts.model.eval(), parts.test_loader
    fill = black_fill(loader.mean, loader.std)
    with torch.no_grad():
        logits = torch.cat([tta_logits(model, x, False, 2, fill) for x, _ in loader])
        labels = torch.cat([y for _, y in loader])
    expected = nn.functional.cross_entropy(logits, labels).item()
    losses = {}
    for pixels in (0, 2):
        plan = Plan(epochs=1, num_classes=10, progress=False, tta_translate=pixels)
        losses[pixels], _ = trainer_for(parts, plan, RunLog("", enabled=False)).evaluate()
    assert losses[2] == pytest.approx(expected, rel=1e-6) and losses[2] != pytest.approx(losses[0], rel=1e-4)


@pytest.fixture(scope="module")
def translate_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("tta") / "run"
    summary = hasten.train(None, tiny(run, "train.tta_translate=2", "train.tta_flip=true", "train.epochs=2"))
    return run, summary


@pytest.mark.numerics
def test_evaluate_reports_the_runs_translate_tta_at_its_accuracy(translate_run, tmp_path):
    run, summary = translate_run
    result = evaluate(run, out=tmp_path / "ev")
    assert result["run_setting"] == "flip_translate_tta" and result["run_tta_translate"] == 2
    assert set(result["results"]) == {"plain", "flip_tta", "flip_translate_tta"}
    assert result["accuracy"] == summary["test_accuracy"] == result["results"]["flip_translate_tta"]["accuracy"]


@pytest.mark.numerics
def test_predict_and_exports_apply_the_runs_translate_tta(translate_run, tmp_path):
    run, summary = translate_run
    data = load_dataset("synthetic", synthetic_size=64, seed=0)
    predictor = hasten.load(run)
    assert predictor.tta_translate == 2
    predicted = predictor.probabilities(data.test_images).argmax(1)
    assert int((predicted == data.test_labels).sum()) / len(data.test_labels) == summary["test_accuracy"]
    x = predictor.preprocessing.normalise(data.test_images[:4])
    with torch.no_grad():
        assert not torch.equal(predictor(x), predictor(x, tta_translate=0))
    path, _ = export(run, tmp_path / "model.safetensors")
    with safe_open(str(path), framework="pt") as f:
        assert json.loads(f.metadata()["hasten_tta_translate"]) == 2
    assert hasten.load(path).tta_translate == 2


def test_the_onnx_graph_holds_the_shifted_copies(translate_run, tmp_path):
    run, summary = translate_run
    data = load_dataset("synthetic", synthetic_size=64, seed=0)
    onnx_path, _ = export(run, tmp_path / "model.onnx")  # onnxruntime must match PyTorch, shifts included
    predicted = hasten.load(onnx_path).probabilities(data.test_images).argmax(1)
    assert int((predicted == data.test_labels).sum()) / len(data.test_labels) == summary["test_accuracy"]


def test_a_shift_of_half_the_side_is_an_error_naming_the_field(tmp_path):
    with pytest.raises(RecipeError, match="train.tta_translate: 14 pixels"):
        build(load_recipe(None, tiny(tmp_path / "run", "train.tta_translate=14")))
    with pytest.raises(RecipeError, match="train.tta_translate"):
        load_recipe(None, ["train.tta_translate=-1"])
