"""The training loop: small, readable, with a few fixed hook points.

Per batch: `on_batch` hooks (mixup, cutmix) take and return (images, soft targets); forward under the
precision's autocast; backward; the precision's step (which may skip on inf/NaN); the LR schedule advances
only when the step was taken; `after_step` hooks (EMA) see the model. Each epoch ends with an evaluation on
the test set, a row of metrics.csv and TensorBoard scalars.

Evaluations cost the wall-clock time a user waits on, so only the last one is the full one (test-time
augmentation: up to 6 views of every test image); those before it (each epoch's end, `Plan.eval_every_steps`)
look at every test image once (`Plan.mid_eval="plain"`, 1/6 of the cost) unless the plan asks for the full one.
Every evaluation is timed on two clocks: the training seconds so far, and the wall seconds since the command
started (`Plan.clock`, hasten/clock.py: start-up, probe, data and evaluations included).

Checkpoints (hasten/runfolder/checkpoint.py) are taken at optimizer-step boundaries: every `save_every_steps` steps, at
the end of every `save_every_epochs`-th epoch, and when SIGINT/SIGTERM asks the run to stop (the current step
finishes first; a second SIGINT aborts at once). They hold everything the run depends on, down to the RNG
states and the epoch's running loss, so a resumed run continues exactly as if never stopped.

Gradient accumulation (`Plan.accumulate` = k): the gradients of k micro-batches are summed, each one's mean
loss weighted by its share of the step's examples, then one optimizer step is taken; so a step equals one batch
of k x batch_size (exactly, without batch norm). The epoch's last group may hold fewer micro-batches; it is
stepped all the same, weighted by what it holds. Grads live only within a group: checkpoint at step boundaries
(`State.batch` a multiple of k). The second optimizer step of the run is profiled for `peak_step_memory_bytes`.

Several processes (DDP): every rank runs this loop on its shard; the decisions that must be the same everywhere
(a non-finite loss on some rank, a stop signal seen by some rank) are agreed by one all-reduce per step;
evaluation runs on each rank's split of the test set, sums reduced, so the accuracy is over every test image
once; a checkpoint gathers each rank's own state (RNG streams, mixing generator, epoch sums) and rank 0
writes it. Only rank 0's RunLog writes files.

Beside the loop: what it is given (hasten/run/plan.py), where it stands and how a checkpoint is loaded back
(hasten/run/state.py), the evaluation loop it shares with `hasten evaluate` (hasten/run/evaluation.py), and the
stop signals (hasten/run/signals.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import signal
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from hasten.data.loader import InMemoryLoader
from hasten.engine.distributed import all_reduce_sum, any_rank, gather_objects, unwrap
from hasten.engine.memory import measure_peak, peak_memory_bytes, reset_peak
from hasten.engine.precision import Precision
from hasten.engine.schedules import Scheduler
from hasten.engine.step import StepResult, TrainStep, steps_per_epoch
from hasten.errors import CheckpointError, HastenError
from hasten.progress import EpochProgress, say
from hasten.run import verdicts
from hasten.run.evaluation import Measurement, check_batches, constant_outputs, lag_warning, measure
from hasten.run.extension import replanned, stuck
from hasten.run.plan import AGAIN, NOT_THE_LR, Collapsed, Hooks, Interrupted, NonFiniteLoss, Plan, Saving, kept_note
from hasten.run.signals import asked_to_stop, handling_stop_signals
from hasten.run.state import State, rank_state, restore, time_to_fraction_of_best, wall_time_to_accuracy
from hasten.run.verdicts import COLLAPSED_TRAIN_LOSS, at_chance_warning, collapsed_outputs, late_warning, no_gradient
from hasten.runfolder.checkpoint import prune, save_checkpoint, set_rng_state
from hasten.runfolder.log import RunLog
from hasten.techniques.tta import views
from hasten.version import __version__

# the loop and its metrics.csv columns; the plan's types (hasten/run/plan.py) too, for modules that import them here
__all__ = ["METRICS", "Hooks", "Plan", "Saving", "Trainer"]

GRAD_NORM_EVERY = 10  # optimizer steps between TensorBoard's grad_norm_per_step points (reading it syncs)

RECENT_STEPS = 20  # the training loss judged against ln(C) is the mean of this many last steps after the warm-up

METRICS = ["epoch", "step", "lr", "train_loss", "train_accuracy", "test_loss", "test_accuracy", "train_seconds",
           "images_per_second", "loss_scale"]  # fmt: skip


# a training loss this many times a uniform guess's, ln(classes), is a warning at once (not learning: at the end)
UNLEARNT_MARGIN = 2.0


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Trainer:
    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Scheduler | torch.optim.lr_scheduler.LRScheduler,
        precision: Precision,
        loaders: tuple[InMemoryLoader, InMemoryLoader],
        plan: Plan,
        log: RunLog,
        hooks: Hooks | None = None,
        saving: Saving | None = None,
    ):
        self.model, self.optimizer, self.scheduler, self.precision = model, optimizer, scheduler, precision
        self.train_loader, self.test_loader = loaders
        self.plan, self.log, self.hooks, self.saving = plan, log, hooks or Hooks(), saving
        self.device = next(model.parameters()).device
        self.state = State(time_to_accuracy={f"{t:.2f}": None for t in plan.thresholds})
        self.stepper = TrainStep(
            model, optimizer, precision, plan.num_classes, self.hooks.on_batch, plan.clip_grad_norm, plan.loss
        )
        self.peak_step_memory_bytes: int | None = None  # hasten.engine.memory.measure_peak of one optimizer step
        self.stop_signal: int | None = None  # set by SIGINT/SIGTERM; acted on at the next step boundary
        self.resumed = False
        self.bar: EpochProgress | None = None
        self.recent_losses: deque[float] = deque(maxlen=RECENT_STEPS)  # training losses of the last steps
        self.wall_before = 0.0  # wall seconds of the run before this process (a resumed run's earlier ones)
        self.startup_seconds: float | None = None  # wall seconds from the command's start to the first step
        self.one_view_accuracy: float | None = None  # the last full evaluation's accuracy on the plain view alone
        self.one_view_head: tuple[float, int] | None = None  # its (accuracy, images) over the live check's images
        self.seconds_per_view: float | None = None  # an evaluation's measured seconds per view: what the ETA assumes
        self.pace = (0, 0.0)  # (batches, training seconds) this process has trained: the ETA's pace
        self.unreached: list[str] | None = None  # trainable parameters the first step's loss gave no gradient
        self.test_losses: deque[float] = deque(maxlen=2)  # the last evaluations' test losses: collapsed outputs
        self.constant_classes: tuple[tuple[int, float], ...] = ()  # (class, output) the same for every test image

    def wall_seconds(self) -> float:
        """The run's wall-clock seconds so far: since the command's start, plus a resumed run's earlier ones."""
        return self.wall_before + self.plan.clock.seconds()

    # ----- checkpoints -----

    def state_dict(self, ranks: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """Everything the run depends on, as a checkpoint holds it (tensors and plain containers only).
        `ranks`: every rank's `rank_state`, gathered (a collective); default: this process's alone."""
        shared = {k: v for k, v in self.hooks.stateful.items() if k not in self.hooks.rank_local}
        return {
            "format": 2,
            "hasten_version": __version__,
            "recipe": self.saving.recipe if self.saving else {},
            "model": unwrap(self.model).state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "precision": self.precision.state_dict(),
            "hooks": {name: hook.state_dict() for name, hook in shared.items()},
            "trainer": dataclasses.asdict(self.state),
            "ranks": ranks if ranks is not None else [rank_state(self.state, self.hooks)],
        }

    def load_state_dict(self, state: dict[str, Any], source: str = "checkpoint") -> None:
        """Continue from `state` (a `state_dict()`); CheckpointError naming `source` when it does not fit.
        Fails closed: whatever a malformed checkpoint makes the loading raise becomes a CheckpointError."""
        try:
            self._load_state_dict(state, source)
        except HastenError:
            raise
        except Exception as error:  # noqa: BLE001 - a malformed checkpoint can break any step of the loading
            raise CheckpointError(f"{source} is malformed: {type(error).__name__}: {error}") from None

    def _load_state_dict(self, state: dict[str, Any], source: str) -> None:
        parts = (self.model, self.optimizer, self.scheduler, self.precision)
        self.state, mine = restore(state, source, *parts, self.hooks)
        self.wall_before = self.state.wall_seconds  # this process's own seconds add to the stopped run's
        set_rng_state(mine["rng"])
        self.resumed = True

    def save(self, *, end_of_epoch: bool = False, accuracy: float | None = None) -> Path | None:
        """Write a checkpoint and prune old ones, keeping the newest and the best. Every rank calls this at the
        same point: each one's own state is gathered, and rank 0 writes."""
        if self.saving is None:
            return None
        ranks = gather_objects(rank_state(self.state, self.hooks))
        if not self.log.enabled:
            return None
        folder = self.saving.folder
        self.state.wall_seconds = round(self.wall_seconds(), 3)
        path = save_checkpoint(self.state_dict(ranks), folder / f"step-{self.state.step}.pt")
        if end_of_epoch and accuracy is not None and accuracy >= self.state.best_accuracy:
            self.state.best_checkpoint = path.name
        best = (folder / self.state.best_checkpoint,) if self.state.best_checkpoint else ()
        prune(folder, self.saving.keep, protect=best + tuple(self.saving.protect))
        return path

    def _keep_epoch_sums(self, loss_sum: Tensor, correct: Tensor, seen: int, seconds: float) -> None:
        self.state.epoch_loss_sum, self.state.epoch_correct = loss_sum.item(), int(correct.item())
        self.state.epoch_seen, self.state.epoch_seconds = seen, seconds

    def stop_on_signals(self) -> contextlib.AbstractContextManager[None]:
        """SIGINT/SIGTERM ask for a stop at the next step boundary (`stop_signal`); a second SIGINT aborts at once,
        even in the middle of a long step (hasten/run/signals.py)."""

        def request(signum: int, frame: object) -> None:
            self.stop_signal = asked_to_stop(self.stop_signal, signum)

        return handling_stop_signals(request)

    def _check_stop(self, stop: bool | None = None) -> None:
        """Checkpoint and stop when a signal came to any rank (`stop`: already agreed across the ranks)."""
        if stop if stop is not None else any_rank(self.stop_signal is not None, self.device):
            checkpoint = self.save()
            raise Interrupted(self.stop_signal or signal.SIGTERM, checkpoint)

    # ----- the loop -----

    def steps_per_epoch(self) -> int:
        return steps_per_epoch(len(self.train_loader), self.plan.accumulate)

    def _group_examples(self, group: int) -> int:
        """Examples in the `group`-th optimizer step of an epoch: k micro-batches, fewer in the epoch's last."""
        loader, k = self.train_loader, self.plan.accumulate
        first, end = group * k, min((group + 1) * k, len(loader))  # micro-batch indices [first, end)
        return loader.batch_span(end - 1)[1] - loader.batch_span(first)[0]

    def train_step(self, images: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        """One optimizer step on one batch (hasten.engine.step, then the schedule and `after_step` hooks); returns the
        (detached) loss and the count of correct predictions."""
        result = self.stepper.backward([(images, labels)], 1, len(labels), self.stop_signal is not None)
        self._finish_step(result)
        return result.last_loss, result.correct

    def _finish_step(self, result: StepResult) -> None:
        """After a step's backward: the update (the precision's optimizer step on the accumulated gradients, clipped
        first when asked; the schedule and `after_step` hooks only follow a step that was taken), or what a
        non-finite loss asks for; the per-step scalars."""
        if result.nonfinite:
            self._nonfinite(result.last_loss)
        elif self.precision.step(self.optimizer, self.stepper.clip_grad_norm):  # False: fp16's scaler skipped it
            self.log.scalar("lr_per_step", self.optimizer.param_groups[0]["lr"], self.state.step)  # the LR just used
            self.scheduler.step()
            self.state.step += 1
            for after in self.hooks.after_step:
                after(self.model)
        else:
            self.state.skipped_steps += 1
        self.log.scalar("train_loss_per_step", result.loss, self.state.step)  # no sync: the step read it
        if not result.nonfinite and self.state.step > self.plan.rise_steps:
            self.recent_losses.append(result.loss)  # judged against ln(C) at the epoch's end
        norm = self.precision.grad_norm
        if norm is not None and (self.state.step - 1) % GRAD_NORM_EVERY == 0:  # steps 1, 11, 21, ...
            self.log.scalar("grad_norm_per_step", norm.item(), self.state.step)  # a sync, so not every step

    def _nonfinite(self, loss: Tensor) -> None:
        """A micro-batch's loss was inf/NaN (on this or another rank): skip the update (train.on_nan=skip) or
        stop naming the step."""
        self.optimizer.zero_grad(set_to_none=True)
        if self.plan.on_nan == "skip":
            self.state.nonfinite_steps += 1
            return
        value = f"became {loss.item()}" if not torch.isfinite(loss) else "became non-finite on another rank"
        advice = NOT_THE_LR if self.state.step == 0 else "lower optim.lr, or set train.on_nan=skip to skip such steps"
        raise NonFiniteLoss(f"the training loss {value} at step {self.state.step + 1} (epoch {self.state.epoch + 1}, "
                            f"batch {self.state.batch}){kept_note(self.saving)}; {advice}")  # fmt: skip

    @torch.no_grad()
    def evaluate(self, live: bool = False) -> tuple[float, float]:
        """The full evaluation: test loss and accuracy over the whole test set with the plan's test-time
        augmentation; each rank evaluates its split, the sums are reduced. The model evaluated is the hooks'
        `eval_model` (the EMA copy) unless `live`. The same pass's accuracy on the plain view alone is kept as
        `one_view_accuracy`, and over the live weights' check's images as `one_view_head`."""
        measured = self._measure(live=live, tta=True, head=check_batches(self.test_loader))
        self.one_view_accuracy, self.one_view_head = measured.plain_accuracy, measured.head
        if not live:  # the final evaluation's: reduced over the ranks here, not in every evaluation
            self.constant_classes = constant_outputs(measured.own, self.device)
        return measured.loss, measured.accuracy

    def evaluate_between(self) -> tuple[float, float]:
        """An evaluation before the last (each epoch's end, `Plan.eval_every_steps`): every test image once, with
        no test-time augmentation (`Plan.mid_eval="plain"`), or the full evaluation (`"tta"`)."""
        if self.plan.mid_eval == "tta":
            return self.evaluate()
        measured = self._measure(live=False, tta=False)
        return measured.loss, measured.accuracy

    @torch.no_grad()
    def _measure(self, live: bool, tta: bool, batches: int | None = None, head: int = 0) -> Measurement:
        """Loss and accuracies over the test set (its first `batches` batches where given; `head`: the plain
        view's accuracy over the first that many too), timed into `State.eval_seconds` and shown."""
        plan, loader = self.plan, self.test_loader
        flip, translate = (plan.tta_flip, plan.tta_translate) if tta else (False, 0)
        passes = views(flip, translate)
        started = time.perf_counter()
        what = "live weights" if live else "final" if tta else "plain"
        shown = len(loader) if batches is None else min(batches, len(loader))
        images = loader.num_samples if batches is None else min(loader.num_samples, shown * loader.batch_size)
        detail = f"{images:,} test images, {what}, {passes} view{'s' * (passes > 1)}"
        with self._showing(detail, shown) as advance:
            model = unwrap(self.model)  # the plain module: no DDP forward hooks or buffer broadcasts in evaluation
            model = self.hooks.eval_model(model) if self.hooks.eval_model and not live else model  # EMA: calibrated
            calibrated = time.perf_counter()
            measured = measure(model, loader, self.precision, self.device, (flip, translate), advance, batches, head)
        done = time.perf_counter()
        if batches is None:  # a whole pass: what the ETA's next evaluation takes
            self.seconds_per_view = (done - calibrated) / passes
        self.state.eval_seconds += done - started
        return measured

    def _showing(self, text: str, batches: int) -> contextlib.AbstractContextManager[Callable[[], None]]:
        """The progress bar's evaluation line while an evaluation runs (a no-op without a bar)."""
        if self.bar is not None and self.bar.enabled and self.log.enabled:
            return self.bar.evaluation(text, batches)
        return contextlib.nullcontext(lambda: None)

    def record_accuracy(self, test_accuracy: float, train_seconds: float) -> None:
        """An evaluation after `train_seconds` of training, at the wall seconds of now: thresholds first reached,
        the best so far, the curve."""
        seconds = round(train_seconds, 3)
        for key in self.state.time_to_accuracy:
            if self.state.time_to_accuracy[key] is None and test_accuracy >= float(key):
                self.state.time_to_accuracy[key] = seconds
        self.state.best_accuracy = max(self.state.best_accuracy, test_accuracy)
        wall = round(self.wall_seconds(), 3)
        self.state.accuracy_curve.append([seconds, self.state.step, round(test_accuracy, 6), wall])

    def _evaluate_mid_epoch(self, seconds_in_epoch: float) -> float:
        """`Plan.eval_every_steps`: an evaluation between two steps of an epoch, timed at the training seconds so
        far; returns the seconds it took, which the epoch's clock leaves out."""
        _sync(self.device)
        paused = time.perf_counter()
        test_loss, test_accuracy = self.evaluate_between()
        self.record_accuracy(test_accuracy, self.state.train_seconds + seconds_in_epoch)  # (the epoch adds its own)
        self.log.scalar("test_accuracy_per_step", test_accuracy, self.state.step)
        self.log.scalar("test_loss_per_step", test_loss, self.state.step)
        _sync(self.device)
        return time.perf_counter() - paused

    # ----- what must not pass silently -----

    def warn(self, text: str) -> None:
        """A warning the user sees (the progress line, or stderr) and summary.json keeps."""
        self.state.warnings.append(text)
        self.tell(f"warning: {text}")

    def tell(self, text: str) -> None:
        """A line the user sees: on the progress display when it shows, else printed (the main process only)."""
        if not self.log.enabled:
            return
        if self.bar is not None and self.bar.enabled:
            self.bar.note(text)
        else:
            say(text)

    def _diverged(self, text: str) -> None:
        """Non-finite statistics or test loss: a divergence, stopped with `train.on_nan=raise`, else a warning."""
        if self.plan.on_nan == "raise":
            raise NonFiniteLoss(f"{text}{kept_note(self.saving)}; {AGAIN}")
        self.warn(text)

    def check_health(self, row: dict[str, float]) -> None:
        """After an epoch's evaluation: non-finite batch-norm statistics or test loss are a divergence; a training
        loss above ln(C), the loss of a uniform guess whatever the (smoothed, mixed) targets, after the warm-up
        means the run is not learning (Goyal et al.'s large-batch failure looks like this)."""
        epoch, uniform = self.state.epoch, math.log(self.plan.num_classes)
        bad = [name for name, buffer in unwrap(self.model).named_buffers()
               if buffer.is_floating_point() and not bool(torch.isfinite(buffer).all())]  # fmt: skip
        if bad:
            self._diverged(f"epoch {epoch}: batch-norm statistics became non-finite ({', '.join(bad[:3])})")
        if not math.isfinite(row["test_loss"]):
            self._diverged(f"epoch {epoch}: the test loss is {row['test_loss']}")
        # the loss of the last steps after the warm-up: an epoch's mean also holds its first, untrained steps
        late = statistics.fmean(self.recent_losses) if self.recent_losses else None
        # clearly worse than a guess (or not finite) is said at once; a loss near the guess's may be a plateau a
        # small set's first epochs sit on, so it is said only when the run ends on it
        worse = late is not None and late > UNLEARNT_MARGIN * uniform
        ends_on_it = late is not None and late > uniform and epoch >= self.plan.epochs
        if not math.isfinite(row["train_loss"]) or worse or ends_on_it:
            shown = row["train_loss"] if late is None or not math.isfinite(row["train_loss"]) else late
            self.warn(
                f"epoch {epoch}: training loss {shown:.3f} (its last steps) is above ln({self.plan.num_classes}) = "
                f"{uniform:.3f}, a uniform guess: the run diverged or is not learning; try "
                f"{', '.join(self.plan.divergence_advice)}"
            )

    def check_result(self, test_accuracy: float, train_accuracy: float | None = None) -> None:
        """At the end: an accuracy near chance is a warning, never just a number (hasten/run/verdicts.py)."""
        plan, late = self.plan, statistics.fmean(self.recent_losses) if self.recent_losses else math.nan
        # a training loss at a uniform guess's: the outputs are the same for every class (as the restart reads it)
        collapsed = plan.collapse_advice if abs(late - math.log(plan.num_classes)) < COLLAPSED_TRAIN_LOSS else None
        text = at_chance_warning(test_accuracy, plan.num_classes, plan.epochs, plan.divergence_advice,
                                 train_accuracy, plan.test_chance, plan.train_chance, collapsed)  # fmt: skip
        dead = verdicts.constant_classes_warning(self.constant_classes, plan.num_classes, plan.class_names)
        for said in filter(None, (text, dead)):
            self.warn(said)

    def check_start(self) -> None:
        """At the end of a run that learnt: one at chance late into its steps is said to have learnt late."""
        plan = self.plan
        if late := late_warning(self.state.accuracy_curve, plan.num_classes, plan.epochs, plan.test_chance):
            self.warn(late)

    def train_epoch(self, bar: EpochProgress) -> dict[str, float]:
        self.model.train()
        self.train_loader.set_epoch(self.state.epoch)
        loss_sum = torch.tensor(self.state.epoch_loss_sum, device=self.device)  # nonzero when resumed mid-epoch
        correct = torch.tensor(self.state.epoch_correct, device=self.device, dtype=torch.long)
        seen = self.state.epoch_seen
        _sync(self.device)
        started = time.perf_counter() - self.state.epoch_seconds
        resumed_seconds, first_batch = self.state.epoch_seconds, self.state.batch  # what this process did not train
        batches = iter(self.train_loader.batches(self.state.batch))
        count, k = len(self.train_loader), self.plan.accumulate
        if self.startup_seconds is None:  # this process's start-up: from the command to its first training step
            self.plan.clock.mark("run folder and loop")
            self.startup_seconds = round(self.plan.clock.seconds(), 3)
        while self.state.batch < count:
            # one optimizer step over the rest of this group of k micro-batches (the epoch's last group may be
            # short: it is stepped all the same, each micro-batch weighted by its share of the group's examples)
            group, first = self.state.batch // k, self.state.batch
            micro_batches = min((group + 1) * k, count) - first
            with self._probe_step_memory():
                asked = lambda: self.stop_signal is not None  # noqa: E731  (read once the step's backward is done)
                result = self.stepper.backward(batches, micro_batches, self._group_examples(group), asked)
                if self.unreached is None and not result.nonfinite:  # this process's first step: before the update
                    self.unreached = no_gradient(unwrap(self.model), self.warn)
                self._finish_step(result)
            self.state.batch += micro_batches
            loss_sum += result.loss_sum
            correct += result.correct
            seen += result.examples
            if any(bar.due(b) for b in range(first + 1, self.state.batch + 1)):
                elapsed = time.perf_counter() - started
                eta = self.eta(self.state.batch - first_batch, elapsed - resumed_seconds)
                bar.update(self.state.batch, loss=loss_sum.item() / seen, accuracy=correct.item() / seen,
                           images_per_second=seen / max(elapsed, 1e-9), eta_seconds=eta)  # fmt: skip
            every = self.plan.eval_every_steps
            if every and self.state.step % every == 0 and self.state.batch < count and not result.nonfinite:
                started += self._evaluate_mid_epoch(time.perf_counter() - started)  # (the epoch's end evaluates)
            self._at_step_boundary(result, (loss_sum, correct, seen, time.perf_counter() - started))
        _sync(self.device)
        seconds = time.perf_counter() - started
        self.pace = (self.pace[0] + count - first_batch, self.pace[1] + seconds - resumed_seconds)
        self.state.train_seconds += seconds
        self.state.epoch += 1
        self.state.batch = 0
        self._keep_epoch_sums(torch.zeros(()), torch.zeros(()), 0, 0.0)
        loss_total, correct_total, seen_total = all_reduce_sum([loss_sum.item(), correct.item(), seen], self.device)
        return {  # over all ranks
            "train_loss": loss_total / max(seen_total, 1),
            "train_accuracy": correct_total / max(seen_total, 1),
            "images_per_second": seen_total / max(seconds, 1e-9),
        }

    def eta(self, batches_now: int, seconds_now: float) -> float | None:
        """Seconds left in the run, estimated: the batches still to train at this process's pace so far (the
        `batches_now` of this epoch in `seconds_now` included), and the evaluations still to come at their measured
        cost per view (before one is measured: a forward pass as a third of a training step); None before a pace."""
        batches, seconds = self.pace[0] + batches_now, self.pace[1] + seconds_now
        if batches < 2:
            return None
        per_batch, count, plan = seconds / batches, len(self.train_loader), self.plan
        left = (plan.epochs - self.state.epoch) * count - self.state.batch
        per_view = self.seconds_per_view
        if per_view is None:  # no evaluation yet: a forward pass over the test set, as a third of a training step
            test_images = len(self.test_loader) * self.test_loader.batch_size
            per_view = test_images / self.train_loader.batch_size * per_batch / 3
        full = views(plan.tta_flip, plan.tta_translate)
        between = 1 if plan.mid_eval == "plain" else full
        steps_left = -(-left // plan.accumulate)
        mid = plan.epochs - self.state.epoch - 1 + (steps_left // plan.eval_every_steps if plan.eval_every_steps else 0)
        live = check_batches(self.test_loader) / max(1, len(self.test_loader)) if self.hooks.eval_model else 0
        live = min(live, 1)  # the live weights' check at the end: one view of its share of the test set
        return left * per_batch + per_view * (max(mid, 0) * between + full + live)

    def _at_step_boundary(self, result: StepResult, epoch_sums: tuple[Tensor, Tensor, int, float]) -> None:
        """A step checkpoint every `saving.every_steps` steps; on a stop request (agreed by the step), a checkpoint
        and `Interrupted`. The epoch's running sums (loss, correct, seen, seconds) are kept in the state first, so
        a run resumed from here reports the same epoch metrics."""
        every = self.saving.every_steps if self.saving else 0
        if (every and self.state.step % every == 0 and not result.nonfinite) or result.stop:
            self._keep_epoch_sums(*epoch_sums)
            if not result.stop:
                self.save()
        self._check_stop(result.stop)

    @contextlib.contextmanager
    def _probe_step_memory(self) -> Iterator[None]:
        """Around the run's second optimizer step (the first with optimizer state; the first when the run has one):
        its peak memory becomes `peak_step_memory_bytes`. Elsewhere: nothing."""
        probe_at = 1 if self.plan.epochs * self.steps_per_epoch() > 1 else 0
        due = self.plan.measure_step_memory and self.peak_step_memory_bytes is None
        if not (due and self.state.step + self.state.skipped_steps == probe_at):
            yield
            return
        with measure_peak(self.device) as peak:
            yield
        self.peak_step_memory_bytes = peak.bytes

    def fit(self) -> dict[str, Any]:
        """Train for the planned epochs; returns the summary (also written to summary.json). Resumed from the
        run's last checkpoint (stopped during the final evaluation or before the summary was written), it only
        writes the summary again, from the metrics that checkpoint holds."""
        if self.state.epoch >= self.plan.epochs:
            if self.state.last_row and self.state.epoch == self.plan.epochs:
                return self.summary(self.state.last_row, self.wall_seconds())
            raise CheckpointError(
                f"nothing to resume: the checkpoint is at the end of a {self.state.epoch}-epoch run; raise "
                "train.epochs to train longer"
            )
        reset_peak(self.device)
        if self.resumed:  # rows of epochs after the checkpoint were never checkpointed: they are redone
            self.log.resume_metrics(METRICS, upto_epoch=self.state.epoch)
        else:
            self.log.start_metrics(METRICS)
        self.log.open_board()  # TensorBoard's import and files now, in the start-up, not in the first step
        bar = EpochProgress(len(self.train_loader), enabled=self.plan.progress and self.log.enabled)
        self.bar, live, plan, classes = bar, {}, self.plan, self.plan.num_classes
        with bar:  # SIGINT/SIGTERM: the caller's `stop_on_signals` (hasten.run.build.train), installed once per run
            while self.state.epoch < self.plan.epochs:
                bar.start_epoch(self.state.epoch + 1, self.plan.epochs)
                row = self.train_epoch(bar)
                final = self.state.epoch == self.plan.epochs
                test_loss, test_accuracy = self.evaluate() if final else self.evaluate_between()
                self.check_health(row | {"test_loss": test_loss})
                self.test_losses.append(test_loss)  # outputs that collapsed: a restart, where the plan allows one
                if not final and plan.restart and collapsed_outputs(self.test_losses, row["train_loss"], classes):
                    raise Collapsed.after(self.state, row | {"test_loss": test_loss}, "collapsed", self.wall_seconds())
                self.record_accuracy(test_accuracy, self.state.train_seconds)
                row.update(
                    epoch=self.state.epoch,
                    step=self.state.step,
                    lr=self.optimizer.param_groups[0]["lr"],
                    test_loss=test_loss,
                    test_accuracy=test_accuracy,
                    train_seconds=round(self.state.train_seconds, 3),
                    loss_scale=self.precision.loss_scale,
                )
                self.log.epoch(row, self.state.step)
                passes = views(plan.tta_flip, plan.tta_translate) if final or plan.mid_eval == "tta" else 1
                bar.end_epoch(row, views=passes, wall_seconds=self.wall_seconds())
                if final:  # the end, judged before the last checkpoint keeps it
                    self.check_result(test_accuracy, row.get("train_accuracy"))
                    self.check_start()
                    live = self.compare_live()
                self.state.last_row = dict(row)
                if self.plan.restart and stuck(self.plan, self.state, row):  # at chance where the hold ends, unmoved
                    raise Collapsed.after(self.state, row, "barely moved", self.wall_seconds())
                if (replanning := replanned(self.plan, self.state, row["train_accuracy"])) is not None:
                    self.tell(replanning)
                every = self.saving.every_epochs if self.saving else 0
                if (every and self.state.epoch % every == 0) or final:
                    self.save(end_of_epoch=True, accuracy=test_accuracy)
                if not final:  # after the last epoch the run is done: its summary follows
                    self._check_stop()
        return self.summary(row, self.wall_seconds()) | live

    def compare_live(self) -> dict[str, float]:
        """With an EMA (or any other evaluated copy), the live weights' accuracy too, on the plain view of the first
        LIVE_CHECK_IMAGES test images (all of them where there are fewer), and a warning when the evaluated copy is
        clearly worse on the same images and view (by more than 2 points), which a working average never is. After
        the final evaluation, whose pass kept the evaluated copy's plain view of those images (`one_view_head`)."""
        if self.hooks.eval_model is None or self.one_view_head is None:
            return {}
        model = unwrap(self.model)
        if self.hooks.eval_model(model) is model:
            return {}
        live = self._measure(live=True, tta=False, batches=check_batches(self.test_loader))
        if warning := lag_warning(self.one_view_head[0], live.accuracy, live.count):
            self.warn(warning)
        return {"live_test_accuracy": live.accuracy, "live_test_images": live.count}

    def summary(self, last: dict[str, float], wall_seconds: float) -> dict[str, Any]:
        """The run's results. Two clocks: `wall_seconds` and `time_to_accuracy_wall` count from the command's start
        (start-up, probe, data and evaluations included: the clock a user waits on), `train_seconds` and
        `time_to_accuracy` the training steps alone."""
        loader = self.train_loader  # images over all ranks
        images = len(loader) and loader.shard_size * loader.world_size * self.state.epoch
        summary = {
            "test_accuracy": last["test_accuracy"],
            "test_loss": last["test_loss"],
            "best_test_accuracy": self.state.best_accuracy,
            "train_accuracy": last["train_accuracy"],
            "train_loss": last["train_loss"],
            "epochs": self.state.epoch,
            "steps": self.state.step,
            "skipped_steps": self.state.skipped_steps,
            "nonfinite_steps": self.state.nonfinite_steps,
            "wall_seconds": round(wall_seconds, 3),
            "train_seconds": round(self.state.train_seconds, 3),
            "images_per_second": round(images / max(self.state.train_seconds, 1e-9), 1),
            "peak_memory_bytes": peak_memory_bytes(self.device),  # whole run; CPU: process RSS high-water mark
            "peak_step_memory_bytes": self.peak_step_memory_bytes,  # one step's tensors (hasten.engine.memory)
            "time_to_accuracy": dict(self.state.time_to_accuracy),
            "time_to_accuracy_wall": wall_time_to_accuracy(self.state.accuracy_curve, self.state.time_to_accuracy),
            "time_to_fraction_of_best": time_to_fraction_of_best(self.state.accuracy_curve),  # fits any data
            "startup_seconds": self.startup_seconds,  # this process's: from the command to its first training step
            "startup": dict(self.plan.clock.marks),  # where the start-up went, seconds per phase
            "eval_seconds": round(self.state.eval_seconds, 3),
            "mid_eval": self.plan.mid_eval,  # how the evaluations before the last were made
            # [train_seconds, step, accuracy, wall_seconds] at every evaluation
            "accuracy_curve": [list(point) for point in self.state.accuracy_curve],
            "one_view_test_accuracy": self.one_view_accuracy,  # the final evaluation's, on the plain view alone
            "warnings": list(self.state.warnings),
            "extended": self.state.extended,  # the run lengthened itself (hasten/run/extension.py); None: it did not
            "shortened": self.state.shortened,  # ... or shortened itself
        }
        self.log.summary(summary)
        return summary
