"""A technique is one object: it says, in one place, which of the run's hook points it uses, what it checkpoints,
and when the recipe turns it on (Composer's algorithm objects, kept plain).

Hook points, in the order a run meets them:

- `on_model(model)`: once the model is built, before it moves to its device and precision and before pretrained
  weights are loaded (zero-init, Dirac init, batch-norm settings, whitening; progressive resizing tries the model
  on its smallest images).
- `param_groups(groups) -> groups`: the optimizer's parameter groups, before the optimizer is made
  (no-bias-decay).
- `on_optimizer(model)`: once the optimizer holds the parameters, with the model as it will be trained (on its
  device, in its precision): the EMA takes its copy, Freeze freezes.
- `on_batch(images, y_soft) -> (images, y_soft)`: before each training forward pass (label smoothing, mixup,
  cutmix, progressive resizing).
- `after_step(model)`: after each optimizer step that was taken (EMA, Freeze).
- `eval_model(model) -> model`: the model evaluation sees (the EMA's average).

A technique with `stateful = True` has `state_dict()`/`load_state_dict()`; its state is checkpointed under
`state["hooks"][name]`, or per rank (`state["ranks"][r]["hooks"][name]`) when `rank_local` (a random stream that
differs per rank). `from_recipe` returns the object when the recipe turns it on, else None, and `switches` names
the recipe keys that do so (a `Switch` each: the key, its off value, an example on value). Defining a subclass
registers it: `techniques(recipe, context)` makes every one the recipe turns on, so no way of building a run can
forget its hooks or its state. hasten's own are listed in hasten/techniques/registry.py, the one table of every
technique (with the settings the run reads itself), which the ablations and benchmarks derive from.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from torch import Tensor, nn

if TYPE_CHECKING:
    from hasten.recipe.schema import Recipe

HOOK_POINTS = frozenset({"on_model", "param_groups", "on_optimizer", "on_batch", "after_step", "eval_model"})


@dataclass(frozen=True)
class Switch:
    """A recipe key that turns a technique on: the value that turns it off and an example value that turns it on,
    as a command line writes them (`tricks.mixup=0`, `tricks.mixup=0.2`), and what it does, in one line.
    `speed`: it computes the same training faster or in less memory (precision, layout, compile, recomputation)
    rather than changing what is trained; a plain baseline in hasten's own loop keeps those."""

    key: str
    off: str
    on: str
    what: str
    speed: bool = False

    @property
    def switched_off(self) -> str:
        """The override that turns the technique off: `KEY=OFF`."""
        return f"{self.key}={self.off}"

    @property
    def switched_on(self) -> str:
        """The override that turns it on, with the example value: `KEY=ON`."""
        return f"{self.key}={self.on}"

    def override(self, value: str) -> str:
        """The override that sets the key to `value` (another on value than the example): `KEY=VALUE`."""
        return f"{self.key}={value}"


@dataclass(frozen=True)
class Context:
    """What a technique may need from the run besides the recipe."""

    rank: int = 0  # this process's rank: random streams differ per rank
    world_size: int = 1
    steps_per_epoch: int = 1  # optimizer steps per epoch (Freeze counts epochs in steps)
    total_steps: int = 1  # optimizer steps in the whole run (progressive resizing's progress)
    image_shape: tuple[int, int, int] | None = None  # (C, H, W) of the training images; None: not known
    # recomputes a model's batch-norm statistics on training batches (the EMA's average before evaluation)
    calibrate: Callable[[nn.Module], None] | None = None
    # the first N training images, normalised as the loader does, not augmented: float (N, C, H, W) (whitening)
    train_images: Callable[[int], Tensor] | None = None


class Technique:
    """Base of every technique: the hook points it uses (`hooks`), its checkpoint key (`name`), whether it has
    state (`stateful`) and whether that state differs per rank (`rank_local`). The default methods do nothing;
    a subclass overrides those it lists in `hooks` (checked when the class is defined)."""

    name: ClassVar[str] = ""
    hooks: ClassVar[frozenset[str]] = frozenset()
    stateful: ClassVar[bool] = False
    rank_local: ClassVar[bool] = False
    # where among the techniques its hooks run; only for bitwise reproducibility: the soft-target hooks
    # commute mathematically (label smoothing is affine, mixing a convex blend), not in floating point
    order: ClassVar[int] = 50
    # the recipe keys that turn it on (any one of them); hasten's techniques all have one at least
    switches: ClassVar[tuple[Switch, ...]] = ()

    registry: ClassVar[list[type[Technique]]] = []

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        unknown = cls.hooks - HOOK_POINTS
        if unknown:
            raise TypeError(f"{cls.__name__}: unknown hook point(s) {sorted(unknown)}; known: {sorted(HOOK_POINTS)}")
        missing = [point for point in cls.hooks if getattr(cls, point) is getattr(Technique, point)]
        if missing or not cls.name:
            raise TypeError(f"{cls.__name__}: needs a name and its hook point(s) {missing} defined")
        if cls.stateful and cls.state_dict is Technique.state_dict:
            raise TypeError(f"{cls.__name__}: stateful, but defines no state_dict()/load_state_dict()")
        Technique.registry.append(cls)

    @classmethod
    def from_recipe(cls, recipe: Recipe, context: Context) -> Technique | None:
        """The technique as the recipe configures it; None when the recipe leaves it off."""
        return None

    def on_model(self, model: nn.Module) -> None:
        pass

    def param_groups(self, groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return groups

    def on_optimizer(self, model: nn.Module) -> None:
        pass

    def on_batch(self, images: Tensor, y_soft: Tensor) -> tuple[Tensor, Tensor]:
        return images, y_soft

    def after_step(self, model: nn.Module) -> None:
        pass

    def eval_model(self, model: nn.Module) -> nn.Module:
        return model

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def techniques(recipe: Recipe, context: Context) -> list[Technique]:
    """Every registered technique the recipe turns on, in hook order; checkpoint names must be unique."""
    made = [t for cls in sorted(Technique.registry, key=lambda c: c.order) if (t := cls.from_recipe(recipe, context))]
    names = [t.name for t in made]
    if len(set(names)) != len(names):
        raise TypeError(f"two techniques share a checkpoint name: {names}")
    return made
