"""Habits of models users write that hasten's own models do not have: flattening with `x.view(...)` (which no
channels_last tensor allows), an `image_size` that is one int, timm's argument names, a required argument of
their own. Each trains, or is refused naming what to set."""

from __future__ import annotations

import pytest
import torch
import yaml
from torch import nn

import hasten
from hasten.cli import main
from hasten.errors import RecipeError
from hasten.models.user import shape_args
from hasten.recipe.trust import import_target
from hasten.tune import autotune
from hasten.tune.choices import Candidate
from tests.run.test_user import QUIET, quadrants
from tests.tune.test_autotune import IdleMeter


class ViewFlat(nn.Module):
    """Flattens its feature map with `view`, as many tutorials do: channels_last tensors cannot be viewed so."""

    def __init__(self, num_classes: int = 4, in_channels: int = 3):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, 6, 3, padding=1)
        self.fc = nn.LazyLinear(num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.max_pool2d(torch.relu(self.conv(x)), 2)
        return self.fc(x.view(x.size(0), -1))


class NoLayoutRuns(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("this model runs in no layout")


def test_a_layout_the_model_cannot_run_in_is_left_out_of_the_probe_with_the_reason():
    model = ViewFlat()
    model(torch.zeros(2, 3, 12, 12))  # the lazy head shaped, as the run does before the probe
    batch = (torch.randn(32, 3, 12, 12), torch.randint(0, 4, (32,)))
    options = [Candidate("fp32", False), Candidate("fp32", True)]
    result = autotune.probe(model, batch, 4, options, meter=IdleMeter())
    assert result.choice == Candidate("fp32", False)
    assert list(result.dropped) == [Candidate("fp32", True)]
    assert result.dropped[Candidate("fp32", True)].startswith("its step raised RuntimeError: view size is not")
    assert "fp32 channels_last left out: its step raised RuntimeError" in result.describe(32)
    with pytest.raises(RuntimeError, match="runs in no layout"):  # no candidate runs: the model's error, as it is
        autotune.probe(NoLayoutRuns(), batch, 4, options, meter=IdleMeter())


def test_a_model_that_flattens_with_view_trains_when_the_layout_is_auto(tmp_path):
    data = (quadrants(64, 0), quadrants(32, 1))
    result = hasten.train(None, [*QUIET, "precision=fp32", "train.channels_last=auto", f"run.dir={tmp_path}"],
                          model=ViewFlat, data=data)  # fmt: skip
    assert result["channels_last"] is False and result["epochs"] == 2
    assert result.predict(data[1][0][:3])[0].label in {"0", "1", "2", "3"}


class IntSide(nn.Module):
    """`image_size` one int, as in many ViT and MLP implementations."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1, image_size: int = 28):
        super().__init__()
        self.side = image_size
        self.fc = nn.Linear(in_channels * image_size * image_size, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))


class TimmNamed(nn.Module):
    """timm's names: in_chans, img_size (an int or a pair), num_classes."""

    def __init__(self, num_classes=1000, in_chans=3, img_size=(224, 224)):
        super().__init__()
        self.size = img_size
        self.fc = nn.Linear(in_chans * img_size[0] * img_size[1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))


def test_the_image_size_is_given_in_the_form_the_model_takes_and_under_timms_names_too(tmp_path):
    assert shape_args(IntSide, (3, 12, 12), 4, "model")["image_size"] == 12
    assert shape_args(TimmNamed, (3, 12, 12), 4, "model").items() >= {"img_size": (12, 12), "in_chans": 3}.items()

    def annotated(num_classes, img_size: int):  # no default: the annotation says it
        return nn.Linear(1, num_classes)

    assert shape_args(annotated, (1, 9, 9), 4, "model")["img_size"] == 9

    class Spelt(nn.Module):  # other spellings of the class count and the input channels, as tutorials write them
        def __init__(self, n_classes=10, n_channels=1):
            super().__init__()
            self.fc = nn.Sequential(nn.Flatten(), nn.LazyLinear(n_classes))
            self.channels = n_channels

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x)

    spelt = hasten.train(None, [*QUIET, "train.epochs=1", f"run.dir={tmp_path / 'spelt'}"], model=Spelt,
                         data=(quadrants(48, 0), quadrants(16, 1)))  # fmt: skip
    assert spelt.model.model.channels == 3 and spelt.predict(quadrants(2, 2)[0])[0].index in range(4)
    with pytest.raises(RecipeError, match=r"IntSide takes image_size as one side \(an int\), but the images are "
                                          r"12 x 16: set data.size"):  # fmt: skip
        shape_args(IntSide, (3, 12, 16), 4, "model.target=pkg:IntSide")
    data = (quadrants(48, 0), quadrants(16, 1))
    for net in (IntSide, TimmNamed):
        result = hasten.train(None, [*QUIET, "train.epochs=1", f"run.dir={tmp_path / net.__name__}"], model=net,
                              data=data)  # fmt: skip
        assert result.model is not None
        loaded = hasten.load(tmp_path / net.__name__, model=net)  # rebuilt with the same arguments
        assert loaded.predict(data[1][0][:2])[0].index in range(4)
    assert hasten.load(tmp_path / "IntSide", model=IntSide).model.side == 12


def _takes_classes(classes, channels=1):  # Keras' and segmentation_models' `classes`, a count
    return nn.Linear(1, classes)


def _typed_classes(classes: int = 10):
    return nn.Linear(1, classes)


def _named_classes(classes: tuple[str, ...] = ("cat", "dog")):  # the class names: not a count, left to its default
    return nn.Linear(1, len(classes))


def test_classes_is_given_the_count_only_where_it_is_a_count():
    assert shape_args(_takes_classes, (3, 8, 8), 4, "model")["classes"] == 4
    assert shape_args(_typed_classes, (3, 8, 8), 4, "model")["classes"] == 4
    assert "classes" not in shape_args(_named_classes, (3, 8, 8), 4, "model")
    assert shape_args(_takes_classes, (3, 8, 8), 4, "model").items() >= {"nb_classes": 4, "num_channels": 3}.items()


class NeedsDepth(nn.Module):
    def __init__(self, depth: int, num_classes: int = 4, in_channels: int = 3):
        super().__init__()
        self.body = nn.Sequential(*[nn.Conv2d(in_channels if i == 0 else 4, 4, 3, padding=1) for i in range(depth)])
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def quadrant_data():
    return quadrants(48, 0), quadrants(16, 1)


def test_a_required_argument_of_the_users_model_is_asked_for_by_its_key(tmp_path, capsys):
    args = ["train", "default", *QUIET, "train.epochs=1", "data.name=import", f"data.target={__name__}:quadrant_data",
            "model.name=import", f"model.target={__name__}:NeedsDepth"]  # fmt: skip
    assert main([*args, f"run.dir={tmp_path / 'a'}"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "missing 1 required positional argument: 'depth'; give it in model.args: model.args.depth=VALUE" in err
    assert main([*args, "model.args.depth=2", f"run.dir={tmp_path / 'b'}"]) == 0
    loaded = hasten.load(tmp_path / "b", model=NeedsDepth)  # rebuilt with the run's model.args
    assert len(loaded.model.body) == 2 and len(loaded.predict(quadrants(5, 2)[0])) == 5


@pytest.mark.parametrize(
    ("target", "advice"),
    [
        ("nets/mine.py:Net", "give a module's name, not a file's: nets.mine from the folder holding nets, or mine with "
                             "nets on PYTHONPATH"),
        ("/home/me/mine.py:Net", "give a module's name, not a file's: mine with /home/me on PYTHONPATH"),
        ("mine.py:Net", "give a module's name, not a file's: mine"),
    ],
)  # fmt: skip
def test_a_file_path_where_a_module_goes_is_answered_with_the_modules_name(target, advice):
    with pytest.raises(RecipeError, match="cannot import module") as raised:
        import_target(target, "model.target")
    assert str(raised.value).endswith(advice)


class ThreeChannels(nn.Module):
    """A first conv built for colour, whatever the data: no constructor arguments."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def test_a_colour_model_on_grey_images_is_told_the_key_that_converts_them(tmp_path):
    (images, labels), (test_images, test_labels) = quadrants(48, 0), quadrants(16, 1)
    grey = (images.mean(-1).astype("uint8"), labels), (test_images.mean(-1).astype("uint8"), test_labels)
    with pytest.raises(RecipeError, match=r"it takes 3-channel images \(set data.rgb=true: grey repeated into 3 "
                                          r"channels\): its forward raised RuntimeError"):  # fmt: skip
        hasten.train(None, [*QUIET, f"run.dir={tmp_path / 'a'}"], model=ThreeChannels, data=grey)
    result = hasten.train(None, [*QUIET, "data.rgb=true", f"run.dir={tmp_path / 'b'}"], model=ThreeChannels, data=grey)
    assert result["preprocessing"]["channels"] == 3


def test_a_view_model_told_to_run_channels_last_is_told_the_layout_key(tmp_path):
    data = (quadrants(32, 0), quadrants(16, 1))
    layout = r"training your model in the channels_last layout, which its `view` cannot take \(set train.channels_"
    with pytest.raises(RecipeError, match=layout + r"last=auto\), raised RuntimeError: view size is not compatible"):
        hasten.train(None, [*QUIET, "precision=fp32", "train.channels_last=true", f"run.dir={tmp_path}"],
                     model=ViewFlat, data=data)  # fmt: skip


class WrittenFor8x8Grey(nn.Module):
    """An MLP written for the 8x8 grey digits: `Linear(64, ...)` over the flattened pixels."""

    def __init__(self, num_classes: int = 4):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def test_a_model_written_for_another_image_size_is_told_the_size_it_takes(tmp_path):
    data = (quadrants(48, 0), quadrants(16, 1))  # 12 x 12 colour images
    with pytest.raises(RecipeError, match=r"its layer takes 64 features where these images give 432: it was written "
                                          r"for 8 x 8 images \(set data.size=8 data.rgb=false\): its forward raised "
                                          r"RuntimeError: mat1 and mat2"):  # fmt: skip
        hasten.train(None, [*QUIET, f"run.dir={tmp_path / 'a'}"], model=WrittenFor8x8Grey, data=data)
    result = hasten.train(None, [*QUIET, "data.size=8", "data.rgb=false", f"run.dir={tmp_path / 'b'}"],
                          model=WrittenFor8x8Grey, data=data)  # fmt: skip
    assert result["preprocessing"]["channels"] == 1 and result["epochs"] == 2
    with pytest.raises(RecipeError) as raised:  # a layer no whole side fits: no size advised
        hasten.train(None, [*QUIET, f"run.dir={tmp_path / 'c'}"], data=data,
                     model=lambda num_classes: nn.Sequential(nn.Flatten(), nn.Linear(77, num_classes)))  # fmt: skip
    assert "mat1 and mat2" in str(raised.value) and "written for" not in str(raised.value)


class TutorialNet(nn.Module):
    """PyTorch's CIFAR-10 tutorial net: 3 channels, unpadded 5x5 convs, `16 * 5 * 5` features after two poolings,
    flattened by `torch.flatten` or, as many copies write it, by `x.view(-1, 16 * 5 * 5)`."""

    def __init__(self, num_classes: int = 4, view: bool = False):
        super().__init__()
        self.view = view
        self.features = nn.Sequential(nn.Conv2d(3, 6, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(6, 16, 5), nn.ReLU(),
                                      nn.MaxPool2d(2))  # fmt: skip
        self.head = nn.Sequential(nn.Linear(16 * 5 * 5, 32), nn.ReLU(), nn.Linear(32, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        return self.head(x.view(-1, 16 * 5 * 5) if self.view else torch.flatten(x, 1))


@pytest.mark.parametrize(
    ("grey", "size", "view", "advice"),
    [
        (True, None, False, r"it was written for 32 x 32 images \(set data.size=32 data.rgb=true\): its forward raised "
                            r"RuntimeError: Given groups=1"),
        (False, None, False, r"it was written for 32 x 32 images \(set data.size=32\): its forward raised "
                             r"RuntimeError: Calculated padded input size"),
        (False, 28, False, r"its layer takes 400 features where these images give 256: it was written for 32 x 32 "
                           r"images \(set data.size=32\): its forward raised RuntimeError: mat1 and mat2"),
        (False, 28, True, r"its layer takes 400 features where these images give 256: it was written for 32 x 32 "
                          r"images \(set data.size=32\): its forward raised RuntimeError: shape '\[-1, 400\]'"),
    ],
)  # fmt: skip
def test_a_net_written_for_32_pixel_colour_images_is_told_both_keys(tmp_path, grey, size, view, advice):
    """The grey 12 x 12 images fail at its first conv (channels), the colour ones at its second (too small), at 28
    at its dense layer: each error says the keys at which the model runs, found by trying them, and with those
    keys the model trains."""
    (images, labels), (test_images, test_labels) = quadrants(32, 0), quadrants(16, 1)
    if grey:
        images, test_images = images.mean(-1).astype("uint8"), test_images.mean(-1).astype("uint8")
    data = (images, labels), (test_images, test_labels)
    keys = [*QUIET, *([f"data.size={size}"] if size else [])]
    with pytest.raises(RecipeError, match=advice):
        hasten.train(None, [*keys, f"run.dir={tmp_path / 'a'}"], model=lambda: TutorialNet(view=view), data=data)
    fixed = [*QUIET, "data.size=32", "data.rgb=true", "train.epochs=1", f"run.dir={tmp_path / 'b'}"]
    result = hasten.train(None, fixed, model=lambda: TutorialNet(view=view), data=data)
    assert result["preprocessing"]["channels"] == 3 and result["steps"] >= 1


def test_the_tries_behind_the_advice_stop_at_their_time_limit(tmp_path, monkeypatch):
    import hasten.models.user as user

    monkeypatch.setattr(user, "HINT_SECONDS", 0.0)  # no time for a try: the error alone, at once
    data = quadrants(32, 0), quadrants(16, 1)
    with pytest.raises(RecipeError, match=r"its forward raised RuntimeError: Calculated padded") as raised:
        hasten.train(None, [*QUIET, f"run.dir={tmp_path}"], model=TutorialNet, data=data)
    assert "written for" not in str(raised.value)


class BrokenInTraining(nn.Module):
    """Raises in training mode only: the start-up's check on zeros (evaluation mode) lets it through."""

    def __init__(self, num_classes: int = 4, in_channels: int = 3):
        super().__init__()
        self.fc = nn.Linear(in_channels * 12 * 12, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            raise ValueError("my training mode is broken")
        return self.fc(x.flatten(1))


def test_a_model_that_raises_in_training_is_its_own_error_in_one_line(tmp_path):
    """Whether the start-up's trials (numerics, probe) or the first training step meet it first."""
    data = (quadrants(64, 0), quadrants(32, 1))
    with pytest.raises(RecipeError, match=r"raised ValueError: my training mode is broken \(at .*test_model_habits"):
        hasten.train(None, [*QUIET, f"run.dir={tmp_path}"], model=BrokenInTraining, data=data)


class Detached(nn.Module):
    """Its features detached before the head (as a `.numpy()` round trip does): the conv never trains."""

    def __init__(self, num_classes: int = 4, in_channels: int = 3, frozen: bool = False):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, 4, 3, padding=1)
        self.head = nn.Linear(4, num_classes)
        self.conv.requires_grad_(not frozen)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = torch.relu(self.conv(x)).mean((2, 3))
        return self.head(features.detach())


def test_parameters_the_loss_does_not_reach_are_named_in_a_warning(tmp_path):
    data = (quadrants(64, 0), quadrants(32, 1))
    result = hasten.train(None, [*QUIET, "precision=fp32", f"run.dir={tmp_path / 'd'}"], model=Detached, data=data)
    (warned,) = [text for text in result["warnings"] if "got no gradient" in text]
    assert warned.startswith("2 of the model's 4 trainable parameter tensors got no gradient from the loss "
                             "(conv.weight, conv.bias)")  # fmt: skip
    frozen = hasten.train(None, [*QUIET, "precision=fp32", f"run.dir={tmp_path / 'f'}"],
                          model=lambda num_classes: Detached(num_classes, frozen=True), data=data)  # fmt: skip
    assert not [text for text in frozen["warnings"] if "got no gradient" in text]  # fixed on purpose: said nothing


def test_a_model_in_float64_is_told_the_precision_key(tmp_path):
    data = (quadrants(64, 0), quadrants(32, 1))
    with pytest.raises(RecipeError, match=r"its weights are float64 where the images come as float32 .*precision=auto"):
        hasten.train(None, [*QUIET, f"run.dir={tmp_path}"], model=BrokenInTraining().double(), data=data)


@pytest.mark.parametrize("wrap", [torch.compile, nn.DataParallel], ids=["compiled", "data-parallel"])
def test_a_model_in_a_wrapper_trains_as_the_module_inside_and_predicts_from_its_folder(tmp_path, wrap, capsys):
    data = (quadrants(64, 0), quadrants(32, 1))
    inner = ViewFlat()
    result = hasten.train(None, [*QUIET, "precision=fp32", f"run.dir={tmp_path}"], model=wrap(inner), data=data)
    assert "model: trains the ViewFlat inside" in capsys.readouterr().err
    assert not any(name.startswith(("_orig_mod.", "module.")) for name in torch.load(
        next((tmp_path / "checkpoints").glob("step-*.pt")), weights_only=True)["model"])  # fmt: skip
    assert len(result.predict(data[1][0][:3])) == 3  # the run folder's weights load into the wrapper's module
    assert torch.equal(hasten.load(tmp_path, model=wrap(ViewFlat())).probabilities(data[1][0]),
                       result.probabilities(data[1][0]))  # fmt: skip


def test_a_torchscript_model_is_refused_naming_what_to_give():
    scripted = torch.jit.script(nn.Sequential(nn.Flatten(), nn.Linear(3 * 12 * 12, 4)))
    with pytest.raises(RecipeError, match="is a TorchScript module .*give the nn.Module it was made from"):
        hasten.train(None, QUIET, model=scripted, data=(quadrants(64, 0), quadrants(32, 1)))


def test_a_fully_convolutional_head_gives_one_score_per_class_or_is_told_how(tmp_path):
    from hasten.models.user import check_model

    pooled = nn.Sequential(nn.Conv2d(3, 4, 1), nn.AdaptiveAvgPool2d(1))  # (N, 4, 1, 1): its logits, not flattened
    said = check_model(pooled, (3, 12, 12), 4, torch.device("cpu"))
    assert said == "model Sequential: its class logits are its map of (2, 4, 1, 1), flattened"
    with pytest.raises(
        RecipeError, match=r"returns \(2, 4, 12, 12\) for a batch of 2 images .*\(a map of class scores: pool it"
    ):
        check_model(nn.Sequential(nn.Conv2d(3, 4, 1)), (3, 12, 12), 4, torch.device("cpu"))
    token = nn.Sequential(nn.Flatten(), nn.Linear(3 * 12 * 12, 4), nn.Unflatten(1, (1, 4)))  # a sequence of one
    assert check_model(token, (3, 12, 12), 4, torch.device("cpu")) == (
        "model Sequential: its class logits are its output of (2, 1, 4), flattened"
    )
    quiet = [*QUIET, "precision=fp32", "optim.lr=0.01", "train.epochs=4", f"run.dir={tmp_path}"]
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 6, stride=6), nn.AdaptiveAvgPool2d(1))
    result = hasten.train(None, quiet, model=net, data=(quadrants(96, 0), quadrants(48, 1)))
    assert result["test_accuracy"] >= 0.75 and len(result.predict(quadrants(48, 1)[0][:4])) == 4


class TutorialMLP(nn.Module):
    """A tutorial's MLP: its class count is `output_size`, a name hasten does not pass the class count by."""

    def __init__(self, input_size: int = 3 * 12 * 12, hidden_size: int = 32, output_size: int = 10):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(input_size, hidden_size), nn.ReLU(),
                                 nn.Linear(hidden_size, output_size))  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def test_a_class_count_under_a_name_hasten_does_not_know_is_named_with_its_key(tmp_path):
    data = (quadrants(96, 0), quadrants(48, 1))
    with pytest.raises(RecipeError, match=r"returns \(2, 10\) .*of shape \(2, 4\) for the data's 4 classes .*; "
                       r"TutorialMLP takes output_size=10 by default: if that is its class count, "
                       r"model.args.output_size=4$"):  # fmt: skip
        hasten.train(None, [*QUIET, f"run.dir={tmp_path / 'a'}"], model=TutorialMLP, data=data)
    with pytest.raises(
        RecipeError,
        match=r"returns \(2, 8\) .*for the data's 4 classes \(labels 0..3; give the class "
        r"names, data.classes, if there are more than the labels show\)$",
    ):  # no default of 8: no key
        hasten.train(None, [*QUIET, f"run.dir={tmp_path / 'b'}", "model.args.output_size=8"], model=TutorialMLP,
                     data=data)  # fmt: skip
    quiet = [*QUIET, "train.epochs=6", "precision=fp32", "optim.lr=0.01", f"run.dir={tmp_path / 'c'}"]
    result = hasten.train(None, [*quiet, "model.args.output_size=4"], model=TutorialMLP, data=data)
    assert result["test_accuracy"] >= 0.75


