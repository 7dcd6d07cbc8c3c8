"""Pretrained weights for transfer learning: from a safetensors file, a hasten checkpoint or a plain PyTorch
state dict, always through the weights-only loader (`hasten.runfolder.checkpoint.read_weights`), or from an
http(s) URL checked against a pinned SHA-256 and cached like datasets (`weights_file`). Keys and shapes that do
not fit are reported by name; the classifier head (the model's last Linear layer, `classifier_head`) keeps its
fresh initialisation when the class count differs, or when `model.reset_head` asks for it. `save_weights`
writes a run's model for a later `model.pretrained`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save
from torch import Tensor, nn

from hasten.data.download import download
from hasten.data.sources import cache_folder
from hasten.errors import CheckpointError, DataError, RecipeError
from hasten.files import sha256_file, write_atomic_bytes
from hasten.recipe.schema import ModelConfig
from hasten.runfolder.checkpoint import read_weights

NORMALISATION = (nn.BatchNorm1d, nn.BatchNorm2d, nn.GroupNorm, nn.LayerNorm)
WRAPPER_PREFIXES = ("module.", "_orig_mod.")  # DistributedDataParallel and torch.compile prefix every key
SHOWN = 12  # names listed per kind of problem before "... and N more"


def classifier_head(model: nn.Module) -> tuple[str, nn.Linear]:
    """The name and module of the model's classifier head: its last Linear layer."""
    linears = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise RecipeError("model: no Linear layer to use as the classifier head (transfer and freezing need one)")
    return linears[-1]


def is_url(source: str) -> bool:
    return source.startswith(("http://", "https://"))


def weights_file(source: str, sha256: str | None = None, *, progress: bool | None = None) -> Path:
    """A local path to the weights named by `source`: the path itself, or for a URL a cached download into
    `~/.cache/hasten/weights/`, checked against `sha256` (required). A local file with `sha256` is checked too."""
    expected = (sha256 or "").lower()
    if not is_url(source):
        path = Path(source).expanduser()
        if expected and path.is_file() and sha256_file(path) != expected:
            raise CheckpointError(f"model.pretrained: {path} does not match model.pretrained_sha256 {expected}")
        return path
    if not expected:
        raise CheckpointError(f"model.pretrained: {source} is a URL; set model.pretrained_sha256 to its SHA-256")
    name = source.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1] or "weights"
    dest = cache_folder("weights") / f"{expected[:16]}-{name}"
    if dest.is_file() and sha256_file(dest) == expected:
        return dest
    try:
        return download(source, dest, expected, progress=sys.stderr.isatty() if progress is None else progress)
    except DataError as error:
        raise CheckpointError(f"model.pretrained: {error}") from None


@dataclass
class PretrainedReport:
    """What `load_pretrained` did: which tensors were loaded, and every name that did not fit."""

    source: str
    loaded: list[str] = field(default_factory=list)
    head: str = ""  # what became of the classifier head, when it was not loaded
    missing: list[str] = field(default_factory=list)  # in the model, not in the file
    unexpected: list[str] = field(default_factory=list)  # in the file, not in the model
    mismatched: list[str] = field(default_factory=list)  # "name: file shape vs model shape"

    def problems(self) -> list[str]:
        def listed(kind: str, names: list[str]) -> str:
            more = f" ... and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
            return f"{kind} ({len(names)}): {', '.join(names[:SHOWN])}{more}"

        kinds = (("shapes differ", self.mismatched), ("missing from the file", self.missing))
        kinds += (("not in the model", self.unexpected),)
        return [listed(kind, names) for kind, names in kinds if names]

    def describe(self) -> str:
        lines = [f"pretrained: loaded {len(self.loaded)} tensors from {self.source}"]
        if self.head:
            lines.append(f"  {self.head}")
        lines += [f"  not loaded, {p}" for p in self.problems()]
        return "\n".join(lines)


def _strip_wrappers(key: str) -> str:
    for prefix in WRAPPER_PREFIXES:
        while key.startswith(prefix):
            key = key[len(prefix) :]
    return key


def load_pretrained(
    model: nn.Module,
    weights: dict[str, Tensor],
    *,
    source: str = "weights",
    reset_head: bool = False,
    strict: bool = True,
) -> PretrainedReport:
    """Copy `weights` into `model` where names and shapes match; returns what was done.

    The head is left as initialised when its class count differs from the file's, when the file has no head,
    or with `reset_head`. With `strict`, any other key or shape that does not fit is a CheckpointError listing
    them all by name and nothing is loaded; without it they are reported and skipped.
    """
    weights = {_strip_wrappers(k): v for k, v in weights.items()}
    own = model.state_dict()
    head_name, head = classifier_head(model)
    head_keys = {f"{head_name}.{k}" for k in head.state_dict()}
    file_head = weights.get(f"{head_name}.weight")
    report = PretrainedReport(source)
    if file_head is None:
        report.head = f"head {head_name!r}: not in the file, freshly initialised"
    elif file_head.shape[0] != head.out_features:
        report.head = f"head {head_name!r} replaced: {file_head.shape[0]} classes in the file, {head.out_features} here"
    elif reset_head:
        report.head = f"head {head_name!r} replaced (model.reset_head)"
    fresh_head = bool(report.head)
    take = {}
    for key, tensor in own.items():
        if fresh_head and key in head_keys:
            continue
        if key not in weights:
            report.missing.append(key)
        elif weights[key].shape != tensor.shape:
            report.mismatched.append(f"{key}: {tuple(weights[key].shape)} in the file vs {tuple(tensor.shape)}")
        else:
            take[key] = weights[key]
    report.unexpected = [k for k in weights if k not in own]
    report.loaded = list(take)
    if strict and report.problems():
        raise CheckpointError(
            f"model.pretrained: {source} does not fit the model (set model.pretrained_strict=false to load what "
            "fits):\n  " + "\n  ".join(report.problems())
        )
    if not take:
        raise CheckpointError(
            f"model.pretrained: nothing in {source} fits the model:\n  " + "\n  ".join(report.problems())
        )
    with torch.no_grad():
        model.load_state_dict(take, strict=False)
    return report


def pretrained_from_config(model: nn.Module, config: ModelConfig) -> PretrainedReport:
    """Load `model.pretrained` (path or URL) into `model` as the recipe's model section says."""
    assert config.pretrained is not None
    path = weights_file(config.pretrained, config.pretrained_sha256)
    return load_pretrained(
        model, read_weights(path), source=str(path), reset_head=config.reset_head, strict=config.pretrained_strict
    )


WEIGHTS_FILE = "model.safetensors"  # what `run.save_weights` writes into the run folder


def save_weights(model: nn.Module, folder: str | Path) -> Path:
    """The model's state dict as `folder/model.safetensors` (contiguous copies; written to a temporary name and
    renamed, so a reader never sees half a file), for `model.pretrained`."""
    path = Path(folder) / WEIGHTS_FILE
    weights = {_strip_wrappers(k): v.detach().to("cpu").clone().contiguous() for k, v in model.state_dict().items()}
    try:
        write_atomic_bytes(path, lambda f: f.write(save(weights)))
    except OSError as error:
        raise CheckpointError(f"cannot write {path}: {error.strerror or error}") from None
    return path
