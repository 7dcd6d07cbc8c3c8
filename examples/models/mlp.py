"""A user's multi-layer perceptron: the image flattened, two hidden layers with ReLU and dropout.

python examples/models/mlp.py                                # scikit-learn's 8x8 digits
hasten train model.name=import model.target=examples.models.mlp:MLP    # by import path
"""

from __future__ import annotations

import sys

from torch import Tensor, nn


class MLP(nn.Module):
    def __init__(self, num_classes: int, in_channels: int = 3, image_size: tuple[int, int] = (32, 32)):
        super().__init__()
        inputs = in_channels * image_size[0] * image_size[1]
        self.layers = nn.Sequential(
            nn.Flatten(),
            nn.Linear(inputs, 512),
            nn.ReLU(),
            nn.Dropout(0.2),
            nn.Linear(512, 256),
            nn.ReLU(),
            nn.Dropout(0.2),
            nn.Linear(256, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)


if __name__ == "__main__":
    import hasten

    result = hasten.train(None, ["data.name=digits", *sys.argv[1:]], model=MLP)
    print(f"test accuracy {result['test_accuracy']:.2%}")
