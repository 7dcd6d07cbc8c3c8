"""Whether a model's only spatial layer is a patch embedding, which `data.augment.translate: auto` reads.

A vision transformer or an MLP-Mixer cuts each image into patches with one convolution whose kernel is its stride
(4x4 patches, stride 4) and mixes the patches' features from there with attention or MLPs: nothing after the cut
slides over the image. A shift of one pixel then changes the contents of every patch, and no later layer shares what
it learnt at one offset with the next; the model has to learn each shifted view from the data. A CNN's convolutions
slide, so a shifted image gives shifted features and the shift costs it little to learn. So a patch model gets
shifts only in runs long enough to see each shifted view about once (hasten.tune.rules.patch_shift_epochs): in a
short run they cost a small ViT accuracy, in a long one they regularise it (docs/defaults.md, "Shifts and
patches").

Read from the modules only (before any step, lazy ones included: a convolution's kernel and stride are set when it
is made): the patch embedding is the one convolution whose kernel equals its stride, at least 2 on every side, with
no padding, dilation or groups; every other convolution is 1x1 and no pooling module has a window over one pixel.
A patch cut some other way (`Tensor.unfold`, a reshape) is not seen.
"""

from __future__ import annotations

from torch import nn

POOLS = (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d, nn.LPPool1d,
         nn.LPPool2d)  # fmt: skip


def _is_patch_cut(conv: nn.modules.conv._ConvNd) -> bool:
    kernel, stride = tuple(conv.kernel_size), tuple(conv.stride)
    unpadded = conv.padding == "valid" or (not isinstance(conv.padding, str) and not any(conv.padding))
    return (kernel == stride and min(kernel) >= 2 and unpadded and conv.groups == 1
            and all(d == 1 for d in conv.dilation))  # fmt: skip


def _spans(size: object) -> bool:
    """Whether a pooling window of `size` covers more than one pixel."""
    sides = size if isinstance(size, tuple | list) else (size,)
    return any(side is not None and side > 1 for side in sides)


def patch_side(model: nn.Module) -> int:
    """The side of the patches `model` cuts its images into, where that cut is its only spatial layer (a vision
    transformer's or an MLP-Mixer's patch embedding); 0 for a model with any other spatial layer (a CNN, a
    ConvNeXt or ConvMixer whose depthwise convolutions slide over the patches) or with no convolution at all."""
    convs = [m for m in model.modules() if isinstance(m, nn.modules.conv._ConvNd)]
    cuts = [m for m in convs if _is_patch_cut(m)]
    if len(cuts) != 1:
        return 0
    if any(max(m.kernel_size) > 1 for m in convs if m is not cuts[0]):
        return 0
    if any(_spans(m.kernel_size) for m in model.modules() if isinstance(m, POOLS)):
        return 0
    return min(cuts[0].kernel_size)
