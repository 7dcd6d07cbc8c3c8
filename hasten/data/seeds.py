"""The run's random streams, each derived from the run's `seed` for one purpose: every derivation is here, side by
side, so two purposes cannot come to share a stream unseen.

Each purpose draws from a generator of its own, never from the global one: a draw for one purpose does not shift
another's (label noise leaves every epoch's shuffle as it was), and a resumed run or another rank recomputes any
stream from the seed alone.

- `stream(seed, purpose)`: a torch generator seeded `seed * STRIDE + purpose` (`stream_seed`), distinct for every
  (seed, purpose) with 0 <= purpose < STRIDE. The purposes: each epoch's shuffle (the epoch, 0, 1, ...), the first
  epoch's alternating flips (FIRST_EPOCH_FLIPS), label noise (LABEL_NOISE), and the per-rank global seed of a
  data-parallel run (the rank; hasten/run/assemble.py). Epochs and ranks share the small numbers, and the shuffle
  of epoch LABEL_NOISE is label noise's stream: the seeds runs were made with, kept so that they repeat.
- `batch_seed(seed, epoch, rank, batch)`: the augmentation of one batch.
- `numpy_stream(seed, *keys)`: a numpy generator from the sequence (seed, *keys): a technique's per-rank stream,
  keyed by the rank and, where several techniques draw, the technique's order.
- `loader_generator()`: what a torch DataLoader draws its workers' base seed from, in place of the global
  generator (hasten's loader workers only decode files: nothing of theirs is random).
"""

from __future__ import annotations

import numpy as np
import torch

STRIDE = 1_000_003  # a prime: stream_seed(s, p) = s * STRIDE + p
FIRST_EPOCH_FLIPS = 0xF11B  # the images alternating flips mirror in epoch 0 (hasten/data/loader.py)
LABEL_NOISE = 0x1AB  # which training labels label noise moves, and to which class (hasten/data/transforms.py)


def stream_seed(seed: int, purpose: int) -> int:
    """The seed of `purpose`'s stream of the run seeded `seed`."""
    return seed * STRIDE + purpose


def stream(seed: int, purpose: int) -> torch.Generator:
    """A CPU generator for `purpose`'s stream of the run seeded `seed` (module docstring)."""
    return torch.Generator().manual_seed(stream_seed(seed, purpose))


def batch_seed(seed: int, epoch: int, rank: int, batch: int) -> int:
    """The seed of one batch's augmentation, from (seed, epoch, rank, batch), so any batch can be redone: a
    non-negative 63-bit number."""
    return hash((seed, epoch, rank, batch)) & 0x7FFF_FFFF_FFFF_FFFF


def numpy_stream(seed: int, *keys: int) -> np.random.Generator:
    """A numpy generator for the stream keyed (`seed`, *`keys`): a technique's draws on one rank."""
    return np.random.default_rng([seed, *keys])


def loader_generator() -> torch.Generator:
    """The generator every DataLoader of hasten's is given. Without one, making a DataLoader's iterator draws its
    workers' base seed from the global generator, whose stream then initialises the model and drives dropout: a
    run's first weights would depend on whether its images were decoded in worker processes (data.workers, whose
    default follows the CPU's cores), and a streamed run's dropout on when its epochs' iterators were made."""
    return torch.Generator().manual_seed(0)
