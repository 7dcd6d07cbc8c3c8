"""Every technique hasten has, in one table: the technique objects (each declares its recipe keys, `switches`) and
the settings the run reads itself (precision, memory layout, augmentation, schedule, test-time augmentation,
compile, activation checkpointing, per-layer LRs), each a `Switch`: its recipe key, the value that turns it off,
an example value that turns it on, and what it does in one line.

What lists techniques derives from this table: `hasten bench --ablate` switches off each one the recipe has on
(hasten/experiments/variants.py `ABLATIONS`, in the table's order), and the benchmarks name their chosen ones by
`switch(key)`, so a misspelt key fails at once instead of being skipped. The imports are explicit: importing
hasten.techniques registers every technique class, and tests/techniques/test_registry.py checks that the table
holds each of them and that every switch does what it says. The docs' list of techniques, docs/techniques.md, is
written from it (hasten/techniques/docs.py, `make reference`).
"""

from __future__ import annotations

from hasten.techniques.batchnorm import BatchNormSettings
from hasten.techniques.cutout import Cutout
from hasten.techniques.dirac import DiracInit
from hasten.techniques.ema import EMA
from hasten.techniques.freeze import Freeze
from hasten.techniques.lookahead import Lookahead
from hasten.techniques.mixing import BatchMixing
from hasten.techniques.no_bias_decay import NoBiasDecay
from hasten.techniques.progressive import ProgressiveResize
from hasten.techniques.soft_targets import LabelSmoothing
from hasten.techniques.technique import Switch, Technique
from hasten.techniques.whitening import Whitening
from hasten.techniques.zero_init import ZeroInitResidual

# in the order `hasten bench --ablate` runs them; a class stands for its switches, in its own order
TECHNIQUES: tuple[type[Technique] | Switch, ...] = (
    Switch("precision", "fp32", "bf16", "16-bit autocast math (bf16, fp16) instead of fp32", speed=True),
    Switch("train.channels_last", "false", "true", "channels-last (NHWC) layout of model and batches", speed=True),
    Switch("data.augment.flip", "false", "true", "random horizontal flips of the training batches"),
    Switch("data.augment.translate", "0", "2", "random shifts of the training images by up to N pixels"),
    LabelSmoothing,
    BatchMixing,
    EMA,
    Lookahead,
    Switch("schedule.name", "constant", "one-cycle", "an LR schedule over the run instead of a constant LR"),
    Switch("train.tta_flip", "false", "true", "test-time augmentation: logits averaged with the mirror image's"),
    Switch("train.tta_translate", "0", "1", "test-time augmentation: and with copies shifted N pixels diagonally"),
    ProgressiveResize,
    ZeroInitResidual,
    Whitening,
    DiracInit,
    BatchNormSettings,
    NoBiasDecay,
    Switch("train.compile", "false", "true", "torch.compile of the model (eager where it cannot)", speed=True),
    Cutout,
    Freeze,
    Switch("train.checkpoint_activations", "false", "true", "activations recomputed in backward", speed=True),
    Switch("optim.layer_lr_decay", "1.0", "0.5", "discriminative fine-tuning: each layer down gets decay x the LR"),
    Switch("optim.fan_in_lr", "false", "true", "Adam's LR by fan-in: a weight reading over 576 inputs at 576 / fan-in"),
    Switch("optim.layer_scale_lr", "1", "10", "Adam's LR x 10 on layer scales (parameters starting at one tiny value)"),
)

SWITCHES: tuple[Switch, ...] = tuple(
    switch for item in TECHNIQUES for switch in (item.switches if isinstance(item, type) else (item,))
)
CLASSES: tuple[type[Technique], ...] = tuple(item for item in TECHNIQUES if isinstance(item, type))
_BY_KEY = {s.key: s for s in SWITCHES}
_OWNER = {s.key: cls for cls in CLASSES for s in cls.switches}


def switch(key: str) -> Switch:
    """The switch of recipe key `key`; KeyError naming the known keys when no technique has it."""
    if key not in _BY_KEY:
        raise KeyError(f"{key!r} switches no technique (hasten/techniques/registry.py); those that do: {list(_BY_KEY)}")
    return _BY_KEY[key]


def technique_of(key: str) -> type[Technique] | None:
    """The technique class that recipe key `key` turns on; None for a setting the run reads itself."""
    return _OWNER.get(switch(key).key)
