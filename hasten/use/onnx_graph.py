"""What an ONNX file must not make hasten do, checked on its graph before onnxruntime opens it.

An `.onnx` file from elsewhere is data, and its graph is a program over it: it may name other files to read its
weights from, and it may compute tensors of any size from a few bytes (`ConstantOfShape [60000, 60000]` is 14.4 GB
of floats from a 16-byte shape; so are `Expand`, `Tile`, `Range`, `RandomNormal`...). onnxruntime folds the parts of
a graph that depend on no input when it opens the file, and runs the rest on every batch, taking whatever memory
they ask for. A hasten export holds its weights itself, and computes from them alone nothing larger than they are
(shapes, reshaped or cast weights). So before a session is made: a file that names another file is refused, and so
is a graph whose input-independent tensors (sized by ONNX's own shape inference, with data propagation, from the
initializers) would take more than MAX_CONSTANT_BYTES beyond a few times the file's own size, or cannot be sized.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from hasten.errors import CheckpointError

# bytes a graph may compute from its constants alone, beside CONSTANT_FILE_FACTOR times the file's size (a weight cast
# from fp16 to fp32 and transposed on the way is twice its bytes, once more while it is folded): a hasten export
# computes shapes and scalars only, some KB
MAX_CONSTANT_BYTES = 256 << 20
CONSTANT_FILE_FACTOR = 4
SHAPE_BYTES = 1 << 16  # an initializer larger is a weight, not a shape: inference reads only its type and dims


def check_onnx_graph(path: Path) -> None:
    """CheckpointError naming `path` when its graph keeps tensors in other files, or computes more from its
    constants than MAX_CONSTANT_BYTES and CONSTANT_FILE_FACTOR times the file's size allow. Without the onnx package
    (which `hasten[onnx]` installs beside onnxruntime) nothing is checked."""
    try:
        import onnx
    except ImportError:
        return
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as error:  # onnx's own error types for files that are not ONNX
        raise CheckpointError(f"{path} is not a readable ONNX model: {str(error).splitlines()[0]}") from None
    named = [t.name for t in proto.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    if named:
        raise CheckpointError(
            f"{path}: its tensors {', '.join(named[:3])} live in other files it names; hasten reads no file an export "
            "names (a hasten export holds everything itself)"
        )
    size = path.stat().st_size
    limit = MAX_CONSTANT_BYTES + CONSTANT_FILE_FACTOR * size
    computed, (op, name, shape) = constant_bytes(proto)
    if computed > limit:
        amount = f"{computed:,} bytes" if computed < math.inf else "tensors of a size shape inference cannot tell"
        largest = f"{op} {name!r} of shape {shape}" if shape is not None else f"{op} {name!r}"
        raise CheckpointError(
            f"{path}: its graph computes {amount} from its constants alone, before it has an input (the largest: "
            f"{largest}), more than the {limit:,} bytes hasten lets a file of {size:,} bytes compute so; a hasten "
            "export computes only shapes from its weights"
        )


def constant_bytes(proto: Any) -> tuple[float, tuple[str, str, list[int] | None]]:
    """The bytes of every node output of `proto`'s main graph that depends on no graph input (infinite where shape
    inference cannot size one), and the largest such output as (operator, name, shape or None).

    `proto` is changed in place, as it is read for nothing else: its `value_info` is dropped (shapes come from
    inference over the initializers, not from what the file says) and so are the values of initializers above
    SHAPE_BYTES (weights: their shapes and types stay, which is all inference reads of them; a shape of more than
    8,192 dimensions, were one there, is then not followed, and what it sizes counts as unsized), so inference, which
    copies the model, copies no weights."""
    from onnx import helper, shape_inference

    graph = proto.graph
    del graph.value_info[:]
    for tensor in graph.initializer:
        if tensor.ByteSize() > SHAPE_BYTES:
            for values in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
                tensor.ClearField(values)
    try:
        inferred = shape_inference.infer_shapes(proto, data_prop=True).graph
    except Exception:  # inference stops on a graph it finds inconsistent: then nothing is sized
        inferred = graph
    shapes: dict[str, tuple[list[int] | None, int]] = {}
    for value in (*inferred.value_info, *inferred.output):
        tensor = value.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
        known = tensor.HasField("shape") and None not in dims
        try:
            itemsize = helper.tensor_dtype_to_np_dtype(tensor.elem_type).itemsize
        except Exception:  # strings and types numpy has no size for
            itemsize = 8
        shapes[value.name] = (dims if known else None, itemsize)  # type: ignore[assignment]

    fed = {value.name for value in graph.input} - {tensor.name for tensor in graph.initializer}
    constant = {tensor.name for tensor in graph.initializer} - fed
    total: float = 0
    largest: tuple[float, tuple[str, str, list[int] | None]] = (-1, ("", "", None))
    for node in graph.node:  # in topological order, as ONNX requires
        if not all(name in constant for name in node.input if name):
            continue
        constant.update(name for name in node.output if name)
        for name in node.output:
            if not name:
                continue
            dims, itemsize = shapes.get(name, (None, 8))
            size = math.inf if dims is None else math.prod(dims) * itemsize
            total += size
            if size > largest[0]:
                largest = (size, (node.op_type, name, dims))
    return total, largest[1]
