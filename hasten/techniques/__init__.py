"""The bag of tricks (He et al., "Bag of Tricks for Image Classification", 2019): each a pure function plus
a thin adapter that plugs it into the loop at a named hook point (`on_batch`, `after_step`, `eval_model`)."""

import importlib
import pkgutil

from hasten.engine.loss import one_hot, soft_cross_entropy
from hasten.models.resnet import zero_init_residual
from hasten.techniques.ema import EMA, ema_update, warmup_decay
from hasten.techniques.lookahead import Lookahead, lookahead_update
from hasten.techniques.mixing import BatchMixing, cutmix, cutmix_box, mixup
from hasten.techniques.no_bias_decay import NoBiasDecay, param_groups
from hasten.techniques.soft_targets import LabelSmoothing, smooth
from hasten.techniques.technique import Context, Technique, techniques
from hasten.techniques.zero_init import ZeroInitResidual

# every module of this package is imported, so each technique defined in one registers itself: a new one is
# its module, its recipe section and its test, with no list to extend here
for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "EMA",
    "BatchMixing",
    "Context",
    "LabelSmoothing",
    "Lookahead",
    "NoBiasDecay",
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
    "techniques",
    "warmup_decay",
    "zero_init_residual",
]
