"""The bag of tricks (He et al., "Bag of Tricks for Image Classification", 2019): each a pure function plus
a thin adapter that plugs it into the loop at a named hook point (`on_batch`, `after_step`, `eval_model`).
Every technique, with the recipe key that turns it on and off, is listed in hasten/techniques/registry.py
(`TECHNIQUES`); importing this package imports each one."""

from hasten.engine.loss import one_hot, soft_cross_entropy
from hasten.models.resnet import zero_init_residual
from hasten.techniques.ema import EMA, ema_update, warmup_decay
from hasten.techniques.lookahead import Lookahead, lookahead_update
from hasten.techniques.mixing import BatchMixing, cutmix, cutmix_box, mixup
from hasten.techniques.no_bias_decay import NoBiasDecay, param_groups
from hasten.techniques.registry import SWITCHES, TECHNIQUES, switch, technique_of
from hasten.techniques.soft_targets import LabelSmoothing, smooth
from hasten.techniques.technique import Context, Switch, Technique, techniques
from hasten.techniques.zero_init import ZeroInitResidual

__all__ = [
    "EMA",
    "SWITCHES",
    "TECHNIQUES",
    "BatchMixing",
    "Context",
    "LabelSmoothing",
    "Lookahead",
    "NoBiasDecay",
    "Switch",
    "Technique",
    "ZeroInitResidual",
    "cutmix",
    "cutmix_box",
    "ema_update",
    "lookahead_update",
    "mixup",
    "one_hot",
    "param_groups",
    "smooth",
    "soft_cross_entropy",
    "switch",
    "technique_of",
    "techniques",
    "warmup_decay",
    "zero_init_residual",
]
