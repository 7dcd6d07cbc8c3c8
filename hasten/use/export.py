"""Exports that stand alone: the evaluated weights with everything needed to use them.

- **safetensors**: the weights `evaluated_state_dict` picks (EMA where the run evaluated it), plus metadata in
  the file's header (string keys `hasten_*`, JSON values): class names, preprocessing (Pillow mode, input size
  and channels, resize, mean/std, and the steps in words), input shape, the run's test-time augmentation
  (`tta_flip`, `tta_translate`), the recipe (so `hasten.load` rebuilds the model), its name, the hasten version
  and the test accuracy the run measured with these weights. The normalisation is not in the weights: the
  metadata says what to do.
- **ONNX** (`torch.onnx.export`, the torch.export-based exporter, falling back to the TorchScript one for
  models it cannot trace): a graph that takes uint8 pixels (N, C, H, W) with a dynamic batch axis, and does
  the /255 scaling, the normalisation and (where the run used them) the flip and translate TTA inside, so
  onnxruntime needs only the image conversion the metadata describes (Pillow mode and resize). After writing,
  the file is run by onnxruntime on a seeded probe batch and must match PyTorch within `ONNX_TOLERANCE`.

An export never replaces what the user had: OUT must end in the format's suffix, must not be one of a run
folder's own files (its checkpoints, recipe.yaml, summary.json, ...), and must not exist unless `overwrite`
(`--overwrite`). The source is data: a `model.target` its recipe names is imported only with `trust_code`.
"""

from __future__ import annotations

import io
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from hasten.errors import CheckpointError, HastenError
from hasten.files import write_atomic_bytes
from hasten.models.copying import folded_norms
from hasten.recipe.trust import Trust
from hasten.runfolder.folder import check_output
from hasten.techniques.tta import black_fill, tta_logits
from hasten.use.load import (
    RunFacts,
    checkpoint_of,
    evaluated_state_dict,
    facts_from_checkpoint,
    network,
    safetensors_facts,
)
from hasten.version import __version__

# max |onnxruntime logits - PyTorch logits| allowed, relative to max(1, the largest |logit|): fp32 kernels
# order their sums differently, which costs ~1e-6; 1e-4 leaves room for deeper models
ONNX_TOLERANCE = 1e-4
FORMATS = {"safetensors": ".safetensors", "onnx": ".onnx"}  # format -> the suffix its file must have


def weights_and_facts(source: str | Path, trust: Trust | None = None) -> tuple[Path, dict[str, Tensor], RunFacts]:
    """The evaluated weights and the run's facts of a run folder, a checkpoint or a hasten safetensors file."""
    path = Path(source)
    if path.suffix == ".safetensors" and path.is_file():
        weights, facts = safetensors_facts(path)
        return path, weights, facts
    if not path.exists():
        raise CheckpointError(f"not found: {path} (expected a run folder, a checkpoint or a hasten .safetensors)")
    path, state = checkpoint_of(path)
    return path, evaluated_state_dict(state), facts_from_checkpoint(path, state, trust)


def metadata(facts: RunFacts, source: Path) -> dict[str, Any]:
    """What an export carries besides the weights (module docstring)."""
    pre = facts.preprocessing
    return {
        "classes": facts.classes,
        "preprocessing": pre.to_dict() if pre else None,
        "input_shape": list(facts.image_shape),
        "mean": list(facts.mean),
        "std": list(facts.std),
        "tta_flip": facts.tta_flip,
        "tta_translate": facts.tta_translate,
        "recipe_name": facts.recipe.name,
        "recipe": facts.recipe.model_dump(mode="json"),
        "hasten_version": __version__,
        "test_accuracy": facts.test_accuracy,
        "exported_from": str(source),
    }


def _encode(meta: dict[str, Any]) -> dict[str, str]:
    return {f"hasten_{key}": json.dumps(value) for key, value in meta.items()}


def _prepare_out(out: str | Path) -> Path:
    out = Path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise CheckpointError(f"cannot write {out}: {error.strerror or error}") from None
    return out


