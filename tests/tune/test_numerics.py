"""The reduced-precision safety check reads the model's own numerics: one batch's gradient against fp32's."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from hasten.tune import numerics
from hasten.tune.choices import Candidate

CPU = torch.device("cpu")


class Cancelling(nn.Module):
    """Logits as the small difference of two large, nearly equal products: exact in fp32, lost in bf16's 8 bits."""

    def __init__(self, features: int = 64, classes: int = 4):
        super().__init__()
        self.a = nn.Linear(features, classes, bias=False)
        self.b = nn.Linear(features, classes, bias=False)
        with torch.no_grad():
            self.a.weight.normal_().mul_(1000)
            self.b.weight.copy_(self.a.weight + torch.randn_like(self.a.weight))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        return self.b(x) - self.a(x)


def batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(32, 1, 8, 8, generator=generator), torch.randint(0, 4, (32,), generator=generator)


def mlp() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 4))


def test_fp32_has_no_error_and_a_plain_mlp_is_safe_in_bf16_on_three_seeds():
    for seed in range(3):
        torch.manual_seed(seed)
        images, labels = batch(seed)
        model = mlp()
        assert numerics.gradient_error(model, images, labels, "fp32", CPU) == 0.0
        error = numerics.gradient_error(model, images, labels, "bf16", CPU)
        assert 0 < error < numerics.MAX_GRAD_ERROR / 4  # dropout's masks are the same in both passes


def test_cancelling_logits_are_unsafe_in_bf16_on_three_seeds():
    for seed in range(3):
        torch.manual_seed(seed)
        images, labels = batch(seed)
        error = numerics.gradient_error(Cancelling(), images, labels, "bf16", CPU)
        assert error > numerics.MAX_GRAD_ERROR and not numerics.safe(error)


def test_the_check_leaves_model_and_random_stream_as_they_were():
    torch.manual_seed(5)
    model, (images, labels) = mlp(), batch()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    state = torch.get_rng_state()
    numerics.gradient_error(model, images, labels, "bf16", CPU)
    assert torch.equal(state, torch.get_rng_state())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_an_unsafe_model_drops_reduced_precision_from_the_candidates_and_says_why():
    torch.manual_seed(0)
    options = [Candidate("bf16", False), Candidate("bf16", True), Candidate("fp32", False), Candidate("fp32", True)]
    kept, notes = numerics.safe_options(Cancelling(), batch(), options, CPU)
    assert [option.precision for option in kept] == ["fp32", "fp32"]
    assert "bf16 left out" in notes[0] and "trains in fp32" in notes[0]
    kept, notes = numerics.safe_options(mlp(), batch(), options, CPU)
    assert kept == options and "bf16 0.0" in notes[0]
    only_low = [Candidate("bf16", False)]
    kept, _ = numerics.safe_options(Cancelling(), batch(), only_low, CPU)
    assert kept == [Candidate("fp32", False)]
    # fp32 alone, its layouts to time (an AVX2 CPU): nothing measured, and no empty "gradient ... : (at most 0.4)"
    layouts = [Candidate("fp32", False), Candidate("fp32", True)]
    assert numerics.safe_options(Cancelling(), batch(), layouts, CPU) == (layouts, [])


def test_a_loss_that_overflows_only_in_reduced_precision_is_infinitely_wrong():
    class Huge(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(64, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = self.linear(x.flatten(1))  # autocast: bf16 under the check
            return out * 1e38 if out.dtype == torch.bfloat16 else out

    assert math.isinf(numerics.gradient_error(Huge(), *batch(), "bf16", CPU))


class NumpyInside(nn.Module):
    """Takes its features through numpy (as some users' code does): numpy has no bf16, and the path has no grad."""

    def __init__(self):
        super().__init__()
        self.features = nn.Linear(64, 16)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = torch.from_numpy(self.features(x.flatten(1)).detach().numpy())
        return self.head(features)


def test_a_precision_the_models_own_code_cannot_run_in_is_left_out_with_what_it_raised():
    options = [Candidate("bf16", False), Candidate("fp32", False)]
    kept, notes = numerics.safe_options(NumpyInside(), batch(), options, CPU)
    assert kept == [Candidate("fp32", False)]
    assert "bf16 left out: its step raised TypeError: Got unsupported ScalarType BFloat16" in notes[0]
    assert "trains in fp32" in notes[0]


def test_what_fp32_cannot_run_is_the_models_own_error_as_it_is():
    class Broken(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise ValueError("not in training mode, please")

    with pytest.raises(ValueError, match="please"):
        numerics.gradient_error(Broken(), *batch(), "bf16", CPU)
