"""`train.compile`: torch.compile (TorchDynamo + Inductor, PyTorch 2.0) with a trial step and an eager fallback.

torch.compile is lazy: it compiles at the first call, and fails there when the platform cannot (an unsupported
Python, no C++ compiler for Inductor on CPU, no Triton on a GPU). So the model is compiled in place
(`nn.Module.compile`, which keeps parameter names, so checkpoints are the same as eager ones) and one trial
forward and backward runs on a real batch at build time. If anything in it fails, the compiled call is dropped,
the reason is printed, and training runs eagerly. The trial's effects (BatchNorm statistics, gradients, RNG
draws) are undone, so a compiled run starts where an eager one would. Its cost, the compile time, is therefore
paid before training and not counted in `train_seconds`; recompiles for new shapes (the last, short batch;
evaluation) happen during the run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch import Tensor, nn

from hasten.errors import first_line

BACKEND = "inductor"  # torch.compile's default; tests swap in "eager" (Dynamo's tracing alone) to stay fast


def compile_model(
    model: nn.Module, example: Tensor, autocast: Callable[[], contextlib.AbstractContextManager]
) -> tuple[nn.Module, str | None]:
    """The model compiled in place, or left eager; and None, or why it could not be compiled.

    `example` is one training batch; `autocast` the precision's autocast, so the trial traces what training runs.
    """
    snapshot = {name: value.detach().clone() for name, value in model.state_dict().items()}
    was_training = model.training
    devices = [example.device.index or 0] if example.device.type == "cuda" else []
    try:
        model.compile(backend=BACKEND)
        with torch.random.fork_rng(devices=devices):
            model.train()
            with autocast():
                out = model(example)
            out.float().sum().backward()
        return model, None
    except Exception as error:  # noqa: BLE001 -- any failure to compile means: train eagerly
        model._compiled_call_impl = None  # undoes nn.Module.compile()
        return model, f"train.compile: torch.compile is not possible here ({first_line(error)}); training eagerly"
    finally:
        with torch.no_grad():
            model.load_state_dict(snapshot)
        model.zero_grad(set_to_none=True)
        model.train(was_training)
