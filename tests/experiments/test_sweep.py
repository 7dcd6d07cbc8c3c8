"""`hasten sweep`: a 2-point grid through the bench runner writes its table, results and plots; the findings
name the peak and the interpolation threshold; the double-descent recipe runs at a tiny scale."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hasten.cli import main
from hasten.experiments.sweep import findings, sweep
from hasten.recipe.schema import load_recipe


def test_two_point_grid_writes_table_results_and_plots(tiny_overrides: list[str], tmp_path: Path) -> None:
    small = ["data.synthetic_size=96", "train.batch_size=32", "train.epochs=2", "data.label_noise=0.1"]
    recipe = load_recipe("double-descent", [*tiny_overrides, *small])
    out = tmp_path / "sweep"
    rows, files = sweep(recipe, ["model.width=2,4"], out, isolate=False, command="hasten sweep ...")
    assert [r["values"]["model.width"] for r in rows] == ["2", "4"]
    assert rows[0]["parameters"] < rows[1]["parameters"]
    # each row's test error is the one its run measured at its last epoch (the curve's), not a stand-in
    assert all(len(r["curve"]) == 2 and r["test_error"] == pytest.approx(r["curve"][-1][2]) for r in rows)
    table = (out / "sweep.md").read_text()
    assert "| model.width | parameters | train error | test error |" in table
    assert table.count("\n| 2 |") == 1 and table.count("\n| 4 |") == 1
    assert "Test error against model.width: highest" in table
    names = {f.name for f in files}
    assert {"sweep.md", "results.json", "results.csv", "error_vs_width.png", "test_error_vs_epoch.png"} <= names
    assert all(f.stat().st_size > 0 for f in files)
    results = json.loads((out / "results.json").read_text())
    assert [v["overrides"] for v in results["variants"]] == [["model.width=2"], ["model.width=4"]]
    assert (out / "runs" / "01-width=2" / "r1" / "metrics.csv").is_file()


def test_cli_takes_the_grid_from_the_recipe_and_refuses_none(tiny_overrides: list[str], tmp_path: Path, capsys) -> None:
    out = tmp_path / "cli"
    small = ["data.synthetic_size=64", "train.batch_size=32", "train.epochs=1"]
    overrides = [*tiny_overrides, *small, "sweep.vary=['model.width=2,3', 'seed=0']"]
    assert main(["sweep", "double-descent", *overrides, "--out", str(out), "--in-process"]) == 0
    printed = capsys.readouterr().out
    assert "| model.width | seed | parameters |" in printed and "written:" in printed
    assert (out / "error_vs_width.png").is_file()
    assert main(["sweep", *tiny_overrides, "--in-process"]) == 2
    assert "nothing to vary" in capsys.readouterr().err


def test_double_descent_recipe_as_shipped() -> None:
    recipe = load_recipe("double-descent")
    assert recipe.data.label_noise == 0.2 and recipe.data.subset == 1000 and recipe.sweep.vary
    assert recipe.optim.weight_decay == 0 and not recipe.data.augment.flip and recipe.tricks.label_smoothing == 0


def row(width: int, train: float, test: float, curve: list[float] | None = None) -> dict:
    tests = curve or [test]
    return {
        "name": f"width={width}",
        "values": {"model.width": str(width)},
        "train_error": train,
        "test_error": test,
        "curve": [[i + 1, 0.0, t] for i, t in enumerate(tests)],
    }


def test_findings_name_the_peak_the_threshold_and_the_epoch_shape() -> None:
    rows = [row(1, 0.5, 0.40), row(4, 0.005, 0.45), row(16, 0.0, 0.30, [0.5, 0.3, 0.35, 0.32, 0.30])]
    lines = findings(rows, "model.width")
    assert lines[0] == "Test error against model.width: highest 0.450 at model.width=4, lowest 0.300 at model.width=16."
    assert "at or below 1%" in lines[1] and lines[1].endswith("at model.width=4.")
    assert lines[2] == (
        "Over epochs at width=16: test error lowest 0.300 at epoch 2, then up to 0.350 (epoch 3), final 0.300 "
        "(first epoch 0.500)."
    )
    unfitted = findings([row(1, 0.5, 0.4), row(2, 0.2, 0.3)], "model.width")
    assert "No run fitted the training set" in unfitted[1] and "0.200, at model.width=2" in unfitted[1]


@pytest.mark.parametrize("bad", ["model.width", "model.width="])
def test_malformed_vary_is_a_recipe_error(bad: str, tiny_overrides: list[str], capsys) -> None:
    assert main(["sweep", *tiny_overrides, "--vary", bad, "--in-process"]) == 2
    assert "--vary" in capsys.readouterr().err


def test_a_grid_point_that_fails_is_said_why_in_the_report_and_fails_the_command(
    tiny_overrides: list[str], tmp_path: Path, capsys
) -> None:
    out = tmp_path / "failing"
    small = ["data.synthetic_size=64", "train.batch_size=32", "train.epochs=1"]
    # a user's model: the second point gives it a width its constructor cannot build with, so that run fails
    model = ["model.name=import", "model.target=tests.run.test_user:TinyNet"]
    args = ["sweep", *tiny_overrides, *small, *model, "--vary", "model.args.width=2,wide", "--out", str(out)]
    assert main([*args, "--in-process"]) == 2
    said = capsys.readouterr()
    assert "error: sweep: 1 of 2 run(s) failed (width=wide); see sweep.md for why" in said.err
    report = (out / "sweep.md").read_text()
    assert "\n| 2 |" in report and "| wide | — | failed |" in report
    assert "\n- width=wide failed: model.target=tests.run.test_user:TinyNet: calling TinyNet raised" in report
