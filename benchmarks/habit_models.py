"""Models with habits hasten's own models do not have, written the way users write them, to check that each
trains or is refused naming what to set (docs/results/models.md, "Models with habits of their own"; the habits'
tests: tests/run/test_model_habits.py):

    PYTHONPATH=benchmarks .venv/bin/python benchmarks/generalization.py --only letters \
        --model viewflat=habit_models:ViewFlat --model rowlstm=habit_models:RowLSTM \
        --model hardrgb=habit_models:HardRGB --model upsampler=habit_models:Upsampler \
        --model frozen=habit_models:Frozen --model inplace=habit_models:InPlaceInput \
        --model softmax=habit_models:SoftmaxEnd \
        --budgets recipe --arms default,plain --seeds 0,1,2 --jobs 1 --threads 2

Thousand and NeedsDepth are refused before training, each naming what it returned or lacks; TupleOut and DictOut
train on the logits they hold (the run says where it took them from).
"""

import torch.nn as nn
import torch.nn.functional as F


class TupleOut(nn.Module):
    """Returns (logits, features), as models with an auxiliary output do."""

    def __init__(self, num_classes=10, in_channels=1):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(in_channels, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x):
        f = self.body(x)
        return self.fc(f), f


class HardRGB(nn.Module):
    """First conv hard-coded to 3 channels, no constructor arguments."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(256, 10)
        )

    def forward(self, x):
        return self.net(x)


class ViewFlat(nn.Module):
    """conv then x.view(x.size(0), -1): breaks on a channels_last tensor."""

    def __init__(self, n_classes=10, in_channels=1):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, 8, 3, padding=1)
        self.fc = nn.LazyLinear(n_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv(x)), 2)
        return self.fc(x.view(x.size(0), -1))


class InPlaceInput(nn.Module):
    """Normalises its input in place (x -= 0.5), which corrupts a batch that is a view of the data."""

    def __init__(self, num_classes=10, in_channels=1):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(in_channels, 16, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(4),
            nn.Flatten(),
            nn.Linear(256, num_classes),
        )

    def forward(self, x):
        x.sub_(0.5)
        return self.net(x)


class Thousand(nn.Module):
    """An ImageNet-style head: 1000 outputs whatever the data has."""

    def __init__(self, in_channels=1):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(in_channels, 16, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(4),
            nn.Flatten(),
            nn.Linear(256, 1000),
        )

    def forward(self, x):
        return self.net(x)


class RowLSTM(nn.Module):
    """Reads the image's rows as a sequence."""

    def __init__(self, num_classes=10, in_channels=1, image_size=28):
        super().__init__()
        self.rnn = nn.LSTM(in_channels * image_size, 64, batch_first=True)
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x):
        b, c, h, w = x.shape
        seq = x.permute(0, 2, 1, 3).reshape(b, h, c * w)
        out, _ = self.rnn(seq)
        return self.fc(out[:, -1])


class NeedsDepth(nn.Module):
    """A required constructor argument hasten does not know."""

    def __init__(self, depth, num_classes=10, in_channels=1):
        super().__init__()
        layers = [nn.Conv2d(in_channels, 16, 3, padding=1), nn.ReLU()]
        for _ in range(depth - 1):
            layers += [nn.Conv2d(16, 16, 3, padding=1), nn.ReLU()]
        self.net = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, num_classes))

    def forward(self, x):
        return self.net(x)


class DictOut(nn.Module):
    """Returns {'logits': ...}, as Hugging Face style models do."""

    def __init__(self, num_classes=10, in_channels=1):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(in_channels, 16, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(4),
            nn.Flatten(),
            nn.Linear(256, num_classes),
        )

    def forward(self, x):
        return {"logits": self.net(x)}


class Upsampler(nn.Module):
    """Upsamples bilinearly inside (an op whose bf16 CPU kernel may be missing or slow)."""

    def __init__(self, num_classes=10, in_channels=1):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, 16, 3, padding=1)
        self.head = nn.Sequential(nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(256, num_classes))

    def forward(self, x):
        x = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)
        return self.head(self.conv(x))


class Frozen(nn.Module):
    """Part frozen (a fixed random feature layer), part trained."""

    def __init__(self, num_classes=10, in_channels=1):
        super().__init__()
        self.stem = nn.Conv2d(in_channels, 32, 3, padding=1)
        for p in self.stem.parameters():
            p.requires_grad_(False)
        self.head = nn.Sequential(nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(512, num_classes))

    def forward(self, x):
        return self.head(self.stem(x))


class SoftmaxEnd(nn.Module):
    """Ends in nn.Softmax, as Keras users write a classifier (hasten reads its outputs as probabilities)."""

    def __init__(self, num_classes=10, in_channels=1):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(in_channels, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(64, num_classes),
            nn.Softmax(dim=1),
        )

    def forward(self, x):
        return self.net(x)
