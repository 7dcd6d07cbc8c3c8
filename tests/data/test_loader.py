"""In-memory loader: seeded order, every sample once per epoch, batched augmentation keeps labels and shapes."""

from __future__ import annotations

import pytest
import torch

from hasten.data.loader import Augment, InMemoryLoader, channel_stats, flip, in_layout, translate


def make_loader(n=100, batch=16, **kwargs) -> InMemoryLoader:
    images = torch.arange(n, dtype=torch.uint8).view(n, 1, 1, 1).expand(n, 1, 6, 6).contiguous()
    labels = torch.arange(n)
    return InMemoryLoader(images, labels, batch, mean=torch.zeros(1), std=torch.ones(1) / 255, **kwargs)


def test_same_seed_same_batches_other_seed_other_order():
    first = [y for _, y in make_loader(shuffle=True, seed=3)]
    again = [y for _, y in make_loader(shuffle=True, seed=3)]
    other = [y for _, y in make_loader(shuffle=True, seed=4)]
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not torch.equal(torch.cat(first), torch.cat(other))


def test_every_sample_once_per_epoch_and_epochs_differ():
    loader = make_loader(shuffle=True, seed=0)
    orders = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        labels = torch.cat([y for _, y in loader])
        assert sorted(labels.tolist()) == list(range(100))
        orders.append(labels)
    assert not torch.equal(*orders)
    assert len(loader) == 7  # 6 full batches of 16 and one of 4


def test_drop_last_drops_the_short_batch():
    loader = make_loader(drop_last=True)
    assert len(loader) == 6 and sum(len(y) for _, y in loader) == 96


def test_images_stay_paired_with_labels_and_normalised():
    loader = make_loader(shuffle=True)
    for x, y in loader:
        # each image is filled with its own index; mean 0, std 1/255 turns uint8 v into float v
        assert torch.allclose(x[:, 0, 0, 0], y.float(), atol=1e-4)


def test_resume_mid_epoch_gives_the_remaining_batches():
    loader = make_loader(shuffle=True, seed=1, augment=Augment(flip=True, translate=1))
    loader.set_epoch(2)
    whole = list(loader)
    rest = list(loader.batches(start=3))
    assert len(rest) == len(whole) - 3
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(whole[3:], rest, strict=True))


def test_ranks_partition_the_epoch():
    shards = [torch.cat([y for _, y in make_loader(shuffle=True, seed=5, rank=r, world_size=3)]) for r in range(3)]
    assert len({len(s) for s in shards}) == 1  # padded to equal length
    union = torch.cat(shards)
    assert set(union.tolist()) == set(range(100)) and len(union) == 102  # 2 wrapped-around samples
    dropped = [torch.cat([y for _, y in make_loader(rank=r, world_size=3, remainder="drop")]) for r in range(3)]
    assert sorted(torch.cat(dropped).tolist()) == list(range(99))


@pytest.mark.parametrize("world", [2, 3, 7])
def test_remainder_rules_over_a_shuffled_epoch(world):
    """pad: equal shards, every sample at least once; drop: equal shards, each sample at most once, fewer than
    `world` left out; split: every sample exactly once, shard sizes differ by at most one."""

    def shards(remainder):
        loaders = [
            make_loader(shuffle=True, seed=3, rank=r, world_size=world, remainder=remainder) for r in range(world)
        ]
        for loader in loaders:
            loader.set_epoch(4)
        return [torch.cat([y for _, y in loader]).tolist() for loader in loaders]

    padded, dropped, split = shards("pad"), shards("drop"), shards("split")
    assert len({len(s) for s in padded}) == 1 and set(sum(padded, [])) == set(range(100))
    flat = sum(dropped, [])
    assert len({len(s) for s in dropped}) == 1 and len(flat) == len(set(flat)) and 100 - world < len(flat) <= 100
    assert sorted(sum(split, [])) == list(range(100)) and max(map(len, split)) - min(map(len, split)) <= 1


def test_pad_wraps_a_set_smaller_than_the_ranks():
    images = torch.arange(2, dtype=torch.uint8).view(2, 1, 1, 1)
    shards = [
        InMemoryLoader(images, torch.arange(2), 4, mean=torch.zeros(1), std=torch.ones(1), rank=r, world_size=5)
        for r in range(5)
    ]
    assert [len(s.indices(0)) for s in shards] == [1] * 5 and set(
        torch.cat([s.indices(0) for s in shards]).tolist()
    ) == {0, 1}


def test_unknown_remainder_rule_is_named():
    with pytest.raises(ValueError, match="remainder.*'wrap'"):
        make_loader(remainder="wrap")


