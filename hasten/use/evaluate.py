"""`hasten evaluate`: a run's evaluated model measured again, on its own test data or on other data.

On the run's own data it repeats the run's evaluation exactly (the same test loader, normalisation, weights
from `evaluated_state_dict`, precision autocast and memory format, and the run's own evaluation loop,
hasten/run/evaluation.py), so its accuracy with the run's TTA setting equals summary.json's `test_accuracy`.
It reports accuracy, top-k accuracy and per-class accuracy with and without flip test-time augmentation (and
with the run's translate TTA, `train.tta_translate`, when it used one; hasten/techniques/tta.py), and writes
the confusion matrix (CSV and PNG) and evaluation.json, as timm's validate.py does for ImageNet models.

Other data: `data.*` overrides (e.g. `data.name=imagefolder data.root=DIR`); its images are brought to the
run's size and channel count, and normalised with the run's training statistics, never their own.

The checkpoint is data (hasten/recipe/trust.py's trust boundary): a `model.target` or `data.target` its recipe names is
imported only with `trust_code`, or when the overrides name the same target. The results are written into a
temporary folder beside the output folder and moved into place once all are written, so a full disk or any
other failure leaves no half-written evaluation.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import io
import json
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from hasten.errors import DataError, HastenError, RecipeError
from hasten.recipe.schema import apply_overrides, parse_value, validate
from hasten.recipe.trust import Trust, embedded_recipe
from hasten.run.evaluation import Measured, evaluate_loader
from hasten.runfolder.checkpoint import disk_full_message
from hasten.runfolder.folder import RunFolderError, check_output, is_run_folder
from hasten.text import listed
from hasten.use.load import (
    RunFacts,
    checked_top_k,
    checkpoint_of,
    evaluated_state_dict,
    facts_from_checkpoint,
    network,
)

# what evaluate may change: the data, and how it runs; the model and its training are the checkpoint's
ALLOWED_OVERRIDES = ("data.", "train.eval_batch_size=", "train.threads=", "device=", "model.target=")
OUTPUT_FILES = ("confusion.csv", "confusion.png", "evaluation.json")  # what an evaluation writes
SETTINGS = {"plain": (False, 0), "flip_tta": (True, 0)}  # result name -> (flip TTA, translate TTA pixels)


def settings(tta_flip: bool, tta_translate: int) -> tuple[dict[str, tuple[bool, int]], str]:
    """The TTA settings evaluate measures, by result name, and the name of the run's own: plain and flip always,
    and the run's translate TTA (with its flip setting) when it had one."""
    measured = dict(SETTINGS)
    if tta_translate:
        name = "flip_translate_tta" if tta_flip else "translate_tta"
        measured[name] = (tta_flip, tta_translate)
        return measured, name
    return measured, "flip_tta" if tta_flip else "plain"


def _test_loader(recipe: Any, data: Any, facts: RunFacts, device: torch.device) -> Any:
    """The test loader the run's evaluation used, normalised with the run's training statistics."""
    from hasten.data.imagefolder import ImageFolder, ImageFolderLoader
    from hasten.data.loader import InMemoryLoader
    from hasten.run.loading import loader_options, loader_workers

    _, options = loader_options(recipe, torch.tensor(facts.mean), torch.tensor(facts.std), device, facts.image_shape)
    if isinstance(data, ImageFolder):
        decoder = data.decoder(data.test)
        return ImageFolderLoader(decoder, workers=loader_workers(recipe), **options)
    return InMemoryLoader(data.test_images, data.test_labels, **options)


def named_targets(overrides: Sequence[str]) -> dict[str, str]:
    """The import paths the user names in `overrides` (model.target=..., data.target=...): trusted as named."""
    named = {}
    for item in overrides:
        key, _, text = item.partition("=")
        if key in ("model.target", "data.target"):
            named[key] = str(parse_value(text))
    return named


