"""The generalization suite: does the default recipe hold on data no one here tuned it for, at every budget, on
every seed, in accuracy and in the time a user waits? (docs/generalization.md; DESIGN: "A default that only works
on the data it was tuned on is a bug".)

Datasets (`--only`): eleven generated image folders (benchmarks/datasets.py: letters, letters-jpeg, glyphs-100,
imbalanced, few-shot, textures-grey, textures-colour, scenes, arrows, colours, shapes), made on first use under
OUT/data/, and five registered ones: Fashion-MNIST whole (`fashion-full`) and its first 5,000 and 1,000 training
images (`fashion-5000`, `fashion-1000`, each judged on the first 2,000 of the 10,000 test images, which the report
says), scikit-learn's 8x8 `digits`, and `synthetic`; `--folder DIR` adds a folder of your own. Budgets
(`--budgets`): 1, 3, 5 and 10 epochs and `recipe`, the recipe's own (no train.epochs given: the recipe may choose
its epochs from the data; plain and naive then run at the epochs the default's recipe.yaml recorded, seed by seed).
Seeds (`--seeds`): 0-4. Three arms, all with the same data overrides, budget, seed and threads:

- **default**: the recipe under test, `python -m hasten train [RECIPE] data.*=... [train.epochs=N]`; `--recipe`
  names one, else the default recipe (`hasten train` with no recipe name);
- **plain**: the same model trained the way a plain PyTorch loop trains it (`PLAIN`): Adam at 1e-3, constant LR,
  batch 64, no label smoothing, mixup, cutmix, EMA, weight decay, augmentation or TTA, the model's outputs taken as
  logits whatever they are (`model.output=logits`), in fp32 and the default
  memory layout (no start-up probe: a plain loop has none);
- **naive**: the textbook loop `hasten bench` shows (hasten/experiments/naive.py: batch 32, Adam 1e-3, fp32).

The model suite (`--models gn-cnn,vit,...` or `all`): each dataset trained with each of six models written the way
users write them (examples/models/), a cell per DATASET@MODEL; `--model NAME=MODULE:ATTR` adds a model of your own
(its module importable from the working folder or PYTHONPATH; its file's bytes are part of the cache key).

Every run is its own process, timed from command to exit (the wall time a user waits: start-up, probe, data,
training and evaluation); summary.json's training seconds are recorded beside it. The runs of one (dataset,
budget, seed) follow each other, the arm order rotated by the seed, so drift of the machine's load falls on every
arm alike. `--jobs N` runs N processes at once (each with train.threads=1): faster, noisier, and the report says so.

Targets, per cell (dataset x budget), all four for OK (benchmarks/generalization_report.py):
(a) the default's worst seed >= the plain baseline's median - 2 points; (b) the default's spread over seeds
(max - min) <= 5 points; (c) the default's median wall time <= the plain baseline's; (d) no default seed at
chance: below chance + 10% of (1 - chance), chance the test set's largest class share (1/classes when balanced).

Each finished run is cached in OUT/cache/, keyed by the arm, its resolved recipe (the naive loop: the data,
model, seed and budget it uses), the generated data's SHA-256 and hasten's source: an interrupted suite resumes
where it stopped, a changed recipe or hasten reruns what it changes, and a (dataset, budget) cell shares runs
with another where they are the same (plain at the recipe's 5 epochs is plain at 5). `--reuse-baselines` keeps
plain and naive runs made by other hasten source (their recipe and data unchanged), and the report counts them;
`--fresh` runs everything again; `--report-only` runs nothing and reports the cache as it is.

    .venv/bin/python benchmarks/generalization.py                              # everything: hours
    .venv/bin/python benchmarks/generalization.py --only letters,few-shot      # two datasets, 5 budgets, 5 seeds
    .venv/bin/python benchmarks/generalization.py --only letters --budgets 3 --seeds 0,1 --jobs 2
    .venv/bin/python benchmarks/generalization.py --recipe my.yaml --only scenes optim.lr=0.1  # extra overrides
    .venv/bin/python benchmarks/generalization.py --only digits,letters --model mine=mymodels:Net --seeds 0,1,2
    .venv/bin/python benchmarks/generalization.py --quick                      # smoke: tiny model, 1 epoch, 1 seed
    .venv/bin/python benchmarks/generalization.py --report-only                # the report from the cache

Output in OUT (default bench/generalization/): report.md (the command, how it ran, one row per cell, failing
cells per target, cost), results.json (every run and cell) and generalization.png (default against plain:
accuracy and wall time).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

if __package__ in (None, ""):  # run as a file: the repository root on the path, so `benchmarks` is a package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import hasten  # noqa: E402
from benchmarks import datasets as generated  # noqa: E402
from benchmarks import generalization_report as report  # noqa: E402
from hasten.data.imagefolder import ImageFolder  # noqa: E402
from hasten.errors import HastenError  # noqa: E402
from hasten.experiments.interleave import rotated  # noqa: E402
from hasten.experiments.naive import PLAIN_TRAINING  # noqa: E402
from hasten.recipe.schema import load_recipe  # noqa: E402
from hasten.run.build import dataset  # noqa: E402
from hasten.runfolder.log import environment, write_atomic  # noqa: E402
from hasten.techniques.registry import SWITCHES  # noqa: E402

ARMS = ("default", "plain", "naive")
# a plain PyTorch loop on the same model: textbook training, batch 64 whatever the data, fp32, no probe
PLAIN = [
    *PLAIN_TRAINING,
    "train.batch_size=64",
    "train.min_steps_per_epoch=0",
    "train.accumulate=1",
    "model.output=logits",  # the model's outputs into the cross-entropy as they are, a softmax's too
    *(switch.switched_off for switch in SWITCHES if switch.speed),  # fp32, no channels_last, no compile
]
QUIET = ["run.progress=false", "run.tensorboard=false"]  # every arm: what a benchmark does not need
BUDGETS = ("1", "3", "5", "10", "recipe")
SEEDS = "0,1,2,3,4"
INTERRUPTED = {130, 143, -2, -9, -15}  # exit codes of a run stopped by SIGINT, SIGKILL or SIGTERM
# every data key that picks the data, so a recipe's own data settings do not leak into another dataset
DATA_RESET = {
    "data.root": "null",
    "data.subset": "null",
    "data.test_subset": "null",
    "data.size": "null",
    "data.rgb": "null",
    "data.per_class": "null",
    "data.label_noise": "0",
    "data.val_fraction": "0",
}
FASHION = {"data.name": "fashion-mnist"}
REGISTERED = {
    "fashion-full": FASHION,
    "fashion-5000": FASHION | {"data.subset": "5000", "data.test_subset": "2000"},
    "fashion-1000": FASHION | {"data.subset": "1000", "data.test_subset": "2000"},
    "digits": {"data.name": "digits"},
    "synthetic": {"data.name": "synthetic"},
}
DATASETS = (*generated.REGISTRY, *REGISTERED)
# the model suite (`--models`): models written the way users write them (examples/models/), not hasten's own
MODELS = {
    "gn-cnn": "examples.models.groupnorm_cnn:GroupNormCNN",
    "plain-cnn": "examples.models.plain_cnn:PlainCNN",
    "vit": "examples.models.vit:TinyViT",
    "mlp": "examples.models.mlp:MLP",
    "mobilenet": "examples.models.mobilenet:MobileNetLike",
    "timm-resnet": "examples.models.timm_resnet:ResNet.for_images",
}
MODEL_MARK = "@"  # a cell of the model suite is named DATASET@MODEL
QUICK = ["model.width=4", "model.blocks=[1]", "data.subset=256", "data.test_subset=200"]


def dataset_overrides(
    name: str, out: Path, folders: dict[str, str] | None = None, models: dict[str, str] | None = None
) -> dict[str, str]:
    """The data.* overrides that swap the recipe's data for dataset `name`; `folders` maps the names of the user's
    own image folders (--folder) to their paths. Small folders are decoded in the main process (data.workers=0):
    no worker start-up. A model-suite cell, DATASET@MODEL, adds the overrides that train that model (`models`:
    the suite's MODELS and the user's own, --model)."""
    name, _, model = name.partition(MODEL_MARK)
    if model:
        own = {"model.name": "import", "model.target": (models or MODELS)[model]}
        return dataset_overrides(name, out, folders) | own
    if folders and name in folders:
        return DATA_RESET | {"data.name": "imagefolder", "data.root": folders[name]}
    if name in generated.REGISTRY:
        read = dict(item.split("=", 1) for item in generated.REGISTRY[name].read)
        root = out / "data" / name
        return DATA_RESET | {"data.name": "imagefolder", "data.root": str(root.resolve()), "data.workers": "0"} | read
    return DATA_RESET | REGISTERED[name]


def model_source(target: str) -> Path:
    """The file that defines `target` (MODULE:ATTR), found the way the runs' Python finds it (the repository, the
    working folder, PYTHONPATH) without importing it: its bytes key the suite's cache."""
    parts = target.partition(":")[0].split(".")
    roots = [Path(__file__).resolve().parents[1], Path.cwd()]
    roots += [Path(entry) for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    for root in roots:
        for candidate in (root.joinpath(*parts).with_suffix(".py"), root.joinpath(*parts, "__init__.py")):
            if candidate.is_file():
                return candidate
    raise FileNotFoundError(
        f"--model: no file for module {target.partition(':')[0]} under the repository, the working folder or "
        "PYTHONPATH (run from the folder that holds it, or add that folder to PYTHONPATH)"
    )


def as_list(overrides: dict[str, str]) -> list[str]:
    return [f"{key}={value}" for key, value in overrides.items()]


def class_shares(recipe: str | None, overrides: list[str]) -> list[float]:
    """Each class's share of the test set the runs are judged on."""
    data = dataset(load_recipe(recipe, overrides))
    labels = data.test.labels if isinstance(data, ImageFolder) else data.test_labels
    return (torch.bincount(labels, minlength=data.num_classes).float() / len(labels)).tolist()


def source_digest() -> str:
    """SHA-256 of hasten's source (every .py and .yaml file of the package): a cached run is reused only when
    the code that made it is the code that would run now."""
    root = Path(hasten.__file__).resolve().parent
    sha = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".yaml") and "__pycache__" not in p.parts):
        sha.update(str(path.relative_to(root)).encode())
        sha.update(path.read_bytes())
    return sha.hexdigest()


