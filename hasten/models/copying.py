"""Copies of a model that hold for any model a user writes.

`copy.deepcopy` refuses a module that keeps a tensor computed from its parameters as a plain attribute ("Only
Tensors created explicitly by the user (graph leaves) support the deepcopy protocol"): `torch.nn.utils.weight_norm`
(the hook-based form many tutorials and older papers' code use) keeps the `weight` it computes before each forward
that way, and so does a model that stores an activation on `self`. hasten copies the model to try settings on it
(the probe, the numerics check, the LR range test), to average it (EMA) and to hand a trained one back; each of
those copies goes through `leaf_attributes`: such tensors are detached while the copy is made and put back after,
so the user's model is left as it was and the copy computes them again at its next forward, as the original does.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import torch
from torch import nn

M = TypeVar("M", bound=nn.Module)


def _computed(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """`module`'s own plain attributes holding a tensor that is not a graph leaf (parameters and buffers live in
    their own dicts, not here)."""
    return [
        (name, value)
        for name, value in vars(module).items()
        if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter) and value.grad_fn is not None
    ]


@contextmanager
def leaf_attributes(model: nn.Module) -> Iterator[None]:
    """While inside, every module of `model` holds its computed tensor attributes detached (deep-copyable); on
    leaving, the originals are back (their autograd graphs included)."""
    held: list[tuple[nn.Module, str, torch.Tensor]] = []
    try:
        for module in model.modules():
            for name, value in _computed(module):
                held.append((module, name, value))
                setattr(module, name, value.detach())
        yield
    finally:
        for module, name, value in held:
            setattr(module, name, value)


def copy_model(model: M) -> M:
    """A deep copy of `model`, also when it keeps tensors computed from its parameters as attributes."""
    with leaf_attributes(model):
        return copy.deepcopy(model)


def folded_norms(model: M) -> M:
    """For an exported graph: a copy of `model` with each hook-based `torch.nn.utils.weight_norm` and
    `spectral_norm` folded into a plain weight (what it computes before every forward in evaluation, done once:
    torch.export would otherwise see the weight assigned as an attribute during the trace); `model` itself when it
    has none."""
    from torch.nn.utils.spectral_norm import SpectralNorm
    from torch.nn.utils.weight_norm import WeightNorm

    removals = {WeightNorm: nn.utils.remove_weight_norm, SpectralNorm: nn.utils.remove_spectral_norm}

    def norms(net: nn.Module) -> list[tuple[nn.Module, str, Any]]:
        return [(m, hook.name, removals[type(hook)]) for m in net.modules() for hook in m._forward_pre_hooks.values()
                if type(hook) in removals]  # fmt: skip

    if not norms(model):
        return model
    folded = copy_model(model)
    for module, name, remove in norms(folded):
        remove(module, name)
    return folded
