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
