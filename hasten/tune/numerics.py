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

import math

import torch
from torch import Tensor, nn

from hasten.engine.precision import compute_dtype
from hasten.errors import first_line
from hasten.models.copying import copy_model
from hasten.tune.choices import Candidate
from hasten.tune.rules import PROBE_BATCH

# The largest relative gradient error of reduced precision the run accepts. Measured (bf16 on a Zen 4, the suite's
# six models and hasten's ResNet at initialisation, a batch of Fashion-MNIST or the letters): 0.003-0.18, every
# one of them training to the fp32 run's accuracy in bf16; 0.4 is twice the worst that trains well.
MAX_GRAD_ERROR = 0.4


class ReducedPassFailed(Exception):
    """The model's forward or backward raised under the reduced precision's autocast where fp32's ran (a `.numpy()`
    of a bf16 tensor, an op with no kernel for the dtype): `error` is what it raised."""

    def __init__(self, error: Exception):
        super().__init__(str(error))
        self.error = error


def gradient_error(model: nn.Module, images: Tensor, labels: Tensor, precision: str, device: torch.device) -> float:
    """|g - g_fp32| / |g_fp32| of one batch's cross-entropy gradient under `precision`'s autocast against fp32, on a
    copy of `model` (the model, its batch-norm statistics and the random streams are left as they were). inf when
    the reduced-precision loss or gradient is not finite while fp32's is; 0.0 for fp32 itself. What fp32's pass
    raises is raised as it is (the model cannot train); what only the reduced pass raises, as ReducedPassFailed."""
    if precision == "fp32":
        return 0.0
    trial = copy_model(model).to(device).train()
    dtype = compute_dtype(precision)
    grads = []
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        for low in (False, True):
            torch.manual_seed(0)  # the same dropout masks in both passes
            trial.zero_grad(set_to_none=True)
            try:
                with torch.autocast(device.type, dtype=dtype, enabled=low):
                    loss = nn.functional.cross_entropy(trial(images).float(), labels)
                loss.backward()
            except Exception as error:  # noqa: BLE001 - the user's model may raise anything in either pass
                if not low:
                    raise
                raise ReducedPassFailed(error) from error
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


def safe_options(
    model: nn.Module, batch: tuple[Tensor, Tensor], options: list[Candidate], device: torch.device
) -> tuple[list[Candidate], list[str]]:
    """`options` without the reduced precisions this model's own numerics do not survive (`gradient_error`:
    one batch's gradient against fp32's), and the line that says what each measured."""
    reduced = list(dict.fromkeys(option.precision for option in options if option.precision != "fp32"))
    if not reduced:  # fp32 alone (layouts to time): nothing to check, nothing to say
        return options, []
    images, labels = batch[0][:PROBE_BATCH], batch[1][:PROBE_BATCH]
    measured, raised = {}, {}
    for name in reduced:
        try:
            measured[name] = gradient_error(model, images, labels, name, device)
        except ReducedPassFailed as failure:  # fp32's pass ran: this precision is one the model cannot run in
            raised[name] = first_line(failure.error, 160).rstrip(".")
    unsafe = {name for name, error in measured.items() if not safe(error)} | set(raised)
    said = ", ".join(f"{name} {error:.3g}" for name, error in measured.items())
    limit = f"at most {MAX_GRAD_ERROR}"
    if not unsafe:
        return options, [f"precision=auto: this model's gradient in reduced precision against fp32's: {said} ({limit})"]
    kept = [option for option in options if option.precision not in unsafe] or [
        Candidate("fp32", option.channels_last) for option in options if option.precision in unsafe
    ][:1]
    why = [f"its step raised {text}" + f" in {name}" * (len(raised) > 1) for name, text in raised.items()]
    if said:
        why.append(f"this model's gradient in reduced precision differs from fp32's by {said} of its size ({limit})")
    return kept, [
        f"precision=auto: {', '.join(sorted(unsafe))} left out: {'; '.join(why)}; it trains in {kept[0].precision}"
    ]
