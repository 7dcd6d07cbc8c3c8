"""The bag of tricks (He et al., "Bag of Tricks for Image Classification", 2019): each a pure function plus
a thin adapter that plugs it into the loop at a named hook point (`on_batch`, `after_step`, `eval_model`)."""

from hasten.tricks.ema import EMA, ema_update, warmup_decay
from hasten.tricks.mixing import BatchMixing, cutmix, cutmix_box, mixup
from hasten.tricks.no_bias_decay import param_groups
from hasten.tricks.soft_targets import LabelSmoothing, one_hot, smooth, soft_cross_entropy
from hasten.tricks.zero_init import zero_init_residual

__all__ = [
    "EMA",
    "BatchMixing",
    "LabelSmoothing",
    "cutmix",
    "cutmix_box",
    "ema_update",
    "mixup",
    "one_hot",
    "param_groups",
    "smooth",
    "soft_cross_entropy",
    "warmup_decay",
    "zero_init_residual",
]
