"""The LR range test (Smith, "Cyclical Learning Rates for Training Neural Networks", 2017; popularised by
fastai): train a short while with the LR growing exponentially from tiny to huge, watch the smoothed loss,
stop when it diverges, and suggest an LR from the curve.

Suggestion rule: the LR at the smoothed loss's minimum divided by 10, one order of magnitude below where the
loss stops falling (Smith 2017; fastai's `lr_min`). Also reported: the LR at the minimum (a one-cycle peak
can sit near it) and the steepest descent of the smoothed loss per unit of log(LR) before the minimum, which
is easily fooled: a freshly initialised net's loss falls fast at any LR, so its steepest point often sits at
the start of the sweep.

The model, optimizer, loss scaler, stateful tricks and torch's RNG are restored afterwards, so a training run
can follow in the same process. Under torch.distributed every rank runs the sweep on its own batches; the
loss of each step is averaged over the ranks, rank 0 decides when to stop and what to suggest, and
broadcasts both, so all ranks agree.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from hasten.engine.step import TrainStep
from hasten.errors import HastenError


class Parts(Protocol):
    """What the range test needs of a built run (hasten.run.assemble.Parts has it): the run's own model, optimizer,
    precision, loader, batch hooks and recipe, so the sweep sees the loss the run will."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    precision: Any
    train_loader: Any
    hooks: Any
    data: Any
    recipe: Any
    device: torch.device


RULE = "LR at the smoothed loss's minimum / 10"
# optim.lr=auto: a sweep of AUTO_STEPS steps from AUTO_START to 10, its loss smoothed with AUTO_BETA; the peak LR
# is AUTO_FACTOR x the LR at the smoothed minimum. benchmarks/lr_auto.py measured it on several datasets, seeds
# and sweep lengths (docs/lr-auto.md): the minimum moves within ~3x between seeds, and the accuracy against the
# peak LR is flat within 2x of the best, so half the minimum lands on the plateau.
AUTO_STEPS = 100
AUTO_START = 1e-5  # below, an SGD step does nothing measurable: steps spent there only shorten the sweep
AUTO_BETA = 0.98  # heavy smoothing: the minimum of a noisy 100-step curve moves less
AUTO_FACTOR = 0.5
AUTO_RULE = f"{AUTO_FACTOR:g} x the LR at the minimum of the loss smoothed with beta {AUTO_BETA:g}"


@dataclass
class LRFindResult:
    lrs: list[float]  # the LRs tried, one per optimizer step, until the sweep stopped
    losses: list[float]  # training loss at each (averaged over ranks)
    smoothed: list[float]  # bias-corrected exponential moving average of the losses
    suggestion: float  # the suggested LR, by `rule`
    rule: str
    min_loss_lr: float  # the LR at the smoothed loss's minimum
    steepest_lr: float | None  # the LR of steepest descent before the minimum (None: minimum too early)
    diverged: bool  # True when the sweep stopped early because the loss blew up


def sweep_lrs(start: float, end: float, steps: int) -> list[float]:
    """`steps` LRs from `start` to `end`, evenly spaced in log(LR)."""
    return [start * (end / start) ** (i / max(steps - 1, 1)) for i in range(steps)]


def smooth_losses(losses: Sequence[float], beta: float = 0.9) -> list[float]:
    """Exponential moving average with bias correction (as in Adam), so the first values are not pulled to 0.

    beta 0.9 remembers about 10 steps, a tenth of a 100-step sweep; fastai's 0.98 remembers about 50, which
    shifts the smoothed curve, its minimum and the suggestion towards larger LRs.
    """
    average, out = 0.0, []
    for i, loss in enumerate(losses):
        average = beta * average + (1 - beta) * loss
        out.append(average / (1 - beta ** (i + 1)))
    return out


def suggest(lrs: Sequence[float], smoothed: Sequence[float]) -> float:
    """The suggested LR (`RULE`): the LR at the smoothed loss's minimum / 10, kept inside the sweep."""
    return max(float(lrs[int(np.argmin(smoothed))]) / 10, float(lrs[0]))


def steepest(lrs: Sequence[float], smoothed: Sequence[float], skip: float = 0.1) -> float | None:
    """The LR where the smoothed loss falls fastest per unit of log(LR), before its minimum, skipping the first
    `skip` of the sweep (little smoothing history there); None when the minimum comes too early."""
    lowest = int(np.argmin(smoothed))
    first = max(1, int(len(lrs) * skip))
    if lowest - first < 2:
        return None
    slopes = np.gradient(np.asarray(smoothed, dtype=float), np.log(np.asarray(lrs, dtype=float)))
    return float(lrs[first + int(np.argmin(slopes[first:lowest]))])


def auto_statistic(result: LRFindResult) -> float:
    """The LR at the minimum of the sweep's losses smoothed with AUTO_BETA (non-finite losses count as huge)."""
    losses = [loss if math.isfinite(loss) else 1e30 for loss in result.losses]
    smoothed = smooth_losses(losses, AUTO_BETA)
    return float(result.lrs[int(np.argmin(smoothed))])


def auto_lr(result: LRFindResult) -> float:
    """The peak LR optim.lr=auto trains with: AUTO_RULE."""
    return AUTO_FACTOR * auto_statistic(result)


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _agree(values: list[float], device: torch.device, average: bool = False) -> list[float]:
    """`values` averaged over the ranks (average=True), or rank 0's values on every rank; as is when alone."""
    if not _distributed():
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    if average:
        torch.distributed.all_reduce(tensor)
        tensor /= torch.distributed.get_world_size()
    else:
        torch.distributed.broadcast(tensor, src=0)
    return tensor.tolist()