def _recipe(state: dict[str, Any], facts: RunFacts, overrides: Sequence[str], source: str) -> Any:
    bad = [o for o in overrides if not o.startswith(ALLOWED_OVERRIDES)]
    if bad:
        raise RecipeError(
            f"evaluate: {', '.join(bad)}: only data.* keys, train.eval_batch_size, train.threads and device can be "
            "changed (the model and its training are the checkpoint's)"
        )
    saved = (
        (state["recipe"].get("model") or {}).get("target") if isinstance(state["recipe"].get("model"), dict) else None
    )
    named = named_targets(overrides).get("model.target")
    if named is not None and named != saved:
        raise RecipeError(
            f"evaluate: model.target={named}: the checkpoint's model is {saved or 'hasten built-in'}; model.target= "
            "may only name the same target, to trust it"
        )
    raw = apply_overrides(state["recipe"], list(overrides))
    if any(o.startswith("data.") for o in overrides):  # other data: brought to the run's input, unless told
        channels, height, width = facts.image_shape
        data = raw.setdefault("data", {})
        if height == width and not any(o.startswith("data.size=") for o in overrides):
            data["size"] = height
        if channels in (1, 3) and not any(o.startswith("data.rgb=") for o in overrides):
            data["rgb"] = channels == 3
        if not any(o.startswith("data.classes=") for o in overrides):
            data["classes"] = None  # the run's class names describe its own data; other data brings its own
    return validate(raw, f"the recipe in {source} with {' '.join(overrides)}" if overrides else source)


def _measure(sums: Measured, num_classes: int, top_k: int) -> dict[str, Any]:
    """One setting's scores: accuracy as the run's evaluation counts it, top-k and the confusion matrix from its
    kept logits."""
    logits, labels = torch.cat(sums.logits), torch.cat(sums.labels)
    predicted = logits.argmax(1)
    correct, count = int(sums.correct), sums.count
    k = min(top_k, num_classes)
    in_top = (logits.topk(k, dim=1).indices == labels[:, None]).any(1)
    confusion = torch.bincount(labels * num_classes + predicted, minlength=num_classes**2).view(num_classes, -1)
    return {
        "accuracy": correct / max(count, 1),  # as the trainer computes it: correct / count
        "correct": correct,
        "count": count,
        f"top{k}_accuracy": int(in_top.sum()) / max(count, 1),
        "confusion": confusion,
    }


def _write_confusion(confusion: Tensor, classes: list[str], folder: Path, title: str) -> list[Path]:
    """confusion.csv (rows: true class, columns: predicted) and confusion.png."""
    text = io.StringIO()
    writer = csv.writer(text)
    writer.writerow(["true \\ predicted", *classes])
    for name, row in zip(classes, confusion.tolist(), strict=True):
        writer.writerow([name, *row])
    (folder / "confusion.csv").write_text(text.getvalue(), encoding="utf-8", errors="backslashreplace")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(classes)
    fig, ax = plt.subplots(figsize=(max(5, 0.5 * n + 2), max(4, 0.5 * n + 1.5)))
    ax.imshow(confusion.numpy(), cmap="Blues")
    if n <= 30:  # names and counts stay legible up to about this many classes
        ax.set_xticks(range(n), classes, rotation=60, ha="right", fontsize=8)
        ax.set_yticks(range(n), classes, fontsize=8)
        peak = int(confusion.max()) or 1
        for (i, j), value in zip(torch.cartesian_prod(torch.arange(n), torch.arange(n)).tolist(),
                                 confusion.flatten().tolist(), strict=True):  # fmt: skip
            ax.text(j, i, str(value), ha="center", va="center", fontsize=7,
                    color="white" if value > peak / 2 else "black")  # fmt: skip
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(folder / "confusion.png", dpi=120)
    plt.close(fig)
    return [folder / "confusion.csv", folder / "confusion.png"]


