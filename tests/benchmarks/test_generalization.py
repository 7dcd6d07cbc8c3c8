"""benchmarks/generalization.py: one tiny cell end to end (three real processes), then the plan (arm order
rotated by seed, the recipe's own budget, runs shared between cells), the cache (resumed, rerun when the recipe or
hasten's source changes, --report-only), --jobs, and the four targets each failing on hand-made numbers."""

from __future__ import annotations

import json
import shlex
import threading
from pathlib import Path

import pytest

from benchmarks import generalization
from benchmarks import generalization_report as report

# precision and layout pinned: no start-up probe, and the same choice on every CPU
TINY = ["data.synthetic_size=64", "data.test_subset=64", "model.width=4", "model.blocks=[1]", "precision=fp32",
        "train.channels_last=false"]  # fmt: skip


def test_one_tiny_cell_end_to_end_through_the_cache_and_report_only(tmp_path: Path, monkeypatch) -> None:
    argv = ["--only", "synthetic", "--budgets", "1", "--seeds", "0", "--out", str(tmp_path), *TINY]
    assert generalization.main(argv) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    runs = results["runs"]
    assert [r["arm"] for r in runs] == ["default", "plain", "naive"]  # seed 0: the arms in their own order
    for run in runs:
        assert run["exit_code"] == 0, run
        assert run["test_accuracy"] is not None and run["train_loss"] > 0
        # the process's wall time holds the run's own: start-up, training and evaluation
        assert run["process_seconds"] > run["wall_seconds"] >= run["train_seconds"] > 0
        assert "data.name=synthetic" in run["overrides"] and "train.epochs=1" in run["overrides"]
        assert (Path(run["run_dir"]) / "summary.json").is_file()
    default, plain, naive = runs
    assert "hasten train" in default["command"].replace("-m hasten train", "hasten train")

    def picks_data(run: dict) -> list[str]:
        return [o for o in run["overrides"] if o.startswith("data.") and not o.startswith("data.augment.")]

    assert picks_data(default) == picks_data(plain) == picks_data(naive)
    plain_only = set(plain["overrides"]) - set(default["overrides"])
    assert plain_only == set(generalization.PLAIN) - set(TINY)  # plain adds its settings and nothing else
    assert default["overrides"] == naive["overrides"]
    assert plain["precision"] == "fp32" and plain["global_batch"] == 64 and plain["recorded"]["optimizer"] == "adam"
    (cell,) = results["cells"]
    assert cell["dataset"] == "synthetic" and cell["budget"] == "1" and cell["classes"] == 10
    assert cell["default"]["accuracy_median"] == default["test_accuracy"]
    assert cell["plain"]["wall_median"] == plain["process_seconds"]
    assert cell["verdict"] in ("OK", "FAIL")  # complete: every planned run is there
    text = (tmp_path / "report.md").read_text()
    assert f"Command: `python benchmarks/generalization.py {shlex.join(argv)}`" in text
    assert "| synthetic | 1 |" in text and "1 run(s) at once" in text
    assert (tmp_path / "generalization.png").stat().st_size > 1000

    def no_runs(*args, **kwargs):
        raise AssertionError("a cached run was run again")

    monkeypatch.setattr(generalization.Suite, "run_one", no_runs)
    assert generalization.main(argv) == 0  # everything from the cache
    assert json.loads((tmp_path / "results.json").read_text())["runs"] == runs
    # --report-only with another model: no run of that model is cached, so the newest of each is reported, marked
    assert generalization.main([*argv, "model.blocks=[2]", "--report-only"]) == 0
    again = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert [r["test_accuracy"] for r in again] == [r["test_accuracy"] for r in runs]
    assert all(r["other_recipe"] for r in again)


@pytest.fixture
def no_plot(monkeypatch):
    """The plot is drawn in two tests; elsewhere it only costs seconds (matplotlib)."""
    monkeypatch.setattr(generalization.report, "plot", lambda rows, path: path)