def range_test(
    step: Callable[[float], float],
    lrs: Sequence[float],
    beta: float = 0.9,
    diverge: float = 4.0,
    device: torch.device | None = None,
) -> LRFindResult:
    """Run `step(lr) -> loss` (one optimizer step at that LR) for each LR until the smoothed loss exceeds
    `diverge` times its best, or the loss is not finite. Under torch.distributed, every rank must call this."""
    device = device or torch.device("cpu")
    tried: list[float] = []
    losses: list[float] = []
    smoothed: list[float] = []
    average, best, diverged = 0.0, math.inf, False
    for i, lr in enumerate(lrs):
        (loss,) = _agree([step(lr)], device, average=True)
        tried.append(lr)
        losses.append(loss)
        average = beta * average + (1 - beta) * loss
        smoothed.append(average / (1 - beta ** (i + 1)))
        best = min(best, smoothed[-1])
        (stop,) = _agree([float(not math.isfinite(loss) or smoothed[-1] > diverge * best)], device)  # rank 0 decides
        if stop:
            diverged = True
            break
    finite = [(lr, s) for lr, s in zip(tried, smoothed, strict=True) if math.isfinite(s)]
    if not finite:
        raise HastenError("lr-find: the loss was not finite even at the sweep's first LR; give a lower --start")
    finite_lrs, finite_smoothed = [f[0] for f in finite], [f[1] for f in finite]
    (suggestion,) = _agree([suggest(finite_lrs, finite_smoothed)], device)  # rank 0's is the one all ranks use
    min_loss_lr = finite_lrs[int(np.argmin(finite_smoothed))]
    steepest_lr = steepest(finite_lrs, finite_smoothed)
    return LRFindResult(tried, losses, smoothed, suggestion, RULE, min_loss_lr, steepest_lr, diverged)


def _endless_batches(parts: Parts) -> Iterator[tuple[Tensor, Tensor]]:
    for epoch in itertools.count():
        parts.train_loader.set_epoch(epoch)
        yield from parts.train_loader


def lr_find(
    parts: Parts, start: float = 1e-6, end: float = 10.0, steps: int = 100, beta: float = 0.9, diverge: float = 4.0
) -> LRFindResult:
    """The LR range test on the built run `parts`; leaves the model, optimizer and the rest as they were."""
    model, optimizer, precision = parts.model, parts.optimizer, parts.precision
    saved: dict[str, Any] = {
        "model": copy.deepcopy(model.state_dict()),
        "optimizer": copy.deepcopy(optimizer.state_dict()),
        "precision": copy.deepcopy(precision.state_dict()),
        "tricks": {name: copy.deepcopy(obj.state_dict()) for name, obj in parts.hooks.stateful.items()},
        "torch_rng": torch.get_rng_state(),
        "loader_epoch": parts.train_loader.epoch,
    }
    batches = _endless_batches(parts)
    # the run's own step: its batch hooks (the loss the run will see), precision, clipping and accumulation
    train_step = TrainStep(
        model, optimizer, precision, len(parts.data.classes), parts.hooks.on_batch, parts.recipe.train.clip_grad_norm
    )
    accumulate = parts.recipe.train.accumulate  # a step spans the run's global batch, as the LR will

    # each group keeps its share of the run's LR (optim.fan_in_lr, discriminative fine-tuning), as the schedule does
    shares = [group.get("initial_lr", parts.lr) / parts.lr if parts.lr else 1.0 for group in optimizer.param_groups]

    def step(lr: float) -> float:
        for group, share in zip(optimizer.param_groups, shares, strict=True):
            group["lr"] = lr * share
        return train_step([next(batches) for _ in range(accumulate)]).loss

    was_training = model.training
    model.train()
    try:
        return range_test(step, sweep_lrs(start, end, steps), beta, diverge, parts.device)
    finally:
        model.train(was_training)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        optimizer.zero_grad(set_to_none=True)
        precision.load_state_dict(saved["precision"])
        for name, obj in parts.hooks.stateful.items():
            obj.load_state_dict(saved["tricks"][name])
        torch.set_rng_state(saved["torch_rng"])
        parts.train_loader.set_epoch(saved["loader_epoch"])


def plot_lr_find(result: LRFindResult, path: str | Path, title: str = "LR range test") -> Path:
    """Loss against LR (log scale): raw and smoothed, with the suggestion marked; a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axis = plt.subplots(figsize=(7, 4.5), constrained_layout=True)
    axis.plot(result.lrs, result.losses, color="tab:blue", alpha=0.3, label="loss")
    axis.plot(result.lrs, result.smoothed, color="tab:blue", label="smoothed loss")
    axis.axvline(result.suggestion, color="tab:red", linestyle="--", label=f"suggested {result.suggestion:.3g}")
    axis.axvline(result.min_loss_lr, color="grey", linestyle=":", label=f"minimum {result.min_loss_lr:.3g}")
    axis.set_xscale("log")
    finite = [s for s in result.smoothed if math.isfinite(s)]
    if finite:  # keep the diverged tail from squashing the interesting part
        low, high = min(finite), finite[0]
        axis.set_ylim(low - 0.1 * (high - low + 1e-9), max(high, low) + 0.5 * (high - low + 1e-9))
    axis.set_xlabel("learning rate")
    axis.set_ylabel("training loss")
    axis.set_title(f"{title}\nsuggestion: {result.rule}", fontsize=10)
    axis.grid(alpha=0.3, which="both")
    axis.legend()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
