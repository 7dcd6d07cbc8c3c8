"""The scripts in examples/ run, each on small data (HASTEN_EXAMPLE_SMALL=1), and example (a)'s model and data
train from the command line by import path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.counted import assert_counted

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 300  # seconds: a hang fails the test instead of the suite
SMALL = os.environ | {"HASTEN_EXAMPLE_SMALL": "1", "OMP_NUM_THREADS": "1"}


def run(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=SMALL, capture_output=True, text=True, timeout=TIMEOUT)


@pytest.mark.parametrize(
    ("script", "model", "classes"),
    [
        ("own_tensors.py", "examples.own_tensors.DigitNet", 10),
        ("own_dataset.py", "examples.own_dataset.ShapeNet", 3),
        ("plain_loop.py", "torch.nn.modules.container.Sequential", 10),
    ],
)
def test_example_runs_and_its_run_folder_records_the_model(tmp_path, script, model, classes):
    result = run([f"examples/{script}", f"run.dir={tmp_path / 'run'}"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "test accuracy" in result.stdout
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["epochs"] == 1
    assert_counted(summary)
    recorded = yaml.safe_load((tmp_path / "run" / "recipe.yaml").read_text())
    assert recorded["model"]["name"] == "object" and recorded["model"]["target"].endswith(model.rsplit(".", 1)[1])
    assert recorded["model"]["parameters"] > 0 and len(recorded["data"]["classes"]) == classes


def test_the_plain_loop_it_replaces_runs_too():
    result = run(["examples/plain_loop.py", "--plain"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "plain loop: test accuracy" in result.stdout


def test_example_model_and_data_by_import_path_from_the_command_line(tmp_path):
    model = ["model.name=import", "model.target=examples.own_tensors:DigitNet", "model.args={width: 8}"]
    data = ["data.name=import", "data.target=examples.own_tensors:load_digits"]
    quick = ["train.epochs=1", "tricks.ema=0", "run.progress=false", "train.threads=1", f"run.dir={tmp_path / 'run'}"]
    args = ["-m", "hasten", "train", "fashion-fast", *model, *data, *quick]
    result = run(args)
    assert result.returncode == 0, result.stderr[-3000:]
    recorded = yaml.safe_load((tmp_path / "run" / "recipe.yaml").read_text())
    assert recorded["model"]["name"] == "import" and recorded["model"]["target"] == "examples.own_tensors:DigitNet"
    assert recorded["model"]["args"] == {"width": 8} and recorded["model"]["parameters"] > 0
    assert recorded["data"]["target"] == "examples.own_tensors:load_digits" and recorded["data"]["classes"][0] == "zero"


@pytest.mark.parametrize(
    ("script", "target"),
    [
        ("groupnorm_cnn.py", "GroupNormCNN"),
        ("plain_cnn.py", "PlainCNN"),
        ("vit.py", "TinyViT"),
        ("mlp.py", "MLP"),
        ("mobilenet.py", "MobileNetLike"),
        ("timm_resnet.py", "ResNet"),
    ],
)
def test_each_model_family_of_the_suite_trains_by_itself_with_the_rules_for_a_model_hasten_did_not_write(
    tmp_path, script, target
):
    from hasten.machine import current as current_machine
    from hasten.tune import choices, rules

    result = run([f"examples/models/{script}", "train.epochs=2", f"run.dir={tmp_path / 'run'}", "run.progress=false"])
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["epochs"] == 2 and summary["test_accuracy"] > 0.3  # 10 digits: chance is 10%
    recorded = yaml.safe_load((tmp_path / "run" / "recipe.yaml").read_text())
    batch_norm = script in ("mobilenet.py", "timm_resnet.py")
    lr = rules.BATCH_NORM_LR if batch_norm else rules.NO_BATCH_NORM_LR
    assert recorded["model"]["target"].endswith(target) and recorded["optim"]["lr"] == lr
    said = (result.stderr + result.stdout).replace("\n  ", " ")  # hasten's notes, unwrapped
    assert "optim.lr unset" in said
    if len(choices.precision_candidates(current_machine(), "cpu")) > 1:  # bf16 is timed here: its safety checked first
        assert "gradient in reduced precision" in said
    else:  # fp32 alone on this CPU (AVX2): said so, and no reduced precision to check
        assert "precision=auto -> fp32: the CPU has no bf16 instructions" in said
        assert "gradient in reduced precision" not in said
