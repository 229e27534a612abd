"""GELU: correctness of every rung, speed against F.gelu, and LeNet-5 trained with ours."""

from __future__ import annotations

from trainlab.hardware import Machine
from trainlab.lab.steps.base import Step, pick, trainlab
from trainlab.lenet.config import TrainConfig
from trainlab.ops.config import BenchConfig, CheckConfig


def steps(hw: Machine, size: str) -> list[Step]:
    dev = hw.device
    check = CheckConfig(json=True, **pick(size, dict(impl=["aten", "python"], dtype=["float32"], n=256), {}, {}))
    # full: up to 256M elements, where issue 29's bandwidth goal is set (far above the 50 MB L2)
    bench = BenchConfig(
        device=dev,
        out="{out}",
        **pick(
            size,
            dict(sizes="1K", impl=["python"], budget=0.01),
            dict(quick=True),
            dict(sizes="1K,1M,16M,64M,256M", budget=0.2),
        ),
    )
    act = pick(size, "gelu-python", "gelu-cpp", "gelu-cuda")
    sub = pick(size, dict(epochs=1, train_subset=1024, test_subset=512), dict(epochs=1), {})
    train = TrainConfig(device=dev, act=act, progress=False, out="{out}/lenet-" + act, **sub)
    return [
        Step(
            "gelu_check",
            "gelu",
            "GELU: Python / C++ / GPU implementations against a float64 reference",
            pick(size, 20, 30, hw.scale(45, "memory")),
            trainlab("gelu", "check", config=check),
            stdout_file="gelu_check.json",
        ),
        Step(
            "gelu_bench",
            "gelu",
            "GELU speed: forward and backward against F.gelu",
            pick(size, 15, 20, hw.scale(25, "memory")),
            trainlab("gelu", "bench", config=bench),
            sizes={"tensor sizes": pick(size, "1K", "1K, 64K, 1M", "1K to 256M elements")},
        ),
        Step(
            "gelu_train",
            "gelu",
            f"LeNet-5 trained with our GELU ({act})",
            pick(size, 25, 75, hw.scale(20, "memory")),
            trainlab("train", config=train),
            sizes={"act": act, "epochs": train.epochs},
        ),
    ]
