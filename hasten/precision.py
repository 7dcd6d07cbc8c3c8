"""Numeric precision of training as a context object: fp32, bf16 autocast, fp16 with dynamic loss scaling.

Micikevicius et al., "Mixed Precision Training" (2018): 16-bit activations and matmuls, fp32 weights for the
update, and a loss scale so small fp16 gradients do not flush to zero. bf16 has fp32's exponent range and
needs no scaling. Each mode is one object with the same few methods, used by the loop as

    with precision.autocast():
        loss = ...
    precision.backward(loss)
    stepped = precision.step(optimizer)   # False when the step was skipped for inf/NaN gradients
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

from hasten.errors import RecipeError


class Precision:
    """fp32: no autocast, plain backward and step. The base of the other modes."""

    name = "fp32"
    autocast_dtype: torch.dtype | None = None

    def __init__(self, device: torch.device):
        self.device = device

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        if self.autocast_dtype is None:
            yield
        else:
            with torch.autocast(self.device.type, dtype=self.autocast_dtype):
                yield

    def prepare(self, model: nn.Module) -> nn.Module:
        """The model as this mode trains it (fp16-master casts the weights)."""
        return model

    def backward(self, loss: Tensor) -> None:
        loss.backward()

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Apply the accumulated gradients; True when the step was taken."""
        optimizer.step()
        return True

    @property
    def loss_scale(self) -> float:
        return 1.0

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class BF16(Precision):
    """bf16 autocast: matmuls and convolutions in bfloat16, weights and the update in fp32, no loss scaling."""

    name = "bf16"
    autocast_dtype = torch.bfloat16


class FP16(Precision):
    """fp16 autocast with dynamic loss scaling (torch.amp.GradScaler): a step with inf/NaN gradients is skipped
    and the scale halved; after `growth_interval` clean steps the scale doubles."""

    name = "fp16"
    autocast_dtype = torch.float16

    def __init__(self, device: torch.device, init_scale: float = 2.0**16, growth_interval: int = 2000):
        super().__init__(device)
        self.scaler = torch.amp.GradScaler(device.type, init_scale=init_scale, growth_interval=growth_interval)

    def backward(self, loss: Tensor) -> None:
        self.scaler.scale(loss).backward()

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        scale_before = self.scaler.get_scale()
        self.scaler.step(optimizer)
        self.scaler.update()
        # GradScaler lowers the scale exactly when it skipped the step for non-finite gradients
        return self.scaler.get_scale() >= scale_before

    @property
    def loss_scale(self) -> float:
        return float(self.scaler.get_scale())

    def state_dict(self) -> dict[str, Any]:
        return self.scaler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scaler.load_state_dict(state)


MODES: dict[str, type[Precision]] = {"fp32": Precision, "bf16": BF16, "fp16": FP16}


def make_precision(name: str, device: torch.device) -> Precision:
    """The precision mode `name` on `device`, or a RecipeError naming both when the device cannot run it."""
    if name not in MODES:
        raise RecipeError(f"precision: {name!r} is not available yet; choose one of {', '.join(MODES)}")
    if name == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise RecipeError(
            f"precision: bf16 needs a GPU with bfloat16 support; {torch.cuda.get_device_name(device)} has none"
        )
    return MODES[name](device)
