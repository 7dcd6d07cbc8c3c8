"""A user's small vision transformer: patches embedded by a strided convolution, a class token, learned position
embeddings, pre-norm transformer blocks (LayerNorm, GELU) from torch.nn, no convolutional features.

    python examples/models/vit.py                                # scikit-learn's 8x8 digits
    hasten train model.name=import model.target=examples.models.vit:TinyViT  # by import path
"""

from __future__ import annotations

import sys

import torch
from torch import Tensor, nn


class TinyViT(nn.Module):
    def __init__(
        self,
        num_classes: int,
        in_channels: int = 3,
        image_size: tuple[int, int] = (32, 32),
        patch: int = 4,
        dim: int = 64,
        depth: int = 4,
        heads: int = 4,
    ):
        super().__init__()
        patch = min(patch, *image_size)
        tokens = (image_size[0] // patch) * (image_size[1] // patch)
        self.embed = nn.Conv2d(in_channels, dim, patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.position = nn.Parameter(torch.randn(1, tokens + 1, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(
            dim, heads, 2 * dim, dropout=0.1, activation="gelu", batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(len(x), -1, -1), x], dim=1) + self.position
        return self.head(self.norm(self.blocks(x))[:, 0])


if __name__ == "__main__":
    import hasten

    result = hasten.train(None, ["data.name=digits", *sys.argv[1:]], model=TinyViT)
    print(f"test accuracy {result['test_accuracy']:.2%}")