def fake_runner(calls: list, epochs: dict | None = None, accuracy: float = 0.5):
    """A Suite.run_one that records its task and returns a finished run (the default recording `epochs`)."""
    lock = threading.Lock()

    def run_one(self, task):
        with lock:
            calls.append(task)
        own = task.arm == "default" and task.budget == "recipe"
        recorded = (epochs or {}).get(task.dataset, task.epochs) if own else task.epochs
        record = {"dataset": task.dataset, "budget": task.budget, "seed": task.seed, "arm": task.arm}
        record |= {"epochs": task.epochs, "key": task.key, "code": self.code, "overrides": task.overrides}
        record |= {"exit_code": 0, "process_seconds": 2.0, "test_accuracy": accuracy, "train_seconds": 1.0}
        record |= {"recorded_epochs": recorded}
        self.cache_path(task).parent.mkdir(parents=True, exist_ok=True)
        self.cache_path(task).write_text(json.dumps(record))
        return record

    return run_one


def _argv(tmp_path: Path, *extra: str) -> list[str]:
    return ["--only", "synthetic", "--out", str(tmp_path / "out"), *extra, *TINY]


def test_arms_rotate_by_seed_and_the_recipe_budget_runs_the_default_first() -> None:
    assert generalization.arm_order(0, "3") == ["default", "plain", "naive"]
    assert generalization.arm_order(1, "3") == ["plain", "naive", "default"]
    assert generalization.arm_order(2, "3") == ["naive", "default", "plain"]
    assert generalization.arm_order(1, "recipe") == ["default", "plain", "naive"]
    assert generalization.arm_order(2, "recipe") == ["default", "naive", "plain"]


def test_the_plan_interleaves_arms_and_runs_baselines_at_the_recipes_recorded_epochs(
    tmp_path, monkeypatch, no_plot
) -> None:
    calls: list = []
    monkeypatch.setattr(generalization.Suite, "run_one", fake_runner(calls, epochs={"synthetic": 7}))
    assert generalization.main(_argv(tmp_path, "--budgets", "2,recipe", "--seeds", "0,1")) == 0
    order = [(t.budget, t.seed, t.arm) for t in calls]
    assert order == [("2", 0, "default"), ("2", 0, "plain"), ("2", 0, "naive"),
                     ("2", 1, "plain"), ("2", 1, "naive"), ("2", 1, "default"),
                     ("recipe", 0, "default"), ("recipe", 0, "plain"), ("recipe", 0, "naive"),
                     ("recipe", 1, "default"), ("recipe", 1, "plain"), ("recipe", 1, "naive")]  # fmt: skip
    by = {(t.budget, t.seed, t.arm): t for t in calls}
    assert not any(o.startswith("train.epochs=") for o in by["recipe", 0, "default"].overrides)
    assert "train.epochs=7" in by["recipe", 0, "plain"].overrides and by["recipe", 1, "naive"].epochs == 7
    rows = json.loads((tmp_path / "out" / "results.json").read_text())["cells"]
    assert [(r["budget"], r["epochs"]) for r in rows] == [("2", [2]), ("recipe", [7])]
    assert "| synthetic | recipe: 7 |" in (tmp_path / "out" / "report.md").read_text()


def test_a_cell_shares_a_run_with_another_where_they_are_the_same(tmp_path, monkeypatch, no_plot) -> None:
    """The recipe's own budget at its 5 epochs is the 5-epoch budget: each run is made once, for both cells."""
    calls: list = []
    monkeypatch.setattr(generalization.Suite, "run_one", fake_runner(calls))
    assert generalization.main(_argv(tmp_path, "--budgets", "5,recipe", "--seeds", "0", "train.epochs=5")) == 0
    assert len(calls) == 3
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [r["budget"] for r in results["runs"]] == ["5"] * 3 + ["recipe"] * 3
    assert [r["verdict"] for r in results["cells"]] == ["OK", "OK"]


def test_a_failed_default_leaves_the_recipe_budget_without_baselines(tmp_path, monkeypatch, no_plot) -> None:
    calls: list = []
    inner = fake_runner(calls)

    def failing(self, task):
        record = inner(self, task)
        if task.arm == "default":
            record |= {"exit_code": 2, "test_accuracy": None, "recorded_epochs": None, "error": "error: boom"}
        return record

    monkeypatch.setattr(generalization.Suite, "run_one", failing)
    assert generalization.main(_argv(tmp_path, "--budgets", "recipe", "--seeds", "0")) == 0
    assert [t.arm for t in calls] == ["default"]
    (cell,) = json.loads((tmp_path / "out" / "results.json").read_text())["cells"]
    assert cell["verdict"] == "FAIL (incomplete)" and "failed" in cell["targets"]["a"]["text"]
    assert "error: boom" in (tmp_path / "out" / "report.md").read_text()


