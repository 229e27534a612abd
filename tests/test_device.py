"""device.py: the one data-sheet table (memory, peaks per precision, bandwidth) matches exact device names
only and plans a GPU from elsewhere (`trainlab lab --plan --device-name`); --tf32 sets and records TF32."""

import pytest
import torch

from trainlab.device import set_tf32, tf32_state
from trainlab.errors import ConfigError
from trainlab.hardware import GPUS, peak_tflops_for_name


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
    assert all(k.startswith(("NVIDIA ", "Tesla ")) and k == g.name for k, g in GPUS.items())
    for name in ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe",
                 "NVIDIA H200", "NVIDIA GeForce RTX 2080 Ti", "Tesla T4", "NVIDIA L4"):  # fmt: skip
        assert name in GPUS  # the course's machines and the lent ones (issue 37)


@pytest.mark.parametrize(
    "name,memory_gib,sm,peak,bandwidth",
    [
        ("NVIDIA GeForce RTX 2080 Ti", 11, 75, 53.8, 616),  # fp16 tensor cores (FP32 accumulate), no bf16
        ("Tesla T4", 16, 75, 65, 320),
        ("NVIDIA L4", 24, 89, 121, 300),
        ("NVIDIA A100-SXM4-40GB", 40, 80, 312, 1555),
        ("NVIDIA A100-SXM4-80GB", 80, 80, 312, 2039),
        ("NVIDIA H100 80GB HBM3", 80, 90, 989, 3350),
        ("NVIDIA H200", 141, 90, 989, 4800),
    ],
)
def test_device_name_plans_from_the_data_sheet(name, memory_gib, sm, peak, bandwidth):
    from trainlab.lab.machine import detect_hardware

    hw = detect_hardware("auto", name, 2, None, None, True)
    assert (hw.memory_bytes, hw.sm, hw.peak_tflops, hw.bandwidth_gbs) == (memory_gib * 2**30, sm, peak, bandwidth)
    assert hw.gpus == 2 and hw.half == ("fp16" if sm < 80 else "bf16")
    # given by hand, a flag wins over the table
    assert detect_hardware("auto", name, 1, None, "8GiB", True).memory_bytes == 8 * 2**30


def test_an_unknown_device_name_says_what_to_pass():
    from trainlab.errors import ConfigError
    from trainlab.lab.machine import detect_hardware

    with pytest.raises(ConfigError, match=r"^--device-name 'NVIDIA B200': not in .*--sm, --gpu-mem and --peak-tflops$"):
        detect_hardware("auto", "NVIDIA B200", 1, None, None, True)
    hw = detect_hardware("auto", "NVIDIA B200", 1, 2250.0, "180GiB", True, 100)  # described by hand
    assert (hw.memory_bytes, hw.sm, hw.peak_tflops) == (180 * 2**30, 100, 2250.0)


def test_step_estimates_scale_with_the_table():
    """Calibrated on the H100: a slower card's estimates (and limits) grow by its data sheet; a faster one's
    never shrink below the measured time."""
    from trainlab.lab.machine import from_table
    from trainlab.lab.steps import lab_steps

    h100 = {s.name: s for s in lab_steps(from_table("NVIDIA H100 80GB HBM3", 1, 16), "full")}
    t4 = {s.name: s for s in lab_steps(from_table("Tesla T4", 1, 16), "full")}
    h200 = {s.name: s for s in lab_steps(from_table("NVIDIA H200", 1, 16), "full")}
    assert t4["lenet_train"].estimate_s == pytest.approx(h100["lenet_train"].estimate_s * 3350 / 320)
    assert t4["lenet_train"].limit_s == 3 * t4["lenet_train"].estimate_s
    assert h200["lenet_train"].estimate_s == h100["lenet_train"].estimate_s


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
