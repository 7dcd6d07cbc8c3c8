"""`hasten bench`: the harness on a tiny recipe (every file written, the naive loop beside the variants,
time-to-accuracy null where never reached), the variant planning, the FLOP count and the matmul peak.
No timing assertions."""

from __future__ import annotations

import csv
import json
import shlex

import pytest
import torch
from torch import nn

from hasten.cli import main
from hasten.errors import RecipeError
from hasten.experiments.bench import NAIVE, Variant, aggregate, bench, plan_variants
from hasten.experiments.flops import matmul_peak, train_step_flops
from hasten.experiments.interleave import rotated
from hasten.experiments.naive import naive_recipe
from hasten.experiments.variants import parse_vary, split_values, variant_recipe
from hasten.recipe.schema import load_recipe

OUTPUTS = ["results.csv", "results.json", "report.md", "accuracy_vs_time.png", "accuracy_vs_training_time.png",
           "images_per_second.png"]  # fmt: skip


@pytest.mark.machine
@pytest.mark.numerics
def test_bench_writes_every_output_with_the_naive_loop_beside_the_variants(tiny_overrides, tmp_path):
    # Nesterov SGD at optim.lr=1e-9 cannot learn (0.09 on every kernel set): its time to 60% must be null; at 0.2
    # the run is at 0.77-0.88 after one epoch and 1.0 after two under AVX2, ATen's default kernels and oneDNN's
    # SSE41 alike. (Muon's filters learn at any optim.lr, and one epoch's accuracy swung from 0.30 to 0.49 by
    # kernel set: neither can make the test's margin.)
    overrides = [*tiny_overrides, "optim.name=sgd", "train.epochs=2", "run.thresholds=[0.6]", "run.tensorboard=false",
                 "precision=bf16"]  # fmt: skip
    recipe = load_recipe("fashion-fast", overrides)
    variants = plan_variants(recipe, ["optim.lr=0.2,1e-9"])
    assert [v.name for v in variants] == [NAIVE, "lr=0.2", "lr=1e-9"]
    out = tmp_path / "bench"
    results, files = bench(
        recipe, variants, 1, out, isolate=False, warmup=False, naive_epochs=1, peak_seconds=0.05, command="test"
    )
    assert {f.name for f in files} >= set(OUTPUTS) | {"peak_memory.png"}
    assert all((out / name).stat().st_size > 0 for name in OUTPUTS)

    saved = json.loads((out / "results.json").read_text())
    assert saved["recipe"]["name"] == "fashion-fast" and saved["machine"]["torch_version"] == torch.__version__
    assert set(saved["matmul_peak"]) == {"fp32", "bf16"}  # naive runs fp32, the recipe bf16
    by_name = {v["name"]: v for v in saved["variants"]}
    naive, good, stuck = by_name[NAIVE], by_name["lr=0.2"], by_name["lr=1e-9"]
    assert naive["kind"] == "naive" and naive["epochs"] == 1 and naive["precision"] == "fp32"
    assert naive["runs"][0]["summary"]["epochs"] == 1 and len(naive["runs"][0]["curve"]) == 1
    assert good["stats"]["time_to_accuracy"]["0.60"]["median"] is not None
    assert stuck["stats"]["time_to_accuracy"]["0.60"]["median"] is None
    # on the wall clock too, from each run's start: later than its training seconds alone
    wall, train = (good["stats"][clock]["0.60"]["median"] for clock in ("time_to_accuracy_wall", "time_to_accuracy"))
    assert wall > train and stuck["stats"]["time_to_accuracy_wall"]["0.60"]["median"] is None
    assert good["speedup_vs_naive_wall"].keys() == {"0.60"}
    assert len(good["runs"][0]["curve_wall"]) == len(good["runs"][0]["curve"]) == 2  # one point per epoch
    assert stuck["runs"][0]["summary"]["time_to_accuracy"]["0.60"] is None
    for variant in saved["variants"]:
        run = variant["runs"][0]
        assert "error" not in run and run["flops_per_image"] > 0 and 0 < run["peak_fraction"]
        assert variant["stats"]["images_per_second"]["median"] > 0
        if variant["kind"] == "naive":  # no bare step for the textbook loop
            assert run["bare_step_images_per_second"] is None and run["train_of_bare"] is None
        else:  # the run against its own step alone: overhead makes the run slower (loosely: tiny runs are noisy)
            assert run["bare_step_images_per_second"] > 0 and 0 < run["wall_of_bare"] < run["train_of_bare"]

    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [r["variant"] for r in rows] == [NAIVE, "lr=0.2", "lr=1e-9"]
    assert rows[2]["time_to_0.60"] == "" and rows[1]["time_to_0.60"] != ""
    assert float(rows[1]["wall_time_to_0.60"]) > float(rows[1]["time_to_0.60"]) and rows[2]["wall_time_to_0.60"] == ""

    report = (out / "report.md").read_text()
    assert "| variant |" in report and "![test accuracy against the wall clock](accuracy_vs_time.png)" in report
    assert "Times are wall-clock seconds from the run's start" in report
    assert "## Time to accuracy in training seconds" in report and report.count("| lr=0.2 |") == 2
    assert "![test accuracy against training time](accuracy_vs_training_time.png)" in report
    assert "| lr=1e-9 |" in report and "—" in report and "Matmul peak" in report and "of bare step" in report
    # the naive run's folder has the same files as a hasten run
    naive_dir = out / "runs" / "01-naive" / "r1"
    assert {"metrics.csv", "summary.json", "recipe.yaml"} <= {p.name for p in naive_dir.iterdir()}