def folder_fingerprint(root: Path) -> str:
    """A user's folder as its files' paths, sizes and modification times (cheap on any size): edited files rerun."""
    sha = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        stat = path.stat()
        sha.update(f"{path.relative_to(root)}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return sha.hexdigest()


def naive_view(resolved: dict[str, Any]) -> dict[str, Any]:
    """What of a resolved recipe the naive loop uses (its data, model, seed, budget): a naive run is made again
    only when that changes, not when the recipe's training settings do (hasten/experiments/naive.py)."""
    model = {k: resolved["model"].get(k) for k in ("name", "width", "blocks", "layers", "widths", "target", "args")}
    train = {k: resolved["train"].get(k) for k in ("epochs", "eval_batch_size", "threads")}
    return {"data": resolved["data"], "model": model, "train": train, "seed": resolved["seed"]}


@dataclass(eq=False)  # a task is itself: compared by identity
class Task:
    """One run of the plan: an arm on a dataset at a budget and seed. `epochs` is None for the recipe's own
    budget until the default's run has recorded it (plain and naive wait for it)."""

    dataset: str
    budget: str  # "1", "3", ... or "recipe"
    seed: int
    arm: str
    epochs: int | None
    overrides: list[str] = field(default_factory=list)
    key: str = ""
    record: dict[str, Any] | None = None

    @property
    def label(self) -> str:
        return f"{self.dataset} {'recipe' if self.budget == 'recipe' else 'e' + self.budget} {self.arm} s{self.seed}"


def arm_order(seed: int, budget: str) -> list[str]:
    """The arms of one (dataset, budget, seed), rotated by the seed; at the recipe's budget the default first,
    since the others run at the epochs it records."""
    order = rotated(ARMS, seed)
    return ["default"] + [arm for arm in order if arm != "default"] if budget == "recipe" else order


class Suite:
    """The plan of every run, the cache, and the runs: in order, `jobs` at a time."""

    def __init__(self, args: argparse.Namespace, out: Path):
        self.args, self.out = args, out
        self.code, self.commit = source_digest(), environment()["git_commit"]
        self.data_digest: dict[str, str | None] = {}
        self.tasks: list[Task] = []
        self.made: dict[str, dict[str, Any]] = {}  # key -> record of the runs made by this suite
        for cell in args.cells:
            name = cell.partition(MODEL_MARK)[0]
            if name in generated.REGISTRY:
                self.data_digest[cell] = generated.ensure(name, out / "data" / name)["sha256"]
            elif name in args.folders:
                self.data_digest[cell] = folder_fingerprint(Path(args.folders[name]))
            else:
                self.data_digest[cell] = None  # hasten's registered datasets: files pinned by their SHA-256
            if MODEL_MARK in cell:  # the user's model is code: its source is part of what the run is
                model_file = model_source(args.model_targets[cell.partition(MODEL_MARK)[2]])
                self.data_digest[cell] = (
                    f"{self.data_digest[cell]}:{hashlib.sha256(model_file.read_bytes()).hexdigest()}"
                )
            for budget in args.budgets:
                for seed in args.seeds:
                    for arm in (a for a in arm_order(seed, budget) if a in args.arms):
                        self.tasks.append(Task(cell, budget, seed, arm, None if budget == "recipe" else int(budget)))

    def overrides(self, task: Task) -> list[str]:
        data = dataset_overrides(task.dataset, self.out, self.args.folders, self.args.model_targets)
        arm = {item.split("=", 1)[0]: item.split("=", 1)[1] for item in PLAIN} if task.arm == "plain" else {}
        budget = {"train.epochs": str(task.epochs)} if task.budget != "recipe" or task.arm != "default" else {}
        common = {"seed": str(task.seed), "train.threads": str(self.args.threads)}
        return as_list(data | arm | budget | common) + QUIET + self.args.overrides

    def prepare(self, task: Task) -> None:
        """The task's overrides and cache key, and its record where one may be reused: a run made by this suite
        already (another cell's run with the same key), else the cache's (unless --fresh) when the same hasten
        source made it (or --reuse-baselines for plain and naive; --report-only takes any, and failing a record
        for this key, the newest for the same dataset, budget, seed and arm, marked as made by another recipe)."""
        task.overrides = self.overrides(task)
        resolved = load_recipe(self.args.recipe, task.overrides).model_dump(mode="json")
        view = naive_view(resolved) if task.arm == "naive" else resolved
        keyed = {"arm": task.arm, "recipe": view, "data": self.data_digest.get(task.dataset), "jobs": self.args.jobs}
        task.key = hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()[:20]
        if task.key in self.made:
            task.record = self.made[task.key]
            return
        cached = self.cache_path(task)
        if cached.is_file() and not self.args.fresh:
            record = json.loads(cached.read_text())
            same_code = record.get("code") == self.code
            if same_code or self.args.report_only or (self.args.reuse_baselines and task.arm != "default"):
                task.record = record if same_code else record | {"reused_from_other_code": True}
        elif self.args.report_only:
            other = self.newest_cached().get((task.dataset, task.budget, task.seed, task.arm))
            if other is not None:
                task.record = other | {"other_recipe": True}

    @functools.cache  # noqa: B019 - one suite per process
    def newest_cached(self) -> dict[tuple[str, str, int, str], dict[str, Any]]:
        """(dataset, budget, seed, arm) -> the newest cached record, whatever its recipe (for --report-only)."""
        newest: dict[tuple[str, str, int, str], tuple[float, dict[str, Any]]] = {}
        for path in (self.out / "cache").glob("*.json"):
            record = json.loads(path.read_text())
            where = (record.get("dataset"), record.get("budget"), record.get("seed"), record.get("arm"))
            if where not in newest or path.stat().st_mtime > newest[where][0]:
                newest[where] = (path.stat().st_mtime, record)
        return {where: record for where, (_, record) in newest.items()}

    def cache_path(self, task: Task) -> Path:
        return self.out / "cache" / f"{task.arm}-{task.key}.json"

    def default_of(self, task: Task) -> Task:
        return next(
            t
            for t in self.tasks
            if (t.dataset, t.budget, t.seed, t.arm) == (task.dataset, task.budget, task.seed, "default")
        )

    def run(self) -> None:
        """Every task not in the cache, in plan order, at most `jobs` at once. At the recipe's budget plain and naive
        wait for the default's run of their seed, then run at the epochs it recorded."""
        for task in self.tasks:
            if task.epochs is not None or task.arm == "default":
                self.prepare(task)
        to_run = sum(1 for task in self.tasks if task.record is None)
        print(f"{len(self.tasks)} runs planned, {len(self.tasks) - to_run} from the cache", flush=True)
        pending, running, done = list(self.tasks), {}, 0
        with concurrent.futures.ThreadPoolExecutor(max_workers=self.args.jobs) as pool:
            try:
                while pending or running:
                    for task in list(pending):
                        if len(running) >= self.args.jobs:
                            break
                        if task.epochs is None and task.arm != "default":
                            default = self.default_of(task)
                            if default in pending or default in running.values():
                                continue  # its epochs are not known yet
                            task.epochs = (default.record or {}).get("recorded_epochs")
                            if task.epochs is None:  # the default failed or is missing: no budget to run at
                                pending.remove(task)
                                continue
                            self.prepare(task)
                        if task.key in {t.key for t in running.values()}:
                            continue  # another cell's run of the same key is under way: its record serves both
                        if task.record is None and task.key in self.made:
                            task.record = self.made[task.key]
                        pending.remove(task)
                        if task.record is None and not self.args.report_only:
                            running[pool.submit(self.run_one, task)] = task
                    if not running:
                        if pending and all(t.epochs is None and t.arm != "default" for t in pending):
                            raise RuntimeError(f"{pending[0].label}: waits for a default run that is not planned")
                        continue
                    finished, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
                    for future in finished:
                        task = running.pop(future)
                        task.record = self.made[task.key] = future.result()
                        done += 1
                        accuracy = task.record.get("test_accuracy")
                        shown = "failed" if accuracy is None else f"{100 * accuracy:.1f}%"
                        print(f"[{done}] {task.label}: {shown} in {task.record['process_seconds']:.1f} s", flush=True)
            except BaseException:
                for future in running:
                    future.cancel()
                raise

    def run_one(self, task: Task) -> dict[str, Any]:
        """One run in a fresh process, timed from command to exit; its record is cached unless it was stopped by
        a signal (then KeyboardInterrupt: an interrupted suite resumes from the cache)."""
        run_dir = self.out / "runs" / task.dataset / f"{task.budget}-{task.arm}-s{task.seed}-{task.key[:10]}"
        shutil.rmtree(run_dir, ignore_errors=True)  # the suite's own folder of an earlier try of this run
        run_dir.mkdir(parents=True)
        overrides = [*task.overrides, f"run.dir={run_dir}"]
        if task.arm == "naive":
            recipe = load_recipe(self.args.recipe, overrides)
            spec = {"recipe": recipe.model_dump(mode="json"), "kind": "naive", "naive_epochs": task.epochs}
            write_atomic(run_dir / "bench-spec.json", json.dumps(spec, indent=2) + "\n")
            command = [sys.executable, "-m", "hasten.experiments.bench", str(run_dir / "bench-spec.json")]
            command.append(str(run_dir / "bench-result.json"))
        else:
            command = [sys.executable, "-m", "hasten", "train", *([self.args.recipe] if self.args.recipe else [])]
            command += overrides
        load_before = os.getloadavg()[0]
        started = time.perf_counter()
        with open(run_dir / "log.txt", "w") as log:
            code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=_env()).returncode
        seconds = time.perf_counter() - started
        if code in INTERRUPTED:
            raise KeyboardInterrupt(f"{run_dir}: run stopped by a signal (exit {code}); rerun to resume")
        record = {"dataset": task.dataset, "budget": task.budget, "seed": task.seed, "arm": task.arm}
        record |= {"epochs": task.epochs, "key": task.key, "code": self.code, "git_commit": self.commit}
        record |= {
            "overrides": task.overrides,
            "command": shlex.join(command),
            "exit_code": code,
            "run_dir": str(run_dir),
        }
        record |= {"process_seconds": round(seconds, 2), "load_before": round(load_before, 2)}
        record |= {"load_after": round(os.getloadavg()[0], 2), "jobs": self.args.jobs}
        record |= read_run(run_dir, code)
        cache = self.cache_path(task)
        cache.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(cache, json.dumps(record, indent=2) + "\n")
        return record


