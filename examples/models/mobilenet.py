"""A user's MobileNet-like net: depthwise-separable convolutions (a 3x3 depthwise, then a 1x1 pointwise), batch
norm and ReLU6, strided blocks instead of pooling.

    python examples/models/mobilenet.py                          # scikit-learn's 8x8 digits
    hasten train model.name=import model.target=examples.models.mobilenet:MobileNetLike   # by import path
"""

from __future__ import annotations

import sys

from torch import Tensor, nn


def separable(cin: int, cout: int, stride: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cin, 3, stride=stride, padding=1, groups=cin, bias=False),
        nn.BatchNorm2d(cin),
        nn.ReLU6(inplace=True),
        nn.Conv2d(cin, cout, 1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU6(inplace=True),
    )


class MobileNetLike(nn.Module):
    def __init__(self, num_classes: int, in_channels: int = 3, width: int = 32):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU6(inplace=True)
        )
        self.blocks = nn.Sequential(
            separable(width, 2 * width, 1),
            separable(2 * width, 2 * width, 2),
            separable(2 * width, 4 * width, 1),
            separable(4 * width, 4 * width, 2),
            separable(4 * width, 8 * width, 1),
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Flatten(), nn.Dropout(0.2), nn.Linear(8 * width, num_classes))

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.pool(self.blocks(self.stem(x))))


if __name__ == "__main__":
    import hasten

    result = hasten.train(None, ["data.name=digits", *sys.argv[1:]], model=MobileNetLike)
    print(f"test accuracy {result['test_accuracy']:.2%}")
