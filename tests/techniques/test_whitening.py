"""Patch whitening (`model.whiten`): the filters against hand-computed values, the whitened patches' covariance,
the conv it sets (frozen, out of the optimizer, unchanged by training), its skips, and a run with it resumed."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
import yaml
from torch import nn

import hasten
from hasten.recipe.schema import load_recipe
from hasten.run.assemble import first_train_images
from hasten.run.build import build, trainer_for
from hasten.run.plan import Plan
from hasten.runfolder.log import RunLog
from hasten.techniques import whitening
from hasten.techniques.whitening import (
    Whitening,
    filters_from_moments,
    image_moments,
    image_patches,
    whiten_first_conv,
    whitening_filters,
)
from hasten.tune import rules
from tests.resuming import final_weights, resume_into


def test_whitening_filters_exact_on_hand_made_patches():
    # mean 0; covariance (over n - 1 = 3) diag(2/3, 8/3): the second axis is the stronger direction
    patches = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 2.0], [0.0, -2.0]])
    strong, weak = 1 / math.sqrt(8 / 3), 1 / math.sqrt(2 / 3)
    expected = torch.tensor([[0.0, strong], [0.0, -strong], [weak, 0.0], [-weak, 0.0]])
    assert torch.allclose(whitening_filters(patches, 4, eps=0.0), expected, atol=1e-6, rtol=0)
    assert torch.allclose(whitening_filters(patches, 3, eps=0.0), expected[:3], atol=1e-6, rtol=0)
    assert torch.allclose(whitening_filters(patches, 8, eps=0.0), expected, atol=1e-6, rtol=0)  # 2D at most
    damped = whitening_filters(patches, 2, eps=1.0)  # eps caps the gain of the weak directions
    assert torch.allclose(damped[0], torch.tensor([0.0, 1 / math.sqrt(8 / 3 + 1)]), atol=1e-6, rtol=0)
    shifted = whitening_filters(patches + torch.tensor([5.0, -3.0]), 4, eps=0.0)  # the covariance is centred
    assert torch.allclose(shifted, expected, atol=1e-5, rtol=0)


def test_whitened_patches_have_identity_covariance():
    generator = torch.Generator().manual_seed(0)
    mixing = torch.tensor([[2.0, 0.0, 0.0], [1.0, 1.0, 0.0], [0.3, -0.5, 0.1]])
    patches = torch.randn(4000, 3, generator=generator) @ mixing  # strongly correlated, unequal variances
    filters = whitening_filters(patches, 6, eps=0.0)
    plus = patches @ filters[0::2].T  # one filter of each pair: the other is its negative
    assert torch.allclose(filters[1::2], -filters[0::2])
    assert torch.allclose(torch.cov(plus.T), torch.eye(3), atol=1e-4)
    variances = torch.cov((patches @ filters[:2].T).T).diagonal()  # a partial fill whitens what it covers
    assert torch.allclose(variances, torch.ones(2), atol=1e-4)


def test_patches_are_the_convs_windows():
    images, weight = torch.randn(2, 3, 6, 5), torch.randn(4, 3, 3, 3)
    by_conv = F.conv2d(images, weight).permute(0, 2, 3, 1).reshape(-1, 4)  # (N * windows, out)
    assert torch.allclose(image_patches(images, (3, 3)) @ weight.view(4, -1).T, by_conv, atol=1e-5)


def test_moments_summed_a_chunk_of_images_at_a_time_are_those_of_all_patches(monkeypatch):
    monkeypatch.setattr(whitening, "PATCH_CHUNK", 50)  # 12 windows an image: chunks of 4 images, then 3
    images = torch.randn(7, 3, 6, 5) * torch.tensor([1.0, 2.0, 0.5])[:, None, None] + 0.3
    count, total, products = image_moments(images, (3, 3))
    patches = image_patches(images, (3, 3)).double()
    assert count == len(patches) == 7 * 12
    assert torch.allclose(total, patches.sum(0)) and torch.allclose(products, patches.T @ patches)
    expected = whitening_filters(image_patches(images, (3, 3)), 8, 1e-3)
    assert torch.allclose(filters_from_moments(count, total, products, 8, 1e-3), expected, atol=1e-6, rtol=0)


class Tiny(nn.Module):
    """A user's own model: a conv with a bias, batch norm, a head."""

    def __init__(self, out_channels: int = 6, groups: int = 1):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(2, out_channels, 3, padding=1, groups=groups), nn.BatchNorm2d(6))
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        return self.head(self.features(x).mean((2, 3)))


