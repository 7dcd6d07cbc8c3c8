"""Muon for convolution filters (Jordan et al., 2024, "Muon: An optimizer for hidden layers in neural networks";
the CIFAR-10 speed record airbench94_muon.py trains its conv filters with it), beside Nesterov SGD for the rest.

Muon replaces a weight matrix's momentum update by its nearest semi-orthogonal matrix, found by a few quintic
Newton-Schulz iterations: every direction of the update moves by about the same amount. A conv filter bank
(out, in, kh, kw) is treated as the matrix (out, in*kh*kw), as airbench does. Only the filters are orthogonalised;
every other parameter (biases, batch-norm scales and shifts, the linear classifier head) takes a plain SGD step
(momentum, Nesterov, L2 weight decay: torch.optim.SGD's functional form) in the same `step()`, one optimizer.

The Muon step per filter bank is torch.optim.Muon's (in recent torch; 2-D parameters only) applied to the
reshaped matrix: momentum `buf <- lerp(buf, grad, 1 - momentum)`, Nesterov `grad.lerp(buf, momentum)`, Newton-Schulz
(on a GPU in bfloat16, torch's own function when this torch has it; on a CPU the same iteration in float32, see
`newton_schulz_dtype`), decoupled weight decay
`p <- p (1 - lr wd)`, then `p <- p - lr sqrt(max(1, rows / cols)) O`. airbench's sum-form momentum differs from
the lerp form only by a factor (1 - momentum), which the orthogonalisation removes. airbench also rescales each
filter bank to a fixed norm after every step; that is not done here (batch norm after a conv makes its scale moot
for the function, not for the effective LR, so `optim.muon_lr` is tuned without it). In float32 the banks of one
shape (a ResNet's repeated blocks) run the iteration together, in batched products (`newton_schulz` of a stack): on a
CPU a small product costs its call more than its arithmetic. fashion-fast's optimizer step (ten banks, six shapes)
took 2.5 ms instead of 3.1 on a 2-core Zen 4, its weights bitwise the same after three steps.

The filter groups' LR is `optim.muon_lr`, not scaled by the batch rule: the orthogonalised update has the same
size whatever the batch (the linear rule is about averaging gradient noise in an SGD step). The schedule drives it
as it drives the other groups. Their momentum stays `optim.muon_momentum`: a momentum schedule (one-cycle, cyclic)
cycles only the SGD groups (`fixed_momentum`): Muon's momentum sets how far back its average looks, not its step.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor
from torch.optim.sgd import sgd as sgd_step

from hasten.machine import Machine
from hasten.machine import current as current_machine

try:  # torch versions that ship torch.optim.Muon have its Newton-Schulz iteration
    from torch.optim._muon import _zeropower_via_newtonschulz as torch_newton_schulz
except ImportError:  # pragma: no cover - older torch: the same iteration, below
    torch_newton_schulz = None

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # Jordan's quintic: steep at 0; singular values land in ~(0.5, 1.5)
NS_STEPS = 5
NS_EPS = 1e-7


def newton_schulz_dtype(device_type: str, machine: Machine) -> torch.dtype:
    """The precision of the Newton-Schulz iteration: the dtype whose small matrix products are faster on the
    device. bfloat16 on a GPU that multiplies it on tensor cores (torch.optim.Muon's and airbench's choice);
    float32 on a CPU, and on a GPU without bfloat16. A filter bank here is at most a few hundred columns wide, so
    a CPU's products are per-call overhead either way, and bfloat16 has no fast small-matrix kernel on the CPUs
    measured: fashion-fast's ten banks took 42 ms a step in bfloat16 against 3.6 ms in float32 on a 2-core AVX2
    EPYC, 4.0 against 2.1 ms on a Zen 4 with AVX512-BF16. float32 is also the more exact iteration."""
    accelerator = machine.accelerator
    gpu_bf16 = accelerator is not None and accelerator.kind == device_type and accelerator.bf16
    return torch.bfloat16 if device_type != "cpu" and gpu_bf16 else torch.float32


def newton_schulz(
    matrix: Tensor,
    steps: int = NS_STEPS,
    coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
    eps: float = NS_EPS,
    dtype: torch.dtype = torch.bfloat16,
    gram: bool | None = None,
) -> Tensor:
    """An approximately semi-orthogonal matrix (singular values near 1) with `matrix`'s singular vectors: `steps`
    quintic Newton-Schulz iterations in `dtype` (bfloat16: torch.optim.Muon's iteration) on the wide orientation
    of `matrix`. A (batch, rows, cols) stack is iterated at once, each matrix scaled by its own norm, in batched
    products: one call per step for every filter bank of a shape, where a CPU's small products cost their call
    more than their arithmetic. `gram`: iterate on the Gram matrix (`_newton_schulz_on_gram`); None: where
    `gram_form_pays`."""
    a, b, c = coefficients
    tall = matrix.size(-2) > matrix.size(-1)
    x = matrix.to(dtype).mT if tall else matrix.to(dtype)
    x = x / torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True).clamp(min=eps)  # spectral norm at most 1
    multiply_add = torch.addmm if x.dim() == 2 else torch.baddbmm
    on_gram = gram_form_pays(x.size(-2), x.size(-1), dtype) if gram is None else gram
    if on_gram:
        return _newton_schulz_on_gram(x, steps, coefficients, multiply_add, tall)
    for _ in range(steps):
        square = x @ x.mT
        x = multiply_add(x, multiply_add(square, square, square, beta=b, alpha=c), x, beta=a)
    return x.mT if tall else x


def gram_form_pays(rows: int, cols: int, dtype: torch.dtype) -> bool:
    """Whether `newton_schulz` of a wide (rows <= cols) matrix iterates on its Gram matrix instead: in float32
    (bfloat16 keeps torch.optim.Muon's exact sequence), for a matrix at least 32 rows high and four times as wide.
    Each step of the direct form costs about 4 rows^2 cols + 2 rows^3 multiply-adds, the Gram form about 8 rows^3
    plus 4 rows^2 cols once; under 32 rows the products are too small for their count (six a step against three)
    not to cost more than the arithmetic saved."""
    return dtype == torch.float32 and rows >= 32 and cols >= 4 * rows


def _newton_schulz_on_gram(
    x: Tensor, steps: int, coefficients: tuple[float, float, float], multiply_add: Any, tall: bool
) -> Tensor:
    """The same iteration as `newton_schulz`'s loop, on the (rows, rows) Gram matrix: a step is x <- q(G) x with
    q(G) = a I + b G + c G^2 and G = x x^T, and q(G) commutes with G, so the next Gram matrix is q(G)^2 G and the
    steps' product of the q's, applied to x once at the end, is the result. Mathematically the same matrix; in
    float32 it differs from the direct loop by about 1e-6 of its norm."""
    a, b, c = coefficients
    gram = x @ x.mT
    product = None
    for _ in range(steps):
        q = multiply_add(gram, gram, gram, beta=b, alpha=c)
        q.diagonal(dim1=-2, dim2=-1).add_(a)
        product = q if product is None else q @ product
        gram = q @ gram @ q
    x = product @ x
    return x.mT if tall else x


def orthogonalize(matrix: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """Newton-Schulz orthogonalisation of a 2-D update in `dtype` (None: `newton_schulz_dtype` of its device on
    hasten.machine.current()); in
    bfloat16 torch's function where this torch has it."""
    dtype = dtype or newton_schulz_dtype(matrix.device.type, current_machine())
    if dtype == torch.bfloat16 and torch_newton_schulz is not None:
        # it divides its bfloat16 copy in place, and .bfloat16() of a bfloat16 tensor is no copy
        own = matrix.clone() if matrix.dtype == torch.bfloat16 else matrix
        return torch_newton_schulz(own, NS_COEFFICIENTS, NS_STEPS, NS_EPS)
    return newton_schulz(matrix, dtype=dtype)


def orthogonalize_all(matrices: list[Tensor], dtype: torch.dtype) -> list[Tensor]:
    """`orthogonalize` of each 2-D update in `dtype`; in float32 the updates of one shape (a network's repeated
    filter banks) go through `newton_schulz` together, as one stack."""
    if dtype != torch.float32:
        return [orthogonalize(matrix, dtype) for matrix in matrices]
    by_shape: dict[tuple[torch.Size, torch.device], list[int]] = {}
    for i, matrix in enumerate(matrices):
        by_shape.setdefault((matrix.shape, matrix.device), []).append(i)
    result: list[Tensor] = list(matrices)
    for indices in by_shape.values():
        if len(indices) == 1:
            result[indices[0]] = newton_schulz(matrices[indices[0]], dtype=dtype)
            continue
        stack = newton_schulz(torch.stack([matrices[i] for i in indices]), dtype=dtype)
        for i, update in zip(indices, stack, strict=True):
            result[i] = update
    return result


class Muon(torch.optim.Optimizer):
    """Groups with `orthogonalize=True` take Muon steps on their parameters seen as (out, rest) matrices; the others
    SGD steps. `fixed_momentum=True` tells the LR schedule to leave a group's momentum alone. `ns_dtype`: the
    precision of the orthogonalisation (None: `newton_schulz_dtype` of each parameter's device)."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float,
        momentum: float = 0.9,
        nesterov: bool = True,
        weight_decay: float = 0.0,
        ns_dtype: torch.dtype | None = None,
    ):
        self.ns_dtype = ns_dtype
        self._machine = current_machine()  # read once: the rule's dtype for each device the parameters are on
        defaults = dict(
            lr=lr,
            momentum=momentum,
            nesterov=nesterov,
            weight_decay=weight_decay,
            orthogonalize=False,
            fixed_momentum=False,
        )
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if group["orthogonalize"]:
                self._muon(params, group)
                continue
            buffers = [self.state[p].get("momentum_buffer") for p in params]
            sgd_step(
                params,
                [p.grad for p in params],
                buffers,
                weight_decay=group["weight_decay"],
                momentum=group["momentum"],
                lr=group["lr"],
                dampening=0.0,
                nesterov=group["nesterov"],
                maximize=False,
            )
            if group["momentum"] != 0:
                for p, buffer in zip(params, buffers, strict=True):
                    self.state[p]["momentum_buffer"] = buffer
        return loss

    def _muon(self, params: list[Tensor], group: dict[str, Any]) -> None:
        """One Muon step of each 2-D view of the filter banks in `params` (torch.optim.Muon's single-tensor update
        with its default ("original") LR adjustment; the banks of one shape orthogonalised together,
        `orthogonalize_all`): momentum `buf <- lerp(buf, grad, 1 - momentum)`, Nesterov's look-ahead, decoupled
        weight decay, then `p <- p - lr sqrt(max(1, rows / cols)) O`."""
        if not params:
            return
        momentum, lr = group["momentum"], group["lr"]
        grads = [p.grad.reshape(len(p), -1) for p in params]
        buffers = []
        for p, grad in zip(params, grads, strict=True):
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(grad, memory_format=torch.contiguous_format)
            buffers.append(state["momentum_buffer"])
        torch._foreach_lerp_(buffers, grads, 1 - momentum)
        updates = torch._foreach_lerp(grads, buffers, momentum) if group["nesterov"] else buffers
        dtype = self.ns_dtype or newton_schulz_dtype(params[0].device.type, self._machine)
        for p, update in zip(params, orthogonalize_all(updates, dtype), strict=True):
            # a view where the layout allows one; channels_last filters are stepped as a copy and written back
            matrix = p.view(len(p), -1) if p.is_contiguous() else p.reshape(len(p), -1)
            rows, cols = matrix.shape
            matrix.mul_(1 - lr * group["weight_decay"])
            matrix.add_(update, alpha=-lr * math.sqrt(max(1, rows / cols)))
            if matrix.data_ptr() != p.data_ptr():
                p.copy_(matrix.view(p.shape))


def is_filter(param: Tensor) -> bool:
    """A convolution filter bank (out, in, kh, kw): what Muon orthogonalises."""
    return param.ndim == 4


def muon_groups(groups: list[dict[str, Any]], lr: float, muon_lr: float, muon_momentum: float) -> list[dict[str, Any]]:
    """`groups` (each with its weight decay, maybe its own LR) split in two: the rest as given, first (so the
    first group's LR, which the logs report, is still `optim.lr`'s), then the filters at `muon_lr` (times the
    group's LR relative to `lr`) and `muon_momentum`, orthogonalised. Empty groups are dropped."""
    rest, filters = [], []
    for group in groups:
        if kept := [p for p in group["params"] if not is_filter(p)]:
            rest.append({**group, "params": kept})
        if banks := [p for p in group["params"] if is_filter(p)]:
            ratio = group.get("lr", lr) / lr
            filters.append({**group, "params": banks, "lr": muon_lr * ratio, "momentum": muon_momentum,
                            "orthogonalize": True, "fixed_momentum": True})  # fmt: skip
    return rest + filters
