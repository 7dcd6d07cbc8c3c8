"""A model that ends in a softmax (the Keras habit) returns probabilities, not the logits hasten's loss takes:
`model.output=auto` reads them as their log (the same loss as on the softmax's input) in training, evaluation,
predict and export; a sigmoid's outputs, which no reading mends, are a warning, and so are a ReLU's."""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest
import torch
import yaml
from torch import nn

import hasten
from hasten.errors import HastenError
from hasten.models.user import habit_warnings, output_kind, read_output
from hasten.recipe.schema import load_recipe
from hasten.run.resolve import resolve_output
from tests.run.test_user import CLASSES, QUIET, quadrants


class Logits(nn.Module):
    """A user's small CNN ending in its linear layer's logits."""

    def __init__(self, num_classes: int = 4, in_channels: int = 3):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(in_channels, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2),
                                      nn.Flatten())  # fmt: skip
        self.head = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class Softmaxed(Logits):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(super().forward(x), dim=1)


class LogSoftmaxed(Logits):  # the PyTorch MNIST example's habit: log-probabilities are logits already
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(super().forward(x), dim=1)


class Sigmoided(Logits):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(super().forward(x))


class ReLUEnded(Logits):  # non-negative, but not bounded: logits, and a class at 0 for every image can die
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(super().forward(x))


class ZeroHead(Logits):  # Big Transfer's habit (and hasten's zero-init): the last layer starts at 0, outputs 0
    def __init__(self, num_classes: int = 4, in_channels: int = 3):
        super().__init__(num_classes, in_channels)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)


class ZeroHeadReLU(ZeroHead):  # ...with a ReLU after it: 0 everywhere, and no gradient ever moves it
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(super().forward(x))


@pytest.mark.parametrize(
    ("model", "kind", "warned"),
    [(Logits, "logits", False), (Softmaxed, "probabilities", False), (LogSoftmaxed, "logits", False),
     (Sigmoided, "logits", True), (ReLUEnded, "logits", True), (ZeroHead, "logits", False),
     (ZeroHeadReLU, "logits", True)],
)  # fmt: skip
def test_what_a_model_returns_is_read_off_its_outputs(model, kind, warned):
    for seed in range(3):
        torch.manual_seed(seed)
        net = model(num_classes=2)  # two classes: the fewest values a chance bound has to go on
        state = torch.get_rng_state()
        found, warning = output_kind(net, (3, 12, 12), torch.device("cpu"), 2)
        assert found == kind and (warning is not None) == warned
        assert all(p.grad is None for p in net.parameters())  # read off, not trained: no gradient left behind
        assert torch.equal(torch.get_rng_state(), state)  # the run's random stream is not drawn from
    assert "sigmoid at its end" in output_kind(Sigmoided(num_classes=2), (3, 12, 12), torch.device("cpu"), 2)[1]
    relu = output_kind(ReLUEnded(num_classes=2), (3, 12, 12), torch.device("cpu"), 2)[1]
    assert relu is not None and "exactly 0 for some (a ReLU at its end?)" in relu


class DropoutAlwaysOn(Logits):  # a forum classic: F.dropout's default is training=True, in evaluation too
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.nn.functional.dropout(self.features(x), 0.5))


class ChangesItsInput(Logits):  # normalises in place: the same images twice are not the same input twice
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.sub_(0.5)
        return super().forward(x)


class DropoutFollowsEval(Logits):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.nn.functional.dropout(self.features(x), 0.5, training=self.training))


