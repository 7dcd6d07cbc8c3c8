"""`hasten gan`: a DCGAN step in each precision, per-network loss scaling, sample grids, the Fréchet distance,
resume, and the command end to end, on tiny networks and the synthetic dataset."""

from __future__ import annotations

import csv
import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import benchmarks.gan_checkpoints as gan_checkpoints
from hasten.cli import main
from hasten.data import load_dataset
from hasten.errors import CheckpointError, RecipeError
from hasten.experiments import gan
from hasten.experiments.frechet import (
    ClassifierFeatures,
    QualityProbe,
    frechet_distance,
    gaussian_stats,
    load_classifier,
    trace_sqrt_product,
    trace_sqrt_product_eigh,
)
from hasten.experiments.gan import build_gan, gan_step, restore, train_gan
from hasten.experiments.gan_report import (
    collapse_warning,
    generate,
    histogram_lines,
    largest_class,
    results_table,
    save_grid,
)
from hasten.models import build_model
from hasten.models.dcgan import SIZE, padded, signed
from hasten.recipe.gan import GanRecipe, load_gan_recipe
from hasten.recipe.schema import ModelConfig
from hasten.run.plan import Interrupted
from hasten.runfolder.checkpoint import checkpoints_in, load_checkpoint, save_checkpoint
from tests.tiny import TINY_GAN_OVERRIDES


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny networks run fastest on one thread; train.threads=1 in a recipe sets torch's, process-wide."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny(tmp_path, *extra: str) -> GanRecipe:
    """The shared tiny GAN recipe (tests/tiny.py) on the CPU, in batches of 8, writing into tmp_path/run."""
    overrides = [*TINY_GAN_OVERRIDES, "train.batch_size=8", "device=cpu", f"run.dir={tmp_path / 'run'}", *extra]
    return load_gan_recipe("dcgan-fashion", overrides)


def params(module: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def same(before: list[torch.Tensor], module: torch.nn.Module) -> bool:
    return all(torch.equal(a, b) for a, b in zip(before, module.parameters(), strict=True))


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_one_step_in_each_precision_updates_both_networks(tmp_path, precision):
    # fp16 starts below the default 2^16, which overflows on a first step and skips it
    parts = build_gan(tiny(tmp_path, f"precision={precision}", "loss_scale.init=256"))
    g_before, d_before = params(parts.generator), params(parts.discriminator)
    real, _ = next(iter(parts.loader.batches()))
    result = gan_step(parts, real)
    assert result.stepped_d and result.stepped_g
    assert torch.isfinite(result.loss_d) and torch.isfinite(result.loss_g)
    assert 0 < result.d_real < 1 and 0 < result.d_fake < 1
    assert not same(g_before, parts.generator) and not same(d_before, parts.discriminator)
    weights = [*parts.generator.parameters(), *parts.discriminator.parameters()]
    assert all(p.dtype == torch.float32 and p.requires_grad for p in weights)  # D unfrozen again after G's step


@pytest.mark.parametrize("broken", ["discriminator", "generator"])
def test_inf_in_one_networks_gradients_skips_only_its_step_and_halves_only_its_scale(tmp_path, broken):
    parts = build_gan(tiny(tmp_path, "precision=fp16", "loss_scale.init=256"))
    net = getattr(parts, broken)
    next(net.parameters()).register_hook(lambda grad: torch.full_like(grad, float("inf")))
    g_before, d_before = params(parts.generator), params(parts.discriminator)
    real, _ = next(iter(parts.loader.batches()))
    result = gan_step(parts, real)
    d_broken = broken == "discriminator"
    assert (result.stepped_d, result.stepped_g) == (not d_broken, d_broken)
    assert same(d_before, parts.discriminator) == d_broken and same(g_before, parts.generator) == (not d_broken)
    assert (parts.precision_d.loss_scale, parts.precision_g.loss_scale) == (
        (128.0, 256.0) if d_broken else (256.0, 128.0)
    )
    skipped = parts.optimizer_d if d_broken else parts.optimizer_g
    taken = parts.optimizer_g if d_broken else parts.optimizer_d
    assert not skipped.state and taken.state  # Adam's moments untouched by the skipped step


def test_grid_png_has_the_expected_size_and_pixels(tmp_path):
    images = -torch.ones(64, 1, SIZE, SIZE)
    images[0] = 1.0
    save_grid(images, tmp_path / "grid.png", rows=8)
    grid = Image.open(tmp_path / "grid.png")
    assert grid.size == (8 * 32 + 9 * 2, 8 * 32 + 9 * 2) and grid.mode == "L"
    pixels = np.asarray(grid)
    assert (pixels[2:34, 2:34] == 255).all() and pixels[:2].max() == 0 and pixels[40:].max() == 0
    save_grid(torch.zeros(10, 3, SIZE, SIZE), tmp_path / "rgb.png", rows=2)
    assert Image.open(tmp_path / "rgb.png").size == (5 * 32 + 6 * 2, 2 * 32 + 3 * 2)


@pytest.mark.numerics
def test_frechet_distance_exact_values():
    one_d = frechet_distance((np.array([0.0]), np.array([[1.0]])), (np.array([1.0]), np.array([[4.0]])))
    assert one_d == pytest.approx(1 + 1 + 4 - 2 * 2)
    a, b = np.diag([1.0, 9.0]), np.diag([4.0, 1.0])  # diagonal: sum of (sqrt(a) - sqrt(b))^2 plus the mean term
    assert frechet_distance((np.zeros(2), a), (np.array([3.0, 4.0]), b)) == pytest.approx(25 + 1 + 4)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(200, 6)), rng.normal(size=(200, 6)) @ rng.normal(size=(6, 6))
    sigma_x, sigma_y = np.cov(x, rowvar=False), np.cov(y, rowvar=False)
    assert trace_sqrt_product(sigma_x, sigma_y) == pytest.approx(trace_sqrt_product_eigh(sigma_x, sigma_y), rel=1e-6)


