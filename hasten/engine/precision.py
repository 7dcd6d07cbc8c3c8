"""Numeric precision of training as a context object: fp32, bf16 autocast, fp16 with dynamic loss scaling, and
fp16 weights with fp32 master copies.

Micikevicius et al., "Mixed Precision Training" (ICLR 2018): 16-bit activations and matmuls, fp32 master weights
for the update, and a loss scale so small fp16 gradients do not flush to zero. bf16 has fp32's exponent range and
needs no scaling. Each mode is one object with the same few methods, used by the loop as

    groups = precision.optimizer_groups(groups)   # before the optimizer is made (fp16-master: the masters)
    with precision.autocast():
        loss = ...
    precision.backward(loss)
    stepped = precision.step(optimizer)   # False when the step was skipped for inf/NaN gradients
    stepped = precision.step(optimizer, max_grad_norm=1.0)   # the global gradient norm clipped first

A skipped step leaves weights and optimizer state untouched; the trainer then does not advance the LR schedule.
`state_dict()` holds the loss scaler (and fp16-master's masters), which a checkpoint must keep.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

from hasten.engine.norms import is_batch_norm
from hasten.errors import RecipeError
from hasten.recipe.schema import PRECISION_MODES, LossScaleConfig, PrecisionName

DEFAULT_LOSS_SCALE = LossScaleConfig()  # where fp16's dynamic loss scale starts and how often it grows, by default


class Precision:
    """fp32: no autocast, plain backward and step. The base of the other modes."""

    name: PrecisionName = "fp32"  # which of the recipe's PRECISION_MODES this class implements
    autocast_dtype: torch.dtype | None = None
    compute_dtype: torch.dtype = torch.float32  # what the matmuls run in (the bench's peak is measured in it)

    def __init__(self, device: torch.device):
        self.device = device
        self.grad_norm: Tensor | None = None  # the global gradient norm before the last clipping (unscaled)

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

    def optimizer_groups(self, groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The parameter groups the optimizer should hold (fp16-master: the fp32 masters of the model's)."""
        return groups

    def backward(self, loss: Tensor) -> None:
        loss.backward()

    def step(self, optimizer: torch.optim.Optimizer, max_grad_norm: float | None = None) -> bool:
        """Apply the accumulated gradients, their global norm clipped to `max_grad_norm` first when given; True
        when the step was taken."""
        self.clip(optimizer, max_grad_norm)
        optimizer.step()
        return True

    def clip(self, optimizer: torch.optim.Optimizer, max_grad_norm: float | None) -> None:
        """Clip the gradients of the optimizer's parameters (unscaled by now) to a global norm of `max_grad_norm`;
        the norm before clipping is kept in `grad_norm`, as a device tensor (no sync)."""
        if not max_grad_norm:
            return
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        self.grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)

    @property
    def loss_scale(self) -> float:
        return 1.0

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class BF16(Precision):
    """bf16 autocast: matmuls and convolutions in bfloat16, weights and the update in fp32, no loss scaling."""

    name: PrecisionName = "bf16"
    autocast_dtype = compute_dtype = torch.bfloat16


class FP16(Precision):
    """fp16 autocast with dynamic loss scaling (torch.amp.GradScaler): a step with inf/NaN gradients is skipped
    and the scale halved; after `growth_interval` clean steps the scale doubles."""

    name: PrecisionName = "fp16"
    autocast_dtype = compute_dtype = torch.float16

    def __init__(
        self,
        device: torch.device,
        init_scale: float = DEFAULT_LOSS_SCALE.init,
        growth_interval: int = DEFAULT_LOSS_SCALE.growth_interval,
    ):
        super().__init__(device)
        self.scaler = torch.amp.GradScaler(device.type, init_scale=init_scale, growth_interval=growth_interval)

    def backward(self, loss: Tensor) -> None:
        self.scaler.scale(loss).backward()

    def step(self, optimizer: torch.optim.Optimizer, max_grad_norm: float | None = None) -> bool:
        scale_before = self.scaler.get_scale()
        if max_grad_norm:
            self.scaler.unscale_(optimizer)  # clip the true gradients; inf/NaN ones still make the step skip
            self.clip(optimizer, max_grad_norm)
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


