"""A restart for a run whose model's outputs collapsed (hasten/run/verdicts.py, collapsed_outputs), or whose training
loss barely moved by the end of its LR's hold (hasten/run/extension.py, stuck): whether a run may
restart, what it starts again from and with which settings, what it says, and what of the abandoned start is
removed from the run folder. hasten/run/build.py's `train` drives it: the loop raises `Collapsed`, the run starts
again once.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.nn.parameter import UninitializedBuffer, UninitializedParameter

from hasten.engine.distributed import DistEnv, world_size
from hasten.engine.memory import available_memory_bytes
from hasten.recipe.schema import Recipe
from hasten.runfolder.checkpoint import prune
from hasten.runfolder.folder import remove_run_records
from hasten.tune import rules

RESTARTS = "TORCHELASTIC_RESTART_COUNT"  # set by torchrun: how often the workers were restarted
# the start-up phase (summary.json `startup`) that holds an abandoned start: its data, probe, training and evaluation
ABANDONED = "abandoned start"


def may_restart(recipe: Recipe) -> bool:
    """Whether a run whose outputs collapse may restart (`train`): its batch, LR and epochs are hasten's to choose
    (`auto`, unset), it is fresh (no resume) and one process's (a restart rebuilds the run; torchrun's workers
    would each have to agree on it)."""
    asked = recipe.train
    return (
        asked.epochs == "auto"
        and asked.batch_size == "auto"
        and asked.accumulate == 1
        and recipe.optim.lr is None
        and recipe.resume is None
        and DistEnv.from_environ().world_size == 1
        and not int(os.environ.get(RESTARTS, "0"))
    )


FIRST_WEIGHTS_SHARE = 1 / 8  # a model object's first weights are kept for a restart when under this share of memory


def first_weights(model: Any) -> dict[str, Tensor] | bool | None:
    """What a restart starts again from: for the user's model object, a copy of its weights (None, no restart, when
    a lazy layer has none yet or they would take over FIRST_WEIGHTS_SHARE of the memory available); for a model the
    run makes (a class, a function, the recipe's), True: the restart makes it again from the same seed."""
    if not isinstance(model, torch.nn.Module):
        return True
    state = model.state_dict()
    if any(isinstance(value, UninitializedParameter | UninitializedBuffer) for value in state.values()):
        return None
    size = sum(value.numel() * value.element_size() for value in state.values())
    if size > available_memory_bytes() * FIRST_WEIGHTS_SHARE:  # a large model's copy is not worth a restart
        return None
    return {name: value.detach().clone() for name, value in state.items()}


def restart_settings(recipe: Recipe, images: int, budget: int) -> dict[str, Any] | None:
    """The overrides a run whose outputs collapsed restarts with: half its LR, and a batch of COLLAPSE_BATCH when
    it trained at a smaller one and the data holds enough images for that batch's run to take half its `budget` of
    optimizer steps within MAX_EPOCHS (1,200 images at 64: 1,140 of a model without batch norm's 1,200);
    None when the recipe's LR is not a number (`auto`: the range test's own choice)."""
    lr = recipe.optim.lr
    if not isinstance(lr, float | int):
        return None
    batch = recipe.train.batch_size
    # the larger batch where its run, at most MAX_EPOCHS epochs, keeps half the budget's optimizer steps or more
    larger = 2 * rules.MAX_EPOCHS * rules.steps_per_epoch(images, rules.COLLAPSE_BATCH, world_size()) >= budget
    if isinstance(batch, int) and batch < rules.COLLAPSE_BATCH and larger:
        batch = rules.COLLAPSE_BATCH
    return {"train.batch_size": batch, "optim.lr": float(f"{lr / 2:.3g}")}


def collapse_note(record: dict[str, Any]) -> str:
    """What the run says when it restarts: for collapsed outputs, or a training loss that barely moved by the end
    of the LR's hold (`record["why"]`)."""
    settings = " ".join(f"{key}={value:g}" for key, value in record["to"].items())
    then = (
        f"restarting from the first weights at {settings} (a larger batch at half the LR steadies the first steps; "
        "once; recipe.yaml records them, summary.json's `restarted` this start)"
    )
    if record.get("why") == "barely moved":
        return (
            f"epoch {record['at_epoch']}, where the LR's hold ends: the training accuracy is "
            f"{record['train_accuracy']:.1%}, at chance, and the training loss ({record['train_loss']:.4f}) has "
            f"barely left a uniform guess's (ln of the classes) in half the run's steps: a longer hold seldom mends "
            f"that; {then}"
        )
    return (
        f"epoch {record['at_epoch']}: the model's outputs collapsed: every test image got the same output for every "
        f"class (test loss {record['test_loss']:.5f}, ln of the classes) and the training loss is there too "
        f"({record['train_loss']:.5f}), so no gradient reaches the weights and no longer run mends it; {then}"
    )


def discard_start(folder: Path) -> None:
    """Remove what a start that collapsed wrote in its run folder (its checkpoints, which a resume would continue,
    recipe.yaml, metrics.csv, its TensorBoard events): the restart writes them afresh."""
    checkpoints = folder / "checkpoints"
    if checkpoints.is_dir() and not checkpoints.is_symlink():
        prune(checkpoints, keep=0)  # hasten's own alone (hasten/runfolder/checkpoint.py)
    remove_run_records(folder)
