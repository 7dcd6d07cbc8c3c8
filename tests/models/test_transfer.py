"""Transfer learning: pretrained weights from every format and from a pinned URL, mismatches reported by name,
the head replaced when the classes differ, freezing that really freezes, per-layer LRs."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from hasten.errors import CheckpointError, RecipeError
from hasten.models import build_model
from hasten.models.pretrained import load_pretrained, pretrained_from_config
from hasten.recipe.schema import ModelConfig, load_recipe
from hasten.run.build import build
from hasten.run.plan import Plan
from hasten.run.trainer import Trainer
from hasten.runfolder.checkpoint import save_checkpoint
from hasten.runfolder.log import RunLog
from hasten.techniques.discriminative import discriminative_groups, layer_groups, layer_lr_scales
from hasten.techniques.freeze import Freeze


def resnet(width: int = 4, classes: int = 10, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model(ModelConfig(width=width, blocks=[1, 1]), (1, 12, 12), classes)


def same(a: torch.nn.Module, b: torch.nn.Module, skip: str = "\0") -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return all(torch.equal(sa[k], sb[k]) for k in sa if not k.startswith(skip))


@pytest.fixture
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("HASTEN_CACHE", raising=False)  # (the test session sets one)
    return tmp_path


@pytest.mark.parametrize("kind", ["safetensors", "checkpoint", "state_dict", "ddp_state_dict"])
def test_pretrained_loads_every_format(tmp_path: Path, kind: str) -> None:
    source = resnet(seed=1)
    weights = {k: v.clone().contiguous() for k, v in source.state_dict().items()}
    path = tmp_path / ("w.safetensors" if kind == "safetensors" else "w.pt")
    if kind == "safetensors":
        save_file(weights, str(path))
    elif kind == "checkpoint":
        save_checkpoint({"model": weights, "step": 3}, path)
    else:
        torch.save({f"module.{k}" if kind == "ddp_state_dict" else k: v for k, v in weights.items()}, path)
    target = resnet(seed=2)
    report = pretrained_from_config(target, ModelConfig(width=4, blocks=[1, 1], pretrained=str(path)))
    assert same(source, target) and not report.problems() and not report.head
    assert len(report.loaded) == len(weights)


def test_other_class_count_replaces_the_head_only() -> None:
    source, target = resnet(classes=10, seed=1), resnet(classes=5, seed=2)
    fresh_head = target.head.weight.clone()
    report = load_pretrained(target, source.state_dict(), source="fashion")
    assert "head 'head' replaced: 10 classes in the file, 5 here" in report.describe()
    assert same(source, target, skip="head.") and torch.equal(target.head.weight, fresh_head)
    again = resnet(seed=3)
    load_pretrained(again, source.state_dict(), reset_head=True)
    assert same(source, again, skip="head.") and not torch.equal(again.head.weight, source.head.weight)


def test_mismatched_shapes_and_keys_are_named() -> None:
    weights = resnet(width=4, seed=1).state_dict()
    weights["extra.weight"] = torch.zeros(3)
    weights["stem.0.renamed"] = weights.pop("stem.0.weight")
    target = resnet(width=8, seed=2)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(CheckpointError) as error:
        load_pretrained(target, weights, source="w.pt")
    message = str(error.value)
    assert "w.pt does not fit" in message and "pretrained_strict=false" in message
    assert "stages.0.0.0.weight: (4, 4, 3, 3) in the file vs (8, 8, 3, 3)" in message
    assert "missing from the file (1): stem.0.weight" in message
    assert "not in the model (2): extra.weight, stem.0.renamed" in message
    assert all(torch.equal(before[k], v) for k, v in target.state_dict().items())  # strict: nothing loaded
    fits = resnet(width=4, seed=2)
    report = load_pretrained(fits, weights, strict=False)
    assert report.missing == ["stem.0.weight"] and sorted(report.unexpected) == ["extra.weight", "stem.0.renamed"]
    assert torch.equal(fits.head.weight, weights["head.weight"])


def test_recipe_with_pretrained_weights_reports_and_loads(tmp_path: Path, tiny_overrides: list[str], capsys) -> None:
    parts = build(load_recipe(None, tiny_overrides))
    save_file({k: v.contiguous() for k, v in parts.model.state_dict().items()}, str(tmp_path / "w.safetensors"))
    tuned = build(load_recipe(None, [*tiny_overrides, f"model.pretrained={tmp_path / 'w.safetensors'}", "seed=5"]))
    assert same(parts.model, tuned.model)
    assert "pretrained: loaded" in capsys.readouterr().err
    with pytest.raises(CheckpointError, match="weights file not found"):
        build(load_recipe(None, [*tiny_overrides, f"model.pretrained={tmp_path / 'none.safetensors'}"]))


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = self.server.files.get(self.path.lstrip("/"))
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[ThreadingHTTPServer]:
    for proxy in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(proxy, raising=False)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.files = {}
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()
    thread.join()


def test_weights_by_url_with_pinned_sha256(server: ThreadingHTTPServer, isolated_home: Path) -> None:
    source = resnet(seed=1)
    path = isolated_home / "w.safetensors"
    save_file(source.state_dict(), str(path))
    body = path.read_bytes()
    server.files["models/w.safetensors"] = body
    url = f"http://127.0.0.1:{server.server_address[1]}/models/w.safetensors"
    digest = hashlib.sha256(body).hexdigest()
    config = ModelConfig(width=4, blocks=[1, 1], pretrained=url, pretrained_sha256=digest)
    target = resnet(seed=2)
    report = pretrained_from_config(target, config)
    assert same(source, target)
    cached = isolated_home / "home" / ".cache" / "hasten" / "weights" / f"{digest[:16]}-w.safetensors"
    assert report.source == str(cached) and cached.read_bytes() == body
    server.files.clear()  # from the cache now: nothing is downloaded again
    pretrained_from_config(resnet(seed=3), config)
    with pytest.raises(CheckpointError, match="does not match its pinned SHA-256"):
        server.files["models/w.safetensors"] = body
        pretrained_from_config(resnet(), config.model_copy(update={"pretrained_sha256": "0" * 64}))
    with pytest.raises(RecipeError, match="model.pretrained_sha256: weights from a URL need"):
        load_recipe(None, [f"model.pretrained={url}"])


def test_layer_lr_decay_values() -> None:
    assert layer_lr_scales(4, 0.5) == [0.125, 0.25, 0.5, 1.0]
    model = resnet()
    layers = layer_groups(model)
    assert [len(g) for g in layers] == [3, 3 + 6, 3 + 6, 2]  # stem; each stage: conv-BN + a residual block; head
    groups = discriminative_groups(model, 0.1, 0.5, 5e-4, no_bias_decay=True)
    lr_of = {id(p): g["lr"] for g in groups for p in g["params"]}
    assert lr_of[id(model.stem[0].weight)] == pytest.approx(0.0125)
    assert lr_of[id(model.stages[0][0][1].bias)] == pytest.approx(0.025)
    assert lr_of[id(model.stages[1][2].second[0].weight)] == pytest.approx(0.05)
    assert lr_of[id(model.head.weight)] == lr_of[id(model.head.bias)] == pytest.approx(0.1)
    assert len(lr_of) == len(list(model.parameters()))
    decay_of = {id(p): g["weight_decay"] for g in groups for p in g["params"]}
    assert decay_of[id(model.head.bias)] == 0 and decay_of[id(model.head.weight)] == 5e-4


def test_layer_lr_decay_in_a_run_keeps_the_ratios_under_the_schedule(tiny_overrides: list[str]) -> None:
    overrides = [*tiny_overrides, "model.blocks=[1,1]", "optim.layer_lr_decay=0.5", "schedule.name=one-cycle"]
    parts = build(load_recipe(None, [*overrides, "optim.name=sgd"]))  # (Muon: the filters' groups keep them too)
    for _ in range(3):
        parts.scheduler.step()
    lrs = sorted({round(g["lr"] / parts.optimizer.param_groups[-1]["lr"], 9) for g in parts.optimizer.param_groups})
    assert lrs == [0.125, 0.25, 0.5, 1.0]


def trainer(parts, tmp_path: Path) -> Trainer:
    plan = Plan(epochs=parts.recipe.train.epochs, num_classes=10, progress=False)
    log = RunLog(tmp_path / "log", enabled=False)
    loaders = (parts.train_loader, parts.test_loader)
    return Trainer(parts.model, parts.optimizer, parts.scheduler, parts.precision, loaders, plan, log, parts.hooks)


@pytest.mark.parametrize("whiten", [False, True])
def test_freeze_trains_the_head_only_then_everything(tiny_overrides: list[str], tmp_path: Path, whiten: bool) -> None:
    overrides = [
        *tiny_overrides,
        "train.freeze_epochs=1",
        "optim.weight_decay=0.01",
        f"model.whiten={str(whiten).lower()}",
    ]
    parts = build(load_recipe(None, [*overrides, "model.whiten_images=40"]))
    steps_per_epoch = len(parts.train_loader)
    loop = trainer(parts, tmp_path)
    body = {k: v.clone() for k, v in parts.model.named_parameters() if not k.startswith("head.")}
    head = parts.model.head.weight.clone()
    batches = iter(parts.train_loader)
    for _ in range(steps_per_epoch):
        loop.train_step(*next(batches))
        assert all(p.grad is None for k, p in parts.model.named_parameters() if not k.startswith("head."))
    params = dict(parts.model.named_parameters())
    assert all(torch.equal(params[k], v) for k, v in body.items())  # no update, not even weight decay
    assert not torch.equal(parts.model.head.weight, head)
    # unfrozen after the first epoch, all but the whitened first conv, which whitening keeps frozen
    thawed = {k for k, p in parts.model.named_parameters() if p.requires_grad}
    assert thawed == set(params) - ({"stem.0.weight"} if whiten else set())
    loop.train_step(*next(iter(parts.train_loader)))
    assert torch.equal(params["stem.0.weight"], body["stem.0.weight"]) is whiten
    assert parts.hooks.stateful["freeze"].state_dict() == {"steps": steps_per_epoch + 1}


def test_freeze_for_the_whole_run_is_a_linear_probe(tiny_overrides: list[str], tmp_path: Path) -> None:
    parts = build(load_recipe(None, [*tiny_overrides, "train.freeze_epochs=5"]))
    body = {k: v.clone() for k, v in parts.model.state_dict().items() if "weight" in k and not k.startswith("head.")}
    summary = trainer(parts, tmp_path).fit()
    assert summary["steps"] == 2 * len(parts.train_loader)
    state = parts.model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in body.items())

    fresh = resnet()  # as a resumed run sees it: built frozen, then told how far the run had got
    resumed = Freeze(fresh, 10)
    assert [k for k, p in fresh.named_parameters() if p.requires_grad] == ["head.weight", "head.bias"]
    resumed.load_state_dict({"steps": 10})
    assert all(p.requires_grad for p in fresh.parameters())


def test_transfer_experiment_pretrains_once_and_compares_both_arms(tmp_path: Path, capsys) -> None:
    from hasten.cli import main

    out = tmp_path / "transfer"
    args = [
        "transfer",
        "transfer-digits",
        "transfer.pretrain=[data.name=synthetic, data.synthetic_size=64, data.subset=null, train.epochs=1]",
        "transfer.per_class=[3]",
        "data.test_subset=40",
        "train.epochs=1",
        "model.width=2",
        "precision=fp32",
        "run.progress=false",
        "--out",
        str(out),
        "--in-process",
    ]
    assert main(args) == 0
    table = capsys.readouterr().out
    assert "| images per class | training images | from scratch | pretrained | gain |" in table
    assert "| 3 | 30 |" in table and "Pretrained on synthetic" in table
    assert (out / "transfer.png").stat().st_size > 0 and (out / "pretrain" / "model.safetensors").is_file()
    names = [v["name"] for v in json.loads((out / "results.json").read_text())["variants"]]
    assert names == ["per_class=3 scratch seed=0", "per_class=3 pretrained seed=0"]
    saved = (out / "runs" / "02-per_class=3_pretrained_seed=0" / "r1" / "recipe.yaml").read_text()
    assert "model.safetensors" in saved and "freeze_epochs: 1" in saved
    assert main(args) == 0  # the second time the pretraining is reused
    assert "pretraining: reusing" in capsys.readouterr().err