def test_frechet_on_classifier_features_self_is_zero_real_vs_noise_large():
    data = load_dataset("synthetic", synthetic_size=256)
    model = build_model(ModelConfig(width=4), data.image_shape, data.num_classes)  # features need no training
    features = ClassifierFeatures(model, torch.tensor([0.5]), torch.tensor([0.25]), 28, SIZE)
    real = signed(padded(data.train_images))
    first, second = features(real[:128])[0], features(real[128:])[0]
    noise = features(torch.rand(128, 1, SIZE, SIZE) * 2 - 1)[0]
    assert features(real[:4])[0].shape == (4, 16)  # the input of the last linear layer: 4 x width channels
    stats = gaussian_stats(first)
    assert abs(frechet_distance(stats, stats)) < 1e-6 * np.trace(stats[1])
    halves = frechet_distance(stats, gaussian_stats(second))
    assert frechet_distance(stats, gaussian_stats(noise)) > 10 * halves


def test_resume_restores_both_optimizers_and_scalers_and_continues_exactly(tmp_path):
    straight = train_gan(tiny(tmp_path / "a", "precision=fp16", "train.epochs=2"))
    first = train_gan(tiny(tmp_path / "b", "precision=fp16", "train.epochs=1"))
    assert first["skipped_steps_d"] + first["skipped_steps_g"] > 0  # the default scale overflows at first
    saved = load_checkpoint(checkpoints_in(tmp_path / "b" / "run" / "checkpoints")[0])
    parts = build_gan(tiny(tmp_path / "b", "precision=fp16"))
    state = restore(parts, saved, tmp_path / "saved.pt")
    assert state.epoch == 1 and state.step == 8
    assert parts.precision_d.state_dict() == saved["scaler_d"] and parts.precision_g.state_dict() == saved["scaler_g"]
    assert parts.precision_d.loss_scale < 2.0**16 and parts.precision_g.loss_scale < 2.0**16
    for name in ("optimizer_d", "optimizer_g"):
        restored, expected = getattr(parts, name).state_dict()["state"], saved[name]["state"]
        assert restored.keys() == expected.keys() and restored
        assert all(torch.equal(restored[k]["exp_avg"], expected[k]["exp_avg"]) for k in expected)

    resumed = train_gan(tiny(tmp_path / "b", "precision=fp16", "train.epochs=2", "resume=auto"))
    assert {k: resumed[k] for k in ("steps", "loss_d", "loss_g", "loss_scale_d", "loss_scale_g")} == {
        k: straight[k] for k in ("steps", "loss_d", "loss_g", "loss_scale_d", "loss_scale_g")
    }
    end_a, end_b = (load_checkpoint(checkpoints_in(tmp_path / r / "run" / "checkpoints")[0]) for r in "ab")
    for net in ("generator", "discriminator"):
        assert all(torch.equal(end_a[net][k], end_b[net][k]) for k in end_a[net])
    rows = list(csv.DictReader((tmp_path / "b" / "run" / "metrics.csv").open()))
    assert [r["epoch"] for r in rows] == ["1", "2"]


