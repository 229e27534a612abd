"""`--model`: every architecture runs forward and backward on the CPU, has the parameter count its
architecture gives (counted here layer by layer, independently of the code), and its FLOPs per image
agree with torch.utils.flop_counter; a short run trains each one."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from trainlab.errors import ConfigError
from trainlab.lenet.models import MODELS, flops_per_image, make_model


def conv(cin, cout, k, bias=True):
    return cin * cout * k * k + (cout if bias else 0)


def fc(n_in, n_out):
    return n_in * n_out + n_out


def bn(c):
    return 2 * c


def resnet18_params(in_channels=1, classes=10):
    """ResNet-18, CIFAR form: 3×3 stem (no bias) + BN, 4 stages × 2 BasicBlocks, 1×1 projections where
    the shape changes, FC."""
    total = conv(in_channels, 64, 3, bias=False) + bn(64)
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        for block in range(2):
            c_in = cin if block == 0 else cout
            total += conv(c_in, cout, 3, False) + bn(cout) + conv(cout, cout, 3, False) + bn(cout)
            if block == 0 and (stride != 1 or c_in != cout):
                total += conv(c_in, cout, 1, False) + bn(cout)
        cin = cout
    return total + fc(512, classes)


EXPECTED_PARAMS = {
    "linear": fc(784, 10),  # 7,850
    "mlp": fc(784, 300) + fc(300, 100) + fc(100, 10),  # 266,610
    "one-conv": conv(1, 8, 5) + fc(8 * 14 * 14, 128) + fc(128, 10),  # 202,330
    "lenet5": conv(1, 6, 5) + conv(6, 16, 5) + fc(400, 120) + fc(120, 84) + fc(84, 10),  # 61,706
    # BatchNorm replaces the biases of the convs and hidden FCs (not of the last layer)
    "lenet5-bn": (
        conv(1, 6, 5, False)
        + bn(6)
        + conv(6, 16, 5, False)
        + bn(16)
        + 400 * 120
        + bn(120)
        + 120 * 84
        + bn(84)
        + fc(84, 10)
    ),
    "resnet18": resnet18_params(),
}


def test_resnet18_count_is_the_known_cifar_figure_less_two_input_channels():
    # torchvision-style CIFAR ResNet-18 (3 input channels) has 11,173,962 parameters; one input
    # channel removes 2 × 64 × 3 × 3 stem weights.
    assert resnet18_params(in_channels=3) == 11_173_962
    assert EXPECTED_PARAMS["resnet18"] == 11_173_962 - 2 * 64 * 9 == 11_172_810


@pytest.mark.parametrize("name", MODELS)
def test_forward_backward_shapes_and_parameter_count(name):
    torch.manual_seed(0)
    model = make_model(name)
    assert sum(p.numel() for p in model.parameters()) == EXPECTED_PARAMS[name]
    x, y = torch.randn(4, 1, 28, 28), torch.tensor([0, 3, 7, 9])
    logits = model(x)
    assert logits.shape == (4, 10) and torch.isfinite(logits).all()
    F.cross_entropy(logits, y).backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert sum(float(g.abs().sum()) for g in grads) > 0
    with pytest.raises(ValueError, match=r"expects input of shape \[B, 1, 28, 28\]"):
        model(torch.randn(2, 3, 32, 32))


@pytest.mark.parametrize("name", MODELS)
def test_flops_per_image_match_torch_flop_counter(name):
    FlopCounterMode = pytest.importorskip("torch.utils.flop_counter").FlopCounterMode  # GUARDED in test_compat
    model = make_model(name).eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(torch.randn(1, 1, 28, 28))
    assert flops_per_image(model) == counter.get_total_flops() > 0


def test_flops_hand_counts():
    # linear: 784·10 multiply-adds; LeNet-5: conv1 6·25·28·28 + conv2 16·150·10·10 + FCs (400·120 + 120·84 + 84·10)
    assert flops_per_image(make_model("linear")) == 2 * 784 * 10
    assert flops_per_image(make_model("lenet5")) == 2 * (6 * 25 * 784 + 16 * 150 * 100 + 400 * 120 + 120 * 84 + 84 * 10)


def test_flop_probe_leaves_batchnorm_statistics_alone():
    model = make_model("resnet18")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    flops_per_image(model)
    assert model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(model="vgg"), r"--model 'vgg': expected one of"),
        (
            dict(model="resnet18", batchnorm=True),
            r"--batchnorm is a LeNet-5 option; --model resnet18 has its own BatchNorm",
        ),
        (dict(model="one-conv", ops="own"), r"--ops own: our operators build LeNet-5 only"),
        (dict(model="mlp", pool="avg"), r"--pool avg: --model mlp has no pooling layer"),
    ],
)
def test_model_flag_conflicts_are_one_line(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        make_model(**kwargs)


def test_act_and_pool_reach_the_new_models():
    assert isinstance(make_model("mlp", act="tanh").classifier[2], torch.nn.Tanh)
    assert isinstance(make_model("one-conv", pool="avg").features[2], torch.nn.AvgPool2d)
    assert isinstance(make_model("resnet18", act="gelu").blocks[0].act1, torch.nn.GELU)
    assert make_model("lenet5-bn").features[1].__class__ is torch.nn.BatchNorm2d


@pytest.mark.parametrize("name", ["linear", "mlp", "one-conv", "lenet5-bn"])
def test_each_model_trains_end_to_end(tmp_path, name):
    from trainlab.lenet.config import TrainConfig
    from trainlab.lenet.loop import train

    s = train(
        TrainConfig(
            model=name,
            epochs=2,
            train_subset=1024,
            test_subset=500,
            batch_size=64,
            device="cpu",
            progress=False,
            tensorboard=True,
            gpu_telemetry=False,
            out=str(tmp_path / name),
        ),
        log=lambda *_: None,
    )
    assert s["model"] == name and s["params"] == EXPECTED_PARAMS[name]
    assert s["flops_per_image"] == flops_per_image(make_model(name))
    assert s["test_accuracy"] > 50  # chance is 10 %; 2 epochs on 1,024 digits reach well above it
    import json

    records = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    assert [r["train_test_gap"] for r in records] == pytest.approx(
        [r["train_accuracy"] - r["test_accuracy"] for r in records]
    )
