"""Whether a layer, or any layer of a model, is batch norm: what decides that a batch of one cannot train, that the
EMA's average needs its statistics recomputed, and which layers the recipe's BN settings reach.

One test for all of them: torch's BatchNorm1d/2d/3d, their lazy forms and SyncBatchNorm all derive from
`_BatchNorm` (InstanceNorm, LayerNorm and GroupNorm do not: they never normalise over the batch).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import nn


def is_batch_norm(module: nn.Module) -> bool:
    return isinstance(module, nn.modules.batchnorm._BatchNorm)


def has_batch_norm(model: nn.Module) -> bool:
    """Whether any layer of `model`, at any depth, is batch norm."""
    return any(is_batch_norm(module) for module in model.modules())


def folded_for_inference(model: nn.Module) -> nn.Module:
    """A copy of `model` for evaluation with each batch norm that directly follows a convolution or linear layer
    folded into that layer's weights and bias (torch.fx's `fuse`), and each that follows a convolution through a
    max-pool (`model.pool_first`) where it can be (`fold_through_max_pools`): the same function in evaluation mode, one
    memory-bound pass less per layer (on a 2-core Zen 4, hasten's fashion-fast ResNet evaluated 1.05-1.5x faster per
    image at batch 64, bf16; docs/results/zen4.md), and each 2x2 max-pool computed as `PairMax` (the same values,
    up to 10x faster on a CPU). `model` itself, unchanged, when it has no batch norm, cannot be
    traced (control flow on its inputs, say) or has forward hooks on any of its modules (the traced copy inlines
    containers and starts a new top-level module: their hooks would not run). Weights keep their memory layout.

    The copy is made once per model and kept beside it (`ReusedFold`): a later call, the model's layers and what
    can fold unchanged, writes the model's current weights into the same copy (the same arithmetic as a fresh
    fold, bitwise) instead of tracing and copying the model again, which costs more than evaluating a small test
    set (hasten's ResNet at 32 px: 37 ms against 27 ms for 100 images, on a 2-core AVX2 EPYC)."""
    if not has_batch_norm(model):
        return model
    if any(m._forward_pre_hooks or m._forward_hooks for m in model.modules()):  # (torch lists them nowhere public)
        return model  # the traced copy would drop a container's: fp16's input and output casts, a caller's recording
    kept = _FOLDS.get(model)
    if kept is not None and kept.module is None:
        return fresh_fold(model)  # found not reusable when first folded
    if kept is not None and kept.refresh(model):
        return kept.module
    folded = fresh_fold(model)
    if folded is not model:
        _FOLDS[model] = ReusedFold.of(model, folded)
    return folded


def fresh_fold(model: nn.Module) -> nn.Module:
    """`folded_for_inference`'s copy made anew (no reuse); `model` itself where it cannot be made."""
    import warnings

    from torch.fx.experimental.optimization import fuse

    was_training = model.training
    model.eval()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            folded = fuse(model)
            fold_through_max_pools(folded)
            pair_max_pools(folded)
    except Exception:  # (fx raises many kinds on a model it cannot trace): evaluate the model as it is
        return model
    finally:
        model.train(was_training)
    convs = [m.weight for m in model.modules() if isinstance(m, nn.Conv2d)]
    if any(w.is_contiguous(memory_format=torch.channels_last) and not w.is_contiguous() for w in convs):
        folded = folded.to(memory_format=torch.channels_last)  # (the folded weights are made contiguous)
    return folded.eval()


def fold_through_max_pools(graph_module: torch.fx.GraphModule) -> int:
    """Folds each eval-mode BatchNorm2d whose input is a MaxPool2d of a Conv2d's output (each used once) into that
    convolution, in place, where every channel's scale (gamma / sqrt(running var + eps)) is positive: a positive
    affine map commutes with a max, so conv -> pool -> BN is conv' -> pool. A batch norm with a scale <= 0 in any
    channel stays. Returns how many were folded."""
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    modules = dict(graph_module.named_modules())

    def module_of(node: torch.fx.Node, kind: type[nn.Module]) -> nn.Module | None:
        found = modules.get(node.target) if node.op == "call_module" else None
        return found if isinstance(found, kind) and len(node.users) == 1 else None

    count = 0
    for node in list(graph_module.graph.nodes):
        norm = module_of(node, nn.BatchNorm2d)
        if norm is None or norm.training or norm.running_var is None or not isinstance(node.args[0], torch.fx.Node):
            continue
        pool_node = node.args[0]
        conv_node = pool_node.args[0] if module_of(pool_node, nn.MaxPool2d) is not None else None
        conv = module_of(conv_node, nn.Conv2d) if isinstance(conv_node, torch.fx.Node) else None
        if conv is None:
            continue
        if not scales_positive(norm):
            continue
        parent, _, name = conv_node.target.rpartition(".")
        setattr(graph_module.get_submodule(parent) if parent else graph_module, name, fuse_conv_bn_eval(conv, norm))
        node.replace_all_uses_with(pool_node)
        graph_module.graph.erase_node(node)
        count += 1
    if count:
        graph_module.graph.lint()
        graph_module.recompile()
        graph_module.delete_all_unused_submodules()  # the folded batch norms
    return count


def scales_positive(norm: nn.BatchNorm2d) -> bool:
    """Whether every channel's scale of an eval-mode batch norm, gamma / sqrt(running var + eps), is positive: what
    lets it fold through a max-pool (`fold_through_max_pools`)."""
    return bool((torch.rsqrt(norm.running_var + norm.eps) * (norm.weight if norm.affine else 1.0) > 0).all())


class PairMax(nn.Module):
    """A 2x2 max-pool of stride 2 (nn.MaxPool2d(2): no padding, floor mode), for evaluation: the elementwise maximum
    of the input's four strided quarter views. The same values, NaN included (a maximum is exact and both propagate
    NaN), in the input's memory layout, without the int64 indices torch's CPU kernel writes beside them. On a
    2-core Zen 4, 256 images of 16x28x28: 0.41 against 0.86 ms in bf16 channels-last, 0.79 against 8.8 ms in fp32
    contiguous (torch's kernel in that layout is 10x slower: what a CPU without bf16 evaluates in); 64x7x7 the same
    in channels-last. Not for training: autograd through the maximums is several times slower than the pool's."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2] // 2 * 2, x.shape[-1] // 2 * 2
        top, bottom = x[..., 0:h:2, 0:w:2], x[..., 1:h:2, 0:w:2]
        return torch.maximum(torch.maximum(top, x[..., 0:h:2, 1:w:2]), torch.maximum(bottom, x[..., 1:h:2, 1:w:2]))


def is_pair_pool(module: nn.Module) -> bool:
    """An nn.MaxPool2d that `PairMax` computes exactly: 2x2, stride 2, no padding or dilation, floor mode, no
    indices returned."""
    if not isinstance(module, nn.MaxPool2d) or module.return_indices or module.ceil_mode:
        return False
    pair = lambda value: value in (2, (2, 2))  # noqa: E731
    fixed = lambda value, size: value in (size, (size, size))  # noqa: E731
    return pair(module.kernel_size) and pair(module.stride) and fixed(module.padding, 0) and fixed(module.dilation, 1)


def pair_max_pools(model: nn.Module) -> int:
    """Replace, in place, each submodule of `model` that `is_pair_pool` with a `PairMax`; returns how many."""
    found = [name for name, module in model.named_modules() if name and is_pair_pool(module)]
    for name in found:
        parent, _, attribute = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, attribute, PairMax())
    return len(found)


_FOLDS: weakref.WeakKeyDictionary[nn.Module, ReusedFold] = weakref.WeakKeyDictionary()  # each model's folded copy


class ReusedFold:
    """A model's folded copy (`fresh_fold`) and how to bring it up to the model's current weights: each layer a
    batch norm was folded into is computed again from the model's layer and batch norm (torch's
    `fuse_conv_bn_weights`, as the fold did); every other parameter and buffer is copied from the model's of the
    same name. Holds names, not the model's tensors, so the model can be freed. `None` modules (`ReusedFold.of`)
    are never reused: a copy whose refresh did not reproduce a fresh fold bitwise when it was made."""

    def __init__(self, module: nn.Module | None, key: tuple[Any, ...], fused: list[tuple[str, str]]):
        self.module, self.key, self.fused = module, key, fused
        fused_layers = {layer for layer, _ in fused}
        self.copied = [
            (name, tensor)
            for name, tensor in [*_tensors(module, "parameters"), *_tensors(module, "buffers")]
            if name.rpartition(".")[0] not in fused_layers
        ] if module is not None else []  # fmt: skip

    @classmethod
    def of(cls, model: nn.Module, folded: nn.Module) -> ReusedFold:
        """The reusable form of `folded` (`fresh_fold(model)`), checked: refreshed from `model` at once, it must
        equal itself bitwise, or it is kept as not reusable (every later call folds afresh)."""
        try:
            fused = _folded_pairs(model, folded)
        except Exception:  # (fx raises many kinds; fresh_fold traced it, so this is not expected)
            return cls(None, (), [])
        made = cls(folded, _key(model, fused), fused)
        before = [t.clone() for t in folded.state_dict().values()]
        if not made.refresh(model) or not all(
            torch.equal(a, b) for a, b in zip(before, folded.state_dict().values(), strict=True)
        ):
            folded.load_state_dict(dict(zip(folded.state_dict(), before, strict=True)))
            return cls(None, (), [])
        return made

    def refresh(self, model: nn.Module) -> bool:
        """The copy brought up to `model`'s current weights; False (nothing written) when it cannot be: not
        reusable, the model's layers changed, or a batch norm's sign changed what folds through a max-pool."""
        if self.module is None or _key(model, self.fused) != self.key:
            return False
        from torch.nn.utils.fusion import fuse_conv_bn_weights, fuse_linear_bn_weights

        tensors = dict([*_tensors(model, "parameters"), *_tensors(model, "buffers")])
        if any(name not in tensors for name, _ in self.copied):
            return False
        with torch.no_grad():
            for layer_name, norm_name in self.fused:
                layer, norm = model.get_submodule(layer_name), model.get_submodule(norm_name)
                target = self.module.get_submodule(layer_name)
                stats = (norm.running_mean, norm.running_var, norm.eps, norm.weight, norm.bias)
                if isinstance(layer, nn.Linear):
                    weight, bias = fuse_linear_bn_weights(layer.weight, layer.bias, *stats)
                else:
                    weight, bias = fuse_conv_bn_weights(layer.weight, layer.bias, *stats, transpose=False)
                target.weight.copy_(weight)
                target.bias.copy_(bias)
            for name, tensor in self.copied:
                tensor.copy_(tensors[name])
        return True


def _tensors(module: nn.Module, kind: str) -> list[tuple[str, torch.Tensor]]:
    named = module.named_parameters if kind == "parameters" else module.named_buffers
    return [(name, tensor) for name, tensor in named(remove_duplicate=False)]


def _folded_pairs(model: nn.Module, folded: nn.Module) -> list[tuple[str, str]]:
    """(layer, batch norm) names in `model` of each batch norm `folded` no longer has: the layer it follows,
    directly or through a max-pool, which it was folded into."""
    modules, kept = dict(model.named_modules()), {name for name, _ in folded.named_modules()}
    pairs = []
    for node in torch.fx.symbolic_trace(model).graph.nodes:
        if node.op != "call_module" or not is_batch_norm(modules[node.target]) or node.target in kept:
            continue
        source = node.args[0]
        if isinstance(modules.get(source.target), nn.MaxPool2d):
            source = source.args[0]
        pairs.append((source.target, node.target))
    return pairs


def _key(model: nn.Module, fused: list[tuple[str, str]]) -> tuple[Any, ...]:
    """What a folded copy of `model` depends on besides the weights' values: each module's name and type, each
    parameter's and buffer's name, shape, dtype and layout, and the sign of every batch norm's scale (whether it
    folds through a max-pool)."""
    layers = tuple((name, type(module)) for name, module in model.named_modules())
    tensors = tuple(
        (name, tuple(t.shape), t.dtype, t.is_contiguous(), t.is_contiguous(memory_format=torch.channels_last))
        if t.dim() == 4 else (name, tuple(t.shape), t.dtype)
        for name, t in [*_tensors(model, "parameters"), *_tensors(model, "buffers")]
    )  # fmt: skip
    signs = tuple(
        scales_positive(m) for m in model.modules() if isinstance(m, nn.BatchNorm2d) and m.running_var is not None
    )
    return layers, tensors, signs, tuple(fused)
