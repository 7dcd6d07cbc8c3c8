"""The bag of tricks (He et al., "Bag of Tricks for Image Classification", 2019): each a pure function plus
a thin adapter that plugs it into the loop at a named hook point."""

from hasten.tricks.soft_targets import one_hot, smooth, soft_cross_entropy

__all__ = ["one_hot", "smooth", "soft_cross_entropy"]