def test_the_first_conv_is_whitened_and_frozen_with_its_bias():
    images = torch.randn(20, 2, 5, 5)
    model = Tiny(out_channels=6)  # a 2x3x3 patch has 18 directions, 36 filters: all 6 are set
    note = whiten_first_conv(model, images, eps=1e-3)
    conv = model.features[0]
    expected = whitening_filters(image_patches(images, (3, 3)), 6, 1e-3).view(6, 2, 3, 3)
    assert torch.allclose(conv.weight, expected) and torch.count_nonzero(conv.bias) == 0
    assert not conv.weight.requires_grad and not conv.bias.requires_grad and "frozen" in note
    assert all(p.requires_grad for p in model.head.parameters())


def test_more_filters_than_directions_keep_their_init_and_stay_trainable():
    conv = nn.Conv2d(1, 5, 1, bias=False)  # a 1x1x1 patch: 1 direction, 2 filters
    before = conv.weight.detach().clone()
    note = whiten_first_conv(nn.Sequential(conv), torch.randn(50, 1, 4, 4), eps=0.0)
    assert conv.weight.requires_grad and "2 of 5" in note
    assert torch.equal(conv.weight[2:], before[2:]) and not torch.equal(conv.weight[:2], before[:2])
    assert torch.allclose(conv.weight[0], -conv.weight[1])


@pytest.mark.parametrize(
    ("model", "why"),
    [
        (nn.Sequential(nn.Flatten(), nn.Linear(50, 3)), "no Conv2d"),
        (Tiny(out_channels=6, groups=2), "grouped or dilated"),
        (nn.Sequential(nn.Conv2d(3, 4, 3)), "takes 3 channels"),
    ],
)
def test_models_it_cannot_whiten_are_left_alone_with_a_note(model, why):
    before = {k: v.clone() for k, v in model.state_dict().items()}
    note = whiten_first_conv(model, torch.randn(4, 2, 5, 5), eps=1e-3)
    assert note.startswith("skipped") and why in note
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.requires_grad for p in model.parameters())


def test_pretrained_weights_win(capsys):
    model = Tiny()
    before = model.features[0].weight.detach().clone()
    Whitening(lambda n: torch.randn(n, 2, 5, 5), 8, 1e-3, pretrained=True).on_model(model)
    assert torch.equal(model.features[0].weight, before) and "model.pretrained" in capsys.readouterr().err


def small(tiny_overrides: list[str], *overrides: str) -> list[str]:
    return [*tiny_overrides, "data.synthetic_size=64", "precision=fp32", "model.whiten=true", *overrides]


def test_a_built_run_trains_around_the_frozen_stem(tiny_overrides):
    parts = build(load_recipe("fashion-fast", small(tiny_overrides, "model.whiten_images=40")))
    stem = parts.model.stem[0]  # 8 filters <= 2 x 1x3x3 directions: all set
    images = first_train_images(parts.train_loader, 40)
    assert torch.equal(images, parts.train_loader.normalise(parts.train_loader.images[:40]))
    expected = whitening_filters(image_patches(images, (3, 3)), 8, 5e-4).view_as(stem.weight)
    assert torch.allclose(stem.weight, expected) and not stem.weight.requires_grad
    in_optimizer = {id(p) for group in parts.optimizer.param_groups for p in group["params"]}
    assert id(stem.weight) not in in_optimizer
    assert len(in_optimizer) == sum(p.requires_grad for p in parts.model.parameters())
    before = {name: p.detach().clone() for name, p in parts.model.named_parameters()}
    trainer = trainer_for(parts, Plan(epochs=1, num_classes=10, progress=False, measure_step_memory=False),
                          RunLog("", enabled=False))  # fmt: skip
    batches = iter(parts.train_loader)
    for _ in range(2):
        trainer.train_step(*next(batches))
    after = dict(parts.model.named_parameters())
    assert torch.equal(after["stem.0.weight"], before["stem.0.weight"])
    assert not torch.equal(after["head.weight"], before["head.weight"])


