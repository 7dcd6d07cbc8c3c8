"""Whether a model trains safely in reduced precision, read from its own numerics before training: one batch's
gradient in fp32 and under the candidate's autocast, compared. The start-up probe (hasten/tune/autotune.py)
picks the fastest precision; a speed alone does not say the model's arithmetic survives 8 bits of mantissa, and a
model hasten did not write (a user's attention, normalisation or loss) may not. The rule is measured across the
model suite (docs/defaults.md, "A model hasten did not write").

The gradient is what the optimizer steps on: its relative error, |g_low - g_fp32| / |g_fp32| over every parameter,
is what the low precision changes in the update. The two passes run on a copy of the model in training mode, from
the same random state (the same dropout masks), so the difference is the arithmetic's alone.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import Tensor, nn

from hasten.engine.precision import compute_dtype

# The largest relative gradient error of reduced precision the run accepts. Measured (bf16 on a Zen 4, the suite's
# six models and hasten's ResNet at initialisation, a batch of Fashion-MNIST or the letters): 0.003-0.18, every
# one of them training to the fp32 run's accuracy in bf16; 0.4 is twice the worst that trains well.
MAX_GRAD_ERROR = 0.4


def gradient_error(model: nn.Module, images: Tensor, labels: Tensor, precision: str, device: torch.device) -> float:
    """|g - g_fp32| / |g_fp32| of one batch's cross-entropy gradient under `precision`'s autocast against fp32, on a
    copy of `model` (the model, its batch-norm statistics and the random streams are left as they were). inf when
    the reduced-precision loss or gradient is not finite while fp32's is; 0.0 for fp32 itself."""
    if precision == "fp32":
        return 0.0
    trial = copy.deepcopy(model).to(device).train()
    dtype = compute_dtype(precision)
    grads = []
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        for low in (False, True):
            torch.manual_seed(0)  # the same dropout masks in both passes
            trial.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=dtype, enabled=low):
                loss = nn.functional.cross_entropy(trial(images).float(), labels)
            loss.backward()
            grads.append(
                torch.cat([p.grad.float().flatten() for p in trial.parameters() if p.grad is not None])
                if math.isfinite(loss.item())
                else None
            )
    reference, reduced = grads
    if reference is None or not torch.isfinite(reference).all():
        return 0.0  # fp32 itself is not finite here: nothing for the precision to lose (the run says why later)
    if reduced is None or not torch.isfinite(reduced).all():
        return math.inf
    norm = reference.norm().item()
    return (reduced - reference).norm().item() / norm if norm > 0 else 0.0


def safe(error: float) -> bool:
    return error <= MAX_GRAD_ERROR
