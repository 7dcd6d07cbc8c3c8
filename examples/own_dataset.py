"""Example (b): a torchvision-style Dataset of your own, streamed through DataLoader workers.

`Shapes` is written the way torchvision's datasets are (`__getitem__` returns a PIL image and an int target,
an optional `transform`, `classes` and `targets`), without depending on torchvision: it draws each image
when asked, so the data never has to fit in memory. hasten fetches whole batches of each epoch's seeded order
in worker processes, shards them per rank, and augments and normalises them as on the in-memory path.

    python examples/own_dataset.py                    # (train, test, class names)
    python examples/own_dataset.py data.workers=4 train.epochs=5

HASTEN_EXAMPLE_SMALL=1 makes it a seconds-long run (the test suite runs it that way).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import numpy as np
from PIL import Image, ImageDraw
from torch import Tensor, nn

import hasten

SMALL = bool(os.environ.get("HASTEN_EXAMPLE_SMALL"))


class Shapes:
    """Circles, squares and triangles of random size, place and grey level on a noisy 24x24 background."""

    classes = ["circle", "square", "triangle"]

    def __init__(self, train: bool = True, size: int = 3000, transform: Callable | None = None, seed: int = 0):
        self.train, self.size, self.transform = train, size, transform
        self.seed = seed * 2 + (0 if train else 1)  # train and test draw from different streams
        self.targets = [i % len(self.classes) for i in range(size)]

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        rng = np.random.default_rng([self.seed, index])
        target = self.targets[index]
        image = Image.fromarray(rng.integers(0, 60, (24, 24), dtype=np.uint8))
        r = int(rng.integers(4, 8))
        cx, cy = (int(v) for v in rng.integers(r, 24 - r, 2))
        shade = int(rng.integers(150, 256))
        draw = ImageDraw.Draw(image)
        if target == 0:
            draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=shade)
        elif target == 1:
            draw.rectangle((cx - r, cy - r, cx + r, cy + r), fill=shade)
        else:
            draw.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=shade)
        if self.transform is not None:
            image = self.transform(image)
        return image, target


class ShapeNet(nn.Module):
    def __init__(self, num_classes: int, in_channels: int):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(in_channels, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
            nn.Flatten(), nn.Linear(32, num_classes),
        )  # fmt: skip

    def forward(self, x: Tensor) -> Tensor:
        return self.body(x)


def main(overrides: list[str]) -> dict:
    n = 240 if SMALL else 3000
    train, test = Shapes(train=True, size=n), Shapes(train=False, size=n // 4)
    small = ["train.epochs=1", "run.progress=false", "train.threads=1", "tricks.ema=0", "data.workers=1"]
    small = small if SMALL else []
    settings = ["data.augment.translate=2", "train.batch_size=64", "run.dir=runs/own-dataset"]
    summary = hasten.train(
        "fashion-fast", [*settings, *small, *overrides], model=ShapeNet, data=(train, test, Shapes.classes)
    )
    print(f"test accuracy {summary['test_accuracy']:.4f} on {summary['evaluated_on']}; run folder {summary['run_dir']}")
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