def export_safetensors(source: str | Path, out: str | Path, trust: Trust | None = None, model: Any = None) -> Path:
    """Write the evaluated weights of `source` to `out` (.safetensors) with the metadata; returns the path.
    `model`: the user's own network (as hasten.load takes it), for a run trained on a model object."""
    from safetensors.torch import save

    path, weights, facts = weights_and_facts(source, trust)
    network(
        facts, weights, str(path), trust=trust, model=model
    )  # the weights fit the recipe's model, or an error names the file
    tensors = {k: v.detach().cpu().clone().contiguous() for k, v in weights.items()}
    out = _prepare_out(out)
    try:
        write_atomic_bytes(out, lambda f: f.write(save(tensors, metadata=_encode(metadata(facts, path)))))
    except OSError as error:
        raise CheckpointError(f"cannot write {out}: {error.strerror or error}") from None
    return out


class PixelsToLogits(nn.Module):
    """uint8 pixels (N, C, H, W) -> logits: the run's /255 and normalisation, the network, and the TTA the
    run evaluated with (hasten/techniques/tta.py). What the ONNX graph holds. A run whose images were floats of the
    user's own making takes float32 images (N, C, H, W) made the same way instead (the metadata's steps say so)."""

    def __init__(self, model: nn.Module, facts: RunFacts):
        super().__init__()
        self.model, self.tta_flip, self.tta_translate = model, facts.tta_flip, facts.tta_translate
        # training's / 255 of its images, whose units a pixel is brought to first (preprocessing.units_of): a run
        # on floats in [0, 1] saw pixels / 255; one on floats of the user's own making takes those floats as input
        self.divisor = 255.0 * 255.0 if facts.preprocessing is not None and facts.preprocessing.fraction else 255.0
        self.register_buffer("mean", torch.tensor(facts.mean).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(facts.std).view(1, -1, 1, 1))
        self.register_buffer("fill", black_fill(self.mean, self.std))

    def forward(self, pixels: Tensor) -> Tensor:
        x = (pixels.float() / self.divisor - self.mean) / self.std
        # float32 logits whatever the network's own dtype (a user's `.double()` model that casts its input itself)
        return tta_logits(self.model, x, self.tta_flip, self.tta_translate, self.fill).float()


# torch.export warns that nn.RNN/LSTM/GRU's `_flat_weights` (its parameters' list, re-assigned by the module itself)
# "were assigned during export": nothing the user can or should change, and the export is checked against PyTorch;
# a message naming any other attribute still shows
RNN_WEIGHTS_NOTICE = r"The tensor attributes (\S+\._flat_weights\[\d+\](, )?)+ were assigned during export"


def _onnx_proto(graph: nn.Module, example: Tensor) -> Any:
    """The ONNX ModelProto of `graph` with a dynamic batch axis: torch.export-based exporter first, the
    TorchScript one where it cannot trace the model."""
    import onnx

    names = dict(input_names=["pixels"], output_names=["logits"])
    try:
        batch = torch.export.Dim("batch", min=1)
        with warnings.catch_warnings():  # torch's own recurrent layers' weights, not the user's code
            warnings.filterwarnings("ignore", message=RNN_WEIGHTS_NOTICE, category=UserWarning)
            program = torch.onnx.export(graph, (example,), dynamo=True, dynamic_shapes=({0: batch},), verbose=False,
                                        **names)  # fmt: skip
        return program.model_proto
    except Exception as error:  # the exporter raises many types; the fallback below reports its own failure
        print(f"torch.export-based ONNX export failed ({type(error).__name__}); trying the TorchScript exporter",
              file=sys.stderr)  # fmt: skip
    buffer = io.BytesIO()
    try:
        torch.onnx.export(graph, (example,), buffer, dynamo=False, dynamic_axes={"pixels": {0: "batch"},
                          "logits": {0: "batch"}}, **names)  # fmt: skip
    except Exception as error:
        raise HastenError(f"ONNX export failed for this model: {type(error).__name__}: {error}") from None
    return onnx.load_from_string(buffer.getvalue())


