"""Three models written after the default's rules were fixed, the way users write them, to check the rules on
models none of them was tuned with (docs/results/models.md, "Three models written after the rules"):

    PYTHONPATH=benchmarks .venv/bin/python benchmarks/generalization.py --only digits,letters,fashion-1000 \
        --model lenet=heldout_models:LeNet5 --model convnext=heldout_models:MiniConvNeXt \
        --model instnet=heldout_models:InstanceNet --budgets recipe --arms default,plain --seeds 0,1,2
"""

import torch
from torch import nn


class LeNet5(nn.Module):
    """The textbook LeNet-5: tanh, average pooling, no normalisation, a LazyLinear head."""

    def __init__(self, num_classes, in_channels=3):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(in_channels, 6, 5, padding=2),
            nn.Tanh(),
            nn.AvgPool2d(2),
            nn.Conv2d(6, 16, 5, padding=2),
            nn.Tanh(),
            nn.AvgPool2d(2),
            nn.Flatten(),
            nn.LazyLinear(120),
            nn.Tanh(),
            nn.Linear(120, 84),
            nn.Tanh(),
            nn.Linear(84, num_classes),
        )

    def forward(self, x):
        return self.body(x)


class LayerNorm2d(nn.LayerNorm):
    def forward(self, x):
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dw = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.gamma = nn.Parameter(1e-6 * torch.ones(dim))

    def forward(self, x):
        y = self.dw(x).permute(0, 2, 3, 1)
        y = self.mlp(self.norm(y)) * self.gamma
        return x + y.permute(0, 3, 1, 2)


class MiniConvNeXt(nn.Module):
    """ConvNeXt in miniature: patchify stem, depthwise 7x7, LayerNorm, inverted MLP, layer scale."""

    def __init__(self, num_classes, in_channels=3, dims=(32, 64)):
        super().__init__()
        layers = [nn.Conv2d(in_channels, dims[0], 2, stride=2), LayerNorm2d(dims[0]), Block(dims[0]), Block(dims[0])]
        layers += [LayerNorm2d(dims[0]), nn.Conv2d(dims[0], dims[1], 2, stride=2), Block(dims[1]), Block(dims[1])]
        self.features = nn.Sequential(*layers)
        self.norm = nn.LayerNorm(dims[1])
        self.head = nn.Linear(dims[1], num_classes)

    def forward(self, x):
        return self.head(self.norm(self.features(x).mean((2, 3))))


class InstanceNet(nn.Module):
    """Strided convolutions with InstanceNorm and LeakyReLU, global max pooling, dropout."""

    def __init__(self, num_classes, in_channels=3, width=24):
        super().__init__()

        def block(cin, cout, stride):
            return nn.Sequential(
                nn.Conv2d(cin, cout, 3, stride, 1), nn.InstanceNorm2d(cout, affine=True), nn.LeakyReLU(0.1)
            )

        self.features = nn.Sequential(
            block(in_channels, width, 1),
            block(width, 2 * width, 2),
            block(2 * width, 2 * width, 1),
            block(2 * width, 4 * width, 2),
            nn.AdaptiveMaxPool2d(1),
            nn.Flatten(),
            nn.Dropout(0.3),
        )
        self.fc = nn.Linear(4 * width, num_classes)

    def forward(self, x):
        return self.fc(self.features(x))