def test_gan_command_end_to_end_with_a_classifier_trained_for_it(tmp_path, capsys):
    run = tmp_path / "run"
    classifier = "[model.width=4, train.batch_size=64, train.threads=1, data.augment.translate=0]"
    args = [
        "gan", "dcgan-fashion", "data.name=synthetic", "data.synthetic_size=256", "model.width=4", "model.latent=8",
        "train.batch_size=32", "train.epochs=2", "train.threads=1", "quality.samples=64", "quality.classifier_epochs=1",
        f"quality.classifier_overrides={classifier}", "run.progress=false", f"run.dir={run}", "precision=bf16",
    ]  # fmt: skip
    code = main(args)
    assert code == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["epochs"] == 2 and summary["images_per_second"] > 0 and summary["peak_memory_bytes"] > 0
    assert summary["frechet_distance"] > 0 and summary["quality"]["measure"].endswith("not Inception FID")
    assert summary["quality"]["classifier_source"].startswith("trained:")
    assert sum(summary["class_distribution"].values()) == pytest.approx(1, abs=1e-3)
    assert set(summary["class_distribution"]) == {str(c) for c in range(10)}
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    assert [r["epoch"] for r in rows] == ["1", "2"] and all(float(r["frechet"]) > 0 for r in rows)
    assert Image.open(run / "samples" / "epoch-002.png").size == (274, 274)
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    kept = Path(summary["quality"]["classifier"])  # in hasten's cache, for every later run on this dataset
    assert kept.is_file() and kept.is_relative_to(Path(os.environ["HASTEN_CACHE"]))
    assert not (run / "classifier").exists()
    assert json.loads(capsys.readouterr().out)["frechet_distance"] == summary["frechet_distance"]
    again = tmp_path / "again"  # another GAN run, its own recipe: the classifier is not trained again
    assert main([*args[:-2], f"run.dir={again}", "precision=fp32"]) == 0
    second = json.loads((again / "summary.json").read_text())["quality"]
    assert second["classifier"] == str(kept) and second["classifier_source"].startswith("reused")


def test_recipe_and_data_errors_exit_2_naming_the_field(tmp_path, capsys):
    assert main(["gan", "model.widht=3", "precision=fp8", "optim.lr=-1"]) == 2
    err = capsys.readouterr().err
    assert "model.widht: unknown key" in err and "precision" in err and "optim.lr" in err
    assert main(["gan", "data.name=digits", "quality.enabled=false", f"run.dir={tmp_path}"]) == 2
    assert "data.name" in capsys.readouterr().err


def test_samples_use_batch_statistics_and_leave_the_running_averages_alone(tmp_path):
    parts = build_gan(tiny(tmp_path))
    buffers = {k: v.clone() for k, v in parts.generator.state_dict().items()}
    parts.generator.eval()
    z = torch.randn(16, 8)
    images = generate(parts.generator, z, batch=8)
    assert images.shape == (16, 1, SIZE, SIZE) and images.dtype == torch.float32 and images.abs().max() <= 1
    with torch.no_grad():
        from_running_averages = parts.generator(z)  # at initialisation: the same grey image for every z
    assert images.std(0).mean() > 100 * from_running_averages.std(0).mean()
    assert all(torch.equal(v, parts.generator.state_dict()[k]) for k, v in buffers.items())
    assert not parts.generator.training and all(
        m.track_running_stats for m in parts.generator.modules() if isinstance(m, torch.nn.BatchNorm2d)
    )


