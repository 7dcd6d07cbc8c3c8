"""The clock a user waits on (hasten/clock.py) and what the terminal shows of it: wall-clock time to accuracy in
summary.json and the results table, the evaluation policy (plain views between epochs, the run's TTA at the
end), the progress bar's ETA and evaluation bar, lines that fit 80 columns, third-party notices kept out.
No timings are asserted: only what the clocks must satisfy whatever the machine (order, sums, lower bounds)."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
from rich.console import Console

import hasten
import hasten.run.evaluation
from hasten import clock
from hasten.cli import main
from hasten.cli.results import results_table, times_to_accuracy
from hasten.data.sources import cache_folder
from hasten.progress import WIDTH, EpochProgress, epoch_line, quiet_third_party, wrap
from hasten.recipe.schema import load_recipe
from hasten.run.build import build, trainer_for
from hasten.run.plan import Plan
from hasten.run.state import time_to_fraction_of_best
from hasten.runfolder.log import RunLog

ROOT = Path(__file__).resolve().parents[2]


def widths(text: str) -> list[int]:
    return [len(line.rstrip()) for line in text.splitlines()]


# ----- the clock -----------------------------------------------------------------------------------------------


class StoppedTime:
    """hasten.clock's `time` module with its clocks stopped at chosen readings: the clock's arithmetic is tested
    on them, with no real time passing or asserted."""

    CLOCK_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", 7)

    def __init__(self, perf: float = 1000.0, epoch: float = 1.7e9, boot: float = 5000.0):
        self.perf, self.epoch, self.boot = perf, epoch, boot

    def perf_counter(self) -> float:
        return self.perf

    def time(self) -> float:
        return self.epoch

    def clock_gettime(self, which: int) -> float:
        assert which == self.CLOCK_BOOTTIME
        return self.boot


def test_the_command_clock_starts_with_the_process(monkeypatch, tmp_path):
    """The process's start read from proc(5)'s stat (field 22, in clock ticks after boot; the command name in
    parentheses may hold spaces and parentheses): the clock counts the interpreter's start and imports."""
    ticks = os.sysconf("SC_CLK_TCK")
    stopped = StoppedTime(perf=1000.0, boot=5000.0)
    monkeypatch.setattr(clock, "time", stopped)
    stat = tmp_path / "stat"
    rest = " ".join(["S", *["0"] * 18, str(int((5000.0 - 12.5) * ticks)), "0", "0"])  # fields 3-21, 22, 23-24
    stat.write_bytes(f"4242 (py thon) (x)) {rest}".encode())
    assert clock._process_age(str(stat)) == pytest.approx(12.5, abs=1 / ticks)
    for started in (5000.0 + 60, 5000.0 - 2 * 24 * 3600):  # after now, and two days ago: not believed
        stat.write_bytes(f"4242 (py) {' '.join(['S', *['0'] * 18, str(int(started * ticks))])}".encode())
        assert clock._process_age(str(stat)) is None
    stat.write_bytes(b"4242 (py) S 0")  # too few fields
    assert clock._process_age(str(stat)) is None
    assert clock._process_age(str(tmp_path / "absent")) is None
    monkeypatch.undo()
    if Path("/proc/self/stat").exists():  # this very process, read for real: an age, whatever its value
        assert clock._process_age() is not None


def test_a_launcher_passes_its_start_on_and_a_bad_value_is_not_believed(monkeypatch):
    stopped = StoppedTime(perf=1000.0, epoch=1.7e9)
    monkeypatch.setattr(clock, "time", stopped)
    monkeypatch.setattr(clock, "_process_age", lambda stat="/proc/self/stat": 3.0)
    monkeypatch.setenv(clock.COMMAND_STARTED_ENV, repr(1.7e9 - 100))
    assert clock.command_started() == pytest.approx(1000.0 - 100)  # the launcher's start, 100 s before now
    for bad in ("soon", repr(1.7e9 + 3600), repr(1.7e9 - 10 * 24 * 3600)):  # garbage, future, stale
        monkeypatch.setenv(clock.COMMAND_STARTED_ENV, bad)
        assert clock._inherited_age() is None
        assert clock.command_started() == pytest.approx(1000.0 - 3.0)  # this process's own start instead


def test_marks_add_up_to_the_time_since_the_start(monkeypatch):
    stopped = StoppedTime(perf=1000.0)
    monkeypatch.setattr(clock, "time", stopped)
    watch = clock.Clock(990.0)  # started 10 s before now
    watch.mark("imports")
    stopped.perf = 1002.5
    watch.mark("data")
    stopped.perf = 1003.0
    watch.mark("data")  # a second mark of a name adds to it
    assert watch.marks == {"imports": 10.0, "data": 3.0}
    assert sum(watch.marks.values()) == watch.seconds() == 13.0