def test_the_cache_follows_the_recipe_hastens_source_and_user_folders(tmp_path: Path, monkeypatch, no_plot) -> None:
    """A run is reused while its resolved recipe, data and hasten's source are unchanged; another model reruns
    every arm, other source reruns them all but, with --reuse-baselines, the default only; --folder adds an image
    folder of the user's own with the same arms."""
    from benchmarks import datasets

    datasets.generate("shapes", tmp_path / "mine", train_per_class=4, val_per_class=2)
    calls: list = []
    monkeypatch.setattr(generalization.Suite, "run_one", fake_runner(calls))
    argv = _argv(tmp_path, "--folder", str(tmp_path / "mine"), "--budgets", "1", "--seeds", "0")
    assert generalization.main(argv) == 0
    assert len(calls) == 6  # 2 datasets x 3 arms
    assert f"data.root={tmp_path / 'mine'}" in calls[3].overrides and "data.name=imagefolder" in calls[3].overrides
    rows = json.loads((tmp_path / "out" / "results.json").read_text())["cells"]
    assert [r["dataset"] for r in rows] == ["synthetic", "mine"] and rows[1]["chance"] == pytest.approx(0.2)
    generalization.main(argv)
    assert len(calls) == 6  # all from the cache
    generalization.main([*argv, "model.blocks=[2]"])
    assert len(calls) == 12  # another model: every arm again
    monkeypatch.setattr(generalization, "source_digest", lambda: "other source")
    generalization.main([*argv, "--reuse-baselines"])
    assert [t.arm for t in calls[12:]] == ["default", "default"]
    generalization.main(argv)
    assert [t.arm for t in calls[14:]] == ["plain", "naive", "plain", "naive"]
    generalization.main([*argv, "--report-only", "model.blocks=[3]", "--budgets", "1,2"])
    assert len(calls) == 18  # --report-only runs nothing
    text = (tmp_path / "out" / "report.md").read_text()
    (second,) = [line for line in text.splitlines() if line.startswith("| synthetic | 2 |")]
    assert "| synthetic | 1 |" in text and "| not run | not run | not run |" in second
    assert "- `synthetic`: registered dataset" in text and "- `mine`: an image folder of your own (--folder)" in text
    first, second = sorted((tmp_path / "mine" / "train").rglob("*.png"))[:2]
    first.write_bytes(second.read_bytes())  # the user replaces an image
    generalization.main(argv)
    assert [t.dataset for t in calls[18:]] == ["mine"] * 3
    with pytest.raises(SystemExit):
        generalization.parse_args(["--folder", str(tmp_path / "nothing-here")])
    with pytest.raises(SystemExit):
        generalization.parse_args(["--only", "letter"])
    with pytest.raises(SystemExit):
        generalization.parse_args(["--budgets", "0"])
    with pytest.raises(SystemExit):
        generalization.parse_args(["--jobs", "2", "--threads", "2"])


def test_a_model_of_the_users_own_joins_the_suite_and_its_source_keys_the_cache(
    tmp_path: Path, monkeypatch, no_plot
) -> None:
    """--model NAME=MODULE:ATTR trains the user's own model (found in the working folder, never imported by the
    suite) in cells DATASET@NAME beside the suite's; an edit to its file reruns its cells; bad specs are errors."""
    source = tmp_path / "mymodels.py"
    source.write_text("from torch import nn\n\ndef Net(num_classes, in_channels=3):\n    return nn.Linear(1, 1)\n")
    monkeypatch.chdir(tmp_path)
    calls: list = []
    monkeypatch.setattr(generalization.Suite, "run_one", fake_runner(calls))
    argv = _argv(tmp_path, "--models", "mlp", "--model", "mine=mymodels:Net", "--budgets", "1", "--seeds", "0")
    assert generalization.main(argv) == 0
    assert sorted({t.dataset for t in calls}) == ["synthetic@mine", "synthetic@mlp"] and len(calls) == 6
    mine = [t for t in calls if t.dataset == "synthetic@mine"]
    assert all("model.name=import" in t.overrides and "model.target=mymodels:Net" in t.overrides for t in mine)
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["models"] == {"mlp": generalization.MODELS["mlp"], "mine": "mymodels:Net"}
    generalization.main(argv)
    assert len(calls) == 6  # unchanged: all from the cache
    source.write_text(source.read_text() + "# the user edits the model\n")
    generalization.main(argv)
    assert [t.dataset for t in calls[6:]] == ["synthetic@mine"] * 3
    for bad in ("mine=mymodels", "=mymodels:Net", "mlp=mymodels:Net", "mine=nowhere.at_all:Net"):
        with pytest.raises(SystemExit):
            generalization.parse_args(["--model", bad])