def _env() -> dict[str, str]:
    root = str(Path(hasten.__file__).resolve().parents[1])  # this tree's hasten in the child too
    return os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}


def read_run(run_dir: Path, code: int) -> dict[str, Any]:
    """What a finished run left: summary.json's results and seconds, and what its recipe.yaml recorded (epochs,
    batch, optimizer, LR, precision: the default's decisions); for a failed run its log's last line."""
    summary_path = run_dir / "summary.json"
    if code != 0 or not summary_path.is_file():
        lines = (run_dir / "log.txt").read_text(errors="replace").strip().splitlines() or ["no output"]
        error = next((line for line in lines if line.startswith("error")), lines[-1])
        return {"test_accuracy": None, "error": error, "recorded_epochs": None}
    summary = json.loads(summary_path.read_text())
    keep = ("test_accuracy", "train_loss", "train_accuracy", "test_loss", "epochs", "steps", "wall_seconds",
            "train_seconds", "images_per_second", "global_batch", "lr", "precision", "channels_last")  # fmt: skip
    record = {key: summary.get(key) for key in keep} | {"warnings": summary.get("warnings", [])}
    record["seconds_to_93"] = (summary.get("time_to_accuracy") or {}).get("0.93")  # training seconds; None: never
    record["accuracy_curve"] = summary.get("accuracy_curve")  # per epoch: training s, step, test accuracy, wall s
    recorded = yaml.safe_load((run_dir / "recipe.yaml").read_text()) if (run_dir / "recipe.yaml").is_file() else {}
    train, optim = recorded.get("train", {}), recorded.get("optim", {})
    record["recorded_epochs"] = train.get("epochs", summary.get("epochs"))
    record["recorded"] = {
        "batch_size": train.get("batch_size"),
        "optimizer": optim.get("name"),
        "lr": optim.get("lr"),
        "schedule": recorded.get("schedule", {}).get("name"),
        "precision": recorded.get("precision"),
    }
    return record


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides for every run (e.g. model.width=4)")
    parser.add_argument("--recipe", default=None, help="the recipe under test (default: the default recipe)")
    parser.add_argument("--only", default=",".join(DATASETS), help=f"datasets, comma-separated: {', '.join(DATASETS)}")
    parser.add_argument("--budgets", default=",".join(BUDGETS), help="epochs, comma-separated; recipe: the recipe's")
    parser.add_argument("--seeds", default=SEEDS, help="seeds, comma-separated")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (each with train.threads=1)")
    parser.add_argument("--threads", type=int, default=1, help="train.threads of every run (1 with --jobs > 1)")
    own = "also an image folder of your own (DIR/train/<class>/, DIR/val/<class>/); repeatable"
    parser.add_argument("--folder", action="append", default=[], metavar="DIR", help=own)
    models = f"the model suite: train each model (of {', '.join(MODELS)}; examples/models/) on each dataset"
    parser.add_argument("--models", default="", help=models + ", comma-separated; all: every one")
    yours = (
        "also a model of your own, NAME=MODULE:ATTR (a class or function taking num_classes and in_channels, "
        "importable from the working folder or PYTHONPATH); repeatable; trained on each dataset"
    )
    parser.add_argument("--model", action="append", default=[], metavar="NAME=MODULE:ATTR", help=yours)
    parser.add_argument("--arms", default=",".join(ARMS), help="the arms to run, comma-separated (a variant of "
                        "the default alone: --arms default)")  # fmt: skip
    parser.add_argument("--out", default="bench/generalization")
    parser.add_argument("--fresh", action="store_true", help="run every run again instead of using the cache")
    reuse = "reuse cached plain and naive runs made by other hasten source (their recipe and data the same)"
    parser.add_argument("--reuse-baselines", action="store_true", help=reuse)
    cached = "run nothing: the report from the cached runs as they are (even of other hasten source)"
    parser.add_argument("--report-only", action="store_true", help=cached)
    parser.add_argument("--quick", action="store_true", help="smoke run: synthetic and few-shot, 1 epoch, seed 0, "
                        "a tiny model")  # fmt: skip
    args = parser.parse_intermixed_args(argv)  # overrides may stand between the options
    if args.quick:
        args.only, args.budgets, args.seeds = "synthetic,few-shot", "1", "0"
        args.overrides = QUICK + args.overrides
    args.folders = {Path(folder).name: str(Path(folder).resolve()) for folder in args.folder}
    missing = [folder for folder in args.folder if not (Path(folder) / "train").is_dir()]
    if missing:
        parser.error(f"--folder: no train/ folder in {', '.join(missing)} (expected train/<class>/*.png, val/...)")
    clashes = [name for name in args.folders if name in DATASETS]
    if clashes:
        parser.error(f"--folder: {', '.join(clashes)} is the name of a built-in dataset; rename the folder")
    args.only = [name for name in args.only.split(",") if name] + [n for n in args.folders if n not in args.only]
    unknown = [name for name in args.only if name not in DATASETS and name not in args.folders]
    if unknown:
        parser.error(f"--only: unknown dataset(s) {', '.join(unknown)}; choose from {', '.join(DATASETS)}")
    own: dict[str, str] = {}
    for item in args.model:
        name, _, target = item.partition("=")
        module, _, attr = target.partition(":")
        if not name or not module or not attr or MODEL_MARK in name or "," in name:
            parser.error(f"--model {item}: expected NAME=MODULE:ATTR, e.g. mine=mymodels:Net")
        if name in MODELS or name in own:
            parser.error(f"--model {item}: {name} is already a model of the suite; choose another name")
        own[name] = target
    args.model_targets = MODELS | own
    args.models = list(MODELS) if args.models == "all" else [m for m in args.models.split(",") if m]
    args.models += [name for name in own if name not in args.models]
    unknown = [model for model in args.models if model not in args.model_targets]
    if unknown:
        parser.error(f"--models: unknown model(s) {', '.join(unknown)}; choose from {', '.join(MODELS)} or all")
    for name in own:
        try:
            model_source(own[name])
        except FileNotFoundError as exc:
            parser.error(f"--model {name}={own[name]}: {exc}".replace("--model: ", ""))
    args.cells = [f"{name}{MODEL_MARK}{model}" for name in args.only for model in args.models] or args.only
    args.arms = [arm for arm in args.arms.split(",") if arm]
    if not args.arms or any(arm not in ARMS for arm in args.arms):
        parser.error(f"--arms: choose from {', '.join(ARMS)}")
    args.budgets = [b.strip() for b in args.budgets.split(",") if b.strip()]
    bad = [b for b in args.budgets if b != "recipe" and not (b.isdigit() and int(b) >= 1)]
    if bad:
        parser.error(f"--budgets: {', '.join(bad)}: each budget is a number of epochs (at least 1) or recipe")
    if "recipe" in args.budgets and "default" not in args.arms and not args.report_only:
        # plain and naive run at the epochs the default's run of their seed records: without it they have no budget
        args.arms.insert(0, "default")
        print("--budgets recipe: the plain and naive arms run at the epochs the default's run of each seed records;"
              " the default arm is added (its cached runs are reused)", file=sys.stderr)  # fmt: skip
    try:
        args.seeds = [int(s) for s in args.seeds.split(",") if s]
    except ValueError as exc:
        parser.error(f"--seeds takes comma-separated integers ({exc})")
    if args.jobs < 1 or args.threads < 1:
        parser.error("--jobs and --threads: at least 1")
    if args.jobs > 1 and args.threads > 1:
        parser.error(
            f"--jobs {args.jobs} runs {args.jobs} processes at once, each with train.threads=1; drop --threads"
        )
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except HastenError as error:  # a bad recipe, override or folder: the message names it
        print(f"error: {error}", file=sys.stderr)
        return error.exit_code