def test_hasten_cache_moves_the_cache_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("HASTEN_CACHE", str(tmp_path / "c"))
    assert cache_folder("probe") == tmp_path / "c" / "probe"
    monkeypatch.delenv("HASTEN_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_folder("probe") == tmp_path / "xdg" / "hasten" / "probe"


# ----- summary.json: two clocks --------------------------------------------------------------------------------


def test_summary_times_accuracy_on_the_wall_clock_from_the_command_start(tiny_overrides, tmp_path, capsys):
    """main(started=...) as `hasten` passes its process's start: every wall time counts from it; the start-up's
    phases add up to the start-up; each evaluation's wall time comes after its training seconds and in order."""
    overrides = [*tiny_overrides, "run.thresholds=[0.2,0.5,0.99]", "train.eval_every_steps=10"]
    assert main(["train", *overrides], started=time.perf_counter() - 30) == 0  # as if 30 s of start-up came before
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    curve = summary["accuracy_curve"]
    assert all(len(point) == 4 for point in curve)
    walls = [wall for _, _, _, wall in curve]
    assert walls == sorted(walls) and all(wall >= 30 + train for train, _, _, wall in curve)
    assert summary["startup_seconds"] >= 30 and summary["wall_seconds"] >= walls[-1]
    assert summary["startup"]["start and imports"] >= 30
    assert sum(summary["startup"].values()) == pytest.approx(summary["startup_seconds"], abs=0.01)
    assert {"data", "model", "probe", "run folder and loop"} <= set(summary["startup"])
    for key in ("0.20", "0.50", "0.99"):  # the first evaluation at or above each threshold, on both clocks
        reached = [point for point in curve if point[2] >= float(key)]
        assert summary["time_to_accuracy_wall"][key] == (reached[0][3] if reached else None)
        assert summary["time_to_accuracy"][key] == (reached[0][0] if reached else None)
    assert 0 < summary["eval_seconds"] < summary["wall_seconds"] - summary["train_seconds"]
    assert summary["mid_eval"] == "plain"


def test_the_probe_is_not_charged_with_torch_optims_import_of_dynamo(tmp_path):
    """Building a torch.optim optimizer imports torch._dynamo (seconds); the start-up's split charges that to the
    imports, so the probe's line is the probe's own time: by the time `resolve` (the probe) starts it is imported.
    In a fresh process, since this test session has long imported it."""
    script = f"""
import sys
import hasten.run.build as build
from hasten.recipe.schema import load_recipe
from tests.tiny import tiny_recipe
seen = []
def resolve(*args, _resolve=build.resolve, **kwargs):
    seen.append("torch._dynamo" in sys.modules)
    return _resolve(*args, **kwargs)
build.resolve = resolve
before = "torch._dynamo" in sys.modules
build.build(load_recipe("default", tiny_recipe({str(tmp_path / "run")!r})))
print(before, seen)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).parents[2])  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[-2] == "False [True]"


def test_a_resumed_run_keeps_counting_from_its_checkpoint(tiny_overrides, tmp_path):
    first = hasten.train(None, [*tiny_overrides, "train.epochs=1"])
    summary = hasten.train(None, [*tiny_overrides, "resume=auto", "resume.allow_changes=[train.epochs]"])
    assert summary["accuracy_curve"][0] == first["accuracy_curve"][0]  # the first epoch's, as the checkpoint has it
    assert summary["accuracy_curve"][1][3] > first["accuracy_curve"][0][3]  # the second goes on from there
    assert summary["wall_seconds"] > summary["accuracy_curve"][0][3]


# ----- evaluations: plain between, the run's TTA at the end ----------------------------------------------------


@pytest.fixture
def views_used(monkeypatch) -> list[tuple[bool, int]]:
    """(flip, translate) of every batch the trainer evaluates."""
    calls: list[tuple[bool, int]] = []
    real = hasten.run.evaluation.tta_views

    def spy(model, images, flip, translate, fill=0.0):
        calls.append((flip, translate))
        return real(model, images, flip, translate, fill)

    monkeypatch.setattr(hasten.run.evaluation, "tta_views", spy)  # where the evaluation loop looks it up
    return calls


def test_evaluations_between_epochs_are_plain_and_the_last_has_the_runs_tta(tiny_overrides, tmp_path, views_used):
    """96 test images in batches of 128: one batch per evaluation. 3 epochs with an EMA: two plain evaluations,
    the full one (flip + shifts), then the live weights on the plain view; with train.mid_eval=tta every
    evaluation but the live check is the full one; the run learns and reports the same either way."""
    common = [*tiny_overrides, "train.epochs=3", "train.tta_flip=true", "train.tta_translate=1", "tricks.ema=0.9",
              "tricks.ema_bn_images=64", "data.test_subset=96"]  # fmt: skip
    plain = hasten.train(None, [*common, f"run.dir={tmp_path / 'plain'}"])
    assert views_used == [(False, 0), (False, 0), (True, 1), (False, 0)]
    views_used.clear()
    full = hasten.train(None, [*common, f"run.dir={tmp_path / 'full'}", "train.mid_eval=tta"])
    assert views_used == [(True, 1), (True, 1), (True, 1), (False, 0)]
    assert plain["train_loss"] == full["train_loss"] and plain["test_accuracy"] == full["test_accuracy"]
    assert plain["live_test_accuracy"] == full["live_test_accuracy"]
    assert plain["one_view_test_accuracy"] == full["one_view_test_accuracy"]
    assert plain["accuracy_curve"][-1][2] == round(plain["test_accuracy"], 6)  # the curve keeps six places


# ----- the results table ---------------------------------------------------------------------------------------


def _summary(best: float, times: dict[str, float | None]) -> dict:
    curve = [[10.0, 10, best * 0.8, 20.0], [20.0, 20, best * 0.95, 31.0], [30.0, 30, best, 42.0]]
    return {
        "test_accuracy": best,
        "best_test_accuracy": best,
        "epochs": 3,
        "wall_seconds": 45.0,
        "train_seconds": 30.0,
        "startup_seconds": 8.0,
        "eval_seconds": 4.0,
        "images_per_second": 1000.0,
        "peak_memory_bytes": 2**20,
        "time_to_accuracy": times,
        "time_to_accuracy_wall": {k: (None if v is None else v + 12) for k, v in times.items()},
        "accuracy_curve": curve,
        "run_dir": "runs/x",
    }


def test_results_table_shows_thresholds_only_where_the_run_came_near():
    thresholds = ["0.90", "0.91", "0.92", "0.93", "0.94"]
    near = times_to_accuracy(_summary(0.9331, dict(zip(thresholds, [10.0, 20.0, 20.0, 30.0, None], strict=True))))
    assert [label for label, _, _ in near] == [f"time to {t}%" for t in (90, 91, 92, 93, 94)]  # 94: a near miss
    assert near[3] == ("time to 93%", 42.0, 30.0) and near[4] == ("time to 94%", None, None)
    short = times_to_accuracy(_summary(0.9215, dict(zip(thresholds, [10.0, 20.0, 30.0, None, None], strict=True))))
    assert [label for label, _, _ in short] == ["time to 90%", "time to 91%", "time to 92%", "time to 93%"]
    folder = times_to_accuracy(_summary(0.62, dict.fromkeys(thresholds)))  # a user's data, far from 90%
    assert [label for label, _, _ in folder] == [
        "time to 50% of best (31.0%)", "time to 75% of best (46.5%)", "time to 90% of best (55.8%)",
        "time to 95% of best (58.9%)", "time to 99% of best (61.4%)",
    ]  # fmt: skip
    assert [times for _, *times in folder] == [[20.0, 10.0], [20.0, 10.0], [31.0, 20.0], [31.0, 20.0], [42.0, 30.0]]
    # as a run records them in summary.json (the same milestones, read from there when present)
    recorded = _summary(0.62, dict.fromkeys(thresholds))
    recorded["time_to_fraction_of_best"] = time_to_fraction_of_best(recorded["accuracy_curve"])
    assert times_to_accuracy(recorded) == folder
    assert recorded["time_to_fraction_of_best"]["0.90"] == {
        "accuracy": 0.558,
        "train_seconds": 20.0,
        "wall_seconds": 31.0,
    }


def test_results_table_fits_80_columns_and_names_both_clocks():
    summary = _summary(0.62, dict.fromkeys(["0.90", "0.91", "0.92", "0.93", "0.94"]))
    summary["run_dir"] = "runs/" + "a-rather-long-folder-name/" * 4
    buffer = io.StringIO()
    Console(file=buffer, width=200).print(results_table(summary))
    text = buffer.getvalue()
    assert max(widths(text)) <= WIDTH, text
    assert "not reached" not in text and "45.0 s from the command's start" in text
    assert "31.0 s (training 20.0 s)" in text and "8.0 s (to the first training step)" in text


# ----- the terminal --------------------------------------------------------------------------------------------


def test_wrap_breaks_between_words_only():
    text = "probe cache key 0123456789abcdef: kept in /" + "very-long-folder/" * 6 + "file.json, and 5,133 img/s"
    lines = wrap(text)
    assert all(len(line) <= WIDTH for line in lines if " " in line.strip())  # a word longer than a line stays whole
    assert " ".join(line.strip() for line in lines) == text  # nothing lost, no number or path split
    assert all(line.startswith("  ") for line in lines[1:])


def test_epoch_lines_fit_80_columns_and_mark_the_full_evaluation():
    row = {"epoch": 12, "train_loss": 1.234, "train_accuracy": 0.9123, "test_accuracy": 0.93125,
           "images_per_second": 123456.0, "train_seconds": 12345.6}  # fmt: skip
    for views, wall in ((1, 75.0), (6, 4000.0)):
        line = epoch_line(row, views, wall)
        plain = line.replace("[bold]", "").replace("[/bold]", "")
        assert len(plain) <= WIDTH, plain
        assert ("(TTA)" in plain) == (views > 1) and "93.12%" in plain and " wall" in plain


def test_the_bar_shows_the_run_eta_and_each_evaluation_in_80_columns():
    buffer = io.StringIO()
    console = Console(file=buffer, width=200, force_terminal=True, color_system=None)
    bar = EpochProgress(235, console=console)
    with bar:
        bar.start_epoch(5, 5)
        bar.update(235, loss=0.6512, accuracy=0.93, images_per_second=12345.0, eta_seconds=3725)
        with bar.evaluation("10,000 test images, final, 6 views", 40) as advance:
            advance()
            rendered = io.StringIO()
            Console(file=rendered, width=200, color_system=None).print(bar.progress.get_renderable())
    text = rendered.getvalue()
    assert "ETA 1:02:05" in text and "evaluate" in text and "10,000 test images, final, 6 views" in text
    assert "1/40" in text
    assert max(widths(text)) <= WIDTH, text


@pytest.mark.machine
def test_a_training_run_names_its_folder_first_and_keeps_to_80_columns(tiny_overrides, tmp_path, capsys):
    overrides = [o for o in tiny_overrides if not o.startswith("run.progress")]  # the table, not JSON
    assert main(["train", *overrides, "precision=auto", "train.channels_last=auto", "tricks.ema=0.9"]) == 0
    captured = capsys.readouterr()
    err = captured.err.replace("\n  ", " ").splitlines()  # a folder's name too long for the line wraps onto the next
    assert err[0] == f"run folder: {tmp_path / 'run'}"
    assert any("probe cache key" in line for line in err)
    assert max(widths(captured.err + captured.out)) <= WIDTH, captured.err + captured.out
    assert "from the command's start" in captured.out


def test_third_party_notices_are_kept_out_and_hastens_own_shown():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_third_party()
        warnings.warn_explicit("deprecated", FutureWarning, "lib.py", 1, module="somelib")
        warnings.warn_explicit("old api", DeprecationWarning, "lib.py", 2, module="torch.onnx")
        warnings.warn_explicit("ours", FutureWarning, "hasten/x.py", 3, module="hasten.x")
    assert [str(w.message) for w in caught] == ["ours"]
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("torch.onnx._internal.exporter._registration")
    logger.addHandler(handler)
    try:
        logger.warning("torchvision is not installed. Skipping torchvision::nms")
        logger.error("a real failure")
    finally:
        logger.removeHandler(handler)
    assert [r.getMessage() for r in records] == ["a real failure"]


def test_export_prints_no_torch_notices(tiny_overrides, tmp_path):
    """`hasten export` as a user runs it (its own process: torch's notices come once per process)."""
    assert main(["train", *tiny_overrides, "train.epochs=1"]) == 0
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "hasten", "export", str(tmp_path / "run"), str(tmp_path / "m.onnx")],
                          capture_output=True, text=True, env=env, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "torchvision" not in done.stderr and "Warning" not in done.stderr, done.stderr
    assert (tmp_path / "m.onnx").is_file()


def test_the_eta_counts_the_batches_and_the_evaluations_left(tiny_overrides):
    """384 images at batch 16: 24 batches an epoch, 3 epochs. 4 batches into the first at 0.5 s each, one view of
    the test set taking 0.25 s: the rest of the batches, two plain evaluations and the final one's 6 views."""
    parts = build(load_recipe(None, [*tiny_overrides, "train.epochs=3"]))
    trainer = trainer_for(parts, Plan(epochs=3, num_classes=10, tta_flip=True, tta_translate=1, progress=False),
                          RunLog("", enabled=False))  # fmt: skip
    assert len(parts.train_loader) == 24 and trainer.eta(1, 0.5) is None  # no pace yet
    trainer.state.batch, trainer.seconds_per_view = 4, 0.25
    assert trainer.eta(4, 2.0) == pytest.approx((3 * 24 - 4) * 0.5 + 0.25 * (2 + 6))
    trainer.plan.mid_eval = "tta"  # every evaluation the full one
    assert trainer.eta(4, 2.0) == pytest.approx((3 * 24 - 4) * 0.5 + 0.25 * (2 * 6 + 6))
    trainer.state.epoch, trainer.state.batch = 2, 20  # the last epoch: 4 batches and the final evaluation left
    assert trainer.eta(4, 2.0) == pytest.approx(4 * 0.5 + 0.25 * 6)
