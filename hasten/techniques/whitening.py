"""Patch-whitening initialisation of the first convolution (Coates & Ng, "Learning Feature Representations with
K-means", 2012; used frozen in Page's ResNet-9 "How to train your ResNet" part 8 and in Keller Jordan's airbench
CIFAR-10 speed records): the first conv's filters are the eigenvectors of the covariance of the training images'
k x k patches, each scaled by 1/sqrt(eigenvalue + eps), so its outputs are decorrelated with unit variance from
the first step. The network then need not learn its first layer, which is frozen.

The rule for filling the conv (`model.whiten`): a patch of C channels and a k x k kernel has D = C*k*k
directions; each gives a +v, -v pair of filters (so a ReLU after the conv passes both signs), the strongest
directions first: filters 2i and 2i+1 are +v_i and -v_i. (airbench puts all the + filters before all the -
ones; pairs keep both signs of the strongest directions when the conv has fewer than 2D filters.)
- out_channels <= 2D: every filter is set; the weight is frozen (requires_grad=False) and its bias, if any, is
  zeroed and frozen. Frozen parameters stay out of the optimizer, so they get no update and no weight decay.
- out_channels > 2D: the first 2D filters are set, the rest keep their default init, and the conv (bias zeroed)
  stays trainable: a parameter cannot be half frozen, and freezing filters that were never set would leave them
  random for ever. A note says so.
The patches are the conv's own kernel-size windows at stride 1 without padding (padding would add patches of
zeros that are not in the data), from the first `model.whiten_images` training images, normalised as the
loader does and not augmented.

Skipped with a note: a model without Conv2d, a grouped or dilated first conv, a first conv whose input channels
are not the images', images smaller than the kernel, and `model.pretrained` (the pretrained conv wins).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hasten.progress import say
from hasten.techniques.technique import Context, Switch, Technique

if TYPE_CHECKING:
    from hasten.recipe.schema import Recipe


MAX_PATCHES = 1 << 22  # patches the covariance is taken over at most (4.2M)
PATCH_CHUNK = 1 << 16  # patches summed at a time, in float64 (64K x 27 values: 14 MB for 3x3 RGB)


def whitening_filters(patches: Tensor, out_channels: int, eps: float) -> Tensor:
    """Whitening filters from `patches` (N, D): the eigenvectors v_i of the patches' covariance, largest
    eigenvalue first, each signed so its largest entry is positive and divided by sqrt(eigenvalue + eps), laid
    out as +v_0, -v_0, +v_1, -v_1, ...; min(out_channels, 2D) rows of D values (float32). The sums are taken in
    float64 a chunk of rows at a time (millions of patches: a float64 copy of all would double the memory)."""
    dim = patches.shape[1]
    total, products = torch.zeros(dim, dtype=torch.float64), torch.zeros(dim, dim, dtype=torch.float64)
    for chunk in patches.split(PATCH_CHUNK):
        chunk = chunk.double().cpu()
        total += chunk.sum(0)
        products += chunk.T @ chunk
    return filters_from_moments(len(patches), total, products, out_channels, eps)


def windows_per_image(images: Tensor, kernel_size: tuple[int, int]) -> int:
    """How many `kernel_size` windows (stride 1, no padding) one image of `images` (N, C, H, W) has; at least 1."""
    return max(1, (images.shape[2] - kernel_size[0] + 1) * (images.shape[3] - kernel_size[1] + 1))


def image_moments(images: Tensor, kernel_size: tuple[int, int]) -> tuple[int, Tensor, Tensor]:
    """The count, sum (D,) and sum of outer products (D, D) of every `kernel_size` window of `images` (N, C, H, W)
    at stride 1 without padding, in float64: what `whitening_filters(image_patches(images, kernel_size))` sums, a
    chunk of images at a time. The windows of a chunk stay in the (images, D, windows) layout unfold gives, multiplied
    as one batched product: on a 2-core AVX2 CPU, 1,200 RGB images of 32x32 took a third of the time of unfolding
    them all into one (N * windows, D) matrix and multiplying that, and the memory is one chunk's."""
    windows = windows_per_image(images, kernel_size)
    dim = images.shape[1] * kernel_size[0] * kernel_size[1]
    total, products = torch.zeros(dim, dtype=torch.float64), torch.zeros(dim, dim, dtype=torch.float64)
    for part in images.split(max(1, PATCH_CHUNK // windows)):
        chunk = F.unfold(part.float(), kernel_size).double().cpu()  # (n, D, windows)
        total += chunk.sum((0, 2))
        products += torch.bmm(chunk, chunk.transpose(1, 2)).sum(0)
    return len(images) * windows, total, products


def filters_from_moments(count: int, total: Tensor, products: Tensor, out_channels: int, eps: float) -> Tensor:
    """`whitening_filters` from the patches' count, float64 sum and sum of outer products."""
    dim = total.shape[0]
    mean = total / count
    covariance = (products - count * torch.outer(mean, mean)) / max(count - 1, 1)
    eigenvalues, eigenvectors = torch.linalg.eigh(covariance)  # ascending
    eigenvalues, eigenvectors = eigenvalues.flip(0), eigenvectors.flip(1)
    # an eigenvector's sign is the solver's choice: fixed here (largest entry positive), so the filters are the
    # same on every machine
    largest = eigenvectors.abs().argmax(0)
    eigenvectors = eigenvectors * eigenvectors[largest, torch.arange(dim)].sign()
    scaled = eigenvectors.T / torch.sqrt(eigenvalues.clamp(min=0) + eps)[:, None]  # row i: v_i / sqrt(l_i + eps)
    pairs = torch.stack([scaled, -scaled], dim=1).reshape(-1, dim)  # +v_0, -v_0, +v_1, ...
    return pairs[:out_channels].float()


def image_patches(images: Tensor, kernel_size: tuple[int, int]) -> Tensor:
    """Every `kernel_size` window of `images` (N, C, H, W) at stride 1, no padding: (N * windows, C*kh*kw), in
    the layout of a Conv2d weight (out, C, kh, kw) flattened."""
    windows = F.unfold(images.float(), kernel_size)  # (N, C*kh*kw, L)
    return windows.transpose(1, 2).reshape(-1, windows.shape[1])


def first_conv(model: nn.Module) -> tuple[str, nn.Conv2d] | None:
    """The model's first Conv2d in module order, with its name; None when it has none."""
    return next(((name, m) for name, m in model.named_modules() if isinstance(m, nn.Conv2d)), None)


def whiten_first_conv(model: nn.Module, images: Tensor, eps: float) -> str:
    """Set the first conv's filters from `images` (normalised, N x C x H x W) as the module docstring says;
    returns what was done, or why nothing was (starting "skipped")."""
    found = first_conv(model)
    if found is None:
        return "skipped: the model has no Conv2d"
    name, conv = found
    if conv.groups != 1 or conv.dilation != (1, 1):
        return f"skipped: the first conv ({name}) is grouped or dilated; its filters are not image patches"
    if conv.in_channels != images.shape[1]:
        return f"skipped: the first conv ({name}) takes {conv.in_channels} channels, the images have {images.shape[1]}"
    kh, kw = conv.kernel_size
    if images.shape[2] < kh or images.shape[3] < kw:
        return f"skipped: the images are smaller than the first conv's ({name}) {kh}x{kw} kernel"
    filters = filters_from_moments(*image_moments(images, (kh, kw)), conv.out_channels, eps)
    filled = len(filters)
    with torch.no_grad():
        conv.weight[:filled] = filters.view(filled, conv.in_channels, kh, kw).to(conv.weight)
        if conv.bias is not None:
            conv.bias.zero_()
    if filled < conv.out_channels:
        return (
            f"{name}: {filled} of {conv.out_channels} filters whitened (a {conv.in_channels}x{kh}x{kw} patch has "
            f"{filled // 2} directions, 2 filters each); the rest keep their init and the conv stays trainable"
        )
    conv.requires_grad_(False)
    return f"{name}: {filled} whitening filters from {len(images):,} images, frozen"


class Whitening(Technique):
    """Model hook (`model.whiten`): whitens the first conv from the run's training images (`Context.train_images`)
    once the model is built; prints what it did or why it skipped."""

    name, hooks, order = "whitening", frozenset({"on_model"}), 3  # after Dirac init: the first conv is its
    switches = (Switch("model.whiten", "false", "true", "the first conv whitens image patches, frozen"),)

    def __init__(self, train_images: Callable[[int], Tensor] | None, images: int, eps: float, pretrained: bool):
        self.train_images, self.images, self.eps, self.pretrained = train_images, images, eps, pretrained

    @classmethod
    def from_recipe(cls, recipe: Recipe, context: Context) -> Whitening | None:
        cfg = recipe.model
        if cfg.whiten is not True:  # false, or `auto` not decided (resolve decides it for a run)
            return None
        return cls(context.train_images, cfg.whiten_images, cfg.whiten_eps, pretrained=bool(cfg.pretrained))

    def on_model(self, model: nn.Module) -> None:
        if self.pretrained:
            note = "skipped: model.pretrained is set, and its first conv wins"
        elif self.train_images is None:
            note = "skipped: this run gives its techniques no training images"
        else:
            count, capped = self.images, ""
            found = first_conv(model)
            if found is not None:  # a bounded sample: large images have hundreds of thousands of patches each
                windows = windows_per_image(self.train_images(1), found[1].kernel_size)
                if count * windows > MAX_PATCHES:
                    count = max(1, MAX_PATCHES // windows)
                    capped = f" (at most {MAX_PATCHES:,} patches: {count:,} of model.whiten_images={self.images:,})"
            note = whiten_first_conv(model, self.train_images(count), self.eps) + capped
        say(f"model.whiten: {note}")
