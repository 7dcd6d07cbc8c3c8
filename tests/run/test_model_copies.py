"""A model that keeps a tensor computed from its parameters as a plain attribute cannot be deep-copied by
`copy.deepcopy`: `torch.nn.utils.weight_norm` (hook based, as in many tutorials and papers' code) does, and so does
a model that stores an activation on `self`. hasten copies the model for its probe, numerics check, LR range test,
EMA and the result it hands back (hasten/models/copying.py); each of those works on such a model, the user's model
is left as it was, and its ONNX export holds the folded weights."""

from __future__ import annotations

import copy
import warnings

import onnxruntime
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import hasten
from hasten.models.copying import copy_model, folded_norms, leaf_attributes
from tests.run.test_user import quadrants

weight_norm = nn.utils.weight_norm  # the hook-based form (torch.nn.utils.parametrizations.weight_norm copies fine)


class WeightNormNet(nn.Module):
    def __init__(self, num_classes: int = 4, in_channels: int = 3):
        super().__init__()
        self.conv = weight_norm(nn.Conv2d(in_channels, 8, 3, padding=1))
        self.head = weight_norm(nn.Linear(8 * 4, num_classes))

    def forward(self, x):
        return self.head(F.adaptive_avg_pool2d(F.relu(self.conv(x)), 2).flatten(1))


class KeepsActivation(nn.Module):
    """Stores its last feature map on self (for a visualisation, say): a tensor with a graph behind it."""

    def __init__(self, num_classes: int = 4, in_channels: int = 3):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, 8, 3, padding=1)
        self.head = nn.Linear(8, num_classes)
        self.features = None

    def forward(self, x):
        self.features = F.relu(self.conv(x))
        return self.head(self.features.mean((2, 3)))


@pytest.mark.parametrize("model", [WeightNormNet, KeepsActivation])
def test_copy_model_copies_what_deepcopy_refuses_and_leaves_the_original_as_it_was(model):
    net = model()
    net(torch.randn(2, 3, 12, 12))  # the attribute now holds a tensor with a graph (weight_norm's from the start)
    with pytest.raises(RuntimeError, match="deepcopy protocol"):
        copy.deepcopy(net)
    computed = {id(m): dict(vars(m)) for m in net.modules()}
    twin = copy_model(net)
    for module in net.modules():  # the very same tensors, graphs included, are back on the original
        for name, value in computed[id(module)].items():
            assert vars(module)[name] is value
    assert any(v.grad_fn is not None for m in net.modules() for v in vars(m).values() if isinstance(v, torch.Tensor))
    x = torch.randn(3, 3, 12, 12)
    assert torch.equal(twin(x), net(x))
    with torch.no_grad():
        next(twin.parameters()).add_(1.0)  # the copy's parameters are its own
    assert not torch.equal(twin(x), net(x))
    with leaf_attributes(net):
        copy.deepcopy(net)  # inside, deepcopy itself works


@pytest.mark.parametrize("model", ["WeightNormNet", "SpectralNormNet"])
def test_a_hook_based_weight_norm_model_trains_with_every_copy_the_default_makes(tmp_path, model):
    model = globals()[model]  # (defined below this test)
    data = (quadrants(96, 0), quadrants(48, 1))
    overrides = ["run.progress=false", "run.tensorboard=false", "train.threads=1", "train.epochs=8",
                 "optim.lr=auto", "tricks.ema=0.9", f"run.dir={tmp_path}"]  # fmt: skip
    # the probe (batch size, and precision and layout where the machine gives a choice), the LR range test, EMA
    result = hasten.train(None, overrides, model=model, data=data)
    assert result["test_accuracy"] >= 0.75  # four quadrants: learnt
    images, labels = data[1]
    predicted = torch.tensor([p.index for p in result.predict(images)])
    assert float((predicted == torch.from_numpy(labels)).float().mean()) == pytest.approx(result["test_accuracy"])
    onnx_path = tmp_path / "m.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # torch.export's "tensor attributes ... assigned during export"
        result.export(onnx_path)
    session = onnxruntime.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    pixels = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous().numpy()
    logits = session.run(None, {"pixels": pixels})[0]
    assert float((torch.from_numpy(logits).argmax(1) == torch.from_numpy(labels)).float().mean()) == pytest.approx(
        result["test_accuracy"]
    )
    loaded = hasten.load(tmp_path, model=model)
    assert [p.index for p in loaded.predict(images)] == predicted.tolist()


class SpectralNormNet(WeightNormNet):  # GAN discriminators' habit, hook-based as before torch 2
    def __init__(self, num_classes: int = 4, in_channels: int = 3):
        super().__init__(num_classes, in_channels)
        self.conv = nn.utils.spectral_norm(nn.Conv2d(in_channels, 8, 3, padding=1))


def test_folded_norms_folds_into_a_copy_and_leaves_other_models_alone():
    net = WeightNormNet()
    folded = folded_norms(net)
    x = torch.randn(2, 3, 12, 12)
    torch.testing.assert_close(folded(x), net(x))
    assert isinstance(folded.conv.weight, nn.Parameter) and "weight_g" not in dict(folded.conv.named_parameters())
    assert "weight_g" in dict(net.conv.named_parameters())  # the original keeps its weight norm
    spectral = SpectralNormNet().eval()
    folded = folded_norms(spectral)
    torch.testing.assert_close(folded(x), spectral(x))  # evaluation's weight: no power iteration
    assert isinstance(folded.conv.weight, nn.Parameter) and "weight_orig" in dict(spectral.conv.named_parameters())
    assert not folded.conv._forward_pre_hooks and not folded.head._forward_pre_hooks
    plain = KeepsActivation()
    assert folded_norms(plain) is plain
