"""The commands that use what a run trained: `hasten export` (safetensors or ONNX), `hasten evaluate` (on its own
test data or other data) and `hasten predict` (class names of image files)."""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from hasten.cli.command import TRUST_HELP, Command, arg
from hasten.errors import HastenError

MODEL_HELP = (
    "your model's import path, for a run that trained it by model.target (or from Python): the network the weights "
    "go into, called as in training; the run's own model.args are kept"
)


def cmd_export(ns: argparse.Namespace) -> int:
    from hasten.use.export import export

    print(export(ns.checkpoint, ns.out, ns.format, overwrite=ns.overwrite, trust_code=ns.trust_code,
                 model=ns.model)[1])  # fmt: skip
    return 0


EXPORT = Command(
    name="export",
    summary="write the evaluated model with its preprocessing and classes: safetensors or ONNX",
    description="Write the model a run evaluated (the EMA weights where tricks.ema was on) with its class names "
    "and preprocessing: safetensors (metadata in the header) or ONNX (uint8 pixels in, normalisation and flip "
    "TTA inside, dynamic batch; checked against PyTorch with onnxruntime).",
    arguments=(
        arg("checkpoint", help="a run folder (its newest checkpoint) or a checkpoint (.pt)"),
        arg("out", help="the file to write (.safetensors or .onnx)"),
        arg("--format", choices=["safetensors", "onnx"], help="default: from OUT's suffix (.safetensors or .onnx)"),
        arg("--overwrite", action="store_true", help="replace OUT when it exists (never a run's own files)"),
        arg("--trust-code", action="store_true", help=TRUST_HELP),
        arg("--model", metavar="MODULE:NAME", help=MODEL_HELP),
    ),
    run=cmd_export,
)


def cmd_evaluate(ns: argparse.Namespace) -> int:
    from hasten.use.evaluate import evaluate

    stray = [a for a in ns.overrides if "=" not in a]
    if stray:
        raise HastenError(f"evaluate: expected key=value data overrides after the run, got {stray[0]!r}")
    if ns.top_k < 1:
        raise HastenError(f"--top-k {ns.top_k}: at least 1")
    result = evaluate(ns.source, ns.overrides, top_k=ns.top_k, out=ns.out, trust_code=ns.trust_code)
    # names from files (class folders, paths) are text, never rich markup: a class named [/] or [red]x prints as is
    title = f"{result['source']} on {result['data']} {result['split']} ({result['images']} images)"
    table = Table(title=escape(title))
    table.add_column("class")
    for name in result["results"]:
        table.add_column(f"{name}{' (as the run)' if name == result['run_setting'] else ''}")
    first = next(iter(result["results"].values()))
    rows = [key for key in first if key.endswith("accuracy") and key != "per_class_accuracy"]
    for key in rows:
        table.add_row(key.replace("_", " "), *(f"{r[key]:.4f}" for r in result["results"].values()))
    for name in result["classes"]:
        table.add_row(
            escape(f"  {name}"), *(f"{r['per_class_accuracy'][name]:.4f}" for r in result["results"].values())
        )
    Console().print(table)
    recorded, last = result["recorded_test_accuracy"], result.get("summary_test_accuracy")
    if recorded is not None and (last is None or recorded == last):
        said = f" (summary.json: {recorded!r})"
    elif recorded is not None:  # an older checkpoint than the run's last (the newest unreadable, or one named)
        said = (f" (metrics.csv for this checkpoint: {recorded!r}; summary.json's {last!r} is the run's last "
                "weights', which these are not)")  # fmt: skip
    else:
        said = ""
    print(f"accuracy {result['accuracy']!r}{said}")
    print(f"written: {', '.join(result['files'])}")
    return 0


EVALUATE = Command(
    name="evaluate",
    summary="a run's model on its test data or other data: accuracy, top-k, per class, confusion matrix",
    description="Evaluate the model a run evaluated, on its own test data (the accuracy equals summary.json's) "
    "or on other data given as data.* overrides (e.g. data.name=imagefolder data.root=DIR): accuracy, top-k, "
    "per-class accuracy, with and without flip TTA; writes confusion.csv/.png and evaluation.json.",
    arguments=(
        arg("source", metavar="RUN_DIR|CHECKPOINT"),
        arg("overrides", nargs="*", metavar="key=value"),
        arg("--top-k", type=int, default=5, help="k of the top-k accuracy (default 5)"),
        arg("--out", metavar="DIR", help="folder to write to (default: RUN_DIR/evaluation)"),
        arg("--trust-code", action="store_true", help=TRUST_HELP),
    ),
    run=cmd_evaluate,
)


def cmd_predict(ns: argparse.Namespace) -> int:
    import csv

    from hasten.use.load import image_files, load

    if ns.json and ns.csv:
        raise HastenError("predict: --json or --csv, not both")
    if ns.top_k < 1:
        raise HastenError(f"--top-k {ns.top_k}: at least 1")
    model = load(ns.source, trust_code=ns.trust_code, model=ns.model)
    files = image_files(ns.images)
    predictions = model.predict(files, top_k=ns.top_k)
    if ns.json:
        print(json.dumps([p.as_dict() for p in predictions], indent=2))
    elif ns.csv:
        k = len(predictions[0].top)
        writer = csv.writer(sys.stdout)
        writer.writerow(["image", *(f"{c}_{i}" for i in range(1, k + 1) for c in ("class", "probability"))])
        for p in predictions:
            writer.writerow([p.source, *(v for name, prob in p.top for v in (name, f"{prob:.6f}"))])
    else:
        table = Table(title=escape(f"{ns.source}: {len(predictions)} image(s)"))
        for column in ("image", "class", "probability", *(["top k"] * (ns.top_k > 1))):
            table.add_column(column)
        for p in predictions:
            top = ", ".join(f"{name} {prob:.3f}" for name, prob in p.top)
            table.add_row(escape(p.source), escape(p.label), f"{p.probability:.4f}", *([escape(top)] * (ns.top_k > 1)))
        Console().print(table)
    return 0


PREDICT = Command(
    name="predict",
    summary="class names and probabilities for image files, from a run folder or an export",
    description="Class names and probabilities of image files (any size and mode: converted as training did), "
    "from a run folder, a checkpoint, or a hasten .safetensors or .onnx export.",
    arguments=(
        arg("source", metavar="RUN_DIR|EXPORT"),
        arg("images", nargs="+", metavar="IMAGE_OR_FOLDER"),
        arg("--top-k", type=int, default=1, help="classes shown per image (default 1)"),
        arg("--json", action="store_true", help="print JSON instead of a table"),
        arg("--csv", action="store_true", help="print CSV instead of a table"),
        arg("--trust-code", action="store_true", help=TRUST_HELP),
        arg("--model", metavar="MODULE:NAME", help=MODEL_HELP),
    ),
    run=cmd_predict,
)