def test_flip_and_translate_exact_values():
    x = torch.arange(16, dtype=torch.uint8).view(1, 1, 4, 4).repeat(2, 1, 1, 1)
    flipped = flip(x, torch.tensor([True, False]))
    assert torch.equal(flipped[0, 0, 0], torch.tensor([3, 2, 1, 0], dtype=torch.uint8))
    assert torch.equal(flipped[1], x[1])
    moved = translate(x, torch.tensor([[1, 0], [0, -1]]), pad=1)
    assert torch.equal(moved[0, 0, 0], torch.zeros(4, dtype=torch.uint8))  # shifted down: top row is padding
    assert torch.equal(moved[0, 0, 1:], x[0, 0, :3])
    assert torch.equal(moved[1, 0, :, :3], x[1, 0, :, 1:])  # shifted left: right column is padding
    assert torch.equal(moved[1, 0, :, 3], torch.zeros(4, dtype=torch.uint8))


def test_augmentation_keeps_labels_shapes_and_dtype():
    plain = make_loader(shuffle=True, seed=2)
    augmented = make_loader(shuffle=True, seed=2, augment=Augment(flip=True, translate=2))
    for (xa, ya), (xp, yp) in zip(augmented, plain, strict=True):
        assert torch.equal(ya, yp) and xa.shape == xp.shape and xa.dtype == xp.dtype


def test_channels_last_batches():
    images = torch.randint(0, 255, (8, 3, 5, 5), dtype=torch.uint8)
    loader = InMemoryLoader(
        images, torch.zeros(8, dtype=torch.long), 4, mean=torch.zeros(3), std=torch.ones(3), channels_last=True
    )
    x, _ = next(iter(loader))
    assert x.is_contiguous(memory_format=torch.channels_last)


def test_channel_stats_match_torch():
    images = torch.randint(0, 256, (50, 3, 4, 4), dtype=torch.uint8)
    mean, std = channel_stats(images)
    values = images.double() / 255
    assert torch.allclose(mean.double(), values.mean((0, 2, 3)), atol=1e-6)
    assert torch.allclose(std.double(), values.std((0, 2, 3), unbiased=False), atol=1e-5)


def test_channel_stats_count_uint8_levels_as_the_sums_would():
    """uint8 images take the per-level count, other dtypes the chunked sums: the same statistics either way,
    on channels with different contents (one constant, one skewed, one full-range)."""
    generator = torch.Generator().manual_seed(0)
    images = torch.stack(
        [
            torch.full((40, 6, 5), 7, dtype=torch.uint8),
            (torch.rand(40, 6, 5, generator=generator).square() * 255).to(torch.uint8),
            torch.randint(0, 256, (40, 6, 5), dtype=torch.uint8, generator=generator),
        ],
        dim=1,
    )
    counted, summed = channel_stats(images), channel_stats(images.float())
    assert torch.allclose(counted[0], summed[0], atol=1e-6) and torch.allclose(counted[1], summed[1], atol=1e-5)
    assert counted[0][0].item() == pytest.approx(7 / 255) and counted[1][0].item() < 1e-5  # a constant channel
    assert counted[0].dtype == counted[1].dtype == torch.float32


CONTIGUOUS_STRIDES, CHANNELS_LAST_STRIDES = (64, 64, 8, 1), (64, 1, 8, 1)  # (N, 1, 8, 8): the strides a conv reads


@pytest.mark.parametrize("channels_last", [False, True])
def test_batches_have_the_strides_of_the_loaders_layout_even_with_one_channel(channels_last):
    """translate makes its batch channels-last in memory; a one-channel batch counts as contiguous in both layouts,
    so only its strides tell a convolution which kernels to use: they must be the run's layout's, in training and
    evaluation alike (a contiguous run once trained channels-last and evaluated contiguous, at half the speed)."""
    images = torch.randint(0, 256, (16, 1, 8, 8), dtype=torch.uint8)
    want = CHANNELS_LAST_STRIDES if channels_last else CONTIGUOUS_STRIDES
    for augment in (Augment(flip=True, translate=2), None):
        loader = InMemoryLoader(images, torch.arange(16) % 2, 4, mean=torch.zeros(1), std=torch.ones(1),
                                augment=augment, channels_last=channels_last)  # fmt: skip
        for batch, _ in loader:
            assert batch.stride() == want, (augment, batch.stride())


def test_in_layout_restrides_a_one_channel_batch():
    nhwc = torch.randn(2, 8, 8, 1).permute(0, 3, 1, 2)  # channels-last in memory
    assert nhwc.contiguous().stride() == CHANNELS_LAST_STRIDES  # .contiguous() leaves it as it is
    assert in_layout(nhwc, False).stride() == CONTIGUOUS_STRIDES
    assert in_layout(nhwc.contiguous(), True).stride() == CHANNELS_LAST_STRIDES
    assert torch.equal(in_layout(nhwc, False), nhwc)