def test_interrupt_mid_epoch_writes_a_checkpoint_that_resumes_exactly(tmp_path, monkeypatch):
    straight = train_gan(tiny(tmp_path / "a", "train.epochs=2"))
    real_step, calls = gan.gan_step, []

    def interrupted_step(parts, real):
        calls.append(1)
        if len(calls) == 11:  # the third batch of the second epoch (8 batches an epoch)
            os.kill(os.getpid(), signal.SIGINT)  # a Ctrl-C: the run stops once this step is done
        return real_step(parts, real)

    monkeypatch.setattr(gan, "gan_step", interrupted_step)
    with pytest.raises(BaseException) as stopped:  # (a KeyboardInterrupt, as before the fix, would end pytest)
        train_gan(tiny(tmp_path / "b", "train.epochs=2"))
    assert isinstance(stopped.value, Interrupted) and stopped.value.exit_code == 130, repr(stopped.value)
    assert "stopped by SIGINT at a step boundary; checkpoint" in str(stopped.value)
    saved = load_checkpoint(checkpoints_in(tmp_path / "b" / "run" / "checkpoints")[0])
    assert (saved["state"]["epoch"], saved["state"]["batch"], saved["state"]["step"]) == (1, 3, 11)
    assert len(calls) == 11
    monkeypatch.setattr(gan, "gan_step", real_step)
    resumed = train_gan(tiny(tmp_path / "b", "train.epochs=2", "resume=auto"))
    assert resumed["steps"] == straight["steps"] == 16
    assert resumed["loss_d"] == pytest.approx(straight["loss_d"], rel=1e-12)  # the epoch's mean spans the interrupt
    end_a, end_b = (load_checkpoint(checkpoints_in(tmp_path / r / "run" / "checkpoints")[0]) for r in "ab")
    assert all(torch.equal(end_a["generator"][k], end_b["generator"][k]) for k in end_a["generator"])


def test_resuming_another_precision_or_a_foreign_file_is_an_error_naming_it(tmp_path):
    train_gan(tiny(tmp_path, "precision=bf16"))
    path = checkpoints_in(tmp_path / "run" / "checkpoints")[0]
    with pytest.raises(CheckpointError, match="precision=bf16, this recipe has fp32"):
        train_gan(tiny(tmp_path, "precision=fp32", "resume=auto", "train.epochs=2"))
    assert "precision: bf16" in (tmp_path / "run" / "recipe.yaml").read_text()  # the run folder left as it was
    foreign = tmp_path / "weights.pt"
    torch.save({"model": {"w": torch.zeros(2)}}, foreign)
    with pytest.raises(CheckpointError, match="not a checkpoint of `hasten gan`"):
        restore(build_gan(tiny(tmp_path)), load_checkpoint(foreign), foreign)
    assert path.is_file()


def test_given_classifier_is_built_from_its_saved_recipe_or_named_when_it_does_not_fit(tmp_path):
    data = load_dataset("synthetic", synthetic_size=64)
    config = ModelConfig(width=4)  # fashion-fast, the fallback recipe, says width 32: the saved recipe wins
    model = build_model(config, data.image_shape, data.num_classes)
    save_checkpoint(
        {"model": model.state_dict(), "recipe": {"model": config.model_dump(mode="json")}}, tmp_path / "c.pt"
    )
    loaded = load_classifier(tmp_path / "c.pt", "fashion-fast", [], data)
    assert all(
        torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), model.state_dict().values(), strict=True)
    )
    torch.save(model.state_dict(), tmp_path / "plain.pt")
    with pytest.raises(CheckpointError, match="quality.classifier: .*plain.pt does not fit the model of recipe"):
        load_classifier(tmp_path / "plain.pt", "fashion-fast", [], data)


def test_resume_is_top_level_as_for_train_and_the_old_key_points_there():
    assert load_gan_recipe(None, ["resume=auto"]).resume == "auto"
    with pytest.raises(RecipeError, match=r"run.resume: unknown key \(moved to resume\)"):
        load_gan_recipe(None, ["run.resume=auto"])


