"""The live weights' check at the end of a run with an EMA (hasten/run/trainer.py `compare_live`): the live weights
on the plain view of the first LIVE_CHECK_IMAGES test images, against the evaluated average's plain view of the
same images, kept from the final evaluation's pass (hasten/run/evaluation.py `head`)."""

from __future__ import annotations

import torch
from torch import nn

import hasten
import hasten.run.evaluation
from hasten.data.loader import InMemoryLoader
from hasten.engine.precision import make_precision
from hasten.run.evaluation import evaluate_loader
from hasten.run.trainer import Trainer


def _loader(images: int, batch: int) -> InMemoryLoader:
    generator = torch.Generator().manual_seed(0)
    data = torch.randint(0, 256, (images, 1, 8, 8), dtype=torch.uint8, generator=generator)
    labels = torch.randint(0, 3, (images,), generator=generator)
    return InMemoryLoader(data, labels, batch, mean=torch.tensor([0.5]), std=torch.tensor([0.25]))


def test_a_pass_over_the_first_batches_sees_the_images_another_pass_kept_apart():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 3))
    loader, precision = _loader(100, 16), make_precision("fp32", torch.device("cpu"))
    (whole,) = evaluate_loader(model, loader, precision, [(True, 1)], torch.device("cpu"), head=3)
    (first,) = evaluate_loader(model, loader, precision, [(False, 0)], torch.device("cpu"), batches=3)
    assert whole.count == 100 and whole.head_count == first.count == 48  # three batches of 16
    assert whole.head_plain_correct.item() == first.plain_correct.item() == first.correct.item()
    assert 0 < whole.head_plain_correct.item() < whole.plain_correct.item()  # a part of the whole pass, not all of it
    (everything,) = evaluate_loader(model, loader, precision, [(False, 0)], torch.device("cpu"), batches=50)
    assert everything.count == 100  # more batches asked than there are: all of them


def _views_per_batch(monkeypatch) -> list[tuple[bool, int, int]]:
    calls: list[tuple[bool, int, int]] = []
    real = hasten.run.evaluation.tta_views

    def spy(model, images, flip, translate, fill=0.0):
        calls.append((flip, translate, len(images)))
        return real(model, images, flip, translate, fill)

    monkeypatch.setattr(hasten.run.evaluation, "tta_views", spy)
    return calls


def test_the_live_weights_are_checked_on_the_first_images_only(tiny_overrides, monkeypatch):
    """96 test images in batches of 16, a check of 32: the final evaluation sees all six batches with its TTA, the
    live weights the first two on the plain view; summary.json says how many images the check saw."""
    monkeypatch.setattr(hasten.run.evaluation, "LIVE_CHECK_IMAGES", 32)
    calls = _views_per_batch(monkeypatch)
    ema = ["tricks.ema=0.9", "tricks.ema_bn_images=64", "data.test_subset=96", "train.eval_batch_size=16"]
    summary = hasten.train(None, [*tiny_overrides, *ema, "train.epochs=1", "train.tta_flip=true"])
    assert calls == [(True, 0, 16)] * 6 + [(False, 0, 16)] * 2
    assert summary["live_test_images"] == 32 and 0 <= summary["live_test_accuracy"] <= 1
    assert not any("lags" in warning for warning in summary["warnings"])


def test_an_average_worse_than_the_live_weights_on_the_same_images_is_a_warning(tiny_overrides, monkeypatch):
    """The average's plain view of the check's images made 0% after the final evaluation: the live weights, which
    learnt, beat it by over 2 points on those images, and the run says so naming how many."""
    monkeypatch.setattr(hasten.run.evaluation, "LIVE_CHECK_IMAGES", 32)
    real = Trainer.evaluate

    def worse_average(self: Trainer, live: bool = False) -> tuple[float, float]:
        result = real(self, live)
        assert self.one_view_head is not None and self.one_view_head[1] == 32  # the check's images, kept apart
        self.one_view_head = (0.0, self.one_view_head[1])
        return result

    monkeypatch.setattr(Trainer, "evaluate", worse_average)
    summary = hasten.train(None, [*tiny_overrides, "tricks.ema=0.9", "tricks.ema_bn_images=64", "train.epochs=3",
                                  "data.test_subset=96", "train.eval_batch_size=16"])  # fmt: skip
    assert summary["live_test_accuracy"] > 0.02
    lag = [warning for warning in summary["warnings"] if "the average lags this run" in warning]
    assert len(lag) == 1 and "the same 32 test images" in lag[0] and "0.00%" in lag[0]