def export_onnx(
    source: str | Path, out: str | Path, trust: Trust | None = None, model: Any = None
) -> tuple[Path, float]:
    """Write `source`'s evaluated model as ONNX (uint8 pixels in, logits out, preprocessing inside) with the
    metadata as metadata_props; returns the path and the max |onnxruntime - PyTorch| on a probe batch."""
    try:
        import onnx
        import onnxruntime
    except ImportError:
        raise HastenError("ONNX export needs onnx, onnxscript and onnxruntime: pip install 'hasten[onnx]'") from None
    path, weights, facts = weights_and_facts(source, trust)
    net = folded_norms(network(facts, weights, str(path), trust=trust, model=model))
    graph = PixelsToLogits(net, facts).eval()
    floats = facts.preprocessing is not None and facts.preprocessing.units == "own"  # the graph takes what trained
    example = torch.zeros((2, *facts.image_shape), dtype=torch.float32 if floats else torch.uint8)
    proto = _onnx_proto(graph, example)
    onnx.helper.set_model_props(proto, _encode(metadata(facts, path)))
    out = _prepare_out(out)
    try:
        write_atomic_bytes(out, lambda f: f.write(proto.SerializeToString()))
    except OSError as error:
        raise CheckpointError(f"cannot write {out}: {error.strerror or error}") from None
    probe = torch.randint(0, 256, (5, *facts.image_shape), generator=torch.Generator().manual_seed(0))
    probe = probe.float() / 255 if floats else probe.to(torch.uint8)
    with torch.no_grad():
        expected = graph(probe)
    try:
        session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    except Exception as error:  # noqa: BLE001 - onnxruntime's own error types; reported with the file kept aside
        os.replace(out, out.with_name(out.name + ".unverified"))
        from hasten.models.user import weight_dtypes_besides_float32  # as load.py: only where it is needed

        kinds = weight_dtypes_besides_float32(graph)
        why = (f" (the model computes in {', '.join(kinds)}: onnxruntime's CPU kernels for some operators are float32 "
               "only; build the model in float32, or export .safetensors)") if kinds else ""  # fmt: skip
        raise HastenError(
            f"{out}: onnxruntime cannot run the exported graph: {str(error).strip()}{why}; kept as "
            f"{out.name}.unverified"
        ) from None
    got = torch.from_numpy(session.run(None, {"pixels": probe.numpy()})[0])
    difference, limit = float((got - expected).abs().max()), ONNX_TOLERANCE * max(1.0, float(expected.abs().max()))
    if difference > limit:
        os.replace(out, out.with_name(out.name + ".mismatch"))
        with torch.no_grad():
            again = float((graph(probe) - expected).abs().max())
        why = (f" (PyTorch's own logits differ by {again:.3g} from one call to the next on the same images: something "
               "random stays on in evaluation, such as F.dropout(x, p) without training=self.training)"
               if again > limit else "")  # fmt: skip
        raise HastenError(
            f"{out}: onnxruntime's logits differ from PyTorch's by {difference:.3g} (tolerance {ONNX_TOLERANCE:g} "
            f"relative){why}; kept as {out.name}.mismatch for inspection"
        )
    return out, difference


def export(
    source: str | Path,
    out: str | Path,
    fmt: str | None = None,
    *,
    overwrite: bool = False,
    trust_code: bool = False,
    model: Any = None,
    overwrite_flag: str = "--overwrite",
) -> tuple[Path, str]:
    """Export in `fmt` (safetensors or onnx; None: from `out`'s suffix); returns the path and a line saying what
    was written. `out` must end in the format's suffix, must not be a run folder's own file, and must not exist
    unless `overwrite`; a `model.target` the source names is imported only with `trust_code`. `model`: the user's
    own network for a run trained on a model object (an nn.Module, or the class or function that makes it).
    `overwrite_flag`: the switch a refusal names ("--overwrite" on the command line, "overwrite=True" from Python);
    a leading ~ in `out` is the user's home folder."""
    suffix = Path(out).suffix.lower()
    by_suffix = {ending: name for name, ending in FORMATS.items()}
    if fmt is not None and fmt not in FORMATS:
        raise HastenError(f"--format {fmt!r}: one of {', '.join(FORMATS)}")
    fmt = fmt or by_suffix.get(suffix)
    if fmt is None or suffix != FORMATS[fmt]:
        wanted = FORMATS[fmt] if fmt else " or ".join(FORMATS.values())
        raise HastenError(
            f"export: {out}: the file to write must end in {wanted} (got {suffix or 'no suffix'}), so what it holds "
            "is clear from its name"
        )
    out = Path(out).expanduser()  # "~/m.onnx" from Python, as a shell would have it: never a folder named ~
    check_output(out, overwrite, "export:", overwrite_flag)
    trust = Trust(code=trust_code)
    if fmt == "onnx":
        path, difference = export_onnx(source, out, trust, model)
        return path, f"{path} (onnxruntime matches PyTorch within {difference:.2g} on a probe batch)"
    path = export_safetensors(source, out, trust, model)
    return path, str(path)
