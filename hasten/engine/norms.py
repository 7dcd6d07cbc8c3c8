"""Whether a layer, or any layer of a model, is batch norm: what decides that a batch of one cannot train, that the
EMA's average needs its statistics recomputed, and which layers the recipe's BN settings reach.

One test for all of them: torch's BatchNorm1d/2d/3d, their lazy forms and SyncBatchNorm all derive from
`_BatchNorm` (InstanceNorm, LayerNorm and GroupNorm do not: they never normalise over the batch).
"""

from __future__ import annotations

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
    containers and starts a new top-level module: their hooks would not run). Weights keep their memory layout."""
    if not has_batch_norm(model):
        return model
    if any(m._forward_pre_hooks or m._forward_hooks for m in model.modules()):  # (torch lists them nowhere public)
        return model  # the traced copy would drop a container's: fp16's input and output casts, a caller's recording
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
        scale = torch.rsqrt(norm.running_var + norm.eps) * (norm.weight if norm.affine else 1.0)
        if not bool((scale > 0).all()):
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
