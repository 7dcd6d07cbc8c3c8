"""The user's own model, beside the recipe: from Python (`hasten.train(recipe, model=...)`) or from YAML by import
path (`model.name=import model.target=pkg.mod:fn model.args={...}`), the `class_path`/`init_args` idea of
LightningCLI; and the check, before training starts, that it maps the data's images to its classes' logits.
"""

from __future__ import annotations

import inspect
import math
import re
import time
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from hasten.errors import RecipeError, their_error
from hasten.progress import say
from hasten.recipe.schema import ModelConfig
from hasten.recipe.trust import call_target, import_target


def own_model(config: ModelConfig, model: Any, image_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """The user's model: `model`, an nn.Module or a callable returning one (a class, a factory: called after the
    run's seed is set, with model.args and num_classes / in_channels / image_size when it takes them), or with None the
    recipe's model.target called with model.args (and those three the same way). Zero-init applies where the
    model has residual blocks ending in batch norm; elsewhere a note says it was skipped."""
    key = "model"
    if model is None:
        if config.name != "import":
            raise RecipeError(
                "model.name=object: this run's model was a Python object; pass it again: hasten.train(..., model=...)"
            )
        model, key = import_target(config.target or "", "model.target"), f"model.target={config.target}"
    if isinstance(model, nn.Module) and config.args:
        raise RecipeError(
            f"model.args ({', '.join(config.args)}): the model given is an nn.Module already built, which takes no "
            "arguments; give its class or a function making it (model=Net), and model.args are passed to it"
        )
    if not isinstance(model, nn.Module):
        model = call_target(model, config.args, key, **shape_args(model, image_shape, num_classes, key))
    if not isinstance(model, nn.Module):
        raise RecipeError(f"{key}: expected an nn.Module (or a callable returning one), got {type(model).__name__}")
    model = unwrapped(model, key, announce=True)
    if not any(p.requires_grad for p in model.parameters()):
        raise RecipeError(f"{key}: the model {type(model).__name__} has no trainable parameters")
    if has_lazy_parameters(model):  # nn.LazyLinear and kin: their shapes come from a first forward pass
        check_model(model, image_shape, num_classes, torch.device("cpu"))
    if config.zero_init_residual:
        from hasten.models.resnet import zero_init_residual

        if not zero_init_residual(model):
            say(
                f"model.zero_init_residual: {type(model).__name__} has no residual blocks ending in batch norm "
                "(hasten.models.Residual, or a module with a `last_bn` BatchNorm attribute); skipped"
            )
    return model


def unwrapped(model: nn.Module, key: str, announce: bool = False) -> nn.Module:
    """The module inside a wrapper the user put around their model: torch.compile's (hasten compiles with
    train.compile), DataParallel's or DistributedDataParallel's (hasten runs its own processes); its weights are the
    module's (the wrapper's names carry a prefix). A TorchScript module is refused: its copies (the probe's, the
    EMA's) do not train as it does, and its Python module is gone. `announce`: say what was unwrapped."""
    if isinstance(model, torch.jit.ScriptModule):
        raise RecipeError(
            f"{key}: {type(model).__name__} is a TorchScript module (torch.jit.script or trace), which hasten does not "
            "train; give the nn.Module it was made from (hasten export writes the trained model to ONNX)"
        )
    wrappers = []
    while True:
        if type(model).__name__ == "OptimizedModule" and isinstance(getattr(model, "_orig_mod", None), nn.Module):
            wrappers.append("torch.compile's wrapper (train.compile=true compiles it in the run)")
            model = model._orig_mod
        elif isinstance(model, nn.DataParallel | nn.parallel.DistributedDataParallel):
            wrappers.append(f"{type(model).__name__} (hasten runs several processes itself: hasten train --devices N)")
            model = model.module
        else:
            break
    if wrappers and announce:
        say(f"{key}: trains the {type(model).__name__} inside {' inside '.join(reversed(wrappers))}")
    return model


# the names a model's constructor takes its class count and its input channels by (shape_args)
CLASS_NAMES = ("num_classes", "n_classes", "nclasses", "num_labels", "nb_classes", "num_class", "n_class")
CHANNEL_NAMES = ("in_channels", "in_chans", "n_channels", "input_channels", "in_ch", "num_channels")


def shape_args(target: Any, image_shape: tuple[int, ...], num_classes: int, key: str) -> dict[str, Any]:
    """What the data says the model takes in and puts out, under the names models use for it: hasten's
    (`num_classes`, `in_channels`, `image_size`), timm's (`in_chans`, `img_size`), Hugging Face's `num_labels`, and
    the other spellings tutorials use (`n_classes`, `nclasses`, `nb_classes`, `num_class`, `n_class`, and `classes`
    where it is a count: an int default or annotation, or required and unannotated; `n_channels`, `input_channels`,
    `in_ch`, `num_channels`);
    `call_target` passes those the model's signature names. The image size is (H, W), or the side alone where the
    model's parameter has an int default or annotation (`image_size=28`, `img_size: int`) and the images are
    square."""
    size = tuple(image_shape[1:])
    shape: dict[str, Any] = dict.fromkeys(CLASS_NAMES, num_classes) | dict.fromkeys(CHANNEL_NAMES, image_shape[0])
    try:
        parameters = inspect.signature(target).parameters
    except (TypeError, ValueError):
        parameters = {}
    counted = parameters.get("classes")  # Keras' and segmentation_models' spelling, where it is a count
    if counted is not None and (
        (counted.default is counted.empty and counted.annotation in (counted.empty, int, "int"))
        or (isinstance(counted.default, int) and not isinstance(counted.default, bool))
        or counted.annotation in (int, "int")
    ):
        shape["classes"] = num_classes
    for name in ("image_size", "img_size"):
        parameter = parameters.get(name)
        wants_int = parameter is not None and (
            (isinstance(parameter.default, int) and not isinstance(parameter.default, bool))
            or parameter.annotation in (int, "int")
        )
        if wants_int and size[0] != size[1]:
            raise RecipeError(
                f"{key}: {getattr(target, '__qualname__', target)} takes {name} as one side (an int), but the images "
                f"are {size[0]} x {size[1]}: set data.size to train at a square size, or let {name} take (H, W)"
            )
        shape[name] = size[0] if wants_int else size
    return shape


def has_lazy_parameters(model: nn.Module) -> bool:
    """Whether `model` has parameters or buffers a lazy module (nn.LazyLinear, nn.LazyConv2d, ...) has not shaped
    yet: they take their shapes from the first batch, so the model is given one (`check_model`) before anything
    counts, copies or moves them."""
    return any(isinstance(t, nn.parameter.UninitializedTensorMixin) for t in [*model.parameters(), *model.buffers()])


def weight_dtypes_besides_float32(model: nn.Module) -> list[str]:
    """The floating-point dtypes of the model's weights other than float32 ("float64" after a `.double()`), sorted."""
    return sorted(
        {str(p.dtype).removeprefix("torch.") for p in model.parameters() if p.is_floating_point()} - {"float32"}
    )


def _dtype_hint(model: nn.Module) -> str:
    """For a model whose weights are not float32 (a `.double()` or `.half()` on it): the key that sets the
    precision instead, as the images come in float32."""
    kinds = weight_dtypes_besides_float32(model)
    if not kinds:
        return ""
    return (
        f"its weights are {', '.join(kinds)} where the images come as float32 (a .double() or .half() on it?): "
        "build it in float32 and let the precision key set the arithmetic (precision=auto, bf16, fp16 or fp32, "
        "by autocast with float32 weights): "
    )


# the sides image models are most often written for, tried (nearest the estimate first) after the estimate itself
COMMON_SIDES = (28, 32, 64, 96, 128, 224, 256, 299)
HINT_SECONDS = 10.0  # the most the tries may add before the error is shown (without advice)


def _works(model: nn.Module, shape: tuple[int, int, int], num_classes: int, device: torch.device) -> bool:
    """Whether the model maps 2 images of zeros of `shape` to its (2, num_classes) logits."""
    try:
        with torch.no_grad():
            out = main_output(model(torch.zeros(2, *shape, device=device)), num_classes, 2)
    except Exception:  # noqa: BLE001 - not this shape either: no advice rather than a wrong one
        return False
    return isinstance(out, torch.Tensor) and tuple(out.shape) == (2, num_classes)


def _shape_hint(model: nn.Module, error: BaseException, image_shape: tuple[int, ...], num_classes: int,
                device: torch.device) -> str:  # fmt: skip
    """For a model written for other images, the keys that convert these to what it takes: a first layer built for
    3 channels given grey images (or the reverse), `data.rgb`; a dense layer sized for other images (`Linear(784,
    ...)` after a flatten, `16 * 5 * 5` after a conv stack written for 32 x 32), `data.size`; or both. Tried on
    zeros: the channels the error names (else these, then the other of grey and colour), each at these images'
    side, the side a flatten of the pixels would take, the common sides and the estimate's neighbours; for images
    too small for its kernels, the common sides."""
    text = str(error)
    channels, height, width = image_shape[0], image_shape[-2], image_shape[-1]
    coloured = re.search(r"to have (\d+) channels, but got (\d+) channels", text)
    dense = re.search(r"mat1 and mat2 shapes cannot be multiplied \(\d+x(\d+) and (\d+)x\d+\)", text)
    viewed = re.search(r"shape '\[-1, (\d+)\]' is invalid for input of size (\d+)", text)
    features = (int(dense[1]), int(dense[2])) if dense else (int(viewed[2]) // 2, int(viewed[1])) if viewed else None
    small = re.search(r"Kernel size can't be greater than actual input size|Output size is too small", text)
    if coloured is None and features is None and small is None:
        return ""
    if coloured is not None:
        options = [int(coloured[1])] if int(coloured[1]) in (1, 3) and channels in (1, 3) else []
    else:
        options = [channels] + [other for other in (1, 3) if other != channels and channels in (1, 3)]
    deadline = time.perf_counter() + HINT_SECONDS
    for used in options:
        estimate = float(height)
        if features is not None and features[0] >= channels:
            estimate = height * math.sqrt(features[1] / (features[0] // channels * used))
        near = sorted({round(estimate + k) for k in range(-4, 5)}, key=lambda side: abs(side - estimate))
        sides = [height] if height != width else [
            *([round(estimate)] if abs(estimate - round(estimate)) < 1e-6 else []),
            *sorted(COMMON_SIDES, key=lambda side: abs(side - estimate)),
            *(near if features is not None else []),
        ]  # fmt: skip
        for side in dict.fromkeys(side for side in sides if side >= 1):
            shape = (used, side, side if height == width else width)
            if time.perf_counter() > deadline:  # a large model's tries add up: the error is not held back long
                return ""
            if (used, side) == (channels, height) or not _works(model, shape, num_classes, device):
                continue
            if side == height:
                wanted = "true: grey repeated into 3 channels" if used == 3 else "false: colour to grey"
                return f"it takes {used}-channel images (set data.rgb={wanted}): "
            layer = (f"its layer takes {features[1]:,} features where these images give {features[0]:,}: "
                     if features is not None else "")  # fmt: skip
            rgb = "" if used == channels else f" data.rgb={str(used == 3).lower()}"
            return f"{layer}it was written for {side} x {side} images (set data.size={side}{rgb}): "
    return ""


LARGER_SIDES = (4, 8, 16, 32, 64, 128, 256)  # the sides tried when hasten's own model fails on the data's images


def check_image_size(model: nn.Module, image_shape: tuple[int, ...], num_classes: int, name: str) -> None:
    """Before training: hasten's own model `name` (`model.name`) maps 2 images of `image_shape` to its logits, on
    the CPU in eval mode (no statistics changed); a RecipeError otherwise, naming the images' size and the least
    of LARGER_SIDES that works as `data.size` where the images are too small for its downsampling (a 2 x 2 image
    halved to nothing), else what its forward raised."""
    was_training = model.training
    model.eval()
    try:
        if _works(model, image_shape, num_classes, torch.device("cpu")):
            return
        channels, height, width = image_shape
        larger = (s for s in LARGER_SIDES if s > min(height, width))
        side = next((s for s in larger if _works(model, (channels, s, s), num_classes, torch.device("cpu"))), None)
        if side is not None:
            raise RecipeError(
                f"model.name={name}: images of {height} x {width} pixels are too small for it (its layers shrink them "
                f"to nothing); data.size={side} or more works, or give a model of your own (model.name=import)"
            )
        try:
            with torch.no_grad():
                model(torch.zeros(2, *image_shape))
        except Exception as error:  # noqa: BLE001 - said with the images it was given
            raise RecipeError(
                f"model.name={name}: given a batch of 2 images of shape {tuple(image_shape)} (C, H, W), its forward "
                f"raised {type(error).__name__}: {error}"
            ) from None
        raise RecipeError(f"model.name={name}: its output for a batch of 2 images of shape {tuple(image_shape)} is "
                          f"not (2, {num_classes}) logits")  # fmt: skip
    finally:
        model.train(was_training)


def check_model(model: nn.Module, image_shape: tuple[int, ...], num_classes: int, device: torch.device) -> str | None:
    """Before training: the model maps a batch of 2 images of `image_shape` to (2, num_classes) floating-point
    logits; a RecipeError naming what it returned (or raised, and where in the user's code) otherwise. Runs in eval
    mode without gradients, on zeros (no RNG drawn, no batch-norm statistics changed); lazy modules take their
    shapes from it. Integer logits are refused here rather than at the first backward pass, where torch would say
    only that a tensor "does not require grad". A model returning a tuple, a mapping or an object holding its
    logits passes (`main_output`: what training takes); returns the line that says so, None for a tensor."""
    name = type(model).__name__
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(torch.zeros(2, *image_shape, device=device))
    except Exception as error:  # noqa: BLE001 - any failure of the user's forward: theirs, with what it was given
        raise RecipeError(
            f"model {name}: given a batch of 2 images of shape {tuple(image_shape)} (C, H, W), {_dtype_hint(model)}"
            f"{_shape_hint(model, error, image_shape, num_classes, device)}its forward raised {their_error(error)}"
        ) from None
    finally:
        model.train(was_training)
    main = main_output(out, num_classes, 2)  # a tuple's, a mapping's: what training takes (OutputReader)
    said = describe_output(out, num_classes, 2)
    rest = "" if isinstance(out, torch.Tensor) else "; the rest is left out of the loss"
    out = main if main is not None else out
    if isinstance(out, torch.Tensor) and tuple(out.shape) == (2, num_classes) and not out.dtype.is_floating_point:
        raise RecipeError(
            f"model {name}: returns {str(out.dtype).removeprefix('torch.')} logits of shape (2, {num_classes}) for "
            f"a batch of 2 images of shape {tuple(image_shape)}; it must return floating-point class logits "
            "(float32, bf16, ...): training differentiates them, and integers have no gradient"
        )
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (2, num_classes):
        got: Any = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        if isinstance(out, tuple | list):  # none of shape (2, classes): what it holds
            got = f"a {type(out).__name__} of {_shapes(out)}"
        squeeze = ""
        if isinstance(out, torch.Tensor) and out.dim() > 2 and tuple(out.shape[:2]) == (2, num_classes):
            # a map of class scores per position (one of 1 x 1 is flattened: main_output)
            squeeze = " (a map of class scores: pool it, e.g. x.mean((2, 3)), to one score per class)"
        raise RecipeError(
            f"model {name}: returns {got} for a batch of 2 images of shape {tuple(image_shape)}{squeeze}; it must "
            f"return class logits of shape (2, {num_classes}) for the data's {num_classes} classes (labels "
            f"0..{num_classes - 1}; give the class names, data.classes, if there are more than the labels show)"
            f"{_class_count_hint(model, out, num_classes)}"
        )
    if said is None:
        return None
    return f"model {name}: its class logits are {said}{rest}"


def _class_count_hint(model: nn.Module, out: Any, num_classes: int) -> str:
    """For a model returning (2, K) logits, K not the data's class count: its constructor's int parameters whose
    default is K (`output_size=10` in a tutorial's MLP), which hasten does not pass as the class count (it knows
    CLASS_NAMES), as the key that sets each."""
    if not isinstance(out, torch.Tensor) or out.dim() != 2:
        return ""
    try:
        parameters = inspect.signature(type(model)).parameters.values()
    except (TypeError, ValueError):
        return ""
    named = [p.name for p in parameters if type(p.default) is int and p.default == out.shape[1]]
    if not named:
        return ""
    keys = " or ".join(f"model.args.{n}={num_classes}" for n in named)
    said = " and ".join(f"{n}={out.shape[1]}" for n in named)
    return f"; {type(model).__name__} takes {said} by default: if that is its class count, {keys}"


# the log of a probability that underflowed to 0: the smallest normal fp32's, a finite logit (-87.3)
SMALLEST_PROBABILITY = torch.finfo(torch.float32).tiny


def output_kind(
    model: nn.Module, image_shape: tuple[int, ...], device: torch.device, num_classes: int
) -> tuple[str, str | None]:
    """What the model returns, read off three batches in evaluation mode (zeros, a fixed noise drawn from its own
    generator so the run's RNG is untouched, and that noise 100 times larger, which moves any logits far):
    ("probabilities", None) when every row is a softmax's (each value in [0, 1], the row summing to 1) for all
    three, or, for two classes, a single output per image lies in [0, 1] for all three and strictly between for the
    first two (("sigmoid", None): a sigmoid's probability of class 1, as binary classifiers end); else ("logits",
    warning), the warning naming outputs that all lie in [0, 1] for all three and strictly between for the first
    two (a sigmoid at the end), which the loss, taking them as logits, barely separates, or outputs never negative
    and exactly 0 somewhere (a ReLU at the end), whose classes can die. Outputs exactly 0 everywhere are a last
    layer initialised to zero where a gradient reaches the weights (no warning), a dead end where none does."""
    noise = torch.randn(8, *image_shape, generator=torch.Generator().manual_seed(0)).to(device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            batches = (torch.zeros(2, *image_shape, device=device), noise, noise * 100)
            raw = [model(b.clone()) for b in batches]  # clones: a model may change its input in place (x -= 0.5)
            outs = [main_output(out, num_classes, len(b)).float() for out, b in zip(raw, batches, strict=True)]
            columns = [binary_column(out, num_classes, len(b)) if isinstance(out, torch.Tensor) else None
                       for out, b in zip(raw, batches, strict=True)]  # fmt: skip
    except Exception:  # noqa: BLE001 - zeros went through (check_model); a model that refuses noise is left as it is
        return "logits", None
    finally:
        model.train(was_training)
    return _read_kind(model, outs, columns, noise, num_classes)


MODULE_INTERNALS = frozenset(vars(nn.Module()))  # the attributes every nn.Module has from torch itself


def habit_warnings(
    model: nn.Module, image_shape: tuple[int, ...], device: torch.device, num_classes: int
) -> tuple[str, ...]:
    """Warnings for habits that leave part of a model untrained or its results unrepeatable, whatever
    model.output says: outputs that differ between two calls on the same images in evaluation mode (a dropout left
    on: `F.dropout(x, p)` without `training=self.training`, whose default is training=True), so its evaluation,
    `predict` and `export` each see another random net; tensors kept as plain attributes with requires_grad=True
    (`self.scale = torch.ones(1, requires_grad=True)` where nn.Parameter was meant), which the optimizer, given the
    model's parameters, never trains; and layers kept in a plain list, tuple or dict (`self.layers =
    [nn.Linear(...)]` where nn.ModuleList was meant), whose parameters are not the model's, so they are never
    trained, saved or exported. Each image batch is a clone (a model may change its input in place)."""
    said = []
    difference, scale = _evaluation_difference(model, image_shape, device, num_classes)
    if difference > 1e-3 * (1 + scale):
        said.append(
            f"model {type(model).__name__} gives different outputs for the same images from one call to the next in "
            f"evaluation mode (up to {difference:.3g} apart): something random stays on there, such as "
            "F.dropout(x, p) without training=self.training (its default is training=True; nn.Dropout follows "
            "model.eval()), so its test accuracy, predictions and export vary from run to run; make it follow "
            "self.training"
        )
    if tensors := _attributes_where(model, lambda value: isinstance(value, torch.Tensor)
                                    and not isinstance(value, nn.Parameter) and value.requires_grad
                                    and value.grad_fn is None):  # fmt: skip
        said.append(
            f"model {type(model).__name__} keeps tensors that require a gradient outside its parameters ({tensors}): "
            "the optimizer is given the model's parameters, so these are never trained; make each an nn.Parameter "
            "(or register it as a buffer if it is not to learn)"
        )
    if layers := _attributes_where(model, _holds_layers):
        said.append(
            f"model {type(model).__name__} keeps layers in a Python list, tuple or dict ({layers}): their parameters "
            "are not the model's, so they are never trained, saved or exported; hold them in nn.ModuleList or "
            "nn.ModuleDict"
        )
    return tuple(said)


def _evaluation_difference(
    model: nn.Module, image_shape: tuple[int, ...], device: torch.device, num_classes: int
) -> tuple[float, float]:
    """The largest difference between the model's logits for the same noise in two calls in evaluation mode, and
    the largest logit: (0, 0) where the model cannot be read so."""
    noise = torch.randn(8, *image_shape, generator=torch.Generator().manual_seed(0)).to(device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            first, again = (main_output(model(noise.clone()), num_classes, len(noise)) for _ in range(2))
            if not isinstance(first, torch.Tensor) or not isinstance(again, torch.Tensor):
                return 0.0, 0.0
            return float((first.float() - again.float()).abs().max()), float(first.float().abs().max())
    except Exception:  # noqa: BLE001 - zeros went through (check_model); a model that refuses noise is left as it is
        return 0.0, 0.0
    finally:
        model.train(was_training)


def _holds_layers(value: Any) -> bool:
    """A plain list, tuple or dict holding a module with parameters."""
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list | tuple) else ()
    return any(isinstance(item, nn.Module) and any(True for _ in item.parameters()) for item in items)


def _attributes_where(model: nn.Module, holds: Any) -> str:
    """The plain attributes of `model`'s modules (not torch's own registries) whose value `holds`, named (with
    their module's class below the top), the first five and '...': empty when there are none."""
    found = [f"{name}{f' in {type(module).__name__}' if module is not model else ''}"
             for module in model.modules() for name, value in vars(module).items()
             if name not in MODULE_INTERNALS and holds(value)]  # fmt: skip
    return ", ".join(found[:5]) + (", ..." if len(found) > 5 else "")


def _read_kind(
    model: nn.Module, outs: list[torch.Tensor], columns: list[Any], noise: torch.Tensor, num_classes: int
) -> tuple[str, str | None]:
    """output_kind's reading of the outputs on its three batches (`outs`; `columns`: each one's single output per
    image, where it has one for two classes)."""
    if all(column is not None for column in columns):  # one output per image for two classes: a sigmoid's p?
        column_within = all(bool(((c >= 0) & (c <= 1)).all()) for c in columns)
        if column_within and all(bool(((c > 0) & (c < 1)).all()) for c in columns[:2]):
            return "sigmoid", None  # read as model.output=probabilities (OutputReader)
    within = all(bool(((out >= 0) & (out <= 1)).all()) for out in outs)
    if within and all(bool(torch.allclose(out.sum(1), torch.ones_like(out[:, 0]), atol=1e-3)) for out in outs):
        return "probabilities", None
    if within and all(bool(((out > 0) & (out < 1)).all()) for out in outs[:2]):  # (a large input may saturate)
        return "logits", (
            f"model {type(model).__name__} returns values between 0 and 1 for every class (a sigmoid at its end?): "
            "the loss takes them as class logits, any real numbers, and logits within 0 and 1 of each other give "
            "every class almost the same probability, so it learns slowly if at all; end the model with its last "
            "linear layer (or a softmax, which model.output=auto reads as probabilities)"
        )
    silent = all(bool((out == 0).all()) for out in outs)  # a last layer initialised to zero (BiT's head), or dead
    if silent and _outputs_move(model, noise[:2], num_classes):
        return "logits", None
    if all(bool((out >= 0).all()) for out in outs) and any(bool((out == 0).any()) for out in outs):
        return "logits", (
            f"model {type(model).__name__} returns no negative value for any class and exactly 0 for some (a ReLU at "
            "its end?): the loss takes its outputs as class logits, and a class whose output stops at 0 for every "
            "image gets no gradient again, so it can stay dead for the rest of the run; end the model with its last "
            "linear layer"
        )
    return "logits", None


def _outputs_move(model: nn.Module, images: torch.Tensor, num_classes: int) -> bool:
    """Whether a gradient reaches any trainable weight from the model's outputs on `images` (evaluation mode;
    `torch.autograd.grad`, so no `.grad` is written): true of a last layer initialised to zero, whose outputs are 0
    at the start and move with its first step; false where a ReLU after it holds them at 0."""
    weights = [p for p in model.parameters() if p.requires_grad]
    was_training = model.training
    model.eval()
    try:
        with torch.enable_grad():
            out = main_output(model(images), num_classes, len(images))
            if out is None or not out.requires_grad or not weights:
                return False
            grads = torch.autograd.grad(out.float().sum(), weights, allow_unused=True)
    except Exception:  # noqa: BLE001 - a model that cannot be differentiated here: no claim about it
        return False
    finally:
        model.train(was_training)
    return any(g is not None and bool((g != 0).any()) for g in grads)


def main_output(output: Any, num_classes: int, batch: int | None = None) -> torch.Tensor | None:
    """The class logits in what a model returned: a tensor as it is; of a mapping or an object with `logits` (Hugging
    Face's outputs), that; of a tuple or list (an auxiliary head's `(logits, aux)`, torchvision's GoogLeNet in
    training, `(features, logits)`), the first tensor of shape (N, num_classes); logits with sides of 1 around them
    (a fully convolutional head's map of (N, num_classes, 1, 1), a sequence of one (N, 1, num_classes)), flattened;
    for two classes, one output per image (`binary_column`) as the logits (0, z),
    whose softmax gives class 1 sigmoid(z), as BCEWithLogitsLoss reads z. None when there is none."""
    if isinstance(output, torch.Tensor):
        column = binary_column(output, num_classes, batch)
        if column is not None:
            return _zero_and(column)
        return output.flatten(1) if _one_by_one(output, num_classes) else output
    found = output.get("logits") if isinstance(output, Mapping) else getattr(output, "logits", None)
    if isinstance(found, torch.Tensor):
        return found
    if isinstance(output, tuple | list):
        return next((part for part in output if isinstance(part, torch.Tensor) and part.dim() == 2
                     and part.shape[1] == num_classes), None)  # fmt: skip
    return None


def binary_column(output: torch.Tensor, num_classes: int, batch: int | None = None) -> torch.Tensor | None:
    """For two classes, a model's one output per image as a column (N, 1): (N, 1) as binary classifiers end
    (`nn.Linear(..., 1)` for BCEWithLogitsLoss), (N,) after a `.squeeze(1)` or `.view(-1)` where the batch is known
    to be N (else a batch of one's two logits squeezed would read as two images'), and () for a batch of one after
    a `.squeeze()`. None for any other output."""
    if num_classes != 2 or not output.is_floating_point():
        return None
    if output.dim() == 2 and output.shape[1] == 1:
        return output
    if batch is not None and (tuple(output.shape) == (batch,) or (batch == 1 and output.dim() == 0)):
        return output.reshape(-1, 1)
    return None


def _zero_and(column: torch.Tensor) -> torch.Tensor:
    """One logit z per image (N, 1) as two classes' logits (0, z): softmax gives class 1 sigmoid(z)."""
    return torch.cat([torch.zeros_like(column), column], 1)


def _one_by_one(output: torch.Tensor, num_classes: int) -> bool:
    """The logits with sides of 1 around them, not yet flattened: a fully convolutional head's class map of 1 x 1
    (N, num_classes, 1, 1), a transformer's class token kept as a sequence of one (N, 1, num_classes), a last step
    sliced as `out[:, -1:]`."""
    sides = output.shape[1:]
    return (
        output.dim() > 2
        and sum(side == num_classes for side in sides) == 1
        and all(side in (1, num_classes) for side in sides)
    )


def describe_output(output: Any, num_classes: int, batch: int | None = None) -> str | None:
    """What a model that does not return its logits as (N, classes) has them taken from, said at start-up (None: it
    does)."""
    if isinstance(output, torch.Tensor):
        if binary_column(output, num_classes, batch) is not None:
            return (
                f"its one output per image ({tuple(output.shape)}), for class 1 against class 0 as binary "
                "classifiers end (a logit z is read as the logits (0, z), as BCEWithLogitsLoss reads it)"
            )
        if not _one_by_one(output, num_classes):
            return None
        return f"its {'map' if output.dim() == 4 else 'output'} of {tuple(output.shape)}, flattened"
    main = main_output(output, num_classes)
    if main is None:
        return None
    if not isinstance(output, tuple | list):
        return f"its `logits` ({type(output).__name__})"
    index = next(i for i, part in enumerate(output) if part is main)
    kind = type(output).__name__
    return f"element {index} of the {kind} it returns ({_shapes(output)}): the first of shape (N, {num_classes})"


def _shapes(parts: tuple | list) -> str:
    """The shapes of a returned tuple's tensors (other parts by their type), for what the run says."""
    return ", ".join(str(tuple(p.shape)) if isinstance(p, torch.Tensor) else type(p).__name__ for p in parts)


class OutputReader:
    """The forward hook that makes a user's model return class logits however it returns them: `main_output` of
    what it returned (the others, an auxiliary head's, are left out of the loss), and for `kind` "probabilities"
    (`model.output`: a softmax's) their log, the logits the loss, the evaluation and predict take (a softmax of them
    gives the probabilities back). Returns None, the output unchanged, for a model that returns its logits."""

    def __init__(self, kind: str, num_classes: int):
        self.kind, self.num_classes = kind, num_classes

    def __call__(self, module: nn.Module, inputs: Any, output: Any) -> torch.Tensor | None:
        batch = inputs[0].shape[0] if inputs and isinstance(inputs[0], torch.Tensor) and inputs[0].dim() else None
        column = binary_column(output, self.num_classes, batch) if isinstance(output, torch.Tensor) else None
        if column is not None:
            if self.kind != "probabilities":
                return _zero_and(column)
            p = column.float().clamp(SMALLEST_PROBABILITY, 1 - torch.finfo(torch.float32).eps / 2)
            return torch.cat([torch.log1p(-p), p.log()], 1)  # a sigmoid's p of class 1: (log(1 - p), log p)
        main = main_output(output, self.num_classes)  # not one output per image: the batch is not needed
        if main is None:  # left as it is: what it returned is named where it is used
            return None
        if self.kind == "probabilities":
            return main.float().clamp_min(SMALLEST_PROBABILITY).log()
        return None if main is output else main


def read_output(
    model: nn.Module, kind: str, num_classes: int, user: bool = True
) -> torch.utils.hooks.RemovableHandle | None:
    """A user's model (`user`) or one whose `model.output` is "probabilities" reads its outputs as class logits from
    here on (`OutputReader`), by a forward hook: its weights and their names unchanged, copies of the model keep it;
    added once. Returns the hook's handle, None when nothing was added."""
    if not (user or kind == "probabilities") or any(isinstance(h, OutputReader) for h in model._forward_hooks.values()):
        return None
    return model.register_forward_hook(OutputReader(kind, num_classes))
