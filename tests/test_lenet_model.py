import pytest
import torch

from trainlab.errors import ConfigError
from trainlab.lenet.activations import ACTIVATIONS, make_activation
from trainlab.lenet.model import LeNet5, count_parameters


def test_classic_lenet5_has_61706_parameters():
    # conv1 156 + conv2 2416 + fc1 48120 + fc2 10164 + fc3 850
    assert count_parameters(LeNet5()) == 61_706


@pytest.mark.parametrize("pool", ["max", "avg"])
@pytest.mark.parametrize("batchnorm", [False, True])
def test_shapes(pool, batchnorm):
    model = LeNet5(pool=pool, batchnorm=batchnorm)
    x = torch.randn(3, 1, 28, 28)
    assert model(x).shape == (3, 10)
    assert model.first_layer_maps(x).shape == (3, 6, 28, 28)


def test_batchnorm_variant_drops_redundant_biases():
    # BN adds a scale and a shift per channel (2 × (6+16+120+84)) and makes the biases before it
    # redundant (6+16+120+84 removed): net +226.
    assert count_parameters(LeNet5(batchnorm=True)) == 61_706 + 226


def test_wrong_input_shape_is_a_clear_error():
    with pytest.raises(ValueError, match=r"\[B, 1, 28, 28\]"):
        LeNet5()(torch.randn(2, 3, 32, 32))


def test_activation_registry():
    assert isinstance(make_activation("relu"), torch.nn.ReLU)
    x = torch.linspace(-3, 3, 11)
    torch.testing.assert_close(make_activation("gelu")(x), torch.nn.functional.gelu(x))
    with pytest.raises(ConfigError, match="unknown activation.*relu"):
        make_activation("swishy")
    assert {"relu", "gelu", "gelu-python", "gelu-cpp", "gelu-triton", "gelu-cuda"} <= set(ACTIVATIONS)


def test_unknown_pool():
    with pytest.raises(ConfigError, match="--pool"):
        LeNet5(pool="median")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batchnorm", [False, True])
def test_pooling_before_relu_is_exactly_relu_then_pool_with_gradients(dtype, batchnorm):
    # LeNet5 pools before ReLU (cheaper); the classic order, written out with the same modules, must give
    # bit-identical logits and parameter gradients, including windows whose values are all ≤ 0 or tied.
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = LeNet5(batchnorm=batchnorm).to(dtype)
    assert model.pool_first and [type(m).__name__ for m in model.features[2:4]] == ["MaxPool2d", "ReLU"]
    conv1, bn1, _, _, conv2, bn2, _, _ = model.features
    fc1, bn3, _, fc2, bn4, _, fc3 = model.classifier[1:]

    def classic(x):
        x = F.max_pool2d(F.relu(bn1(conv1(x))), 2)
        x = F.max_pool2d(F.relu(bn2(conv2(x))), 2).flatten(1)
        return fc3(F.relu(bn4(fc2(F.relu(bn3(fc1(x)))))))

    x = torch.randn(16, 1, 28, 28, dtype=dtype)
    x[:, :, :8] = x[:, :, :8].round()  # ties inside pooling windows
    grads = []
    for forward in (model, classic):
        model.zero_grad()
        out = forward(x)
        out.float().square().sum().backward()
        grads.append((out.detach(), [p.grad.clone() for p in model.parameters()]))
    assert torch.equal(grads[0][0], grads[1][0])
    for a, b in zip(grads[0][1], grads[1][1]):
        assert torch.equal(a, b)


@pytest.mark.parametrize("act, pool", [("gelu", "max"), ("relu", "avg")])
def test_activation_stays_before_pooling_where_they_do_not_commute(act, pool):
    model = LeNet5(act=act, pool=pool)
    assert not model.pool_first and isinstance(model.features[3], (torch.nn.MaxPool2d, torch.nn.AvgPool2d))
