"""Example (c): a plain PyTorch training loop, and the same training converted to hasten.

`plain()` is the loop a tutorial teaches: a TensorDataset, a DataLoader, Adam, cross-entropy, an evaluation
pass. `with_hasten()` trains the same model on the same data; the lines marked `# hasten:` are the ones that
changed. What the conversion buys: the recipe's bf16, channels_last, one-cycle schedule, label smoothing,
augmentation, EMA, checkpoints with exact resume, a run folder with metrics and time-to-accuracy, and
`torchrun --nproc-per-node 2 examples/plain_loop.py` for data-parallel training, with no further change.

    python examples/plain_loop.py            # hasten
    python examples/plain_loop.py --plain    # the loop it replaces

HASTEN_EXAMPLE_SMALL=1 makes it a seconds-long run (the test suite runs it that way).
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hasten

SMALL = bool(os.environ.get("HASTEN_EXAMPLE_SMALL"))
EPOCHS = 1 if SMALL else 5


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(32, 10),
    )  # fmt: skip


def load_data() -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """Your data, as you have it: here Fashion-MNIST-like synthetic arrays, uint8 N x 28 x 28."""
    from hasten.data.datasets import synthetic_arrays

    train_x, train_y, test_x, test_y = synthetic_arrays(512 if SMALL else 4096, seed=0)
    return (train_x[:, 0], train_y), (test_x[:, 0], test_y)


def plain() -> float:
    (train_x, train_y), (test_x, test_y) = load_data()
    to_float = lambda x: torch.from_numpy(x).float().div(255).unsqueeze(1)  # noqa: E731
    train_loader = DataLoader(TensorDataset(to_float(train_x), torch.from_numpy(train_y)), batch_size=64, shuffle=True)
    test_loader = DataLoader(TensorDataset(to_float(test_x), torch.from_numpy(test_y)), batch_size=256)
    torch.manual_seed(0)
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(EPOCHS):
        model.train()
        for images, labels in train_loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(images), labels)
            loss.backward()
            optimizer.step()
    model.eval()
    correct = 0
    with torch.no_grad():
        for images, labels in test_loader:
            correct += int((model(images).argmax(1) == labels).sum())
    return correct / len(test_y)


def with_hasten(overrides: list[str]) -> float:
    (train_x, train_y), (test_x, test_y) = load_data()
    # hasten: no tensors to float, no DataLoaders: the uint8 arrays go in as they are (normalised in batches)
    # hasten: no torch.manual_seed: hasten seeds (recipe key `seed`) and then calls make_model
    # hasten: no optimizer, no loop, no evaluation pass: the recipe holds them (here fashion-fast's SGD +
    # one-cycle, bf16, label smoothing, EMA), each a key you can override
    small = ["train.epochs=1", "run.progress=false", "train.threads=1", "tricks.ema=0"] if SMALL else []
    summary = hasten.train(  # hasten: the one call
        "fashion-fast",  # hasten: the recipe
        [f"train.epochs={EPOCHS}", "train.batch_size=64", "run.dir=runs/plain-loop", *small, *overrides],
        model=make_model,  # hasten: your model (or an instance)
        data=((train_x, train_y), (test_x, test_y)),  # hasten: your data
    )
    return summary["test_accuracy"]  # hasten: the summary also has time_to_accuracy, images/s, peak memory


if __name__ == "__main__":
    arguments = sys.argv[1:]
    if "--plain" in arguments:
        print(f"plain loop: test accuracy {plain():.4f}")
    else:
        print(f"hasten: test accuracy {with_hasten(arguments):.4f}")
