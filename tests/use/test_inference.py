"""Using what was trained: evaluate, predict, hasten.load, safetensors and ONNX exports (hasten/use/load.py,
evaluation.py, exporting.py, data/preprocessing.py). One tiny run with a weight EMA (decay 0.9, so the evaluated
weights are not the live ones) serves most tests; fp32 without channels_last, so an export run in fp32 must
reproduce the run's accuracy exactly."""

from __future__ import annotations

import csv
import json

import numpy
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

import hasten
import hasten.models as models_module
from hasten.cli import main
from hasten.data import load_dataset
from hasten.data.makefolder import write_image_folder
from hasten.data.preprocessing import Preprocessing
from hasten.data.transforms import resize_images
from hasten.errors import CheckpointError
from hasten.runfolder.checkpoint import checkpoints_in, load_checkpoint, save_checkpoint
from hasten.tune import rules
from hasten.use.load import evaluated_state_dict
from tests.tiny import TINY_GAN_OVERRIDES, tiny_recipe

SYNTHETIC = 384  # training images; the test set is a quarter of it


def tiny(run_dir, *extra: str) -> list[str]:
    return tiny_recipe(run_dir, f"data.synthetic_size={SYNTHETIC}", "run.tensorboard=false", *extra)


@pytest.fixture(scope="module")
def ema_run(tmp_path_factory):
    """A finished run of the default recipe (flip TTA on) with an EMA of decay 0.9, in fp32, saving its weights.
    Every evaluation with the run's TTA (train.mid_eval=tta; by default those before the last are on the plain
    view), so an earlier checkpoint's recorded accuracy is what its export, which applies the TTA, reproduces."""
    run = tmp_path_factory.mktemp("inference") / "run"
    torch.manual_seed(0)
    summary = hasten.train(None, tiny(run, "tricks.ema=0.9", "precision=fp32", "train.channels_last=false",
                                      "train.tta_flip=true", "run.save_weights=true",
                                      "train.mid_eval=tta"))  # fmt: skip
    return run, summary


def synthetic_test_set():
    data = load_dataset("synthetic", synthetic_size=SYNTHETIC, seed=0)
    return data.test_images, data.test_labels


def accuracy(predicted, labels) -> float:
    return int((torch.as_tensor(predicted) == labels).sum()) / len(labels)


def test_summary_records_classes_sizes_splits_and_preprocessing(ema_run):
    run, summary = ema_run
    saved = json.loads((run / "summary.json").read_text())
    assert saved["classes"] == [str(d) for d in range(10)]
    assert saved["dataset"] == {"name": "synthetic", "train_size": SYNTHETIC, "test_size": SYNTHETIC // 4,
                                "test_split": "test"}  # fmt: skip
    assert saved["accuracy_measured_on"]["test"].startswith("test split, 96 images, the evaluated weights")
    assert json.dumps(saved).count('"test_accuracy"') == 1  # scripts find the metric once
    pre = Preprocessing.from_dict(saved["preprocessing"])
    images, _ = synthetic_test_set()
    train = load_dataset("synthetic", synthetic_size=SYNTHETIC, seed=0).train_images.double() / 255
    assert (pre.mode, pre.height, pre.width) == ("L", 28, 28)
    assert pre.mean[0] == pytest.approx(float(train.mean()), abs=1e-6)
    assert pre.std[0] == pytest.approx(float(train.std(unbiased=False)), abs=1e-6)
    assert "x = pixels / 255" in saved["preprocessing"]["steps"]


