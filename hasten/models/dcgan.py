"""DCGAN generator and discriminator (Radford, Metz and Chintala, "Unsupervised Representation Learning with
Deep Convolutional Generative Adversarial Networks", 2015), sized for 32x32 images.

As in the paper: no pooling (strided convolutions in D, fractionally strided ones in G), batch norm in both
networks except G's output layer and D's input layer, ReLU in G with tanh at its output, LeakyReLU(0.2) in D,
weights drawn from N(0, 0.02). The paper's 64x64 networks have one more stage; at 32x32 the stages are
4 -> 8 -> 16 -> 32. 28x28 images (Fashion-MNIST) are padded to 32x32 with the background value.

D returns logits, not probabilities: the sigmoid lives in the loss (`binary_cross_entropy_with_logits`),
which is numerically stable and safe under autocast; a sigmoid followed by `binary_cross_entropy` is
refused by CUDA autocast as unsafe in 16 bits.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

SIZE = 32  # pixels per side of what G makes and D judges


class Generator(nn.Module):
    """z (N, latent) -> images (N, channels, 32, 32) in [-1, 1]; `width` channels in the last hidden layer."""

    def __init__(self, latent: int = 100, width: int = 64, channels: int = 1):
        super().__init__()
        self.latent = latent

        def up(c_in: int, c_out: int) -> list[nn.Module]:
            return [nn.ConvTranspose2d(c_in, c_out, 4, 2, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(True)]

        self.net = nn.Sequential(
            nn.ConvTranspose2d(latent, 4 * width, 4, 1, 0, bias=False),  # 1x1 -> 4x4
            nn.BatchNorm2d(4 * width),
            nn.ReLU(True),
            *up(4 * width, 2 * width),  # 8x8
            *up(2 * width, width),  # 16x16
            nn.ConvTranspose2d(width, channels, 4, 2, 1, bias=False),  # 32x32, no batch norm at the output
            nn.Tanh(),
        )

    def forward(self, z: Tensor) -> Tensor:
        return self.net(z[:, :, None, None])


class Discriminator(nn.Module):
    """images (N, channels, 32, 32) -> one logit per image (N,); `width` channels in the first layer."""

    def __init__(self, width: int = 64, channels: int = 1):
        super().__init__()

        def down(c_in: int, c_out: int) -> list[nn.Module]:
            return [nn.Conv2d(c_in, c_out, 4, 2, 1, bias=False), nn.BatchNorm2d(c_out), nn.LeakyReLU(0.2, True)]

        self.net = nn.Sequential(
            nn.Conv2d(channels, width, 4, 2, 1, bias=False),  # 16x16, no batch norm at the input
            nn.LeakyReLU(0.2, True),
            *down(width, 2 * width),  # 8x8
            *down(2 * width, 4 * width),  # 4x4
            nn.Conv2d(4 * width, 1, 4, 1, 0, bias=False),  # 1x1: the logit
        )

    def forward(self, images: Tensor) -> Tensor:
        return self.net(images).flatten()


def init_dcgan(module: nn.Module) -> None:
    """The paper's initialisation, for `model.apply`: conv weights N(0, 0.02); batch-norm scales N(1, 0.02)."""
    if isinstance(module, (nn.Conv2d, nn.ConvTranspose2d)):
        nn.init.normal_(module.weight, 0.0, 0.02)
    elif isinstance(module, nn.BatchNorm2d):
        nn.init.normal_(module.weight, 1.0, 0.02)
        nn.init.zeros_(module.bias)


def dcgan(latent: int, width: int, channels: int) -> tuple[Generator, Discriminator]:
    """A generator and a discriminator, initialised as in the paper."""
    generator, discriminator = Generator(latent, width, channels), Discriminator(width, channels)
    generator.apply(init_dcgan)
    discriminator.apply(init_dcgan)
    return generator, discriminator


def padded(images: Tensor) -> Tensor:
    """uint8 images (N, C, 28 or 32, same) zero-padded to SIZE x SIZE (background 0), the size the networks work at."""
    pad = (SIZE - images.shape[-1]) // 2
    return F.pad(images, (pad, pad, pad, pad)) if pad else images


def signed(images: Tensor) -> Tensor:
    """uint8 images as floats in [-1, 1], the range of G's tanh output."""
    return images.float() / 127.5 - 1