def class_match(data: list[str], run: list[str]) -> str:
    """How the data's labels meet the run's classes: label i is scored as the run's class i. "by name" where the
    names agree (or the data's are only the numbers 0..K-1, a registered set's or arrays' own), else what differs,
    said as the warning it is: a class renamed or one the run did not have scores its images as another's."""
    if data == run or data == [str(i) for i in range(len(data))]:
        return "by name"
    pairs = [f"{d} as {r}" for d, r in zip(data, run, strict=True) if d != r]
    order = "in another order " if sorted(data) == sorted(run) else ""
    return (
        f"the data's class names are not the run's {order}and labels are scored by position: {listed(pairs, 5)}; "
        "name the data's classes as the run's (summary.json's classes) for an accuracy that means something"
    )


def evaluate(
    source: str | Path,
    overrides: Sequence[str] = (),
    *,
    top_k: int = 5,
    out: str | Path | None = None,
    trust_code: bool = False,
) -> dict[str, Any]:
    """Evaluate the model a run evaluated (`source`: run folder or checkpoint) on its test data, or on the
    data `overrides` name; returns the results (also written, with the confusion matrix, to `out`). A
    `model.target`/`data.target` the checkpoint names is imported only with `trust_code` or named in `overrides`."""
    from hasten.data.preprocessing import held_out_split
    from hasten.engine.distributed import resolve_device
    from hasten.engine.precision import make_precision
    from hasten.run.build import dataset

    top_k = checked_top_k(top_k)
    path, state = checkpoint_of(source)
    trust = Trust(code=trust_code, named=named_targets(overrides))
    facts = facts_from_checkpoint(path, state, trust)
    recipe = _recipe(state, facts, overrides, str(path))
    if out is not None:
        _check_output_folder(Path(out))  # before the data is read: a refused folder costs nothing
    if recipe.train.threads:
        torch.set_num_threads(recipe.train.threads)
    device = resolve_device(recipe.device)
    with embedded_recipe(str(path), trust):
        data = dataset(recipe)
    if len(data.classes) != len(facts.classes) or tuple(data.image_shape) != tuple(facts.image_shape):
        raise DataError(
            f"data.name={recipe.data.name}: {len(data.classes)} classes of {tuple(data.image_shape)} images, but "
            f"{path} was trained on {len(facts.classes)} classes of {tuple(facts.image_shape)} images"
        )
    matched = class_match(list(data.classes), list(facts.classes))
    if matched != "by name":
        print(f"warning: {matched}", file=sys.stderr)  # loud: an accuracy over mismatched names is no accuracy
    precision = make_precision(recipe.precision, device, recipe.loss_scale.init, recipe.loss_scale.growth_interval)
    model = network(facts, evaluated_state_dict(state), str(path), prepare=precision.prepare, trust=trust).to(device)
    if recipe.train.channels_last:
        model = model.to(memory_format=torch.channels_last)
    measured, headline = settings(facts.tta_flip, facts.tta_translate)
    loader = _test_loader(recipe, data, facts, device)
    # the run's own evaluation loop, op for op, over every setting at once
    passes = evaluate_loader(model, loader, precision, list(measured.values()), device, keep_predictions=True)
    results = {name: _measure(sums, len(facts.classes), top_k) for name, sums in zip(measured, passes, strict=True)}
    for result in results.values():
        confusion = result["confusion"]
        per_class = confusion.diag() / confusion.sum(1).clamp_min(1)
        result["per_class_accuracy"] = dict(zip(facts.classes, per_class.tolist(), strict=True))
    own_data = not any(o.startswith("data.") for o in overrides)
    folder = Path(out) if out else path.parent.parent / ("evaluation" if own_data else f"evaluation-{recipe.data.name}")
    test_split = held_out_split(data)
    files = [folder / name for name in OUTPUT_FILES]
    summary = {
        "source": str(path),
        "data": recipe.data.name,
        "split": test_split,
        "images": passes[0].count,
        "run_tta_flip": facts.tta_flip,
        "run_tta_translate": facts.tta_translate,
        "run_setting": headline,  # the result computed as the run evaluated
        "accuracy": results[headline]["accuracy"],  # the run's setting: summary.json's test_accuracy on its data
        "recorded_test_accuracy": facts.test_accuracy if own_data else None,  # metrics.csv's, for these weights
        "summary_test_accuracy": facts.summary_accuracy if own_data else None,  # the run's last weights'
        "classes": facts.classes,
        "data_classes": list(data.classes),
        "classes_matched": matched,  # "by name", or the warning that they were scored by position
        "results": {name: {k: v for k, v in r.items() if k != "confusion"} for name, r in results.items()},
        "confusion": results[headline]["confusion"].tolist(),
        "files": [str(f) for f in files],
    }
    title = f"{recipe.name}: {recipe.data.name} {test_split} ({headline})"
    with staged_output(folder) as stage:
        _write_confusion(results[headline]["confusion"], facts.classes, stage, title)
        (stage / "evaluation.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary


def _check_output_folder(folder: Path) -> None:
    """The folder an evaluation writes may be new, an earlier evaluation's, or any folder that holds none of the
    files it writes; never a run folder itself or its own files (RUN/checkpoints), nor files of another kind (an
    evaluation.json is recognised by what it holds, not by its name), nor anything reached through a link."""
    check_output(folder / OUTPUT_FILES[-1], overwrite=True, what="evaluate --out:")
    if folder.is_symlink() or any((folder / name).is_symlink() for name in OUTPUT_FILES):
        raise RunFolderError(
            f"evaluate --out: {folder} is, or holds, a symbolic link; an evaluation writes only into a folder of "
            "its own, never through a link: give another folder"
        )
    if folder.exists() and not folder.is_dir():
        raise RunFolderError(f"evaluate --out: {folder} is a file; give a folder")
    if is_run_folder(folder):
        raise RunFolderError(
            f"evaluate --out: {folder} is a run folder; its results go into its evaluation/ (the default), or "
            "give a folder of their own"
        )
    ours = [folder / name for name in OUTPUT_FILES if (folder / name).exists()]
    if ours and not written_by_evaluate(folder / "evaluation.json"):
        names = ", ".join(p.name for p in ours)
        raise RunFolderError(f"evaluate --out: {folder} holds {names} that no evaluation wrote; give another folder")


EVALUATION_KEYS = {"source", "run_setting", "results", "files"}  # what every evaluation.json hasten writes holds


def written_by_evaluate(path: Path) -> bool:
    """Whether `path` is an evaluation.json that `hasten evaluate` wrote (read at most 64 MiB: a larger one is
    not), by its contents: a JSON object holding the keys every evaluation writes."""
    try:
        if not path.is_file() or path.stat().st_size > 64 << 20:
            return False
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(found, dict) and EVALUATION_KEYS <= found.keys()


@contextlib.contextmanager
def staged_output(folder: Path) -> Any:
    """A temporary folder beside `folder` to write the results into; once the block ends they are moved into
    `folder` (made, or an earlier evaluation's files replaced). On any failure the temporary folder goes and
    `folder` is as it was; a full disk is a HastenError saying how much space is free."""
    _check_output_folder(folder)
    stage = folder.parent / f".{folder.name}.tmp-{os.getpid()}"
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(stage, ignore_errors=True)
        stage.mkdir()
        yield stage
        if not folder.exists():
            os.rename(stage, folder)
        else:
            for item in sorted(stage.iterdir()):
                os.replace(item, folder / item.name)
    except OSError as error:
        space = f"; it {disk_full_message(folder, 1 << 20)}" if error.errno in (errno.ENOSPC, errno.EDQUOT) else ""
        raise HastenError(f"evaluate: cannot write {folder}: {error.strerror or error}{space}") from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)