def _main(argv: list[str] | None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    load_recipe(args.recipe, args.overrides)  # a bad recipe or override: one message before anything runs
    suite = Suite(args, out)
    suite.run()
    shares = {
        name: class_shares(args.recipe, as_list(dataset_overrides(name, out, args.folders)) + args.overrides)
        for name in args.only
    }
    shares |= {cell: shares[cell.partition(MODEL_MARK)[0]] for cell in args.cells}
    argv_text = shlex.join(sys.argv[1:] if argv is None else argv)
    runs = [task_row(task) for task in suite.tasks]
    cells = report.cells(runs, shares)
    recipe_name = load_recipe(args.recipe, args.overrides).name
    results = {
        "command": f"python benchmarks/generalization.py {argv_text}".strip(),
        "recipe": args.recipe or f"the default recipe ({recipe_name})",
        "seeds": args.seeds,
        "budgets": args.budgets,
        "jobs": args.jobs,
        "threads": args.threads,
        "plain_overrides": PLAIN,
        "datasets": {name: dataset_note(name, out, args) for name in args.only},
        "models": {model: args.model_targets[model] for model in args.models},
        "code": suite.code,
        "environment": environment(),
        "cells": cells,
        "runs": runs,
    }
    write_atomic(out / "results.json", json.dumps(results, indent=2) + "\n")
    report.plot(cells, out / "generalization.png")
    text = report.write_report(results, out / "report.md")
    print(text)
    return 0


def task_row(task: Task) -> dict[str, Any]:
    """A task's run as results.json lists it: the task, then its record (None fields for a run not made)."""
    row = {"dataset": task.dataset, "budget": task.budget, "seed": task.seed, "arm": task.arm, "epochs": task.epochs}
    made = with_curve(task.record) or {"missing": True, "test_accuracy": None}
    return made | row  # a run shared by two cells: this one's


def with_curve(record: dict[str, Any] | None) -> dict[str, Any] | None:
    """A cached record made before records kept the run's accuracy curve, with it read from the run's summary.json
    where the run folder is still there (the report times the default to the plain loop's accuracy from it)."""
    if record is None or "accuracy_curve" in record or not record.get("run_dir"):
        return record
    summary = Path(record["run_dir"]) / "summary.json"
    if record.get("exit_code") != 0 or not summary.is_file():
        return record
    return record | {"accuracy_curve": json.loads(summary.read_text()).get("accuracy_curve")}


def dataset_note(name: str, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """What the report says of a dataset: its overrides (but those at DATA_RESET's values), where it comes from."""
    overrides = dataset_overrides(name, out, args.folders)
    note: dict[str, Any] = {"overrides": as_list({k: v for k, v in overrides.items() if DATA_RESET.get(k) != v})}
    if args.folders and name in args.folders:
        note["folder"] = args.folders[name]
    elif name in generated.REGISTRY:
        found = generated.manifest(out / "data" / name) or {}
        note |= {"generated": generated.REGISTRY[name].summary, "sha256": found.get("sha256")}
    if overrides.get("data.test_subset") not in (None, "null"):
        note["test_subset"] = int(overrides["data.test_subset"])
    return note


if __name__ == "__main__":
    sys.exit(main())
