"""What the training loop is given besides the objects it drives: the plan (epochs, test-time augmentation,
accumulation, what a non-finite loss does, when to evaluate), where and when checkpoints are written, and the
hooks the run's techniques plug into it; and the two ways a run ends early, a stop signal and a non-finite loss.

Kept apart from the loop (hasten/run/trainer.py) because the code that builds a run (hasten/run/assemble.py,
hasten/run/build.py), the tools that drive a loop of their own and the tests make these objects without running it.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from hasten.clock import Clock
from hasten.engine.loss import soft_cross_entropy
from hasten.errors import HastenError
from hasten.recipe.schema import Recipe, dotted
from hasten.run.extension import Extension
from hasten.runfolder.checkpoint import checkpoints_in
from hasten.techniques import Technique


def recipe_default(key: str) -> Any:
    """The default recipe's value of dotted `key`: the schema holds each default once, and the loop's plan and
    checkpointing take theirs from it (a Plan or Saving made without a recipe behaves as the default recipe)."""
    return dotted(_DEFAULTS, key)


_DEFAULTS = Recipe().model_dump()

BatchHook = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]
StepHook = Callable[[nn.Module], None]


@dataclass
class Plan:
    """What the loop is asked to do, apart from the objects it drives."""

    epochs: int
    num_classes: int
    tta_flip: bool = False
    tta_translate: int = 0  # pixels: evaluation also averages diagonally shifted copies (hasten/techniques/tta.py)
    thresholds: Sequence[float] = field(default_factory=lambda: tuple(recipe_default("run.thresholds")))
    progress: bool = recipe_default("run.progress")
    accumulate: int = recipe_default("train.accumulate")  # micro-batches per optimizer step (gradient accumulation)
    measure_step_memory: bool = True  # profile one step's peak memory (the run's second optimizer step)
    # a non-finite loss: "raise" (stop, naming the step) or "skip" (no update, counted)
    on_nan: str = recipe_default("train.on_nan")
    rise_steps: int = 0  # optimizer steps of LR warm-up: the training loss is judged against ln(C) after them
    loss: Callable[[Tensor, Tensor], Tensor] = soft_cross_entropy  # (logits, soft targets) -> mean loss
    # clip the global gradient norm to this before each update; None/0: off
    clip_grad_norm: float | None = recipe_default("train.clip_grad_norm")
    eval_every_steps: int = recipe_default("train.eval_every_steps")  # also evaluate every N optimizer steps (0: off)
    # what the divergence warning advises: overrides the run's own recipe accepts (build.divergence_advice)
    divergence_advice: Sequence[str] = ("optim.lr=...",)
    # what a run whose outputs became the same for every class is told to try first (a larger batch); None: nothing
    collapse_advice: str | None = None
    # what a run whose outputs became the same for every test image and class is restarted with, from its first
    # weights (recipe overrides: a larger batch at half the LR), raised as `Collapsed` for hasten.run.build.train to
    # act on; None: such a run goes on to its end and its warning (the settings were the user's, or it restarted)
    restart: dict[str, Any] | None = None
    # the evaluations before the last: "plain", every test image once (no test-time augmentation); "tta": as the last
    mid_eval: str = recipe_default("train.mid_eval")
    clock: Clock = field(default_factory=Clock)  # wall seconds since the command started (hasten/clock.py)
    extension: Extension | None = None  # train.epochs=auto's once-only lengthening (hasten/run/extension.py)
    # the largest class's share of the test and the training images (hasten/run/verdicts.py, chance); None: unknown
    test_chance: float | None = None
    train_chance: float | None = None
    class_names: Sequence[str] = ()  # the classes' names, for the warnings (empty: named by their index)


@dataclass
class Saving:
    """Where and when checkpoints are written; `recipe` is stored in each, so a checkpoint says what it was."""

    folder: Path
    every_epochs: int = recipe_default("run.save_every")  # 0: not at epoch ends
    every_steps: int = recipe_default("run.save_every_steps")  # 0: off
    keep: int = recipe_default("run.keep")  # newest kept, besides the best
    recipe: dict[str, Any] = field(default_factory=dict)
    protect: tuple[Path, ...] = ()  # never pruned: e.g. the checkpoint a run with allowed recipe changes resumed


class Interrupted(HastenError):
    """SIGINT or SIGTERM stopped the run after a checkpoint was written (`when`: at a step boundary), or during its
    start-up before it wrote anything (no checkpoint: resume=auto starts afresh); exit code 128 + the signal number."""

    resumable = True  # no error: the command that made it goes on with resume=auto (the CLI says how)

    def __init__(self, signum: int, checkpoint: Path | None, when: str = "at a step boundary"):
        where = f"; checkpoint {checkpoint}" if checkpoint else ""
        super().__init__(f"stopped by {signal.Signals(signum).name} {when}{where}")
        self.signum, self.exit_code = signum, 128 + signum


class Collapsed(Exception):  # noqa: N818  (a turn of the run, not an error: the user never sees it raised)
    """The loop's word that the model's outputs collapsed, or its training loss barely moved by the end of the LR's
    hold, and the plan allows a restart (`Plan.restart`): `record` says when, why and what was seen
    (hasten/run/verdicts.py, collapsed_outputs; hasten/run/extension.py, stuck); hasten.run.build.train restarts."""

    def __init__(self, record: dict[str, Any]):
        super().__init__(f"outputs {record.get('why', 'collapsed')} at epoch {record.get('at_epoch')}")
        self.record = record

    @classmethod
    def after(cls, state: Any, row: dict[str, float], why: str, wall_seconds: float) -> Collapsed:
        """The word after an epoch (`state`: hasten.run.state.State; `row`: its losses and training accuracy) that
        the run should start again, `why` ("collapsed": its outputs; "barely moved": its training loss at the
        LR's hold's end, hasten/run/extension.py `stuck`), with when (epoch, step, wall seconds) and what was seen."""
        seen = {key: row[key] for key in ("test_loss", "train_loss", "train_accuracy")}
        return cls({"at_epoch": state.epoch, "step": state.step, "why": why, **seen, "wall_seconds": wall_seconds})


class NonFiniteLoss(HastenError):
    """The loss became inf/NaN with `train.on_nan=raise`; the last good checkpoint is kept."""

    exit_code = 1


# what a NonFiniteLoss advises: for a loss that is not finite before any update (the LR has not acted, so the model
# or the data made it), and for a divergence found at an epoch's end
NOT_THE_LR = ("before any update, so not the LR: the model's output or the loss on this batch is not finite (check the "
              "model's forward and the images)")  # fmt: skip
AGAIN = "lower optim.lr, or set train.on_nan=skip to go on regardless"


def kept_note(saving: Saving | None) -> str:
    """Where the last good checkpoint is, for a message; "" when none was written yet."""
    return f"; the last good checkpoint is in {saving.folder}" if saving and checkpoints_in(saving.folder) else ""


@dataclass
class Hooks:
    """What the loop calls and the checkpoint gathers; `from_techniques` fills it from technique objects, so a
    technique's hooks and its state come from one place. Plain callables may be added for tests and tools."""

    on_batch: list[BatchHook] = field(default_factory=list)
    after_step: list[StepHook] = field(default_factory=list)
    eval_model: Callable[[nn.Module], nn.Module] | None = None  # e.g. the EMA copy instead of the live model
    stateful: dict[str, Any] = field(default_factory=dict)  # hooks with state_dict() (EMA, mixing RNG), by name
    rank_local: set[str] = field(default_factory=set)  # names in `stateful` whose state differs per rank
    techniques: list[Technique] = field(default_factory=list)  # the objects the fields above came from

    @classmethod
    def from_techniques(cls, techniques: Sequence[Technique]) -> Hooks:
        """Each technique's loop hooks, as it declares them, and its state under its name."""
        hooks = cls(techniques=list(techniques))
        for technique in techniques:
            if "on_batch" in technique.hooks:
                hooks.on_batch.append(technique.on_batch)
            if "after_step" in technique.hooks:
                hooks.after_step.append(technique.after_step)
            if "eval_model" in technique.hooks:
                if hooks.eval_model is not None:
                    raise TypeError(f"{technique.name}: a second technique that chooses the evaluated model")
                hooks.eval_model = technique.eval_model
            if technique.stateful:
                hooks.stateful[technique.name] = technique
                if technique.rank_local:
                    hooks.rank_local.add(technique.name)
        return hooks
