"""A user's VGG-style CNN with no normalisation at all, and an `nn.LazyLinear` head (the flattened size is
never computed by hand): ReLU, max pooling, dropout.

    python examples/models/plain_cnn.py                         # scikit-learn's 8x8 digits
    hasten train model.name=import model.target=examples.models.plain_cnn:PlainCNN   # by import path
"""

from __future__ import annotations

import sys

from torch import Tensor, nn


class PlainCNN(nn.Module):
    def __init__(self, num_classes: int, in_channels: int = 3, width: int = 32):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(2 * width, 4 * width, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveMaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.LazyLinear(256), nn.ReLU(), nn.Dropout(0.3), nn.Linear(256, num_classes)
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))


if __name__ == "__main__":
    import hasten

    result = hasten.train(None, ["data.name=digits", *sys.argv[1:]], model=PlainCNN)
    print(f"test accuracy {result['test_accuracy']:.2%}")