def test_cli_bench_runs_each_variant_in_its_own_process(tiny_overrides, tmp_path, capsys):
    out = tmp_path / "cli"
    argv = [
        "bench",
        "--no-naive",
        *tiny_overrides,
        "--repeats",
        "1",
        "train.epochs=1",
        "--no-warmup",
        "--out",
        str(out),
    ]
    code = main(argv)
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    (variant,) = results["variants"]
    assert variant["name"] == "default" and results["isolated"]
    run_dir = out / "runs" / "01-default" / "r1"
    assert (run_dir / "worker.log").is_file() and (run_dir / "summary.json").is_file()
    assert results["command"] == shlex.join(["hasten", *argv])  # as given, options in their places
    assert "| default |" in capsys.readouterr().out
    assert all((out / name).is_file() for name in OUTPUTS)


def test_a_failed_run_is_recorded_and_reported(tmp_path):
    recipe = load_recipe(None, ["data.name=mnist", f"data.root={tmp_path}", "data.download=false"])
    options = dict(isolate=False, warmup=False, measure_peak=False)
    results, _ = bench(recipe, [Variant("broken")], 1, tmp_path / "out", **options)
    (variant,) = results["variants"]
    assert "error" in variant["runs"][0] and str(tmp_path) in variant["runs"][0]["error"]
    assert variant["stats"]["runs"] == 0 and variant["stats"]["failed"] == 1
    report = (tmp_path / "out" / "report.md").read_text()
    assert "| broken | failed |" in report and "## Failed runs" in report


def test_cli_bench_exits_2_when_a_run_failed(tmp_path, capsys):
    args = ["data.name=mnist", f"data.root={tmp_path}", "data.download=false", "--no-naive", "--no-warmup"]
    assert main(["bench", *args, "--in-process", "--repeats", "1", "--out", str(tmp_path / "out")]) == 2
    assert "1 run(s) failed (default r1)" in capsys.readouterr().err
    assert (tmp_path / "out" / "report.md").is_file()


def test_plan_variants_grid_ablation_and_naive():
    recipe = load_recipe("fashion-fast", ["precision=bf16", "train.channels_last=true"])  # fixed, not auto
    grid = plan_variants(recipe, ["precision=fp32,bf16", "train.channels_last=false,true"], naive=False)
    assert [v.overrides for v in grid] == [
        ("precision=fp32", "train.channels_last=false"),
        ("precision=fp32", "train.channels_last=true"),
        ("precision=bf16", "train.channels_last=false"),
        ("precision=bf16", "train.channels_last=true"),
    ]
    assert grid[0].name == "precision=fp32 channels_last=false"
    # one change at a time; the recipe's own value (bf16) is not a change
    ablation = plan_variants(recipe, ["precision=fp32,bf16", "train.batch_size=128"], ablate=True)
    assert [v.name for v in ablation] == [NAIVE, "fashion-fast", "precision=fp32", "batch_size=128"]
    # --ablate alone: each technique the recipe has switched on, switched off
    switched_off = {o for v in plan_variants(recipe, ablate=True, naive=False) for o in v.overrides}
    assert {"precision=fp32", "train.channels_last=false", "data.augment.flip=false"} <= switched_off
    assert "tricks.mixup=0" not in switched_off  # fashion-fast has no mixup to switch off
    assert [v.name for v in plan_variants(recipe)] == [NAIVE, "fashion-fast"]


