"""In-memory batches: the whole dataset is one uint8 tensor, batches are index slices, augmentation runs
on whole batches as tensor ops.

This is what the fast MNIST and CIFAR records do (Page's ResNet-9, airbench): no per-sample Python, no
DataLoader workers, no collate. The shuffle of epoch `e` is a permutation drawn from the seed's stream for
epoch `e` (hasten/data/seeds.py), the same on every rank; each rank takes its strided share, so every sample is
seen once per epoch across ranks. Augmentation draws from a generator seeded by (seed, epoch, rank, batch), so
any batch can be recomputed exactly, which is what exact resume and rank-distinct streams need.

Alternating flips (`Augment(flip="alternate")`, airbench, Keller Jordan 2024): in epoch 0 each image is mirrored
with probability 1/2, a per-image mask drawn once from the seed alone (the same on every rank, whatever the
batch or shard an image lands in); in epoch e it is mirrored exactly when the mask XOR (e odd) says so, so every
two consecutive epochs show each image both ways. The mask is a function of (seed, image index, epoch): a resumed
run and every rank recompute it exactly.

What happens to the samples left over when the set does not divide by the ranks (`remainder`): "pad" repeats
the first ones so every rank gets the same count (DistributedSampler's default), "drop" leaves them out of the
epoch (DistributedSampler's drop_last), "split" gives each sample to exactly one rank, so shards differ by one
(evaluation: no collective runs per batch there, and every test image counts exactly once).

A training loader (`shuffle=True`) never yields a batch of one image: batch norm cannot normalise a single
example in training mode, and a set of 1,425 images in batches of 16 would otherwise end each epoch with one. Such
an image is merged into the batch before it (a last batch of B + 1), so every image is still seen every epoch and
the epoch has one step fewer; a shard of a single image has no batch at all (the run refuses it). Evaluation
loaders keep their batches as they fall.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from hasten.data.seeds import FIRST_EPOCH_FLIPS, batch_seed, stream


def layout(channels_last: bool) -> torch.memory_format:
    return torch.channels_last if channels_last else torch.contiguous_format


def in_layout(images: Tensor, channels_last: bool) -> Tensor:
    """A copy of `images` (N, C, H, W) with the strides of the layout asked for. `.contiguous(memory_format=...)`
    is no copy when the tensor counts as being in that layout already, and a one-channel batch counts as being in
    both (a size-1 dimension's stride is not checked), while a convolution picks its kernels by the strides."""
    return images.clone(memory_format=layout(channels_last))


def flip(images: Tensor, mask: Tensor) -> Tensor:
    """`images` (N, C, H, W) with the rows where `mask` is true mirrored left-right."""
    return torch.where(mask[:, None, None, None], images.flip(3), images)


def translate(images: Tensor, shifts: Tensor, pad: int) -> Tensor:
    """Each image shifted by its (dy, dx) in `shifts` (N, 2), values in [-pad, pad], zero-filled at the edges."""
    n, _, h, w = images.shape
    padded = torch.nn.functional.pad(images, (pad, pad, pad, pad))
    rows = (pad - shifts[:, 0])[:, None] + torch.arange(h, device=images.device)  # (N, H)
    cols = (pad - shifts[:, 1])[:, None] + torch.arange(w, device=images.device)  # (N, W)
    batch = torch.arange(n, device=images.device)[:, None, None]
    # advanced indexing around a slice puts the indexed dims first: (N, H, W, C)
    return padded.permute(0, 2, 3, 1)[batch, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)


def first_epoch_flips(n: int, seed: int) -> Tensor:
    """Which of `n` images alternating flips mirror in epoch 0: each with probability 1/2, from `seed` alone."""
    return torch.rand(n, generator=stream(seed, FIRST_EPOCH_FLIPS)) < 0.5


def alternating_flips(first: Tensor, epoch: int) -> Tensor:
    """The flip mask of `epoch` given each image's epoch-0 mask `first`: the same in even epochs, inverted in odd
    ones, so every two consecutive epochs show each image once mirrored and once not."""
    return first ^ bool(epoch % 2)


@dataclass(frozen=True)
class Augment:
    """Batched augmentation: horizontal flip (True: random per image and batch; "alternate": the mask `flips`
    the loader passes, from `alternating_flips`) and random translation by up to `translate` pixels."""

    flip: bool | str = False
    translate: int = 0

    def __call__(self, images: Tensor, generator: torch.Generator, flips: Tensor | None = None) -> Tensor:
        n = images.shape[0]
        if self.flip == "alternate":
            if flips is None:
                raise ValueError("alternating flips need the batch's flip mask (the loader computes it)")
            images = flip(images, flips.to(images.device))
        elif self.flip:
            images = flip(images, torch.rand(n, generator=generator, device=generator.device) < 0.5)
        if self.translate:
            shifts = torch.randint(
                -self.translate, self.translate + 1, (n, 2), generator=generator, device=generator.device
            )
            images = translate(images, shifts, self.translate)
        return images


def channel_stats(images: Tensor) -> tuple[Tensor, Tensor]:
    """Per-channel mean and std of `images` (N, C, H, W) divided by 255 (uint8 pixels: in [0, 1] units). uint8
    images are counted per level (a 256-bin histogram a channel: exact, and ~10x faster over Fashion-MNIST's 47
    million pixels than summing them, which every run's start-up pays); others are summed in chunks."""
    if images.dtype == torch.uint8:
        return _level_stats(images)
    total = torch.zeros(images.shape[1], dtype=torch.float64)
    total_sq = torch.zeros_like(total)
    for chunk in images.split(8192):
        values = chunk.to(torch.float64).div_(255).transpose(0, 1).flatten(1)
        total += values.sum(1)
        total_sq += values.square().sum(1)
    count = images.numel() // images.shape[1]
    mean = total / count
    std = (total_sq / count - mean.square()).clamp_min(1e-12).sqrt()
    return mean.float(), std.float()


def _level_stats(images: Tensor) -> tuple[Tensor, Tensor]:
    """`channel_stats` of uint8 images from each channel's count of every pixel level."""
    levels = torch.arange(256, dtype=torch.float64, device=images.device) / 255
    means, stds = [], []
    for channel in range(images.shape[1]):
        counts = torch.bincount(images[:, channel].reshape(-1), minlength=256).to(torch.float64)
        mean = (counts * levels).sum() / counts.sum()
        means.append(mean)
        stds.append(((counts * (levels - mean).square()).sum() / counts.sum()).clamp_min(1e-12).sqrt())
    return torch.stack(means).float().cpu(), torch.stack(stds).float().cpu()


REMAINDERS = ("pad", "drop", "split")


def shard_size(n: int, rank: int, world_size: int, remainder: str) -> int:
    """How many of `n` samples rank `rank` takes per epoch under the `remainder` rule."""
    if remainder == "pad":
        return -(-n // world_size)
    if remainder == "drop":
        return n // world_size
    if remainder == "split":
        return len(range(rank, n, world_size))
    raise ValueError(f"remainder must be one of {', '.join(REMAINDERS)}, got {remainder!r}")


def shard_indices(n: int, epoch: int, seed: int, shuffle: bool, rank: int, world_size: int, remainder: str) -> Tensor:
    """Rank `rank`'s sample indices of `n` for `epoch`: a permutation drawn from (seed, epoch), the same on every
    rank, padded by wrapping around or cut per `remainder` (as DistributedSampler does), then strided by rank.
    Shared by every loader, so the same seed gives the same batches whichever path the data takes."""
    if shuffle:
        order = torch.randperm(n, generator=stream(seed, epoch))  # the epoch is the purpose
    else:
        order = torch.arange(n)
    if remainder == "split":
        return order[rank::world_size]
    total = shard_size(n, rank, world_size, remainder) * world_size
    if total > n:
        order = torch.cat([order.repeat(total // n), order[: total % n]])  # wraps more than once for tiny sets
    return order[rank:total:world_size]


class ShardedEpochs:
    """The part both loaders share: the batching, sharding and normalisation settings, each epoch's seeded
    order, this rank's shard of it, its batch count, and the normalisation of a uint8 batch. Subclasses provide
    `num_samples` and `batches(start)`. Its `__init__` is the one list of the loaders' shared options and their
    defaults: each loader takes its own source, then passes every other argument on here."""

    def __init__(
        self,
        batch_size: int,
        *,
        mean: Tensor,
        std: Tensor,
        shuffle: bool = False,
        seed: int = 0,
        augment: Augment | None = None,
        drop_last: bool = False,
        rank: int = 0,
        world_size: int = 1,
        remainder: str = "pad",  # "pad", "drop" or "split" (module docstring)
        channels_last: bool = False,
        device: torch.device | str = "cpu",
    ):
        if remainder not in REMAINDERS:
            raise ValueError(f"remainder must be one of {', '.join(REMAINDERS)}, got {remainder!r}")
        self.batch_size, self.shuffle, self.seed, self.augment = batch_size, shuffle, seed, augment
        self.drop_last, self.rank, self.world_size, self.remainder = drop_last, rank, world_size, remainder
        self.channels_last, self.device = channels_last, torch.device(device)
        self.mean = mean.to(self.device).view(1, -1, 1, 1)
        self.std = std.to(self.device).view(1, -1, 1, 1)
        self.epoch = 0
        self._first_flips: Tensor | None = None  # alternating flips: each image's epoch-0 mask, made when needed

    def batches(self, start: int = 0) -> Iterator[tuple[Tensor, Tensor]]:
        raise NotImplementedError

    def _generator(self, epoch: int, batch: int) -> torch.Generator:
        """The augmentation stream of one batch: from (seed, epoch, rank, batch), so any batch can be redone."""
        return torch.Generator(device=self.device).manual_seed(batch_seed(self.seed, epoch, self.rank, batch))

    def augmented(self, images: Tensor, indices: Tensor, batch: int) -> Tensor:
        """uint8 `images`, the samples `indices` of batch `batch` of the current epoch, augmented (as they are
        when there is no augmentation)."""
        if self.augment is None:
            return images
        flips = None
        if self.augment.flip == "alternate":
            if self._first_flips is None:
                self._first_flips = first_epoch_flips(self.num_samples, self.seed).to(self.device)
            flips = alternating_flips(self._first_flips[indices.to(self.device)], self.epoch)
        return self.augment(images, self._generator(self.epoch, batch), flips)

    def normalise(self, images: Tensor) -> Tensor:
        """uint8 `images` as float, scaled and normalised, in the loader's memory layout. The layout is set by the
        float copy itself (`memory_format`), not by `.contiguous()`: that keeps the strides of a one-channel batch
        as they are (a size-1 dimension counts as contiguous either way), and a convolution reads its layout from
        the strides, so a translated batch (made channels-last by `translate`) would train channels-last in a
        contiguous run and evaluate contiguous: on a 2-core AVX2 EPYC, fashion-fast then evaluated at half the
        speed its training suggested, and the start-up probe timed one layout twice."""
        x = images.to(torch.float32, memory_format=layout(self.channels_last))
        return x.div_(255).sub_(self.mean).div_(self.std)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        return self.batches()

    @property
    def num_samples(self) -> int:
        raise NotImplementedError

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    @property
    def shard_size(self) -> int:
        return shard_size(self.num_samples, self.rank, self.world_size, self.remainder)

    def __len__(self) -> int:
        full, rest = divmod(self.shard_size, self.batch_size)
        if self.shuffle and rest == 1 and not self.drop_last:
            return full  # the single image joins the last full batch (module docstring)
        return full + (1 if rest and not self.drop_last else 0)

    def batch_span(self, batch: int) -> tuple[int, int]:
        """[start, stop) of batch `batch` within this rank's order of the epoch: the last batch runs to the end of
        the shard (short, or one longer when a single image was merged into it), unless `drop_last`."""
        start, stop = batch * self.batch_size, (batch + 1) * self.batch_size
        if batch == len(self) - 1 and not self.drop_last:
            stop = self.shard_size
        return start, stop

    def indices(self, epoch: int) -> Tensor:
        """This rank's sample indices for `epoch`, in the order its batches take them."""
        n = self.num_samples
        return shard_indices(n, epoch, self.seed, self.shuffle, self.rank, self.world_size, self.remainder)


class InMemoryLoader(ShardedEpochs):
    """Batches of (normalised float images, int64 labels) sliced from tensors held in memory.

    `drop_last` drops the final short batch of each rank's share; `remainder` says what happens to the samples
    that do not divide by the ranks (module docstring). `batch_size` and `options`: those of `ShardedEpochs`.
    """

    def __init__(self, images: Tensor, labels: Tensor, batch_size: int, **options: Any):
        if images.dtype != torch.uint8 or images.dim() != 4:
            raise ValueError(f"images must be uint8 (N, C, H, W), got {images.dtype} {tuple(images.shape)}")
        if len(images) != len(labels):
            raise ValueError(f"{len(images)} images but {len(labels)} labels")
        super().__init__(batch_size, **options)
        self.images, self.labels = images.to(self.device), labels.to(self.device)

    @property
    def num_samples(self) -> int:
        return len(self.images)

    def batches(self, start: int = 0) -> Iterator[tuple[Tensor, Tensor]]:
        """The batches of the current epoch from batch index `start` on (a resumed run starts mid-epoch)."""
        order = self.indices(self.epoch).to(self.device)
        for b in range(start, len(self)):
            first, stop = self.batch_span(b)
            idx = order[first:stop]
            # index_select: the same rows as images[idx], gathered in a tenth of the time (64 of 3x96x96: 0.57 ms
            # against 4.9 ms on a Zen 4)
            yield self.normalise(self.augmented(self.images.index_select(0, idx), idx, b)), self.labels[idx]