def test_a_run_with_whitening_resumed_equals_the_unbroken_run(tiny_overrides, tmp_path):
    common = small(tiny_overrides, "run.save_every_steps=3", "run.keep=100", "model.bn_weight=frozen")
    whole = tmp_path / "whole"
    hasten.train("fashion-fast", [*common, f"run.dir={whole}"])
    assert "whiten: true" in (whole / "recipe.yaml").read_text()
    middle = whole / "checkpoints" / "step-6.pt"  # epoch 2 of 2 (4 steps each), mid-epoch
    resumed = resume_into(tmp_path / "resumed", "fashion-fast", common, middle, metrics_from=whole)
    a, b = final_weights(whole), final_weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)


class SeededNoise(torch.utils.data.Dataset):
    """A user's Dataset, streamed: 3 x 8 x 8 uint8 images of seeded noise."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        generator = torch.Generator().manual_seed(index)
        return torch.randint(0, 256, (3, 8, 8), generator=generator, dtype=torch.uint8), index % 2


def test_a_streamed_datasets_first_images_whiten_a_users_model(tiny_overrides):
    overrides = [*small(tiny_overrides, "model.whiten_images=10"), "data.workers=0", "data.augment.flip=true"]
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2))
    parts = build(load_recipe("fashion-fast", overrides), model=model, data=(SeededNoise(), SeededNoise()))
    stored = torch.stack([SeededNoise()[i][0] for i in range(10)])  # in stored order, not flipped
    images = first_train_images(parts.train_loader, 10)
    assert torch.equal(images, parts.train_loader.normalise(stored))
    expected = whitening_filters(image_patches(images, (3, 3)), 4, 5e-4).view(4, 3, 3, 3)
    assert torch.allclose(parts.model[0].weight, expected) and not parts.model[0].weight.requires_grad


def test_auto_whitens_hasten_s_resnet_from_scratch_only():
    assert rules.auto_whiten("resnet", None) is True
    assert rules.auto_whiten("resnet", "weights.safetensors") is False  # the pretrained conv wins
    assert not any(rules.auto_whiten(name, None) for name in ("sequential", "import", "object", "timm"))


def test_the_default_recipe_records_its_whitening_choice(tiny_overrides, tmp_path, capsys):
    hasten.train(None, [*tiny_overrides, "model.whiten_images=40", f"run.dir={tmp_path / 'resnet'}"])
    recorded = yaml.safe_load((tmp_path / "resnet" / "recipe.yaml").read_text())
    assert recorded["model"]["whiten"] is True
    assert "model.whiten=auto -> true" in capsys.readouterr().err
    # a model object given to hasten.train keeps its own first conv, trainable
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 10))
    hasten.train(None, [*tiny_overrides, f"run.dir={tmp_path / 'own'}"], model=model)
    recorded = yaml.safe_load((tmp_path / "own" / "recipe.yaml").read_text())
    assert recorded["model"]["whiten"] is False and model[0].weight.requires_grad
    assert "model.whiten=auto -> false" in capsys.readouterr().err
    # the record recipe keeps the first conv it was tuned with
    assert load_recipe("fashion-fast", []).model.whiten is False


def test_large_images_whiten_from_a_bounded_number_of_patches(monkeypatch, capsys):
    asked = []

    def train_images(count: int) -> torch.Tensor:
        asked.append(count)
        return torch.randn(count, 3, 64, 64, generator=torch.Generator().manual_seed(0))

    monkeypatch.setattr(whitening, "MAX_PATCHES", 10_000)  # 62 x 62 = 3,844 windows an image: 2 images
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 2))
    Whitening(train_images, 5000, 5e-4, pretrained=False).on_model(model)
    assert asked == [1, 2] and not model[0].weight.requires_grad
    said = " ".join(capsys.readouterr().err.split())  # as printed, wrapped to the terminal
    assert "8 whitening filters from 2 images, frozen (at most 10,000 patches: 2 of model.whiten_images=5,000)" in said
