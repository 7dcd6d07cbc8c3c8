"""benchmarks/generalization.py: its machinery on one tiny cell (synthetic data, 1 epoch, a tiny model), the
cache that lets an interrupted run resume, and the verdict logic (a FAIL cell is reported as FAIL)."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "generalization.py"


@pytest.fixture(scope="module")
def generalization():
    spec = importlib.util.spec_from_file_location("generalization", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TINY = ["data.synthetic_size=64", "data.test_subset=64", "model.width=4", "model.blocks=[1]"]


def test_one_tiny_cell_end_to_end_and_resumed_from_the_cache(generalization, tmp_path: Path, monkeypatch) -> None:
    argv = ["--only", "synthetic", "--budgets", "1", "--no-recipe-budget", "--out", str(tmp_path), *TINY]
    assert generalization.main(argv) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert [r["variant"] for r in results["runs"]] == ["default", "plain", "naive"]
    for run in results["runs"]:
        assert run["exit_code"] == 0, run
        assert 0.0 <= run["test_accuracy"] <= 1.0 and run["train_loss"] > 0
        assert "data.name=synthetic" in run["overrides"] and "train.epochs=1" in run["overrides"]
    default, plain, naive = results["runs"]

    # the data overrides are the same for all three; the plain baseline adds its settings and nothing else
    def picks_data(run: dict) -> list[str]:
        return [o for o in run["overrides"] if o.startswith("data.") and not o.startswith("data.augment.")]

    assert picks_data(default) == picks_data(plain) == picks_data(naive)
    assert set(plain["overrides"]) - set(default["overrides"]) == set(generalization.PLAIN)
    assert set(default["overrides"]) <= set(plain["overrides"])
    assert default["overrides"] == naive["overrides"]
    (row,) = results["cells"]
    assert row["dataset"] == "synthetic" and row["epochs"] == 1
    assert row["chance"] == pytest.approx(max(row["chance"], 0.1)) and 0 < row["chance"] < 1
    assert row["default"] == default["test_accuracy"] and row["plain"] == plain["test_accuracy"]
    expected, _ = generalization.verdict(row["default"], row["plain"], row["chance"], 0.01, 0.05)
    assert row["verdict"] == expected
    report = (tmp_path / "report.md").read_text()
    assert (
        f"python benchmarks/generalization.py {' '.join(argv)}".replace("model.blocks=[1]", "'model.blocks=[1]'")
        in report
    )
    assert "| synthetic | 1 |" in report
    assert ("**FAIL**" in report) == (expected == "FAIL")
    assert (tmp_path / "default_vs_plain.png").stat().st_size > 1000
    assert (tmp_path / "runs" / "synthetic__e1__default__s0" / "recipe.yaml").is_file()

    def no_runs(*args, **kwargs):
        raise AssertionError("a cached cell was run again")

    monkeypatch.setattr(generalization, "run_one", no_runs)
    assert generalization.main(argv) == 0  # everything from the cache
    assert json.loads((tmp_path / "results.json").read_text())["runs"] == results["runs"]


def test_verdict(generalization) -> None:
    verdict = generalization.verdict
    assert verdict(0.90, 0.905, 0.1, 0.01, 0.05) == ("OK", "")
    assert verdict(0.85, 0.90, 0.1, 0.01, 0.05)[0] == "FAIL"
    assert "5.0 points below plain" in verdict(0.85, 0.90, 0.1, 0.01, 0.05)[1]
    assert verdict(0.12, 0.11, 0.1, 0.01, 0.05) == ("FAIL", "within 5 points of chance")
    assert verdict(None, 0.9, 0.1, 0.01, 0.05) == ("FAIL", "the default run failed")
    assert verdict(0.5, None, 0.1, 0.01, 0.05) == ("OK", "")  # a failed baseline does not fail the default


def _run(dataset: str, variant: str, accuracy: float | None, seed: int = 0) -> dict:
    warnings = ["loss above ln C"] if accuracy == 0.1 else []
    return {
        "dataset": dataset, "epochs": 2, "variant": variant, "seed": seed, "recipe_budget": False,
        "test_accuracy": accuracy, "train_loss": 1.0, "seconds": 3.0, "warnings": warnings,
    }  # fmt: skip


def test_a_failing_cell_is_reported_as_fail(generalization, tmp_path: Path) -> None:
    runs = [_run("letters", "default", 0.1), _run("letters", "plain", 0.89), _run("letters", "naive", 0.85)]
    runs += [_run("good", "default", 0.9), _run("good", "plain", 0.88), _run("good", "naive", 0.8)]
    runs += [_run("good", "default", 0.8, seed=1), _run("good", "plain", 0.88, 1), _run("good", "naive", None, 1)]
    args = argparse.Namespace(plain_margin=0.01, chance_margin=0.05)
    rows = generalization.table_rows(runs, {"letters": 0.1, "good": 0.1}, args)
    letters, good = rows
    assert letters["verdict"] == "FAIL" and "79.0 points below plain" in letters["why"]
    assert good["default"] == pytest.approx(0.85) and good["verdict"] == "FAIL"  # the mean over seeds: 3 below
    assert good["naive"] is None  # one failed seed is not averaged away
    assert letters["default_warnings"] == ["loss above ln C"]
    results = {"command": "python benchmarks/generalization.py x", "recipe": "r", "seeds": [0, 1]}
    results |= {"plain_margin": 0.01, "chance_margin": 0.05}
    text = generalization.write_report(rows, results, tmp_path).read_text()
    assert "**2 of 2 cells FAIL.**" in text
    assert "| letters | 2 | 10.0 | 10.0 | 89.0 | 85.0 |" in text and "**FAIL** (79.0 points below plain" in text
    assert "| good | 2 | 10.0 | 85.0 | 88.0 | failed |" in text
    assert "letters, 2 epochs, default: warning loss above ln C" in text
    rows[1] |= {"default": 0.9, "verdict": "OK"}
    rows = rows[1:]
    assert "All 1 cells OK." in generalization.write_report(rows, results, tmp_path).read_text()


def test_cache_follows_the_resolved_recipe_and_user_folders(generalization, tmp_path: Path, monkeypatch) -> None:
    """A cell is reused while its resolved recipe is unchanged and run again when it changes; --folder adds the
    user's own image folder as one more dataset, with the same variants."""
    from hasten.data.toy import make_toy

    make_toy("shapes", tmp_path / "mine", train_per_class=4, val_per_class=2)
    calls: list[tuple[str, list[str]]] = []

    def fake_run(recipe: str, variant: str, overrides: list[str], epochs: int, run_dir: Path) -> dict:
        calls.append((variant, overrides))
        return {"exit_code": 0, "seconds": 1.0, "command": "x", "test_accuracy": 0.5, "train_loss": 1.0}

    monkeypatch.setattr(generalization, "run_one", fake_run)
    argv = ["--only", "synthetic", "--folder", str(tmp_path / "mine"), "--budgets", "1", "--no-recipe-budget"]
    argv += ["--out", str(tmp_path / "out"), *TINY]
    assert generalization.main(argv) == 0
    assert len(calls) == 6  # 2 datasets x 3 variants
    assert f"data.root={tmp_path / 'mine'}" in calls[3][1] and "data.name=imagefolder" in calls[3][1]
    rows = json.loads((tmp_path / "out" / "results.json").read_text())["cells"]
    assert [r["dataset"] for r in rows] == ["synthetic", "mine"] and rows[1]["chance"] == pytest.approx(0.2)
    generalization.main(argv)
    assert len(calls) == 6  # all from the cache
    generalization.main(argv[:-1] + ["model.blocks=[2]"])
    assert len(calls) == 12  # another model: every cell again
    generalization.main(argv[:-1] + ["model.blocks=[3]", "--report-only", "--budgets", "1,2"])
    assert len(calls) == 12  # --report-only runs nothing: the cached cells as they are
    report = (tmp_path / "out" / "report.md").read_text()
    assert "| synthetic | 1 |" in report and "| synthetic | 2 |" not in report
    with pytest.raises(SystemExit):
        generalization.parse_args(["--folder", str(tmp_path / "nothing-here")])
    with pytest.raises(SystemExit):
        generalization.parse_args(["--only", "letters"])


def test_an_interrupted_run_is_not_cached(generalization, tmp_path: Path, monkeypatch) -> None:
    class Stopped:
        returncode = 130  # what hasten train exits with after SIGINT

    monkeypatch.setattr(generalization.subprocess, "run", lambda *a, **k: Stopped())
    with pytest.raises(KeyboardInterrupt):
        generalization.main(["--only", "synthetic", "--budgets", "1", "--no-recipe-budget", "--out", str(tmp_path)])
    assert not list(tmp_path.rglob("cells/*.json"))


def test_a_bad_override_is_an_error_naming_it(generalization, tmp_path: Path, capsys) -> None:
    assert generalization.main(["--only", "synthetic", "--out", str(tmp_path), "model.widht=4"]) == 2
    assert "model.widht" in capsys.readouterr().err