def test_a_model_random_in_evaluation_mode_is_warned_and_one_whose_dropout_follows_eval_is_not(tmp_path):
    for seed in range(3):
        torch.manual_seed(seed)
        assert output_kind(DropoutAlwaysOn(), (3, 12, 12), torch.device("cpu"), 4) == ("logits", None)  # the kind
        (warning,) = habit_warnings(DropoutAlwaysOn(), (3, 12, 12), torch.device("cpu"), 4)
        assert "different outputs for the same images from one call to the next in evaluation mode" in warning
        assert "F.dropout(x, p) without training=self.training" in warning
        assert habit_warnings(DropoutFollowsEval(), (3, 12, 12), torch.device("cpu"), 4) == ()
        assert habit_warnings(nn.Sequential(Logits(), nn.Dropout(0.5)), (3, 12, 12), torch.device("cpu"), 4) == ()
        assert habit_warnings(ChangesItsInput(), (3, 12, 12), torch.device("cpu"), 4) == ()
        assert output_kind(ChangesItsInput(), (3, 12, 12), torch.device("cpu"), 4) == ("logits", None)
    result = hasten.train(None, [*QUIET, f"run.dir={tmp_path}"], model=DropoutAlwaysOn,
                          data=(quadrants(64, 0), quadrants(32, 1)))  # fmt: skip
    assert any("from one call to the next in evaluation mode" in text for text in result["warnings"])
    both = nn.Sequential(DropoutAlwaysOn(num_classes=2), nn.Sigmoid())
    for output in ("auto", "logits"):  # the habit is warned whatever model.output says; the sigmoid where it is read
        recipe = load_recipe("default", [f"model.output={output}"])
        said = resolve_output(recipe, both, (3, 12, 12), torch.device("cpu"), False, 2)[2]
        assert any("from one call to the next" in text for text in said)  # each warning said
        assert any("sigmoid at its end" in text for text in said) == (output == "auto")
    with pytest.raises(HastenError, match=r"PyTorch's own logits differ by .* from one call to the next on the same "
                       r"images: something random stays on in evaluation"):  # fmt: skip
        result.export(tmp_path / "m.onnx")  # its check against onnxruntime cannot agree, and says why
    assert (tmp_path / "m.onnx.mismatch").is_file() and not (tmp_path / "m.onnx").exists()


class PlainTensorScale(Logits):  # torch.ones(1, requires_grad=True) where nn.Parameter was meant: never trained
    def __init__(self, num_classes: int = 4, in_channels: int = 3):
        super().__init__(num_classes, in_channels)
        self.scale = torch.ones(1, requires_grad=True)
        self.offsets = torch.zeros(num_classes)  # a constant: no gradient wanted, nothing to say

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * self.scale + self.offsets


def test_a_tensor_that_requires_grad_outside_the_parameters_is_warned(tmp_path):
    assert output_kind(PlainTensorScale(), (3, 12, 12), torch.device("cpu"), 4) == ("logits", None)
    (warning,) = habit_warnings(PlainTensorScale(), (3, 12, 12), torch.device("cpu"), 4)
    assert "keeps tensors that require a gradient outside its parameters (scale): " in warning
    assert "make each an nn.Parameter" in warning and "offsets" not in warning
    nested = nn.Sequential(PlainTensorScale())
    assert "(scale in PlainTensorScale)" in habit_warnings(nested, (3, 12, 12), torch.device("cpu"), 4)[0]
    result = hasten.train(None, [*QUIET, "model.output=logits", f"run.dir={tmp_path}"], model=PlainTensorScale,
                          data=(quadrants(64, 0), quadrants(32, 1)))  # fmt: skip
    assert any("outside its parameters (scale)" in text for text in result["warnings"])


def test_the_log_is_read_once_however_often_it_is_asked_for():
    net = Softmaxed()
    x = torch.randn(5, 3, 12, 12)
    probabilities = net(x)
    classes = probabilities.shape[1]
    handle = read_output(net, "probabilities", classes)
    assert read_output(net, "probabilities", classes) is None and read_output(net, "logits", classes) is None
    assert torch.allclose(net(x), probabilities.log()) and torch.allclose(net(x).softmax(1), probabilities)
    handle.remove()
    assert torch.allclose(net(x), probabilities)