def test_jobs_run_several_at_once_and_every_run_is_made(tmp_path: Path, monkeypatch, no_plot) -> None:
    calls: list = []
    monkeypatch.setattr(generalization.Suite, "run_one", fake_runner(calls, epochs={"synthetic": 4}))
    assert generalization.main(_argv(tmp_path, "--budgets", "1,recipe", "--seeds", "0,1,2", "--jobs", "3")) == 0
    assert len(calls) == 18 and len({(t.budget, t.seed, t.arm) for t in calls}) == 18
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["jobs"] == 3 and all(r["verdict"] == "OK" for r in results["cells"])
    assert (
        "3 run(s) at once, train.threads=1 each (a faster, noisier pass" in (tmp_path / "out" / "report.md").read_text()
    )


def test_an_interrupted_run_is_not_cached(tmp_path: Path, monkeypatch, no_plot) -> None:
    class Stopped:
        returncode = 130  # what hasten train exits with after SIGINT

    monkeypatch.setattr(generalization.subprocess, "run", lambda *a, **k: Stopped())
    with pytest.raises(KeyboardInterrupt):
        generalization.main(_argv(tmp_path, "--budgets", "1", "--seeds", "0"))
    assert not list((tmp_path / "out").rglob("cache/*.json"))


def test_a_bad_override_is_an_error_naming_it(tmp_path: Path, capsys) -> None:
    assert generalization.main(["--only", "synthetic", "--out", str(tmp_path), "model.widht=4"]) == 2
    assert "model.widht" in capsys.readouterr().err


# ---- the targets on hand-made numbers -------------------------------------------------------------------------

SEEDS = range(5)


def _judge(default, plain, default_wall=(10.0,) * 5, plain_wall=(10.0,) * 5, chance=0.1):
    return report.judge(dict(zip(SEEDS, default, strict=True)), dict(zip(SEEDS, plain, strict=True)),
                        dict(zip(SEEDS, default_wall, strict=True)), dict(zip(SEEDS, plain_wall, strict=True)),
                        chance)  # fmt: skip


def _failing(checks) -> list[str]:
    return [target for target, check in checks.items() if check["ok"] is False]


def test_every_target_holds_on_a_good_cell() -> None:
    checks = _judge([0.80, 0.82, 0.81, 0.83, 0.84], [0.80, 0.81, 0.82, 0.83, 0.85], [9, 9, 10, 10, 11])
    assert _failing(checks) == [] and all(c["ok"] for c in checks.values())
    assert report.verdict(checks, complete=True) == "OK"
    assert report.verdict(checks, complete=False) == "incomplete"


def test_target_a_the_worst_seed_against_the_plain_median() -> None:
    # plain median 0.82: the worst default seed may be 0.80, not 0.79
    assert _failing(_judge([0.80, 0.81, 0.82, 0.83, 0.84], [0.70, 0.82, 0.82, 0.83, 0.90])) == []
    checks = _judge([0.79, 0.81, 0.82, 0.83, 0.83], [0.70, 0.82, 0.82, 0.83, 0.90])
    assert _failing(checks) == ["a"]
    assert checks["a"]["text"] == "worst 79.0 vs plain median 82.0 - 2 = 80.0: 1.0 points short"
    assert report.verdict(checks, complete=True) == "FAIL"


def test_target_b_the_spread_over_seeds() -> None:
    assert _failing(_judge([0.80, 0.85, 0.82, 0.83, 0.84], [0.7] * 5)) == []  # 5 points: on the line
    checks = _judge([0.80, 0.86, 0.82, 0.83, 0.84], [0.7] * 5)
    assert _failing(checks) == ["b"] and checks["b"]["text"] == "spread 6.0 over 5 seed(s): 1.0 points over 5"


