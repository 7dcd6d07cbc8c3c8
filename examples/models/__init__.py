"""Six models written the way a user writes them, not hasten's own: each file is one family (GroupNorm CNN, a CNN
without normalisation, a small vision transformer, an MLP, a depthwise-separable net, a timm-style ResNet). Each
trains by itself (`python examples/models/vit.py`) and is the model suite of `benchmarks/generalization.py
--models` (docs/results/models.md)."""
