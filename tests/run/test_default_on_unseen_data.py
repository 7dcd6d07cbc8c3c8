"""The default recipe on a folder it was not tuned on: 300 rendered letters (b d p q F J L N R S in 15 fonts,
rotated, shifted, coloured, noisy; a mirror turns b into d), trained as a user would (`hasten train DIR`, only the
thread count fixed), at the budget the rules choose. Accuracies and chosen values are asserted, never seconds."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import hasten
from benchmarks import datasets
from hasten.tune import rules

FLOOR = 0.70  # each seed; chance is 0.10. Measured: see the test's docstring


@pytest.fixture(scope="module")
def letters(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("letters") / "letters"
    datasets.generate("letters", root, train_per_class=30, val_per_class=20)
    return root


# seed 0 also under a second kernel set in CI (the numerics pass); the three take ~1.5 min natively, ~3 under SSE4.1
@pytest.mark.parametrize("seed", [pytest.param(0, marks=pytest.mark.numerics), 1, 2])
def test_a_small_folder_is_learnt_on_every_seed_at_the_rules_budget(letters, tmp_path, seed):
    """The time rule may pick either candidate, 16 or 32, by this machine's step times. Measured on an AMD EPYC
    (AVX2), native kernels, seeds 0-2, the first conv whitened (the default): batch 16 (608 steps) 91.5%, 91.5%,
    91.0%; batch 32 (600 steps) 94.0%, 86.0%, 90.0%. Before whitening the worst was 80.5% (batch 32), and 79.5% in
    bf16 (emulated here; a CPU with bf16 instructions may pick it). FLOOR is 70%, for other kernels."""
    quiet = ["run.progress=false", "run.tensorboard=false", "train.threads=1"]
    summary = hasten.train(None, [f"data.root={letters}", "data.name=imagefolder", f"seed={seed}", *quiet,
                                  f"run.dir={tmp_path / 'run'}"])  # fmt: skip
    assert summary["test_accuracy"] >= FLOOR, summary["test_accuracy"]
    recorded = yaml.safe_load((tmp_path / "run" / "recipe.yaml").read_text())
    batch, epochs = recorded["train"]["batch_size"], recorded["train"]["epochs"]
    assert batch in rules.batch_candidates(300, None) == [16, 32] and epochs == rules.auto_epochs(300, batch)
    assert summary["steps"] == epochs * rules.steps_per_epoch(300, batch) >= rules.RUN_STEPS
    assert recorded["data"]["augment"]["flip"] is False and recorded["train"]["tta_flip"] is False  # mirrors
    assert summary["warnings"] == []