def test_target_c_the_median_wall_time() -> None:
    accuracy = [0.8] * 5
    assert _failing(_judge(accuracy, accuracy, [5, 5, 10, 30, 30], [10, 10, 10, 1, 1])) == []  # medians 10 and 10
    checks = _judge(accuracy, accuracy, [5, 5, 12, 30, 30], [10, 10, 10, 1, 1])
    assert _failing(checks) == ["c"]
    assert checks["c"]["text"] == "median 12.0 s vs plain 10.0 s (1.20x): 2.0 s slower"


def test_target_d_no_seed_at_chance() -> None:
    # 10 classes: chance 10%, at chance below 10 + 0.1 x 90 = 19%
    assert report.chance_threshold(0.1) == pytest.approx(0.19)
    checks = _judge([0.19, 0.20, 0.21, 0.22, 0.23], [0.15] * 5)
    assert _failing(checks) == []
    checks = _judge([0.185, 0.20, 0.21, 0.22, 0.23], [0.15] * 5)
    assert _failing(checks) == ["d"] and checks["d"]["text"] == "seed(s) 0 (18.5) below 19.0"
    # an imbalanced test set: chance is its largest class share
    checks = _judge([0.54] * 5, [0.54] * 5, chance=0.5)
    assert _failing(checks) == ["d"] and "below 55.0" in checks["d"]["text"]


def test_a_failed_default_seed_fails_a_b_and_d_and_a_failed_baseline_cannot_judge() -> None:
    checks = _judge([0.8, None, 0.8, 0.8, 0.8], [0.8] * 5)
    assert _failing(checks) == ["a", "b", "d"] and checks["a"]["text"] == "default seed(s) 1 failed"
    checks = _judge([0.8] * 5, [None] * 5)
    assert _failing(checks) == [] and checks["a"]["ok"] is None and checks["c"]["ok"] is None
    assert report.verdict(checks, complete=True) == "incomplete"


def _run(dataset: str, arm: str, seed: int, accuracy: float | None, seconds: float = 10.0) -> dict:
    where = {"dataset": dataset, "budget": "3", "seed": seed, "arm": arm, "epochs": 3, "key": f"{dataset}{arm}{seed}"}
    return where | {"test_accuracy": accuracy, "process_seconds": seconds, "train_seconds": seconds / 2, "warnings": []}


