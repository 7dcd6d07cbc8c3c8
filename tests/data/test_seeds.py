"""The run's random streams (hasten/data/seeds.py): each reproducible from the seed alone, one per purpose, and
seeded exactly as the recorded runs were."""

from __future__ import annotations

import numpy as np
import torch

from hasten.data.seeds import FIRST_EPOCH_FLIPS, LABEL_NOISE, batch_seed, numpy_stream, stream, stream_seed


def draws(generator: torch.Generator) -> torch.Tensor:
    return torch.rand(6, generator=generator)


def test_a_stream_repeats_from_the_seed_alone_whatever_else_was_drawn():
    first = draws(stream(3, LABEL_NOISE))
    torch.rand(100)  # the global generator moves: a stream of its own does not
    assert torch.equal(draws(stream(3, LABEL_NOISE)), first)
    assert np.array_equal(numpy_stream(3, 1, 15).random(6), numpy_stream(3, 1, 15).random(6))
    assert batch_seed(3, 2, 1, 7) == batch_seed(3, 2, 1, 7)


def test_each_purpose_seed_and_key_has_a_stream_of_its_own():
    purposes = [stream(3, 0), stream(3, 1), stream(3, FIRST_EPOCH_FLIPS), stream(3, LABEL_NOISE), stream(4, 0),
                stream(4, LABEL_NOISE)]  # fmt: skip
    seen = [draws(generator) for generator in purposes]
    assert all(not torch.equal(a, b) for i, a in enumerate(seen) for b in seen[i + 1 :])
    numpy_draws = [numpy_stream(*keys).random(6) for keys in ((3, 0), (3, 1), (3, 0, 15), (4, 0))]
    assert all(not np.array_equal(a, b) for i, a in enumerate(numpy_draws) for b in numpy_draws[i + 1 :])
    batches = {batch_seed(*key) for key in ((3, 0, 0, 0), (4, 0, 0, 0), (3, 1, 0, 0), (3, 0, 1, 0), (3, 0, 0, 1))}
    assert len(batches) == 5 and all(0 <= seed < 2**63 for seed in batches)


def test_the_streams_are_seeded_as_the_recorded_runs_were():
    """Every seeded run's shuffle, flips, label noise and technique draws come from these seeds: a change here and
    no recorded result repeats."""
    assert stream_seed(3, 0) == 3_000_009 and stream_seed(3, 5) == 3_000_014
    assert stream_seed(3, FIRST_EPOCH_FLIPS) == 3 * 1_000_003 + 0xF11B == 3_061_732
    assert stream_seed(7, LABEL_NOISE) == 7 * 1_000_003 + 0x1AB
    assert torch.equal(draws(stream(3, 2)), draws(torch.Generator().manual_seed(3_000_011)))
    assert batch_seed(3, 2, 1, 7) == hash((3, 2, 1, 7)) & (2**63 - 1)
    assert np.array_equal(numpy_stream(3, 1).random(6), np.random.default_rng([3, 1]).random(6))