def test_vary_values_and_errors(capsys):
    assert split_values("[1,1,1],[2,2,2], 3") == ["[1,1,1]", "[2,2,2]", "3"]
    assert parse_vary(["model.blocks=[1,1],[2,2]"]) == [("model.blocks", ["[1,1]", "[2,2]"])]
    assert main(["bench", "fashion-fast", "--vary", "precision"]) == 2
    assert "--vary" in capsys.readouterr().err
    assert main(["bench", "fashion-fast", "--vary", "precision=fp32,fp8"]) == 2  # validated before any run
    assert "precision" in capsys.readouterr().err


def test_aggregate_counts_unreached_thresholds_as_slowest():
    def run(seconds):
        summary = {k: 1.0 for k in ("test_accuracy", "train_seconds", "wall_seconds", "images_per_second")}
        return {"summary": summary | {"peak_memory_bytes": 10, "time_to_accuracy": {"0.90": seconds}}}

    assert aggregate([run(3.0), run(1.0), run(None)], ["0.90"])["time_to_accuracy"]["0.90"] == {
        "median": 3.0,
        "min": 1.0,
        "max": None,  # not every run got there
        "reached": 2,
    }
    assert aggregate([run(2.0), run(None), run(None)], ["0.90"])["time_to_accuracy"]["0.90"]["median"] is None


def test_naive_recipe_is_the_textbook_setting():
    recipe = naive_recipe(load_recipe("fashion-fast"), epochs=3)
    assert (recipe.precision, recipe.train.batch_size, recipe.optim.name, recipe.optim.lr) == ("fp32", 32, "adam", 1e-3)
    assert not recipe.data.augment.flip and recipe.data.augment.translate == 0 and recipe.train.epochs == 3
    assert recipe.model == load_recipe("fashion-fast").model


def test_train_step_flops_counts_forward_and_backward_matmuls():
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
    # forward 2*4*3 per image; backward: the weight gradient 2*4*3 (the input needs no gradient)
    assert train_step_flops(model, (1, 2, 2), 3) == pytest.approx(48)
    assert model[1].weight.grad is None  # counted on a copy


@pytest.mark.machine
def test_matmul_peak_is_positive_and_reports_its_size():
    flops, size = matmul_peak(torch.float32, torch.device("cpu"), size=128, min_seconds=0.02)
    assert flops > 0 and size == 128


def test_also_runs_another_recipe_as_the_overrides_that_make_it():
    base = load_recipe("fashion-fast")
    variants = plan_variants(base, also=["double-descent", "seed-cnn-32"], naive=False)
    assert [v.name for v in variants] == ["fashion-fast", "double-descent", "seed-cnn-32"]
    for variant in variants[1:]:
        made, wanted = variant_recipe(base, variant).model_dump(), load_recipe(variant.name).model_dump()
        made["run"].pop("progress"), wanted["run"].pop("progress")  # the bench runs quietly
        assert made == wanted
    assert any(o.startswith("model.layers=[") for o in variants[2].overrides)  # a list of mappings, whole
    with pytest.raises(RecipeError, match="--also fashion-fast: each variant needs its own name"):
        plan_variants(base, also=["fashion-fast"])
    with pytest.raises(RecipeError, match="no-such-recipe"):
        plan_variants(base, also=["no-such-recipe"])


def test_each_repeat_rotates_the_variant_order_by_one_place():
    assert [rotated("abc", repeat) for repeat in range(4)] == [list("abc"), list("bca"), list("cab"), list("abc")]
    assert rotated([], 3) == []