def test_evaluated_weights_are_the_ema_copy_everywhere(ema_run):
    """The EMA-vs-live case: what evaluate, exports and run.save_weights use is the EMA copy, not the live model."""
    run, summary = ema_run
    state = load_checkpoint(checkpoints_in(run / "checkpoints")[0])
    evaluated = evaluated_state_dict(state)
    ema = state["hooks"]["ema"]
    assert int(ema["n_averaged"]) == summary["steps"]
    assert evaluated.keys() == state["model"].keys()
    assert all(torch.equal(evaluated[k], ema[f"module.{k}"]) for k in evaluated)
    assert any(not torch.equal(evaluated[k], state["model"][k]) for k in evaluated if evaluated[k].is_floating_point())
    saved = load_file(str(run / "model.safetensors"))  # run.save_weights
    assert saved.keys() == evaluated.keys() and all(torch.equal(saved[k], evaluated[k]) for k in saved)
    no_ema = dict(state, recipe={**state["recipe"], "tricks": {**state["recipe"]["tricks"], "ema": 0.0}})
    assert all(torch.equal(evaluated_state_dict(no_ema)[k], state["model"][k]) for k in evaluated)


@pytest.mark.numerics
def test_evaluate_prints_summary_accuracy_and_writes_confusion(ema_run, tmp_path, capsys):
    run, summary = ema_run
    assert main(["evaluate", str(run), "--out", str(tmp_path / "ev"), "--top-k", "3"]) == 0
    out = capsys.readouterr().out
    assert f"accuracy {summary['test_accuracy']!r} (summary.json: {summary['test_accuracy']!r})" in out
    result = json.loads((tmp_path / "ev" / "evaluation.json").read_text())
    assert result["accuracy"] == summary["test_accuracy"] == result["results"]["flip_tta"]["accuracy"]
    confusion = torch.tensor(result["confusion"])
    assert (
        int(confusion.sum()) == SYNTHETIC // 4
        and int(confusion.diag().sum()) == result["results"]["flip_tta"]["correct"]
    )
    for name in ("plain", "flip_tta"):
        r = result["results"][name]
        assert r["top3_accuracy"] >= r["accuracy"]
    per_class = result["results"]["flip_tta"]["per_class_accuracy"]
    assert per_class["3"] == pytest.approx(float(confusion[3, 3] / confusion[3].sum()))
    rows = (tmp_path / "ev" / "confusion.csv").read_text().splitlines()
    assert rows[0].split(",")[1:] == [str(d) for d in range(10)] and len(rows) == 11
    assert (tmp_path / "ev" / "confusion.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.numerics
def test_evaluate_equals_summary_in_bf16_with_channels_last(tmp_path):
    """The default recipe's evaluation settings (bf16 autocast, channels_last, flip TTA, EMA): still exact."""
    # bf16 and channels_last fixed, not the default's `auto`: a CPU without bf16 kernels would probe fp32 and test
    # something else
    summary = hasten.train(None, tiny(tmp_path / "run", "precision=bf16", "tricks.ema=0.9", "train.epochs=1",
                                      "train.tta_flip=true"))  # fmt: skip
    assert (summary["precision"], summary["channels_last"]) == ("bf16", True)
    from hasten.use.evaluate import evaluate

    result = evaluate(tmp_path / "run", out=tmp_path / "ev")
    assert result["run_setting"] == "flip_tta"  # synthetic data alone would have turned the flips off
    assert result["accuracy"] == summary["test_accuracy"] == result["recorded_test_accuracy"]


def test_evaluate_on_other_data_uses_the_run_normalisation(ema_run, tmp_path):
    """The run's own test images as an image folder are other data to evaluate; normalised with the run's
    statistics (not the folder's), the accuracy is the run's. Digits (8x8) are resized to the run's 28x28."""
    run, summary = ema_run
    write_image_folder(load_dataset("synthetic", synthetic_size=SYNTHETIC, seed=0), tmp_path / "folder")
    from hasten.use.evaluate import evaluate

    result = evaluate(run, ["data.name=imagefolder", f"data.root={tmp_path / 'folder'}", "data.workers=0"],
                      out=tmp_path / "ev")  # fmt: skip
    assert result["split"] == "val" and result["images"] == SYNTHETIC // 4
    assert result["accuracy"] == summary["test_accuracy"]
    digits = evaluate(run, ["data.name=digits"])
    assert digits["images"] == 360 and (run / "evaluation-digits" / "confusion.csv").is_file()


@pytest.mark.numerics
def test_safetensors_export_carries_metadata_and_reproduces_accuracy(ema_run, tmp_path, monkeypatch):
    run, summary = ema_run
    out = tmp_path / "model.safetensors"
    assert main(["export", str(run), str(out)]) == 0
    from safetensors import safe_open

    with safe_open(str(out), framework="pt") as f:
        meta = {k: json.loads(v) for k, v in f.metadata().items()}
    assert meta["hasten_classes"] == [str(d) for d in range(10)] and meta["hasten_tta_flip"] is True
    assert meta["hasten_test_accuracy"] == summary["test_accuracy"]
    assert meta["hasten_input_shape"] == [1, 28, 28] and meta["hasten_recipe_name"] == "default"
    assert meta["hasten_hasten_version"] == hasten.__version__
    assert (
        meta["hasten_preprocessing"]["mean"] == json.loads((run / "summary.json").read_text())["preprocessing"]["mean"]
    )
    model = hasten.load(out)
    images, labels = synthetic_test_set()
    probs = model.probabilities(images)
    assert accuracy(probs.argmax(1), labels) == summary["test_accuracy"]
    # the same from the run folder, and from a plain nn.Module use of it
    assert torch.equal(hasten.load(run).probabilities(images), probs)
    with torch.no_grad():
        logits = model(model.preprocessing.normalise(images))
    assert accuracy(logits.argmax(1), labels) == summary["test_accuracy"]
    # predict batches as the run's evaluation would on this device in fp32 (256 images of 28x28 on a CPU), and in
    # several chunks (a smaller limit here) the same probabilities as one pass over every image
    assert model.chunk() == rules.eval_batch("cpu", 28, 28) == 256
    assert torch.allclose(probs, logits.softmax(1), atol=1e-5)
    monkeypatch.setattr(rules, "EVAL_BATCH_CPU", 32)
    assert model.chunk() == 32 and len(images) > model.chunk()
    assert torch.allclose(model.probabilities(images), probs, atol=1e-6)


@pytest.mark.numerics
def test_onnx_export_runs_in_onnxruntime_at_the_run_accuracy(ema_run, tmp_path):
    pytest.importorskip("onnx")
    onnxruntime = pytest.importorskip("onnxruntime")
    run, summary = ema_run
    out = tmp_path / "model.onnx"
    assert main(["export", str(run), str(out), "--format", "onnx"]) == 0
    session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    meta = {k: json.loads(v) for k, v in session.get_modelmeta().custom_metadata_map.items()}
    assert meta["hasten_classes"] == [str(d) for d in range(10)]
    images, labels = synthetic_test_set()
    (logits,) = session.run(None, {"pixels": images.numpy()})  # uint8 in: normalisation and TTA are in the graph
    assert logits.shape == (len(labels), 10)
    reference = hasten.load(run)
    with torch.no_grad():
        expected = reference(reference.preprocessing.normalise(images))
    assert numpy.abs(logits - expected.numpy()).max() <= 1e-4 * max(1.0, float(expected.abs().max()))
    assert accuracy(logits.argmax(1), labels) == summary["test_accuracy"]
    (one,) = session.run(None, {"pixels": images[:1].numpy()})  # the batch axis is dynamic
    assert one.shape == (1, 10)
    assert [p.label for p in hasten.load(out).predict(images[:8])] == [str(int(i)) for i in logits[:8].argmax(1)]


def write_pngs(folder, images, labels, mode: str = "L", scale: int = 1) -> list:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, (image, label) in enumerate(zip(images, labels.tolist(), strict=True)):
        picture = Image.fromarray(image[0].numpy()).convert(mode)
        if scale != 1:
            picture = picture.resize((28 * scale, 28 * scale), Image.Resampling.NEAREST)
        paths.append(folder / f"{i:03d}_{label}.png")
        picture.save(paths[-1])
    return paths


@pytest.mark.numerics
def test_predict_on_png_files_returns_labels_at_the_run_accuracy(ema_run, tmp_path, capsys):
    run, summary = ema_run
    images, labels = synthetic_test_set()
    write_pngs(tmp_path / "png", images, labels)
    assert main(["predict", str(run), str(tmp_path / "png"), "--json", "--top-k", "3"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == len(labels) and all(len(r["top"]) == 3 for r in rows)
    truth = [r["image"].rsplit("_", 1)[1].removesuffix(".png") for r in rows]
    assert sum(r["class"] == t for r, t in zip(rows, truth, strict=True)) / len(rows) == summary["test_accuracy"]
    assert all(r["top"][0]["probability"] >= r["top"][1]["probability"] for r in rows)
    assert main(["predict", str(run), *map(str, sorted((tmp_path / "png").iterdir())[:3]), "--csv"]) == 0
    csv_lines = capsys.readouterr().out.strip().splitlines()
    assert csv_lines[0] == "image,class_1,probability_1" and len(csv_lines) == 4
    assert main(["predict", str(run), str(tmp_path / "png" / f"000_{int(labels[0])}.png")]) == 0
    assert "probability" in capsys.readouterr().out


def test_predict_converts_images_of_any_size_and_mode_as_training_did(ema_run, tmp_path):
    run, _ = ema_run
    images, labels = synthetic_test_set()
    model = hasten.load(run)
    grey = model.predict(write_pngs(tmp_path / "grey", images[:16], labels[:16]))
    colour = model.predict(write_pngs(tmp_path / "rgb", images[:16], labels[:16], mode="RGBA"))
    assert [p.probability for p in colour] == [p.probability for p in grey]  # luma of R=G=B is the grey value
    big = model.predict(write_pngs(tmp_path / "big", images[:16], labels[:16], mode="RGB", scale=3))
    pre = model.preprocessing
    expected = model.probabilities(resize_images(images[:16].repeat_interleave(3, 2).repeat_interleave(3, 3), 28))
    assert torch.allclose(torch.tensor([p.probability for p in big]), expected.max(1).values, atol=1e-6)
    assert pre.read(tmp_path / "big" / f"000_{int(labels[0])}.png").shape == (1, 28, 28)


def test_bad_sources_exit_2_naming_the_file(ema_run, tmp_path, capsys):
    run, _ = ema_run
    text = tmp_path / "notes.txt"
    text.write_text("not a checkpoint\n")
    picture = write_pngs(tmp_path / "png", *[t[:1] for t in synthetic_test_set()])[0]
    state = load_checkpoint(checkpoints_in(run / "checkpoints")[0])
    other = save_checkpoint(
        dict(state, recipe={**state["recipe"], "model": {**state["recipe"]["model"], "width": 16}}),
        tmp_path / "other.pt",
    )
    bare = tmp_path / "bare.safetensors"
    save_file({k: v.contiguous() for k, v in state["model"].items()}, str(bare))
    for source, why in ((text, "not a checkpoint"), (picture, "not a checkpoint"), (other, "another model"),
                        (bare, "no hasten metadata"), (tmp_path / "missing", "not found")):  # fmt: skip
        out = str(tmp_path / "x.safetensors")
        for command in (["predict", str(source), str(picture)], ["export", str(source), out],
                        ["evaluate", str(source)]):  # fmt: skip
            if command[0] == "evaluate" and source == bare:
                continue  # evaluate takes runs and checkpoints only
            assert main(command) == 2, command
            err = capsys.readouterr().err
            assert str(source.name) in err and why in err, (command, err)
    assert main(["predict", str(run), str(text)]) == 2
    assert "notes.txt" in capsys.readouterr().err
    assert main(["evaluate", str(run), "model.width=16"]) == 2
    assert "model.width=16" in capsys.readouterr().err
    with pytest.raises(CheckpointError, match="no recipe"):
        hasten.load(save_checkpoint({"model": state["model"]}, tmp_path / "plain.pt"))


def test_a_file_whose_recipe_outsizes_its_weights_is_refused_before_the_model_is_built(ema_run, tmp_path, capsys):
    """An export's recipe sizes the model rebuilt from it: one that claims a far wider net than its weights (a
    crafted file; it took 23 GB) is refused before the model is built, naming the file."""
    from safetensors import safe_open

    run, _ = ema_run
    honest = tmp_path / "honest.safetensors"
    assert main(["export", str(run), str(honest)]) == 0
    with safe_open(str(honest), framework="pt") as f:
        meta, weights = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    recipe = json.loads(meta["hasten_recipe"])
    recipe["model"]["width"] = 10000
    crafted = tmp_path / "crafted.safetensors"
    save_file(weights, str(crafted), metadata={**meta, "hasten_recipe": json.dumps(recipe)})
    picture = write_pngs(tmp_path / "png", *[t[:1] for t in synthetic_test_set()])[0]
    built: list[str] = []
    real = models_module.build_model

    def watched(config, *args, **kwargs):
        built.append(str(torch.empty(0).device))  # the device new tensors go to: meta for the size check
        return real(config, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(models_module, "build_model", watched)
        assert main(["predict", str(crafted), str(picture)]) == 2
    err = capsys.readouterr().err
    assert "crafted.safetensors" in err and "parameters" in err and "Traceback" not in err
    assert built == ["meta"]  # sized on the meta device, never built for real
    assert main(["predict", str(honest), str(picture)]) == 0  # the honest file is served


def test_a_gan_run_is_refused_as_one_not_as_a_bare_state_dict(tmp_path, capsys):
    """A `hasten gan` run folder holds a generator and a discriminator and no classifier: evaluate, predict and export
    say so, not that it is a bare state dict to load with model.pretrained (which a GAN's weights do not fit)."""
    run = tmp_path / "gan"
    assert main(["gan", "dcgan-fashion", *TINY_GAN_OVERRIDES, f"run.dir={run}"]) == 0
    capsys.readouterr()
    picture = write_pngs(tmp_path / "png", *[t[:1] for t in synthetic_test_set()])[0]
    for command in (["evaluate", str(run)], ["predict", str(run), str(picture)],
                    ["export", str(run), str(tmp_path / "g.onnx")]):  # fmt: skip
        assert main(command) == 2, command
        err = capsys.readouterr().err
        assert "is a `hasten gan` checkpoint" in err and "model.pretrained" not in err, (command, err)
    with pytest.raises(CheckpointError, match="`hasten gan` checkpoint"):
        hasten.load(checkpoints_in(run / "checkpoints")[0])
    assert not (tmp_path / "g.onnx").exists()


@pytest.mark.numerics
def test_an_earlier_checkpoint_exports_the_weights_evaluated_at_its_epoch(ema_run, tmp_path):
    """A "best" or earlier checkpoint: its export carries the accuracy metrics.csv recorded for its epoch, and
    its EMA weights reproduce it."""
    run, _ = ema_run
    first = checkpoints_in(run / "checkpoints")[-1]
    state = load_checkpoint(first)
    assert state["trainer"]["epoch"] == 1
    recorded = [r for r in csv.DictReader((run / "metrics.csv").open()) if r["epoch"] == "1"][0]
    from hasten.use.export import export_safetensors

    out = export_safetensors(first, tmp_path / "epoch1.safetensors")
    model = hasten.load(out)
    assert model.facts.test_accuracy == float(recorded["test_accuracy"])
    images, labels = synthetic_test_set()
    assert accuracy(model.probabilities(images).argmax(1), labels) == float(recorded["test_accuracy"])
