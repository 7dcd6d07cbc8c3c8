"""Activation checkpointing (Chen et al., "Training Deep Nets with Sublinear Memory Cost", 2016): a segment keeps
only its input for backward and recomputes its activations there, trading one extra forward for memory
(`train.checkpoint_activations`, `train.checkpoint_modules`). The mechanism (`checkpointed`, with batch-norm
statistics updated once) is hasten/engine/memory.py's; this chooses and wraps the modules.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from torch import nn
from torch.utils.checkpoint import checkpoint

from hasten.engine.memory import running_stats_kept
from hasten.errors import RecipeError
from hasten.models.resnet import ResNet


def checkpoint_activations(model: nn.Module, names: Sequence[str] | None = None) -> nn.Module:
    """`model` with the activations of the submodules `names` (dotted, as `named_modules` gives them) recomputed
    in backward instead of kept. Without names: hasten's ResNet checkpoints its own segments; any other model
    each of its top-level children with parameters but the last (whose activations backward needs at once).
    Each module is wrapped by torch's `checkpoint_wrapper`, which keeps the state_dict's keys, so checkpoints and
    exports load either way; batch-norm statistics are updated once, in the forward pass. RecipeError when a name
    is not a submodule or the model has nothing to checkpoint."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

    if names is None and isinstance(model, ResNet):
        model.checkpoint_activations = True
        return model
    modules = dict(model.named_modules())
    if names is None:
        children = list(model.named_children())[:-1]
        names = [name for name, child in children if any(True for _ in child.parameters())]  # layers, not reshapes
        if not names:
            raise RecipeError(
                f"train.checkpoint_activations: {type(model).__name__} has no top-level child with parameters before "
                "its last, nothing to checkpoint; name submodules with train.checkpoint_modules=[...]"
            )
    unknown = [name for name in names if name not in modules or not name]
    if unknown:
        known = ", ".join(n for n in list(modules)[1:30])
        raise RecipeError(
            f"train.checkpoint_modules: {type(model).__name__} has no submodule {unknown[0]!r} (it has: {known})"
        )
    for name in names:
        parent_name, _, leaf = name.rpartition(".")
        parent = modules[parent_name] if parent_name else model
        inner = modules[name]

        def contexts(inner: nn.Module = inner) -> tuple[contextlib.AbstractContextManager, ...]:
            return contextlib.nullcontext(), running_stats_kept([inner])

        wrapped = checkpoint_wrapper(inner, CheckpointImpl.NO_REENTRANT, checkpoint, use_reentrant=False,
                                     context_fn=contexts)  # fmt: skip
        parent.register_module(leaf, wrapped)
    return model
