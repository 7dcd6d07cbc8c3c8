"""A small ResNet family (He et al., 2016) for 28x28 and 32x32 images, with a width knob.

Channels are `width`, 2*`width`, 4*`width`, ... per stage, so `width` scales the model the way Nakkiran
et al. (Deep Double Descent, 2019) scale ResNet18; `blocks` sets the residual blocks per stage. The stem
and each stage's downsampling follow Page's ResNet-9 (conv-BN-ReLU then max-pool), which is cheap on CPU.
"""

from __future__ import annotations

from torch import Tensor, nn


def conv_bn(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True))


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
    def __init__(self, in_channels: int, num_classes: int, width: int = 32, blocks: list[int] | None = None):
        super().__init__()
        blocks = blocks or [1, 1, 1]
        self.stem = conv_bn(in_channels, width)
        stages = []
        c_in = width
        for i, count in enumerate(blocks):
            c_out = width * 2**i
            stages.append(
                nn.Sequential(conv_bn(c_in, c_out), nn.MaxPool2d(2), *(Residual(c_out) for _ in range(count)))
            )
            c_in = c_out
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveMaxPool2d(1)
        self.head = nn.Linear(c_in, num_classes)

    def residual_blocks(self) -> list[Residual]:
        return [m for m in self.modules() if isinstance(m, Residual)]

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.pool(self.stages(self.stem(x))).flatten(1))