def test_a_softmax_model_trains_as_its_logits_twin_and_predicts_and_exports_its_probabilities(tmp_path):
    train, test = quadrants(128, 0), quadrants(64, 1)
    results = {}
    for model in (Logits, Softmaxed):
        torch.manual_seed(0)
        net = model()
        overrides = [
            *QUIET,
            "precision=fp32",
            "train.channels_last=false",  # no probe: both twins in one layout, whichever is faster for either
            "train.epochs=8",
            "optim.lr=0.01",
            f"run.dir={tmp_path / model.__name__}",
        ]
        results[model] = hasten.train(None, overrides, model=net, data=(train, test, CLASSES)), net
    (twin, _), (result, net) = results[Logits], results[Softmaxed]
    recorded = yaml.safe_load((result.run_dir / "recipe.yaml").read_text())
    assert recorded["model"]["output"] == "probabilities" and twin["test_accuracy"] >= 0.9
    # the same loss: the same run, up to the rounding of log(softmax(z)) against log_softmax(z)
    assert result["test_accuracy"] == twin["test_accuracy"]
    assert result["train_loss"] == pytest.approx(twin["train_loss"], rel=1e-3)
    images = torch.as_tensor(test[0][:6]).permute(0, 3, 1, 2).float()
    assert torch.allclose(net(images).sum(1), torch.ones(6))  # the user's own object returns what it did
    probabilities = result.probabilities(test[0])
    assert torch.allclose(probabilities.sum(1), torch.ones(len(test[0])))
    again = hasten.load(result.run_dir, model=Softmaxed)
    assert torch.allclose(again.probabilities(test[0]), probabilities, atol=1e-6)
    session = onnxruntime.InferenceSession(str(result.export(tmp_path / "m.onnx")), providers=["CPUExecutionProvider"])
    logits = session.run(None, {"pixels": np.ascontiguousarray(test[0].transpose(0, 3, 1, 2))})[0]
    assert torch.allclose(torch.from_numpy(logits).softmax(1), probabilities, atol=1e-5)


def test_a_sigmoid_model_is_warned_and_a_loss_of_the_users_takes_the_probabilities_as_they_are(tmp_path):
    data = (quadrants(64, 0), quadrants(32, 1))
    warned = hasten.train(None, [*QUIET, "precision=fp32", f"run.dir={tmp_path / 's'}"], model=Sigmoided, data=data)
    assert any("a sigmoid at its end?" in text for text in warned["warnings"])

    given = []

    def on_probabilities(p: torch.Tensor, soft: torch.Tensor) -> torch.Tensor:  # a loss written for a softmax's output
        given.append(bool(torch.allclose(p.detach().sum(1), torch.ones(len(p)))))
        return -(soft * p.clamp_min(1e-12).log()).sum(1).mean()

    result = hasten.train(None, [*QUIET, "precision=fp32", f"run.dir={tmp_path / 'p'}"], model=Softmaxed, data=data,
                          loss=on_probabilities)  # fmt: skip
    assert yaml.safe_load((result.run_dir / "recipe.yaml").read_text())["model"]["output"] == "logits"
    assert len(given) >= 8 and all(given)  # every step's loss saw the model's probabilities


class ListedLayers(nn.Module):
    """Layers in a plain list where nn.ModuleList was meant: their parameters are not the model's."""

    def __init__(self, num_classes: int = 4, in_channels: int = 3):
        super().__init__()
        self.blocks = [nn.Conv2d(in_channels, in_channels, 3, padding=1) for _ in range(2)]
        self.activations = [nn.ReLU()]  # a layer without parameters in a list loses nothing: nothing to say
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(in_channels * 12 * 12, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = self.activations[0](block(x))
        return self.head(x)


def test_layers_in_a_plain_list_are_warned_and_a_module_list_is_not():
    (warning,) = habit_warnings(ListedLayers(), (3, 12, 12), torch.device("cpu"), 4)
    assert "keeps layers in a Python list, tuple or dict (blocks): " in warning
    assert "hold them in nn.ModuleList or nn.ModuleDict" in warning and "activations" not in warning
    registered = ListedLayers()
    registered.blocks = nn.ModuleList(registered.blocks)
    assert habit_warnings(registered, (3, 12, 12), torch.device("cpu"), 4) == ()