def test_the_report_names_the_failing_targets_and_counts_them(tmp_path: Path) -> None:
    runs = []
    for seed in range(3):
        runs += [_run("letters", "default", seed, 0.1 if seed == 2 else 0.7, 20.0), _run("letters", "plain", seed, 0.7)]
        runs += [_run("letters", "naive", seed, 0.6), _run("good", "default", seed, 0.9, 5.0)]
        runs += [_run("good", "plain", seed, 0.88), _run("good", "naive", seed, 0.8)]
    rows = report.cells(runs, {"letters": [0.1] * 10, "good": [0.1] * 10})
    letters, good = rows
    assert _failing(letters["targets"]) == ["a", "b", "c", "d"] and good["verdict"] == "OK"
    assert letters["default"]["accuracy_median"] == pytest.approx(0.7) and letters["default"]["accuracy_min"] == 0.1
    results = {"command": "python benchmarks/generalization.py x", "recipe": "r", "seeds": [0, 1, 2], "budgets": ["3"],
               "jobs": 1, "threads": 1, "environment": {}, "datasets": {}, "cells": rows, "runs": runs}  # fmt: skip
    text = report.write_report(results, tmp_path / "report.md")
    assert "**1 of 2 cells OK**, 1 FAIL." in text
    for target in "abcd":
        assert f"| ({target}) {report.TARGETS[target]} | 1 |" in text
    assert (
        "| letters | 3 | 10.0 | 70.0 (10.0-70.0) | 70.0 (70.0-70.0) | 60.0 | 20.0 / 10.0 / 10.0 | **FAIL** a: " in text
    )
    assert "c: median 20.0 s vs plain 10.0 s (2.00x): 10.0 s slower; d: seed(s) 2 (10.0) below 19.0 |" in text
    assert "| good | 3 | 10.0 | 90.0 (90.0-90.0) | 88.0 (88.0-88.0) | 80.0 | 5.0 / 10.0 / 10.0 | OK |" in text
    report.plot(rows, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 1000


def test_a_slower_default_says_its_steps_and_when_it_passed_the_plain_loops_accuracy(tmp_path: Path) -> None:
    runs = []
    curves = {0: [[1, 10, 0.4, 5.0], [2, 20, 0.65, 8.0], [3, 30, 0.7, 12.0]], 1: [[1, 10, 0.6, 6.0]]}
    curves[2] = [[1, 10, 0.3, 9.0]]
    for seed in range(3):
        mine = _run("letters", "default", seed, 0.7, 20.0) | {"steps": 2000, "global_batch": 16}
        runs += [mine | {"accuracy_curve": curves[seed]}]
        runs += [_run("letters", "plain", seed, [0.5, 0.6, 0.62][seed]) | {"steps": 500, "global_batch": 64}]
    (row,) = report.cells(runs, {"letters": [0.1] * 10})
    c = row["targets"]["c"]
    assert c["ok"] is False and c["to_plain"] == {0: 8.0, 1: 6.0, 2: None}
    assert c["why"] == (
        "4.0x plain's optimizer steps (batch 16 against 64); passed plain's median 60.0% at 7.0 s "
        "(epochs 1-2; 2 of 3 seeds), before plain's 10.0 s"
    )
    assert f"c: median 20.0 s vs plain 10.0 s (2.00x): 10.0 s slower ({c['why']})" in report._verdict_text(row)
    late = [r | {"accuracy_curve": [[1, 10, 0.6, 11.0]]} if r["arm"] == "default" else r for r in runs]
    assert (
        "at 11.0 s (epoch 1; 3 of 3 seeds), after plain's 10.0 s"
        in report.cells(late, {"letters": [0.1] * 10})[0]["targets"]["c"]["why"]
    )
    never = [r | {"accuracy_curve": [[1, 10, 0.2, 11.0]]} if r["arm"] == "default" else r for r in runs]
    assert report.cells(never, {"letters": [0.1] * 10})[0]["targets"]["c"]["why"].endswith(
        "no seed reached plain's median 60.0%"
    )
    # a record cached before records kept the curve takes it from its run folder's summary.json
    (tmp_path / "summary.json").write_text(json.dumps({"accuracy_curve": curves[0]}))
    old = {"run_dir": str(tmp_path), "exit_code": 0, "test_accuracy": 0.7}
    assert generalization.with_curve(old)["accuracy_curve"] == curves[0]
    assert generalization.with_curve(old | {"exit_code": 1}) == old | {"exit_code": 1}


def test_a_default_seed_short_of_the_plain_loop_says_when_it_sat_at_chance() -> None:
    late = [[epoch, 100 * epoch, 0.1 if epoch <= 5 else 0.5, epoch] for epoch in range(1, 11)]  # chance to step 500
    early = [[epoch, 100 * epoch, 0.8, epoch] for epoch in range(1, 11)]
    runs = []
    for seed, (accuracy, curve) in enumerate([(0.8, early), (0.5, late), (0.8, early)]):
        runs += [
            _run("scenes", "default", seed, accuracy) | {"accuracy_curve": curve},
            _run("scenes", "plain", seed, 0.7),
        ]
    (row,) = report.cells(runs, {"scenes": [0.1] * 10})
    assert row["targets"]["a"]["why"] == "seed 1 was at chance until step 500 of 1,000 (50%); plain's seed 1: 70.0%"
    assert "(seed 1 was at chance until step 500" in report._verdict_text(row)
    runs[2]["accuracy_curve"] = early  # the short seed learnt from its start: only the plain loop's same seed
    (row,) = report.cells(runs, {"scenes": [0.1] * 10})
    assert row["targets"]["a"]["ok"] is False and row["targets"]["a"]["why"] == "plain's seed 1: 70.0%"


def test_the_cost_estimate_fits_fixed_and_per_epoch_seconds() -> None:
    runs = [
        {
            "dataset": "d",
            "budget": str(e),
            "arm": arm,
            "seed": 0,
            "epochs": e,
            "key": f"{arm}{e}",
            "process_seconds": 4.0 + 2.0 * e,
        }  # fmt: skip
        for e in (1, 3)
        for arm in ("default", "plain", "naive")
    ]
    cost = report.estimate(runs)
    assert cost["seconds_spent"] == 3 * (6 + 10)
    assert cost["datasets"]["d"]["fits"]["plain"] == {"fixed_seconds": 4.0, "seconds_per_epoch": 2.0}
    # 5 seeds x 3 arms x (4 runs x 4 s fixed + 2 s x (1 + 3 + 5 + 10) epochs)
    assert cost["datasets"]["d"]["full_grid_seconds"] == 5 * 3 * (16 + 38)


def _pass(commit: str, cells: dict[str, dict[str, float]], arms=("default", "plain", "naive")) -> dict:
    """A suite pass's results.json as generalization_merge reads it: per cell, every arm's accuracy on seeds 0-2."""
    runs = [{"dataset": name, "budget": "recipe", "seed": seed, "arm": arm, "test_accuracy": accuracy[arm] + seed / 100,
             "process_seconds": 10.0, "epochs": 8, "recorded_epochs": 8, "train_seconds": 5.0, "git_commit": commit}
            for name, accuracy in cells.items() for arm in arms for seed in range(3)]  # fmt: skip
    shares = {name: [0.1] * 10 for name in cells}
    return {"runs": runs, "cells": report.cells(runs, shares), "command": f"pass {commit}",
            "environment": {"git_commit": commit}}  # fmt: skip


def test_merging_passes_takes_the_later_default_or_with_cells_every_arm_of_the_cells_it_ran() -> None:
    from benchmarks.generalization_merge import merged

    earlier = _pass("old", {"a": {"default": 0.5, "plain": 0.4, "naive": 0.3}, "b": {"default": 0.6, "plain": 0.5,
                                                                                        "naive": 0.4}})  # fmt: skip
    later = _pass("new", {"b": {"default": 0.9, "plain": 0.8}, "c": {"default": 0.7, "plain": 0.2}},
                  ("default", "plain"))  # fmt: skip

    def arms(result: dict, cell: str) -> set[tuple[str, str]]:
        return {(r["arm"], r["git_commit"]) for r in result["runs"] if r["dataset"] == cell}

    default_only = merged(earlier, later)
    assert arms(default_only, "b") == {("default", "new"), ("plain", "old"), ("naive", "old")}
    assert arms(default_only, "a") == {("default", "old"), ("plain", "old"), ("naive", "old")}
    whole = merged(earlier, later, whole_cells=True)
    assert arms(whole, "b") == {("default", "new"), ("plain", "new")}  # the old baselines ran at other epochs: gone
    assert arms(whole, "c") == {("default", "new"), ("plain", "new")}  # a cell only the later pass ran
    assert arms(whole, "a") == {("default", "old"), ("plain", "old"), ("naive", "old")}
    rows = {row["dataset"]: row for row in whole["cells"]}
    assert rows["b"]["default"]["accuracy_median"] == pytest.approx(0.91) and rows["c"]["chance"] == pytest.approx(0.1)
    assert "every arm of b, c" in whole["command"] and whole["epochs_differ"] == []


def test_a_cost_line_that_falls_with_the_epochs_estimates_nothing() -> None:
    # runs of one cell from passes at other loads: the longer run took less time, and a line through them would
    # put a negative number of hours in the report
    runs = [{"dataset": "d", "budget": "recipe", "arm": arm, "seed": 0, "epochs": e, "key": f"{arm}{e}",
             "process_seconds": 100.0 - 3 * e} for e in (10, 30) for arm in ("default", "plain", "naive")]  # fmt: skip
    assert report.estimate(runs)["datasets"]["d"]["full_grid_seconds"] is None


def test_a_baseline_alone_at_the_recipe_budget_runs_the_default_for_its_epochs(
    tmp_path, monkeypatch, no_plot, capsys
) -> None:
    """`--arms plain --budgets recipe`: the plain loop's epochs are the default's recorded ones, so the default's
    run is added (it was a StopIteration traceback); at a fixed budget the plain arm runs alone."""
    calls: list = []
    monkeypatch.setattr(generalization.Suite, "run_one", fake_runner(calls, epochs={"synthetic": 7}))
    assert generalization.main(_argv(tmp_path, "--arms", "plain", "--budgets", "recipe", "--seeds", "0")) == 0
    assert [(t.arm, t.epochs) for t in calls] == [("default", None), ("plain", 7)]
    assert "the default arm is added" in capsys.readouterr().err
    calls.clear()
    assert generalization.main(_argv(tmp_path, "--arms", "plain", "--budgets", "3", "--seeds", "0")) == 0
    assert [(t.arm, t.epochs) for t in calls] == [("plain", 3)]