def _to_half(value: Any) -> Any:
    return value.half() if isinstance(value, Tensor) and value.is_floating_point() else value


def _to_float(value: Any) -> Any:
    return value.float() if isinstance(value, Tensor) and value.is_floating_point() else value


class FP16Master(Precision):
    """fp16 weights and activations, fp32 master weights for the optimizer (the apex "O2" recipe), step by step:

    1. `prepare` casts the model to fp16, except BatchNorm, which stays fp32 as in apex (`keep_batchnorm_fp32`):
       its running variance and the per-channel statistics lose too much in fp16, and it costs nothing, since
       BatchNorm takes fp16 input with fp32 weights and returns fp16. Floating inputs are cast to fp16 on the way
       in and the output back to fp32 on the way out (forward hooks), so the loss is computed in fp32.
    2. `optimizer_groups` gives the optimizer an fp32 copy (master) of every parameter instead of the parameter.
    3. `backward` multiplies the loss by the scale before backpropagating through the fp16 model.
    4. `step` copies the fp16 gradients into the masters' fp32 gradients, checks them for inf/NaN, and
       - on inf/NaN: skips the step (masters, weights and optimizer state untouched), halves the scale;
       - else: divides by the scale, steps the optimizer on the masters, copies the masters back into the fp16
         weights, and doubles the scale after `growth_interval` clean steps in a row.
    """

    name: PrecisionName = "fp16-master"
    compute_dtype = torch.float16

    def __init__(
        self,
        device: torch.device,
        init_scale: float = DEFAULT_LOSS_SCALE.init,
        growth_interval: int = DEFAULT_LOSS_SCALE.growth_interval,
    ):
        super().__init__(device)
        self.scale = float(init_scale)
        self.growth_interval = growth_interval
        self.clean_steps = 0  # steps since the scale last changed
        self.pairs: list[tuple[nn.Parameter, nn.Parameter]] = []  # (fp16 model weight, its fp32 master)

    def prepare(self, model: nn.Module) -> nn.Module:
        model.half()
        for module in model.modules():
            if is_batch_norm(module):
                module.float()
        model.register_forward_pre_hook(lambda _module, args: tuple(_to_half(a) for a in args))
        model.register_forward_hook(lambda _module, _args, output: _to_float(output))
        return model

    def optimizer_groups(self, groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
        mapped = []
        for group in groups:
            masters = []
            for param in group["params"]:
                master = nn.Parameter(param.detach().float().clone(), requires_grad=param.requires_grad)
                self.pairs.append((param, master))
                masters.append(master)
            mapped.append({**group, "params": masters})
        return mapped

    def backward(self, loss: Tensor) -> None:
        (loss.float() * self.scale).backward()

    def step(self, optimizer: torch.optim.Optimizer, max_grad_norm: float | None = None) -> bool:
        if not self.pairs:
            raise RuntimeError("fp16-master: build the optimizer on precision.optimizer_groups(...), not the model")
        with torch.no_grad():
            for weight, master in self.pairs:
                master.grad = None if weight.grad is None else weight.grad.float()
                weight.grad = None  # the masters own the gradients now; the next backward starts from zero
            grads = [master.grad for _, master in self.pairs if master.grad is not None]
            finite = bool(torch.stack([g.isfinite().all() for g in grads]).all()) if grads else True
            if not finite:
                for _, master in self.pairs:
                    master.grad = None
                self.scale /= 2
                self.clean_steps = 0
                return False
            for g in grads:
                g.mul_(1.0 / self.scale)
        self.clip(optimizer, max_grad_norm)  # on the masters' unscaled fp32 gradients
        with torch.no_grad():
            optimizer.step()
            for weight, master in self.pairs:
                weight.copy_(master)
        self.clean_steps += 1
        if self.clean_steps >= self.growth_interval:
            self.scale *= 2
            self.clean_steps = 0
        return True

    @property
    def loss_scale(self) -> float:
        return self.scale

    def state_dict(self) -> dict[str, Any]:
        """The scaler and the fp32 masters: the fp16 weights alone would round them on resume."""
        return {
            "scale": self.scale,
            "growth_interval": self.growth_interval,
            "clean_steps": self.clean_steps,
            "masters": [master.detach() for _, master in self.pairs],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale = float(state["scale"])
        self.growth_interval = int(state["growth_interval"])
        self.clean_steps = int(state["clean_steps"])
        masters = state.get("masters", [])
        if len(masters) != len(self.pairs):
            raise ValueError(f"fp16-master state holds {len(masters)} master weights, the model has {len(self.pairs)}")
        with torch.no_grad():
            for (weight, master), saved in zip(self.pairs, masters, strict=True):
                master.copy_(saved)
                weight.copy_(saved)


# each of the recipe's PRECISION_MODES, in its order, by the class that implements it
MODES: dict[str, type[Precision]] = {mode.name: mode for mode in (Precision, BF16, FP16, FP16Master)}


def compute_dtype(name: str) -> torch.dtype:
    """The dtype precision mode `name` computes in: the one map from mode names to dtypes."""
    return MODES[name].compute_dtype


def _describe(device: torch.device) -> str:
    if device.type == "cuda" and torch.cuda.is_available():
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return str(device)


def _probe(name: str, device: torch.device) -> None:
    """Run a tiny convolution, forward and backward, the way mode `name` will; raise RecipeError if it cannot.
    Each mode is tried once per device in a process (the verdict kept), and the try leaves the random streams as
    they were: a run's random numbers do not depend on whether, or how often, its precision was checked."""
    failure = _probe_failure(name, str(device))
    if failure is not None:
        raise RecipeError(f"precision: {name} cannot run on {_describe(device)}: {failure}")


@functools.cache
def _probe_failure(name: str, where: str) -> str | None:
    """The first line of what running mode `name` on device `where` raised, or None when it ran."""
    device, dtype = torch.device(where), compute_dtype(name)
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            conv = nn.Conv2d(2, 2, 3).to(device)
            x = torch.randn(2, 2, 5, 5, device=device)
            if name == "fp16-master":
                conv, x = conv.half(), x.half()
                conv(x).float().sum().backward()
            else:
                with torch.autocast(device.type, dtype=dtype):
                    out = conv(x)
                out.float().sum().backward()
    except Exception as error:  # noqa: BLE001 -- whatever the backend raises (no CUDA build: AssertionError)
        return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return None


def check_precision(name: str, device: torch.device) -> None:
    """A RecipeError naming the mode and the device when `device` cannot run precision `name` (a tiny autocast
    op tells), so a run fails before its data is read."""
    if name not in MODES:
        raise RecipeError(f"precision: {name!r} is not a precision mode; choose one of {', '.join(PRECISION_MODES)}")
    if name == "bf16" and device.type == "cuda" and torch.cuda.is_available() and not torch.cuda.is_bf16_supported():
        raise RecipeError(f"precision: bf16 cannot run on {_describe(device)}: the GPU has no bfloat16 support")
    if name != "fp32":
        _probe(name, device)


def make_precision(
    name: str,
    device: torch.device,
    init_scale: float = DEFAULT_LOSS_SCALE.init,
    growth_interval: int = DEFAULT_LOSS_SCALE.growth_interval,
) -> Precision:
    """The precision mode `name` on `device`, or a RecipeError naming both when the device cannot run it.

    `init_scale` and `growth_interval` configure the dynamic loss scale of fp16 and fp16-master.
    """
    check_precision(name, device)
    if MODES[name] in (FP16, FP16Master):  # the modes with a loss scale
        return MODES[name](device, init_scale=init_scale, growth_interval=growth_interval)
    return MODES[name](device)
