"""A user's CNN with GroupNorm, GELU and dropout: three convolutions, average pooling, no batch norm.

    python examples/models/groupnorm_cnn.py                     # scikit-learn's 8x8 digits
    python examples/models/groupnorm_cnn.py data.name=imagefolder data.root=PHOTOS train.epochs=5

or from the command line, by import path: `hasten train model.name=import
model.target=examples.models.groupnorm_cnn:GroupNormCNN` (from the repository root).
"""

from __future__ import annotations

import sys

from torch import Tensor, nn


class GroupNormCNN(nn.Module):
    def __init__(self, num_classes: int, in_channels: int = 3, width: int = 32, dropout: float = 0.2):
        super().__init__()

        def block(cin: int, cout: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.GroupNorm(8, cout), nn.GELU())

        self.features = nn.Sequential(
            block(in_channels, width),
            nn.AvgPool2d(2),
            block(width, 2 * width),
            nn.AvgPool2d(2),
            nn.Dropout(dropout / 2),
            block(2 * width, 4 * width),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Dropout(dropout),
        )
        self.head = nn.Linear(4 * width, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))


if __name__ == "__main__":
    import hasten

    result = hasten.train(None, ["data.name=digits", *sys.argv[1:]], model=GroupNormCNN)
    print(f"test accuracy {result['test_accuracy']:.2%}")
