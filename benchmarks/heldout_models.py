"""Models written after the default's rules were fixed, the way users write them, to check the rules on models
none of them was tuned with (docs/results/models.md, "Three models written after the rules", "Two more",
"Three with batch norm" and "Five from tutorials and papers"):

    PYTHONPATH=benchmarks .venv/bin/python benchmarks/generalization.py --only digits,letters,fashion-1000 \
        --model lenet=heldout_models:LeNet5 --model convnext=heldout_models:MiniConvNeXt \
        --model instnet=heldout_models:InstanceNet --budgets recipe --arms default,plain --seeds 0,1,2
    PYTHONPATH=benchmarks .venv/bin/python benchmarks/generalization.py --only digits,letters \
        --model mixer=heldout_models:MixerLite --model squeeze=heldout_models:SqueezeLike \
        --budgets recipe --arms default,plain --seeds 0,1,2 --jobs 1 --threads 2
    PYTHONPATH=benchmarks .venv/bin/python benchmarks/generalization.py --only letters \
        --model eff=heldout_models:TinyEfficientNet --model dense=heldout_models:TinyDenseNet \
        --model vgglazy=heldout_models:VGGLazy --budgets recipe --arms default,plain --seeds 0 --jobs 1 --threads 2
    PYTHONPATH=benchmarks .venv/bin/python benchmarks/generalization.py --only letters,fashion-1000 \
        --model keras=heldout_models:KerasCNN --model allconv=heldout_models:AllConvNet \
        --model convmixer=heldout_models:ConvMixer --model kuang=heldout_models:KuangResNet \
        --model bnhead=heldout_models:BNHeadCNN --budgets recipe --arms default,plain --seeds 0,1,2 --jobs 1 --threads 2

MiniConvNeXt and LayerScaleViT have layer scales (docs/defaults.md, "Layer scales"), with and without their rule:

    PYTHONPATH=benchmarks .venv/bin/python benchmarks/generalization.py --only letters,fashion-1000 \
        --model lsvit=heldout_models:LayerScaleViT --budgets recipe --arms default --seeds 0,1,2 optim.layer_scale_lr=1
"""

import torch
import torch.nn.functional as F
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


class MixerLite(nn.Module):
    """An MLP-Mixer-style net: patches, token-mixing and channel-mixing MLPs with LayerNorm."""

    def __init__(self, num_classes=10, in_channels=1, image_size=32, patch=4, dim=64):
        super().__init__()
        h, w = image_size if isinstance(image_size, tuple) else (image_size, image_size)
        self.patch = nn.Conv2d(in_channels, dim, patch, stride=patch)
        tokens = (h // patch) * (w // patch)
        self.blocks = nn.ModuleList()
        for _ in range(3):
            self.blocks.append(
                nn.ModuleDict(
                    {
                        "n1": nn.LayerNorm(dim),
                        "tok": nn.Sequential(nn.Linear(tokens, 2 * tokens), nn.GELU(), nn.Linear(2 * tokens, tokens)),
                        "n2": nn.LayerNorm(dim),
                        "ch": nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim)),
                    }
                )
            )
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)  # (N, tokens, dim)
        for b in self.blocks:
            x = x + b["tok"](b["n1"](x).transpose(1, 2)).transpose(1, 2)
            x = x + b["ch"](b["n2"](x))
        return self.head(self.norm(x).mean(1))


class SqueezeLike(nn.Module):
    """Fire modules, a 1x1 conv classifier and global pooling, as SqueezeNet ends."""

    def __init__(self, num_classes=10, in_channels=1):
        super().__init__()

        def fire(cin, s, e):
            return nn.Sequential(
                nn.Conv2d(cin, s, 1), nn.ReLU(inplace=True), nn.Conv2d(s, e, 3, padding=1), nn.ReLU(inplace=True)
            )

        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            fire(32, 16, 64),
            fire(64, 16, 64),
            nn.MaxPool2d(2),
            fire(64, 32, 128),
        )
        self.classifier = nn.Sequential(
            nn.Dropout(0.5), nn.Conv2d(128, num_classes, 1), nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1)
        )

    def forward(self, x):
        return torch.flatten(self.classifier(self.features(x)), 1)


