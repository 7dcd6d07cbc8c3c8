"""Five model families written after the rules, the way papers and tutorials give them, outside the repository
first and run with the rules unchanged (docs/results/models.md, "Five families from papers"): a self-normalising
CNN (SELU, AlphaDropout, LeCun-normal init, no normalisation layers), Big Transfer's ResNet-v2 in miniature
(weight-standardised convolutions, GroupNorm, pre-activation bottlenecks, a head initialised to zero), GoogLeNet's
inception modules, a batch-norm CNN with a cosine classifier (NormFace), and ShuffleNetV2's units (channel split,
depthwise convolutions, a channel shuffle by view and transpose):

    PYTHONPATH=benchmarks .venv/bin/python benchmarks/generalization.py --only letters \
        --model selu=heldout_families:SELUNet --model bit=heldout_families:BiTResNet \
        --model incep=heldout_families:InceptionMini --model cosine=heldout_families:CosineNet \
        --model shuffle=heldout_families:ShuffleMini --budgets recipe --arms default,plain --seeds 0,1,2 \
        --jobs 1 --threads 2
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class SELUNet(nn.Module):
    """Self-normalizing CNN (Klambauer et al.): SELU, AlphaDropout, LeCun-normal init, no normalisation layers."""

    def __init__(self, num_classes=10, in_channels=3):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 3, padding=1),
            nn.SELU(),
            nn.Conv2d(32, 64, 3, padding=1, stride=2),
            nn.SELU(),
            nn.AlphaDropout(0.05),
            nn.Conv2d(64, 128, 3, padding=1, stride=2),
            nn.SELU(),
            nn.AlphaDropout(0.05),
        )
        self.classifier = nn.Linear(128, num_classes)
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                fan_in = m.weight[0].numel()
                nn.init.normal_(m.weight, 0, 1 / math.sqrt(fan_in))
                nn.init.zeros_(m.bias)

    def forward(self, x):
        return self.classifier(self.features(x).mean(dim=(2, 3)))


class StdConv2d(nn.Conv2d):
    def forward(self, x):
        w = self.weight
        v, m = torch.var_mean(w, dim=[1, 2, 3], keepdim=True, unbiased=False)
        w = (w - m) / torch.sqrt(v + 1e-10)
        return F.conv2d(x, w, self.bias, self.stride, self.padding, self.dilation, self.groups)


class PreActBottleneck(nn.Module):
    def __init__(self, cin, cout, cmid, stride=1):
        super().__init__()
        self.gn1 = nn.GroupNorm(8, cin)
        self.conv1 = StdConv2d(cin, cmid, 1, bias=False)
        self.gn2 = nn.GroupNorm(8, cmid)
        self.conv2 = StdConv2d(cmid, cmid, 3, stride=stride, padding=1, bias=False)
        self.gn3 = nn.GroupNorm(8, cmid)
        self.conv3 = StdConv2d(cmid, cout, 1, bias=False)
        self.downsample = StdConv2d(cin, cout, 1, stride=stride, bias=False) if (stride != 1 or cin != cout) else None

    def forward(self, x):
        out = F.relu(self.gn1(x))
        residual = self.downsample(out) if self.downsample is not None else x
        out = self.conv1(out)
        out = self.conv2(F.relu(self.gn2(out)))
        out = self.conv3(F.relu(self.gn3(out)))
        return out + residual


class BiTResNet(nn.Module):
    """Big Transfer's ResNet-v2 in miniature: weight-standardised convs, GroupNorm, pre-activation bottlenecks."""

    def __init__(self, num_classes=10, in_chans=3, width=16):
        super().__init__()
        self.root = StdConv2d(in_chans, 4 * width, 3, padding=1, bias=False)
        self.body = nn.Sequential(
            PreActBottleneck(4 * width, 16 * width // 2, width),
            PreActBottleneck(16 * width // 2, 16 * width // 2, width),
            PreActBottleneck(16 * width // 2, 16 * width, 2 * width, stride=2),
            PreActBottleneck(16 * width, 16 * width, 2 * width, stride=2),
        )
        self.head = nn.Sequential(
            nn.GroupNorm(8, 16 * width),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1),
            nn.Conv2d(16 * width, num_classes, 1),
        )
        nn.init.zeros_(self.head[-1].weight)
        nn.init.zeros_(self.head[-1].bias)

    def forward(self, x):
        x = self.head(self.body(self.root(x)))
        return x[..., 0, 0]


class BasicConv(nn.Module):
    def __init__(self, cin, cout, **kw):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, bias=False, **kw)
        self.bn = nn.BatchNorm2d(cout, eps=0.001)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)), inplace=True)


