"""Progressive resizing (Howard, fast.ai's DAWNBench ImageNet entries, 2018; "budgeted training" of the record
holders): early training steps see smaller images, which are cheaper, and the size grows to full by part of
the way through the run, so the model ends trained on, and is always evaluated at, the full size.

The side of each training batch is `start` x the full side at the first optimizer step, growing linearly to the
full side at `until` of the run's optimizer steps, rounded to a multiple of 4 pixels and at least 8 (never above
the full side). Images are resized with antialiased bilinear interpolation (F.interpolate). The model must take
images of any size (global pooling before its head, as hasten's ResNet has); one that cannot is found before
training starts. The technique counts the optimizer steps it has seen, which a checkpoint keeps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from hasten.errors import RecipeError
from hasten.techniques.technique import Context, Switch, Technique

if TYPE_CHECKING:
    from hasten.recipe.schema import Recipe

MULTIPLE = 4  # pixels: sides are rounded to this
SMALLEST = 8  # pixels: no side below this (nor above the full side)


def progressive_side(progress: float, full: int, start: float, until: float) -> int:
    """The side, in pixels, of images whose full side is `full` at `progress` (fraction of optimizer steps done):
    `start` x full at 0, growing linearly to full at `until`, rounded to a multiple of 4, at least 8."""
    if progress >= until:
        return full
    fraction = start + (1 - start) * progress / until
    side = MULTIPLE * int(full * fraction / MULTIPLE + 0.5)  # to the nearest multiple, halves up
    return min(full, max(side, SMALLEST))


def resize_batch(images: Tensor, height: int, width: int) -> Tensor:
    """Float `images` (N, C, H, W) at (height, width): antialiased bilinear; the same tensor when already so."""
    if images.shape[-2:] == (height, width):
        return images
    return nn.functional.interpolate(images, size=(height, width), mode="bilinear", align_corners=False,
                                     antialias=True)  # fmt: skip


class ProgressiveResize(Technique):
    """Batch hook (`train.progressive_resize`: the starting fraction of the side; `train.progressive_until`): each
    training batch resized to `progressive_side` of the run's progress, which `after_step` counts in optimizer
    steps (`Context.total_steps` is the run's). `on_model` tries the model on the smallest images once."""

    # last of the batch hooks: cutout and mixing act at the full size, as their recipe keys give it
    name, hooks, order = "progressive_resize", frozenset({"on_model", "on_batch", "after_step"}), 60
    switches = (Switch("train.progressive_resize", "0", "0.5", "training images grow from a fraction of their side"),)
    stateful = True

    def __init__(self, start: float, until: float, total_steps: int, image_shape: tuple[int, ...] | None = None):
        self.start, self.until, self.total_steps, self.image_shape = start, until, max(total_steps, 1), image_shape
        self.steps = 0  # optimizer steps taken

    @classmethod
    def from_recipe(cls, recipe: Recipe, context: Context) -> ProgressiveResize | None:
        if not recipe.train.progressive_resize:
            return None
        return cls(recipe.train.progressive_resize, recipe.train.progressive_until, context.total_steps,
                   context.image_shape)  # fmt: skip

    def sides(self, height: int, width: int) -> tuple[int, int]:
        progress = self.steps / self.total_steps
        return (progressive_side(progress, height, self.start, self.until),
                progressive_side(progress, width, self.start, self.until))  # fmt: skip

    @torch.no_grad()
    def on_model(self, model: nn.Module) -> None:
        """A model that takes only its full input size (a Linear after a flatten) is a RecipeError now, not a
        shape error at the first step. Runs in eval mode: no batch-norm statistic or random stream changes."""
        if self.image_shape is None:
            return
        channels, height, width = self.image_shape
        small = (progressive_side(0.0, height, self.start, self.until),
                 progressive_side(0.0, width, self.start, self.until))  # fmt: skip
        was_training = model.training
        model.eval()
        try:
            model(torch.zeros(2, channels, height, width))  # a model that fails even at full size: not ours to name
        except Exception:  # noqa: BLE001 - the user's model may raise anything; the model check reports it
            return
        finally:
            model.train(was_training)
        try:
            model.eval()
            model(torch.zeros(2, channels, *small))
        except Exception as error:  # noqa: BLE001 - a shape error, whatever type the model raises it as
            raise RecipeError(
                f"train.progressive_resize: the model cannot take the {small[0]}x{small[1]} images the run starts "
                f"with (it needs {height}x{width}: {type(error).__name__}: {str(error).splitlines()[0]}); give it "
                "global pooling before its head, or set train.progressive_resize=0"
            ) from None
        finally:
            model.train(was_training)

    def on_batch(self, images: Tensor, y_soft: Tensor) -> tuple[Tensor, Tensor]:
        return resize_batch(images, *self.sides(*images.shape[-2:])), y_soft

    def after_step(self, model: nn.Module) -> None:
        self.steps += 1

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = int(state["steps"])