def test_a_folder_or_a_classifiers_recipe_is_refused_in_one_line_that_says_so(tmp_path, monkeypatch):
    """`hasten gan photos/` was told its folder was an unknown recipe ('did you mean photos/?'), and `hasten gan
    fashion-fast` got a dozen unknown keys, each right for `hasten train`."""
    (tmp_path / "photos" / "train").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RecipeError, match=r"^photos/ is a folder: hasten gan trains on a dataset of the registry"):
        load_gan_recipe("photos/")
    with pytest.raises(RecipeError) as refused:
        load_gan_recipe("fashion-fast", ["model.latent=8"])
    assert str(refused.value).startswith("shipped recipe 'fashion-fast' is a classifier's recipe, for hasten train")
    assert "\n" not in str(refused.value)
    # a GAN recipe that only holds a value out of a GAN's range is still told which value
    (tmp_path / "small.yaml").write_text("train: {batch_size: 1}\n")
    with pytest.raises(RecipeError, match=r"train.batch_size: Input should be greater than or equal to 2"):
        load_gan_recipe("small.yaml")
    (tmp_path / "dcgan-fashion").mkdir()  # a folder named like a shipped recipe does not shadow it
    assert load_gan_recipe("dcgan-fashion").name == "dcgan-fashion"


def test_collapse_warning_names_the_class_above_the_threshold_and_is_quiet_otherwise():
    collapsed = {"T-shirt/top": 0.05, "Bag": 0.81, "Boot": 0.14}
    warning = collapse_warning(collapsed)
    assert warning is not None and "'Bag'" in warning and "81%" in warning and "50%" in warning
    assert collapse_warning({"a": 0.5, "b": 0.5}) is None  # exactly half is not more than half
    assert collapse_warning({str(c): 0.1 for c in range(10)}) is None
    assert collapse_warning({"a": 0.3, "b": 0.25, "c": 0.45}, threshold=0.4) is not None
    assert collapse_warning({}) is None
    assert largest_class(collapsed) == ("Bag", 0.81)


def test_histogram_lines_have_one_bar_per_class_as_long_as_its_share():
    lines = histogram_lines({"a": 0.5, "bb": 0.25, "c": 0.0, "d": 0.25}, width=8)
    assert [line.split()[0] for line in lines] == ["a", "bb", "c", "d"]
    assert [line.count("█") for line in lines] == [4, 2, 0, 2]
    assert lines[0].endswith("50.0%") and lines[2].endswith("0.0%")
    assert len({line.index("%") for line in lines}) == 1  # shares aligned in one column
    assert histogram_lines({"a": 1 / 16}, width=8)[0].split()[1] == "▌"  # half a block for half a step


class LabelsAs:
    """A stand-in for the quality classifier: features are pixel means, the label is `label(i)` for sample i."""

    def __init__(self, classes: int, label):
        self.classes, self.label = classes, label

    def over(self, batches):
        images = torch.cat(list(batches))
        features = images.flatten(2).mean(2).repeat(1, 3) + 0.01 * torch.randn(len(images), 3)
        labels = torch.tensor([self.label(i) for i in range(len(images))])
        return features, torch.nn.functional.one_hot(labels, self.classes).float()


@pytest.mark.parametrize("collapsed", [True, False])
def test_run_warns_of_mode_collapse_and_reports_the_class_histogram(tmp_path, monkeypatch, capsys, collapsed):
    classes = [f"class {c}" for c in range(10)]
    label = (lambda i: 3 if i % 10 < 6 else i % 10) if collapsed else (lambda i: i % 10)  # 60% class 3, or 10% each

    def probe(recipe, data, device, folder, console, trust_code=False):
        reference = gaussian_stats(torch.randn(64, 3))
        info = {"measure": "stand-in", "samples": 40, "real_train_vs_test": 0.0}
        return QualityProbe(LabelsAs(10, label), reference, torch.randn(40, 8), classes, info)

    monkeypatch.setattr(gan, "quality_probe", probe)
    summary = train_gan(tiny(tmp_path, "quality.enabled=true", "train.epochs=2"))
    err = capsys.readouterr().err
    expected_share = 0.6 if collapsed else 0.1
    assert summary["class_distribution"]["class 3"] == pytest.approx(expected_share)
    assert summary["largest_class"] == {"name": "class 3" if collapsed else "class 0", "share": expected_share}
    if collapsed:
        assert err.count("mode collapse") == 2 and "'class 3'" in err and "epoch 2" in err
        assert "60%" in summary["mode_collapse"]
    else:
        assert "mode collapse" not in err and summary["mode_collapse"] is None
    rows = list(csv.DictReader((tmp_path / "run" / "metrics.csv").open()))
    assert [(r["largest_class"], float(r["largest_share"])) for r in rows] == [
        (summary["largest_class"]["name"], expected_share)
    ] * 2
    assert Image.open(summary["quality_plot"]).size[0] > 200  # Fréchet and largest share per epoch
    histogram = Image.open(summary["class_histogram"])
    assert histogram.size[0] > 200 and (tmp_path / "run" / "class_histogram.png").stat().st_size < 200_000
    table = results_table(summary | {"run_dir": "x"})
    cells = [str(cell) for column in table.columns for cell in column._cells]
    assert sum("█" in cell for cell in cells) == (5 if collapsed else 10)  # a bar per class with samples: 3, 6-9
    assert any("mode collapse" in cell for cell in cells) == collapsed