class SE(nn.Module):
    def __init__(self, c, r=4):
        super().__init__()
        self.fc1 = nn.Conv2d(c, max(1, c // r), 1)
        self.fc2 = nn.Conv2d(max(1, c // r), c, 1)

    def forward(self, x):
        s = F.adaptive_avg_pool2d(x, 1)
        return x * torch.sigmoid(self.fc2(F.silu(self.fc1(s))))


class MBConv(nn.Module):
    def __init__(self, cin, cout, stride, expand=4):
        super().__init__()
        mid = cin * expand
        self.use_res = stride == 1 and cin == cout
        self.block = nn.Sequential(
            nn.Conv2d(cin, mid, 1, bias=False),
            nn.BatchNorm2d(mid),
            nn.SiLU(),
            nn.Conv2d(mid, mid, 3, stride, 1, groups=mid, bias=False),
            nn.BatchNorm2d(mid),
            nn.SiLU(),
            SE(mid),
            nn.Conv2d(mid, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        )

    def forward(self, x):
        out = self.block(x)
        return x + out if self.use_res else out


class TinyEfficientNet(nn.Module):
    def __init__(self, num_classes=10, in_channels=3):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.SiLU())
        self.blocks = nn.Sequential(MBConv(16, 24, 2), MBConv(24, 24, 1), MBConv(24, 40, 2), MBConv(40, 40, 1))
        self.head = nn.Sequential(
            nn.Conv2d(40, 128, 1, bias=False),
            nn.BatchNorm2d(128),
            nn.SiLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Dropout(0.2),
            nn.Linear(128, num_classes),
        )

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)))


class DenseLayer(nn.Module):
    def __init__(self, cin, growth):
        super().__init__()
        self.bn = nn.BatchNorm2d(cin)
        self.conv = nn.Conv2d(cin, growth, 3, padding=1, bias=False)

    def forward(self, x):
        return torch.cat([x, self.conv(F.relu(self.bn(x)))], 1)


class TinyDenseNet(nn.Module):
    def __init__(self, num_classes=10, in_channels=3, growth=12):
        super().__init__()
        c = 2 * growth
        layers = [nn.Conv2d(in_channels, c, 3, padding=1, bias=False)]
        for i in range(3):
            for _ in range(4):
                layers.append(DenseLayer(c, growth))
                c += growth
            if i < 2:
                layers += [nn.BatchNorm2d(c), nn.ReLU(), nn.Conv2d(c, c // 2, 1, bias=False), nn.AvgPool2d(2)]
                c //= 2
        layers += [nn.BatchNorm2d(c), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(c, num_classes)

    def forward(self, x):
        return self.classifier(self.features(x))


class VGGLazy(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()

        def block(cin, cout):
            return nn.Sequential(
                nn.Conv2d(cin, cout, 3, padding=1),
                nn.BatchNorm2d(cout),
                nn.ReLU(inplace=True),
                nn.Conv2d(cout, cout, 3, padding=1),
                nn.BatchNorm2d(cout),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(2),
            )

        self.features = nn.Sequential(nn.LazyConv2d(32, 3, padding=1), nn.ReLU(), block(32, 64), block(64, 128))
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.LazyLinear(256), nn.ReLU(inplace=True), nn.Dropout(0.5), nn.Linear(256, num_classes)
        )

    def forward(self, x):
        return self.classifier(self.features(x))


class KerasCNN(nn.Module):
    """pytorch/examples' MNIST net, widened a little: log_softmax at the end (made for nll_loss)."""

    def __init__(self, num_classes=10, in_channels=1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.LazyLinear(128)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return F.log_softmax(self.fc2(x), dim=1)


class AllConvNet(nn.Module):
    """Springenberg et al.'s all-convolutional net, small: strided convs for pooling, no normalisation."""

    def __init__(self, num_classes=10, in_channels=1):
        super().__init__()
        self.net = nn.Sequential(
            nn.Dropout(0.2),
            nn.Conv2d(in_channels, 48, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(48, 48, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(48, 48, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Dropout(0.5),
            nn.Conv2d(48, 96, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(96, 96, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(96, 96, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Dropout(0.5),
            nn.Conv2d(96, 96, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(96, 96, 1),
            nn.ReLU(),
            nn.Conv2d(96, num_classes, 1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )

    def forward(self, x):
        return self.net(x)


class Residual(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x) + x


class ConvMixer(nn.Module):
    """ConvMixer (Trockman & Kolter, "Patches Are All You Need?"), dim 128, depth 4."""

    def __init__(self, num_classes=10, in_channels=1, dim=128, depth=4, kernel_size=5, patch_size=2):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(in_channels, dim, kernel_size=patch_size, stride=patch_size),
            nn.GELU(),
            nn.BatchNorm2d(dim),
            *[
                nn.Sequential(
                    Residual(
                        nn.Sequential(
                            nn.Conv2d(dim, dim, kernel_size, groups=dim, padding="same"), nn.GELU(), nn.BatchNorm2d(dim)
                        )
                    ),
                    nn.Conv2d(dim, dim, kernel_size=1),
                    nn.GELU(),
                    nn.BatchNorm2d(dim),
                )
                for _ in range(depth)
            ],
            nn.AdaptiveAvgPool2d((1, 1)),
            nn.Flatten(),
            nn.Linear(dim, num_classes),
        )

    def forward(self, x):
        return self.net(x)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_planes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(nn.Conv2d(in_planes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class KuangResNet(nn.Module):
    """kuangliu/pytorch-cifar's ResNet, one block a stage, width 32."""

    def __init__(self, num_classes=10, in_channels=1):
        super().__init__()
        self.in_planes = 32
        self.conv1 = nn.Conv2d(in_channels, 32, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(32)
        self.layer1 = self._make_layer(32, 1, 1)
        self.layer2 = self._make_layer(64, 1, 2)
        self.layer3 = self._make_layer(128, 1, 2)
        self.layer4 = self._make_layer(256, 1, 2)
        self.linear = nn.Linear(256, num_classes)

    def _make_layer(self, planes, num_blocks, stride):
        layers = []
        for s in [stride] + [1] * (num_blocks - 1):
            layers.append(BasicBlock(self.in_planes, planes, s))
            self.in_planes = planes
        return nn.Sequential(*layers)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        out = F.adaptive_avg_pool2d(out, 1)
        return self.linear(out.flatten(1))


class BNHeadCNN(nn.Module):
    """Conv blocks with ELU, a BatchNorm1d head with dropout, kaiming(fan_out) init."""

    def __init__(self, num_classes=10, in_channels=1):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 5, padding=2),
            nn.ELU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ELU(),
            nn.MaxPool2d(2),
            nn.Conv2d(64, 64, 3, padding=1),
            nn.ELU(),
            nn.AdaptiveMaxPool2d(4),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(64 * 16, 256),
            nn.BatchNorm1d(256),
            nn.ELU(),
            nn.Dropout(0.4),
            nn.Linear(256, num_classes),
        )
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        return self.classifier(self.features(x))


class LayerScale(nn.Module):
    """timm's LayerScale: a learnt per-channel factor on a residual branch, from `init_values`."""

    def __init__(self, dim, init_values=1e-5):
        super().__init__()
        self.gamma = nn.Parameter(init_values * torch.ones(dim))

    def forward(self, x):
        return x * self.gamma


class CaiTBlock(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ls1 = LayerScale(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.ls2 = LayerScale(dim)

    def forward(self, x):
        y = self.norm1(x)
        x = x + self.ls1(self.attn(y, y, y, need_weights=False)[0])
        return x + self.ls2(self.mlp(self.norm2(x)))


class LayerScaleViT(nn.Module):
    """A small DeiT-III / CaiT-style vision transformer: patches, learnt positions, pre-norm blocks whose branches
    are scaled by LayerScale from 1e-5, mean-pooled tokens. Written after optim.layer_scale_lr's factor was chosen
    on MiniConvNeXt, to check it on a second model with layer scales."""

    def __init__(self, num_classes=10, in_channels=3, image_size=32, patch=4, dim=64, depth=4, heads=4):
        super().__init__()
        side = image_size[0] if isinstance(image_size, tuple) else image_size
        self.patch = nn.Conv2d(in_channels, dim, patch, stride=patch)
        self.pos = nn.Parameter(torch.randn(1, (side // patch) ** 2, dim) * 0.02)
        self.blocks = nn.Sequential(*[CaiTBlock(dim, heads) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2) + self.pos
        return self.head(self.norm(self.blocks(x)).mean(1))