class NeedsOutputs(nn.Module):
    def __init__(self, n_outputs: int, in_channels: int = 3):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(in_channels, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                 nn.Linear(8, n_outputs))  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def test_model_args_reach_a_class_given_from_python_and_an_instance_is_told_they_cannot(tmp_path):
    data = (quadrants(64, 0), quadrants(32, 1))
    with pytest.raises(RecipeError, match=r"missing 1 required positional argument: 'n_outputs'; give it in "
                       r"model.args: model.args.n_outputs=VALUE$"):  # fmt: skip
        hasten.train(None, [*QUIET, f"run.dir={tmp_path / 'a'}"], model=NeedsOutputs, data=data)
    result = hasten.train(None, [*QUIET, "model.args.n_outputs=4", f"run.dir={tmp_path / 'b'}"], model=NeedsOutputs,
                          data=data)  # fmt: skip
    assert yaml.safe_load((tmp_path / "b" / "recipe.yaml").read_text())["model"]["args"] == {"n_outputs": 4}
    loaded = hasten.load(tmp_path / "b", model=NeedsOutputs)  # built again with the args the run recorded
    assert [p.index for p in loaded.predict(data[1][0][:8])] == [p.index for p in result.predict(data[1][0][:8])]
    with pytest.raises(RecipeError, match=r"model.args \(n_outputs\): the model given is an nn.Module already built"):
        hasten.train(None, [*QUIET, "model.args.n_outputs=4", f"run.dir={tmp_path / 'c'}"], model=NeedsOutputs(4),
                     data=data)  # fmt: skip