class Inception(nn.Module):
    def __init__(self, cin, c1, c3r, c3, c5r, c5, pp):
        super().__init__()
        self.b1 = BasicConv(cin, c1, kernel_size=1)
        self.b2 = nn.Sequential(BasicConv(cin, c3r, kernel_size=1), BasicConv(c3r, c3, kernel_size=3, padding=1))
        self.b3 = nn.Sequential(
            BasicConv(cin, c5r, kernel_size=1),
            BasicConv(c5r, c5, kernel_size=3, padding=1),
            BasicConv(c5, c5, kernel_size=3, padding=1),
        )
        self.b4 = nn.Sequential(nn.MaxPool2d(3, stride=1, padding=1), BasicConv(cin, pp, kernel_size=1))

    def forward(self, x):
        return torch.cat([self.b1(x), self.b2(x), self.b3(x), self.b4(x)], 1)


class InceptionMini(nn.Module):
    """GoogLeNet in miniature: a stem, inception modules of four branches concatenated, dropout, a linear head."""

    def __init__(self, num_classes=10, in_channels=3):
        super().__init__()
        self.stem = BasicConv(in_channels, 32, kernel_size=3, padding=1)
        self.i3a = Inception(32, 16, 24, 32, 4, 8, 8)
        self.i3b = Inception(64, 32, 32, 48, 8, 24, 16)
        self.pool = nn.MaxPool2d(3, stride=2, padding=1)
        self.i4a = Inception(120, 48, 24, 52, 4, 12, 16)
        self.dropout = nn.Dropout(0.2)
        self.fc = nn.Linear(128, num_classes)

    def forward(self, x):
        x = self.pool(self.stem(x))
        x = self.pool(self.i3b(self.i3a(x)))
        x = self.i4a(x)
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.fc(self.dropout(x))


class CosineNet(nn.Module):
    """A batch-norm CNN with a cosine classifier (NormFace / CosFace style): logits = s * cos(feature, class weight)."""

    def __init__(self, num_classes=10, in_channels=3, scale=16.0):
        super().__init__()

        def block(i, o):
            return nn.Sequential(nn.Conv2d(i, o, 3, padding=1, bias=False), nn.BatchNorm2d(o), nn.ReLU(inplace=True))

        self.features = nn.Sequential(
            block(in_channels, 32),
            block(32, 32),
            nn.MaxPool2d(2),
            block(32, 64),
            block(64, 64),
            nn.MaxPool2d(2),
            block(64, 128),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.weight = nn.Parameter(torch.randn(num_classes, 128) * 0.01)
        self.scale = scale

    def forward(self, x):
        f = F.normalize(self.features(x), dim=1)
        w = F.normalize(self.weight, dim=1)
        return self.scale * f @ w.t()


def channel_shuffle(x, groups):
    b, c, h, w = x.size()
    x = x.view(b, groups, c // groups, h, w)
    x = torch.transpose(x, 1, 2).contiguous()
    return x.view(b, -1, h, w)


class ShuffleUnit(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.stride = stride
        branch = cout // 2
        if stride > 1:
            self.branch1 = nn.Sequential(
                nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False),
                nn.BatchNorm2d(cin),
                nn.Conv2d(cin, branch, 1, bias=False),
                nn.BatchNorm2d(branch),
                nn.ReLU(inplace=True),
            )
        else:
            self.branch1 = nn.Sequential()
        c2 = cin if stride > 1 else branch
        self.branch2 = nn.Sequential(
            nn.Conv2d(c2, branch, 1, bias=False),
            nn.BatchNorm2d(branch),
            nn.ReLU(inplace=True),
            nn.Conv2d(branch, branch, 3, stride, 1, groups=branch, bias=False),
            nn.BatchNorm2d(branch),
            nn.Conv2d(branch, branch, 1, bias=False),
            nn.BatchNorm2d(branch),
            nn.ReLU(inplace=True),
        )

    def forward(self, x):
        if self.stride == 1:
            x1, x2 = x.chunk(2, dim=1)
            out = torch.cat((x1, self.branch2(x2)), dim=1)
        else:
            out = torch.cat((self.branch1(x), self.branch2(x)), dim=1)
        return channel_shuffle(out, 2)


class ShuffleMini(nn.Module):
    """ShuffleNetV2 in miniature: channel split, depthwise convs, channel shuffle by view/transpose."""

    def __init__(self, num_classes=10, in_channels=3):
        super().__init__()
        self.conv1 = nn.Sequential(
            nn.Conv2d(in_channels, 24, 3, 1, 1, bias=False), nn.BatchNorm2d(24), nn.ReLU(inplace=True)
        )
        stages = []
        cin = 24
        for cout, repeats in ((48, 2), (96, 3), (192, 2)):
            for i in range(repeats):
                stages.append(ShuffleUnit(cin, cout, 2 if i == 0 else 1))
                cin = cout
        self.stages = nn.Sequential(*stages)
        self.conv5 = nn.Sequential(nn.Conv2d(cin, 256, 1, bias=False), nn.BatchNorm2d(256), nn.ReLU(inplace=True))
        self.fc = nn.Linear(256, num_classes)

    def forward(self, x):
        x = self.conv5(self.stages(self.conv1(x)))
        return self.fc(x.mean([2, 3]))
