"""`hasten train`: a recipe, in this process or data-parallel over several through torchrun's launcher."""

from __future__ import annotations

import argparse
import os

from hasten.cli.command import RECIPE_ARGUMENTS, Command, arg, recipe_of, show
from hasten.cli.results import results_table
from hasten.errors import HastenError


def cmd_train(ns: argparse.Namespace) -> int:
    recipe = recipe_of(ns)  # recipe errors show before torch and the data are loaded
    if ns.devices < 1 or ns.max_restarts < 0:
        raise HastenError("--devices must be at least 1 and --max-restarts at least 0")
    under_torchrun = "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_RANK" in os.environ
    if ns.devices > 1 or ns.max_restarts:
        if under_torchrun:
            raise HastenError("--devices/--max-restarts: this process was started by torchrun; give them to torchrun")
        return _launch(recipe.device, ns.devices, ["train", *ns.args], ns.max_restarts, ns.started)
    from hasten.clock import Clock
    from hasten.engine.distributed import is_main
    from hasten.run.build import train

    summary = train(recipe, clock=Clock(ns.started))  # wall-clock times count from the command's start
    if is_main():  # every rank has the same results; one prints them
        show(summary, recipe.run.progress, results_table)
    return 0


def _launch(device: str, devices: int, args: list[str], max_restarts: int, started: float) -> int:
    """`devices` worker processes of `hasten ARGS` through torchrun's launcher, one per GPU on CUDA."""
    from hasten.clock import COMMAND_STARTED_ENV, started_epoch
    from hasten.engine.distributed import launch
    from hasten.machine import current

    machine = current()  # the GPUs and cores the ranks are laid on: this machine's, or HASTEN_MACHINE's profile's
    gpu = machine.gpu if machine.gpu is not None and machine.gpu.kind == "cuda" else None
    gpus = gpu.count if gpu is not None and (device in ("auto", "cuda") or device.startswith("cuda")) else 0
    if device.startswith("cuda") and devices > gpus:
        raise HastenError(f"--devices {devices}: this machine has {gpus} CUDA device(s)")
    if device == "auto" and 0 < gpus < devices:
        raise HastenError(f"--devices {devices}: this machine has {gpus} CUDA device(s); use device=cpu for CPU ranks")
    cpus = machine.cores
    if (device == "cpu" or (device == "auto" and gpus == 0)) and devices > cpus:  # each rank is a whole process
        raise HastenError(
            f"--devices {devices}: this machine has {cpus} CPU core(s) for this process; CPU ranks beyond that only "
            f"share them (and each takes its own memory): use at most --devices {cpus}"
        )
    previous = os.environ.get(COMMAND_STARTED_ENV)
    os.environ[COMMAND_STARTED_ENV] = repr(started_epoch(started))  # the workers' clocks start with this command
    try:
        return launch(devices, args, max_restarts=max_restarts)
    finally:  # a caller in this process (a test, a script) does not inherit it
        if previous is None:
            os.environ.pop(COMMAND_STARTED_ENV, None)
        else:
            os.environ[COMMAND_STARTED_ENV] = previous


def _train_notes() -> str:
    """The end of `hasten train --help`: what RECIPE may be, read from the package, and the common forms."""
    from hasten.recipe.gan import DEFAULT_GAN_RECIPE
    from hasten.recipe.schema import shipped_recipes

    recipes = [name for name in shipped_recipes() if name != DEFAULT_GAN_RECIPE]
    return "\n".join([
        "shipped recipes (RECIPE by name; without one, default):",
        f"  {', '.join(recipes)}",
        f"  ({DEFAULT_GAN_RECIPE} is a GAN's: hasten gan {DEFAULT_GAN_RECIPE})",
        "",
        "examples:",
        "  hasten train fashion-fast precision=bf16 optim.lr=0.2",
        "  hasten train my-recipe.yaml run.dir=runs/try1",
        "  hasten train path/to/folder",
        "      your own images, in path/to/folder/train/<class>/* and path/to/folder/val/<class>/*, with the "
        "default recipe (the same as data.name=imagefolder data.root=path/to/folder)",
        "  hasten train fashion-fast resume=auto",
        "      continue an interrupted run from the newest complete checkpoint in its run.dir (the command an "
        "interrupted run prints)",
    ])  # fmt: skip


TRAIN = Command(
    name="train",
    summary="train a recipe",
    description="Train RECIPE (a shipped recipe's name, a YAML file, or a folder of images) with dotted "
    "key=value overrides, e.g. 'hasten train fashion-fast precision=bf16 optim.lr=0.2'.",
    arguments=(
        RECIPE_ARGUMENTS,
        arg(
            "--devices",
            type=int,
            default=1,
            metavar="N",
            help="data-parallel over N processes on this machine (one per GPU; gloo on CPU), started through "
            "torchrun's launcher; for several machines run torchrun yourself (docs/guide/distributed.md)",
        ),
        arg(
            "--max-restarts",
            type=int,
            default=0,
            metavar="K",
            help="with --devices: restart the workers up to K times after a failure, resuming from the last checkpoint",
        ),
    ),
    run=cmd_train,
    notes=_train_notes,
    resumable=True,
)
