"""A user's ResNet written the way timm writes one (BasicBlock: conv1/bn1/act1, conv2/bn2, a downsample path,
act2 after the sum), batch norm throughout, at a small width for small images.

    python examples/models/timm_resnet.py                        # scikit-learn's 8x8 digits
    hasten train model.name=import model.target=examples.models.timm_resnet:ResNet   # by import path
"""

from __future__ import annotations

import sys

from torch import Tensor, nn


class BasicBlock(nn.Module):
    def __init__(self, inplanes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.act1 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.act2 = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(planes))  # fmt: skip

    def forward(self, x: Tensor) -> Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        x = self.bn2(self.conv2(self.act1(self.bn1(self.conv1(x)))))
        return self.act2(x + shortcut)


class ResNet(nn.Module):
    def __init__(self, num_classes: int, in_chans: int = 3, layers: tuple[int, ...] = (1, 1, 1), width: int = 32):
        super().__init__()
        self.conv1 = nn.Conv2d(in_chans, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.act1 = nn.ReLU(inplace=True)
        stages, inplanes = [], width
        for i, blocks in enumerate(layers):
            planes = width * 2**i
            for b in range(blocks):
                stages.append(BasicBlock(inplanes, planes, stride=2 if i > 0 and b == 0 else 1))
                inplanes = planes
        self.layers = nn.Sequential(*stages)
        self.global_pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(inplanes, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.global_pool(self.layers(self.act1(self.bn1(self.conv1(x))))).flatten(1))

    @classmethod
    def for_images(cls, num_classes: int, in_channels: int = 3) -> ResNet:
        """timm names the input channels `in_chans`; hasten passes `in_channels` to what takes it."""
        return cls(num_classes, in_chans=in_channels)


if __name__ == "__main__":
    import hasten

    result = hasten.train(None, ["data.name=digits", *sys.argv[1:]], model=ResNet.for_images)
    print(f"test accuracy {result['test_accuracy']:.2%}")
