"""A small ResNet family (He et al., 2016) for 28x28 and 32x32 images, with a width knob.

Channels are `width`, 2*`width`, 4*`width`, ... per stage, so `width` scales the model the way Nakkiran
et al. (Deep Double Descent, 2019) scale ResNet18; `blocks` sets the residual blocks per stage. `widths` gives
each stage's channels outright instead (the stem gets the first stage's), for layouts that suit the hardware's
kernels, e.g. multiples of 16, 32 or 64 for oneDNN's bf16 convolutions. The stem
and each stage's downsampling follow Page's ResNet-9 (conv-BN-ReLU then max-pool; the ReLU computed after the
pool, which gives the same numbers on a quarter of the pixels), which is cheap on CPU.

With `checkpoint_activations` (Chen et al., 2016; `train.checkpoint_activations`), the forward pass runs as
segments -- the stem, each stage's downsampling unit (conv-BN-ReLU + max-pool) and each residual block -- and the
stem's and the first stage's segments keep only their input for backward, recomputing the rest there. That is
where the memory is: each stage has 4x fewer pixels and 2x the channels of the one before, so half its
activation memory, and the stem and first downsampling unit run at full resolution. Measured on the 28x28
reference model at batch 256 (hasten.engine.memory.measure_peak): checkpointing only the residual blocks cuts the step's
peak by ~17%; the stem and stage 1, 44%; adding stage 2 gives the same 44% for ~40% more step time instead of
~10%. The last segment is never checkpointed (backward would recompute it at once). Parameter names do not
change, so checkpoints load either way.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from hasten.engine.memory import checkpointed
from hasten.engine.norms import is_batch_norm


def conv_bn(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True))


def downsampling(c_in: int, c_out: int, pool_first: bool = False) -> tuple[nn.Sequential, nn.Sequential]:
    """A stage's downsampling unit, conv-BN-ReLU then a 2x2 max-pool, as two modules: (conv, BN) and (max-pool,
    ReLU). The ReLU runs after the pool, on a quarter of the pixels: the same numbers, forward and backward, as
    before it (ReLU is monotone, so it commutes with a max; where a window's maximum is not positive both orders
    give 0 and a zero gradient), and a full-resolution pass fewer each way (a ReLU and its backward over the
    stage's largest activations). Parameter names are those of conv_bn followed by a pool (stages.N.0.0 the conv,
    stages.N.0.1 the BN), so checkpoints load either way.

    `pool_first` (`model.pool_first`): conv, then the max-pool, then BN and ReLU (airbench's order, Jordan 2024):
    the batch norm, too, on a quarter of the pixels. Another model, not the same numbers (the batch norm's
    statistics are the pooled values', and a negative BN scale does not commute with a max): (conv) and (max-pool,
    BN, ReLU), the BN named stages.N.1.1."""
    conv = nn.Conv2d(c_in, c_out, 3, padding=1, bias=False)
    if pool_first:
        return nn.Sequential(conv), nn.Sequential(nn.MaxPool2d(2), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True))
    return nn.Sequential(conv, nn.BatchNorm2d(c_out)), nn.Sequential(nn.MaxPool2d(2), nn.ReLU(inplace=True))


class Residual(nn.Module):
    """x + f(x), with f two conv-BN-ReLU layers; `last_bn` is the BN that zero-init-residual sets to 0."""

    def __init__(self, channels: int):
        super().__init__()
        self.first = conv_bn(channels, channels)
        self.second = conv_bn(channels, channels)

    @property
    def last_bn(self) -> nn.BatchNorm2d:
        return self.second[1]

    def forward(self, x: Tensor) -> Tensor:
        return x + self.second(self.first(x))


class ResNet(nn.Module):
    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        width: int = 32,
        blocks: list[int] | None = None,
        checkpoint_activations: bool = False,
        widths: list[int] | None = None,
        pool_first: bool = False,
    ):
        super().__init__()
        blocks = blocks or [1, 1, 1]
        widths = widths or [width * 2**i for i in range(len(blocks))]
        if len(widths) != len(blocks):
            raise ValueError(f"widths: one per stage, got {len(widths)} for {len(blocks)} stages")
        self.checkpoint_activations = checkpoint_activations
        self.stem = conv_bn(in_channels, widths[0])
        stages = []
        c_in = widths[0]
        for count, c_out in zip(blocks, widths, strict=True):
            unit = downsampling(c_in, c_out, pool_first)
            stages.append(nn.Sequential(*unit, *(Residual(c_out) for _ in range(count))))
            c_in = c_out
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveMaxPool2d(1)
        self.head = nn.Linear(c_in, num_classes)

    def segments(self) -> list[list[nn.Module]]:
        """The layers before the head as checkpoint segments: stem, then per stage its downsampling unit and
        each residual block."""
        segments: list[list[nn.Module]] = [[self.stem]]
        for stage in self.stages:
            segments.append([stage[0], stage[1]])
            segments.extend([block] for block in stage[2:])
        return segments

    def checkpointed_segments(self) -> int:
        """How many leading segments `checkpoint_activations` recomputes: the stem's and the first stage's (its
        downsampling unit and residual blocks), never the last segment."""
        first_stage = len(self.stages[0]) - 1  # stage = (conv-BN-ReLU, max-pool, *blocks): 1 + blocks segments
        return min(1 + first_stage, len(self.segments()) - 1)

    def forward(self, x: Tensor) -> Tensor:
        recompute = self.checkpoint_activations and self.training and torch.is_grad_enabled()
        checkpointed_count = self.checkpointed_segments() if recompute else 0
        for i, segment in enumerate(self.segments()):
            if i < checkpointed_count:
                x = checkpointed(segment, x)
            else:
                for layer in segment:
                    x = layer(x)
        return self.head(self.pool(x).flatten(1))


def zero_init_residual(model: nn.Module) -> list[str]:
    """Set the last BN gamma of every residual block to 0; returns the names of the parameters it zeroed (empty:
    the model has none). A residual block is hasten's `Residual` or, in a user's model, any module whose
    `last_bn` is a BatchNorm layer: the norm that ends its residual branch."""
    zeroed = []
    for name, module in model.named_modules():
        last_bn = getattr(module, "last_bn", None)  # the documented hook for a user's residual block
        if isinstance(module, Residual) or is_batch_norm(last_bn):
            nn.init.zeros_(module.last_bn.weight)
            bn_name = next(n for n, m in module.named_modules() if m is module.last_bn)
            zeroed.append(f"{name}.{bn_name}.weight")
    return zeroed
