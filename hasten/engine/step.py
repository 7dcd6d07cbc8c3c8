"""One training step, the only one: the loop (hasten/run/trainer.py), the LR range test, the batch-size finder and
the bench's bare step all run it, so what they measure is what training does.

A step is: for each of its micro-batches (gradient accumulation), soft targets, the `on_batch` hooks (label
smoothing, mixup, cutmix), forward and loss under the precision's autocast, backward with the micro-batch's mean
loss weighted by its share of the step's examples (so k accumulated micro-batches equal one batch of their
union), gradient all-reduce only on the last micro-batch under DDP (`no_sync`); then one agreement across the
ranks on whether any loss was inf/NaN and whether any rank was asked to stop; then, unless a loss was not finite,
the precision's step, with the global gradient norm clipped first when asked (Pascanu et al., "On the difficulty
of training recurrent neural networks", 2013), after unscaling for fp16 and fp16-master.

Each micro-batch's loss is read to the host once, which is the synchronisation the finiteness check always
needed; the step's mean loss comes with it for free (logged per step as `train_loss_per_step`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from hasten.engine.distributed import agree, no_sync
from hasten.engine.loss import UserLoss, one_hot, soft_cross_entropy
from hasten.engine.precision import Precision

BatchHook = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]


def steps_per_epoch(micro_batches: int, accumulate: int) -> int:
    """Optimizer steps in an epoch of `micro_batches` batches, one per `accumulate` of them, the last group possibly
    short (it is stepped all the same). The one place this is computed: the loop, the LR schedule's length,
    Freeze's epochs and `hasten schedule` all use it."""
    return -(-micro_batches // accumulate)


@dataclass
class StepResult:
    """What one step did; tensors are detached and stay on the device (reading them syncs it)."""

    loss: float  # the step's mean training loss over its examples, as the update saw it (inf/NaN possible)
    loss_sum: Tensor  # sum over micro-batches of mean loss x examples: what the epoch's running loss adds
    correct: Tensor  # correct predictions among the step's examples (before mixing: against the labels)
    examples: int
    last_loss: Tensor  # the last micro-batch's mean loss (names the value when it is not finite)
    nonfinite: bool  # some rank's loss was inf/NaN: the gradients were dropped (agreed across ranks)
    stop: bool  # some rank was asked to stop (agreed across ranks)


class TrainStep:
    """The training step over a model, its optimizer and precision, with the run's batch hooks; `backward` and
    `apply` are its two halves (the trainer advances the schedule and runs `after_step` hooks between them and
    the next step), calling the object does both."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        precision: Precision,
        num_classes: int,
        on_batch: Sequence[BatchHook] = (),
        clip_grad_norm: float | None = None,
        loss: Callable[[Tensor, Tensor], Tensor] = soft_cross_entropy,  # (logits, soft targets) -> mean loss
        local: bool = False,
    ):
        """`local`: a step of this process alone (the start-up probe's timing steps on a copy of the model): no
        agreement across ranks, whose all-reduce would tie the ranks' step counts together where each decides
        on its own clock how many steps to time."""
        self.model, self.optimizer, self.precision, self.num_classes = model, optimizer, precision, num_classes
        self.local = local
        self.loss = loss if loss is soft_cross_entropy else UserLoss(loss)  # a loss of the user's is checked
        self.on_batch, self.clip_grad_norm = on_batch, clip_grad_norm or None  # 0: off
        self.device = next(model.parameters()).device

    def backward(
        self,
        micro_batches: Iterable[tuple[Tensor, Tensor]],
        count: int,
        examples: int,
        stop: bool | Callable[[], bool] = False,
    ) -> StepResult:
        """Gradients of `count` micro-batches holding `examples` examples in all, then the agreement across ranks
        (`stop`: this rank was asked to stop). On a non-finite loss the gradients are dropped."""
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), device=self.device)
        correct = torch.zeros((), device=self.device, dtype=torch.long)
        total, finite, seen = 0.0, True, 0
        loss = torch.zeros(())
        for index, (images, labels) in zip(range(count), micro_batches, strict=False):
            weight = len(labels) / examples
            last = index == count - 1
            with no_sync(self.model, skip=not last):  # DDP all-reduces the gradients once, after the last
                loss, right = self._forward_backward(images, labels, weight)
            value = loss.item()  # the step's one sync per micro-batch: finiteness and the logged loss at once
            finite = finite and math.isfinite(value)
            total += value * weight
            loss_sum = loss_sum + loss * len(labels) if index else loss * len(labels)
            correct = correct + right if index else right
            seen += len(labels)
        asked = stop() if callable(stop) else stop  # read after the backward: a signal during it counts now
        # one all-reduce with several processes (none for a local step)
        nonfinite, stop = (not finite, asked) if self.local else agree([not finite, asked], self.device)
        if nonfinite:
            self.optimizer.zero_grad(set_to_none=True)
        return StepResult(total, loss_sum, correct, seen, loss, nonfinite, stop)

    def _forward_backward(self, images: Tensor, labels: Tensor, weight: float) -> tuple[Tensor, Tensor]:
        y_soft = one_hot(labels, self.num_classes)
        for hook in self.on_batch:
            images, y_soft = hook(images, y_soft)
        with self.precision.autocast():
            logits = self.model(images)
            loss = self.loss(logits, y_soft)
        self.precision.backward(loss if weight == 1 else loss * weight)
        return loss.detach(), (logits.detach().argmax(1) == labels).sum()

    def apply(self) -> bool:
        """The precision's optimizer step on the gradients (clipped first when asked); False when it skipped
        for inf/NaN gradients (fp16's loss scaling). The clipped norm is then `self.precision.grad_norm`."""
        return self.precision.step(self.optimizer, self.clip_grad_norm)

    def __call__(self, micro_batches: Sequence[tuple[Tensor, Tensor]]) -> StepResult:
        """One whole step on `micro_batches` (a list): backward, then the optimizer step unless a loss was not
        finite. No LR schedule, no `after_step` hooks: what the LR range test and the benchmarks need."""
        examples = sum(len(labels) for _, labels in micro_batches)
        result = self.backward(micro_batches, len(micro_batches), examples)
        if not result.nonfinite:
            self.apply()
        return result