@pytest.mark.numerics
@pytest.mark.parametrize("real_label", [1.0, 0.9])
def test_discriminator_loss_uses_train_real_label_for_real_images_only(tmp_path, real_label):
    import copy

    parts = build_gan(tiny(tmp_path, "precision=fp32", f"train.real_label={real_label}"))
    generator, discriminator = copy.deepcopy(parts.generator), copy.deepcopy(parts.discriminator)
    real, _ = next(iter(parts.loader.batches()))
    torch.manual_seed(1)
    result = gan_step(parts, real)
    torch.manual_seed(1)
    with torch.no_grad():
        fake = generator(torch.randn(len(real), parts.recipe.model.latent))
        real_logits, fake_logits = discriminator(real), discriminator(fake)
    bce = torch.nn.functional.binary_cross_entropy_with_logits
    expected = bce(real_logits, torch.full_like(real_logits, real_label)) + bce(
        fake_logits, torch.zeros_like(fake_logits)
    )
    assert float(result.loss_d) == pytest.approx(float(expected), rel=1e-5)
    with pytest.raises(RecipeError, match="train.real_label"):
        tiny(tmp_path, "train.real_label=0.4")


@pytest.mark.numerics
def test_checkpoint_quality_script_measures_every_checkpoint_like_the_run(tmp_path, capsys):
    data = load_dataset("synthetic", synthetic_size=64)
    config = ModelConfig(width=4)
    model = build_model(config, data.image_shape, data.num_classes)  # untrained: features need no training
    save_checkpoint(
        {"model": model.state_dict(), "recipe": {"model": config.model_dump(mode="json")}}, tmp_path / "c.pt"
    )
    measured = train_gan(
        tiny(tmp_path, "train.epochs=2", "run.keep=5", "quality.enabled=true", "quality.samples=32",
             f"quality.classifier={tmp_path / 'c.pt'}")
    )  # fmt: skip
    assert gan_checkpoints.main([str(tmp_path / "run"), "--classifier", str(tmp_path / "c.pt"), "--samples", "32"]) == 0
    result = json.loads((tmp_path / "run" / "checkpoint_quality.json").read_text())
    assert [r["epoch"] for r in result["checkpoints"]] == [1, 2] and [r["step"] for r in result["checkpoints"]] == [
        8,
        16,
    ]
    rows = list(csv.DictReader((tmp_path / "run" / "metrics.csv").open()))
    for row, checkpoint in zip(rows, result["checkpoints"], strict=True):  # the same numbers the run measured
        assert checkpoint["frechet"] == pytest.approx(float(row["frechet"]), abs=0.01)
        assert checkpoint["largest_share"] == pytest.approx(float(row["largest_share"]))
    assert result["checkpoints"][-1]["mix"] == measured["class_distribution"]
    assert "epoch   2 step    16" in capsys.readouterr().out


def test_quality_plot_skips_unmeasured_epochs_and_rows_from_before_the_share_column(tmp_path):
    from hasten.experiments.gan_report import save_quality_plot

    history = [
        {"epoch": 1, "frechet": 40.0},  # a row restored from a checkpoint written before largest_share existed
        {"epoch": 2, "frechet": "", "largest_share": ""},  # quality.every_epoch=false: not measured
        {"epoch": 3, "frechet": 9.5, "largest_share": 0.3},
    ]
    path = save_quality_plot(history, tmp_path / "q.png", "t", 0.1, 0.5, uniform=0.1)
    assert path is not None and Image.open(path).size[0] > 200
    assert save_quality_plot([{"epoch": 1, "frechet": ""}], tmp_path / "none.png", "t", None, 0.5, 0.1) is None
    assert not (tmp_path / "none.png").exists()
