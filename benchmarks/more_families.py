"""A second set of user models, of kinds the model suite (examples/models/) does not hold: a GRU reading rows, a
ConvNeXt-like net (depthwise 7x7, LayerNorm over channels, layer scale), squeeze-and-excitation with SiLU,
InstanceNorm, a softmax at the end with a LazyLinear, a (logits, features) tuple out, BatchNorm1d in an MLP, a net
that resizes its input to 64 px itself, an MLP-Mixer. Written as users write them, not tuned for hasten; each
takes (num_classes, in_channels, image_size) like the suite's.

PYTHONPATH=benchmarks python benchmarks/generalization.py --only digits,fashion-1000 \
    --model grurows=more_families:GRURows --model mixer=more_families:Mixer ... --budgets recipe --arms default,plain
"""

import torch
import torch.nn.functional as F
from torch import nn


class GRURows(nn.Module):
    """Reads the image row by row with a GRU."""

    def __init__(self, num_classes, in_channels=3, image_size=(32, 32)):
        super().__init__()
        self.rnn = nn.GRU(in_channels * image_size[1], 128, batch_first=True, num_layers=2)
        self.head = nn.Linear(128, num_classes)

    def forward(self, x):
        b, c, h, w = x.shape
        seq = x.permute(0, 2, 1, 3).reshape(b, h, c * w)
        out, _ = self.rnn(seq)
        return self.head(out[:, -1])


class LayerNorm2d(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln = nn.LayerNorm(c)

    def forward(self, x):
        return self.ln(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class NeXtBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = nn.LayerNorm(c)
        self.pw1 = nn.Linear(c, 4 * c)
        self.pw2 = nn.Linear(4 * c, c)
        self.gamma = nn.Parameter(1e-6 * torch.ones(c))

    def forward(self, x):
        y = self.dw(x).permute(0, 2, 3, 1)
        y = self.pw2(F.gelu(self.pw1(self.norm(y))))
        return x + (self.gamma * y).permute(0, 3, 1, 2)


class ConvNeXtTiny(nn.Module):
    def __init__(self, num_classes, in_channels=3, image_size=(32, 32)):
        super().__init__()
        dims = (32, 64, 128)
        layers = [nn.Conv2d(in_channels, dims[0], 2, stride=2), LayerNorm2d(dims[0])]
        for i, d in enumerate(dims):
            if i:
                layers += [LayerNorm2d(dims[i - 1]), nn.Conv2d(dims[i - 1], d, 2, stride=2)]
            layers += [NeXtBlock(d), NeXtBlock(d)]
        self.features = nn.Sequential(*layers)
        self.norm = nn.LayerNorm(dims[-1])
        self.head = nn.Linear(dims[-1], num_classes)

    def forward(self, x):
        x = self.features(x).mean((2, 3))
        return self.head(self.norm(x))


class SE(nn.Module):
    def __init__(self, c, r=4):
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(c, c // r, 1), nn.Conv2d(c // r, c, 1)

    def forward(self, x):
        s = x.mean((2, 3), keepdim=True)
        return x * torch.sigmoid(self.fc2(F.silu(self.fc1(s))))


class SENet(nn.Module):
    def __init__(self, num_classes, in_channels=3, image_size=(32, 32)):
        super().__init__()

        def block(i, o, s):
            return nn.Sequential(nn.Conv2d(i, o, 3, s, 1, bias=False), nn.BatchNorm2d(o), nn.SiLU(), SE(o))

        self.body = nn.Sequential(block(in_channels, 32, 1), block(32, 64, 2), block(64, 128, 2), block(128, 128, 1))
        self.fc = nn.Linear(128, num_classes)

    def forward(self, x):
        return self.fc(self.body(x).mean((2, 3)))


class InstanceNormCNN(nn.Module):
    def __init__(self, num_classes, in_channels=3, image_size=(32, 32)):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(in_channels, 32, 3, padding=1),
            nn.InstanceNorm2d(32, affine=True),
            nn.LeakyReLU(0.1),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.InstanceNorm2d(64, affine=True),
            nn.LeakyReLU(0.1),
            nn.MaxPool2d(2),
            nn.Conv2d(64, 128, 3, padding=1),
            nn.InstanceNorm2d(128, affine=True),
            nn.LeakyReLU(0.1),
            nn.AdaptiveMaxPool2d(1),
            nn.Flatten(),
            nn.Linear(128, num_classes),
        )

    def forward(self, x):
        return self.net(x)


class SoftmaxCNN(nn.Module):
    """Keras habit: softmax at the end."""

    def __init__(self, num_classes, in_channels=3, image_size=(32, 32)):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(in_channels, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.LazyLinear(128),
            nn.ReLU(),
            nn.Linear(128, num_classes),
            nn.Softmax(dim=1),
        )

    def forward(self, x):
        return self.net(x)


class TupleOut(nn.Module):
    """Returns (logits, features)."""

    def __init__(self, num_classes, in_channels=3, image_size=(32, 32)):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 3, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.BatchNorm2d(64),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.head = nn.Linear(64, num_classes)

    def forward(self, x):
        f = self.features(x)
        return self.head(f), f


class BN1dMLP(nn.Module):
    def __init__(self, num_classes, in_channels=3, image_size=(32, 32)):
        super().__init__()
        n = in_channels * image_size[0] * image_size[1]
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(n, 256),
            nn.BatchNorm1d(256),
            nn.ReLU(),
            nn.Linear(256, 256),
            nn.BatchNorm1d(256),
            nn.ReLU(),
            nn.Linear(256, num_classes),
        )

    def forward(self, x):
        return self.net(x)


class Upsampled(nn.Module):
    """Resizes its input to 64 px inside the model."""

    def __init__(self, num_classes, in_channels=3, image_size=(32, 32)):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(in_channels, 16, 5, stride=2, padding=2),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3, stride=2, padding=1),
            nn.BatchNorm2d(64),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(64, num_classes),
        )

    def forward(self, x):
        return self.net(F.interpolate(x, size=(64, 64), mode="bilinear", align_corners=False))


class Mixer(nn.Module):
    def __init__(self, num_classes, in_channels=3, image_size=(32, 32), patch=4, dim=64, depth=4):
        super().__init__()
        self.patch = nn.Conv2d(in_channels, dim, patch, stride=patch)
        tokens = (image_size[0] // patch) * (image_size[1] // patch)
        self.blocks = nn.ModuleList()
        for _ in range(depth):
            self.blocks.append(
                nn.ModuleDict(
                    dict(
                        n1=nn.LayerNorm(dim),
                        tok=nn.Sequential(nn.Linear(tokens, 2 * tokens), nn.GELU(), nn.Linear(2 * tokens, tokens)),
                        n2=nn.LayerNorm(dim),
                        ch=nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim)),
                    )
                )
            )
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        for b in self.blocks:
            x = x + b["tok"](b["n1"](x).transpose(1, 2)).transpose(1, 2)
            x = x + b["ch"](b["n2"](x))
        return self.head(self.norm(x).mean(1))
