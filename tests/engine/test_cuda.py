"""What needs a real CUDA device: a run on the GPU with the probe choosing among its precisions, fp16 with loss
scaling on tensor cores, pinned host memory for a folder's batches. Skipped, with the reason, where torch sees no
GPU (every CPU machine, and a HASTEN_MACHINE=cuda profile on one: the profile's decisions are tested in
tests/test_machine.py); `benchmarks/gpu.sh` runs them on a lent GPU."""

from __future__ import annotations

import pytest
import torch

import hasten
from hasten import machine

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.machine,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: torch sees none on this machine"),
]


def test_a_gpu_run_probes_the_gpu_s_precisions_and_evaluates_in_batches_of_256(tiny_overrides, monkeypatch, capsys):
    monkeypatch.delenv(machine.ENV, raising=False)
    summary = hasten.train(None, [*tiny_overrides, "device=auto", "precision=auto", "train.channels_last=auto",
                                  "train.eval_batch_size=auto", "train.epochs=1"])  # fmt: skip
    gpu = machine.gather().gpu
    assert summary["machine"]["accelerator"]["kind"] == "cuda" and gpu is not None
    assert summary["precision"] in (("fp32", "bf16") if gpu.bf16 else ("fp32", "fp16"))
    err = capsys.readouterr().err.replace("\n  ", " ")
    assert "train.eval_batch_size=auto -> 256 (on cuda)" in err


@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp16-master"])
def test_every_16_bit_mode_trains_on_the_gpu(precision, tiny_overrides):
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    summary = hasten.train(None, [*tiny_overrides, "device=cuda", f"precision={precision}", "train.epochs=1"])
    assert summary["precision"] == precision and summary["train_loss"] == summary["train_loss"]  # finite, not NaN
