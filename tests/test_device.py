"""device.py: the peak-FLOPs table matches exact device names only; --tf32 sets and records TF32."""

import pytest
import torch

from trainlab.device import PEAK_BF16_TFLOPS, peak_tflops_for_name, set_tf32, tf32_state
from trainlab.errors import ConfigError


@pytest.mark.parametrize(
    "name,peak",
    [
        ("NVIDIA H100 80GB HBM3", 989.0),  # H100 SXM5, the lent machines' GPU
        ("NVIDIA H200", 989.0),  # H200 SXM
        ("NVIDIA H200 NVL", 835.0),  # not the SXM part
        ("NVIDIA H100 NVL", 835.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA A10", 125.0),
    ],
)
def test_known_parts(name, peak):
    assert peak_tflops_for_name(name) == (peak, f"data sheet ({name}, dense bf16)")


@pytest.mark.parametrize(
    "name",
    [
        "NVIDIA A10G",
        "NVIDIA H100 80GB HBM3 MIG 1g.10gb",
        "Tesla V100-SXM2-32GB",
        "NVIDIA H200 NVL 2",
        "H100",
        "NVIDIA B200",
    ],
)
def test_unknown_parts_get_no_peak(name):
    peak, source = peak_tflops_for_name(name)
    assert peak is None and source.startswith("unknown peak")


def test_table_keys_are_exact_device_names():
    assert all(k.startswith("NVIDIA ") for k in PEAK_BF16_TFLOPS)


def test_tf32_switch_and_record():
    try:
        on = set_tf32("on")
        assert on["matmul_allow_tf32"] is True and on["cudnn_allow_tf32"] is True
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        off = set_tf32("off")
        assert off == tf32_state() and not off["matmul_allow_tf32"] and not off["cudnn_allow_tf32"]
        with pytest.raises(ConfigError, match="--tf32 'maybe'"):
            set_tf32("maybe")
    finally:
        set_tf32("off")


def test_train_records_tf32(tmp_path):
    from trainlab.lenet.config import TrainConfig
    from trainlab.lenet.loop import train

    try:
        summary = train(
            TrainConfig(
                epochs=1,
                train_subset=256,
                test_subset=256,
                batch_size=128,
                device="cpu",
                progress=False,
                tensorboard=False,
                tf32="on",
                out=str(tmp_path / "run"),
            ),
            log=lambda *a: None,
        )
        assert summary["tf32"]["matmul_allow_tf32"] is True
        assert '"tf32": "on"' in (tmp_path / "run" / "config.json").read_text()
    finally:
        set_tf32("off")
