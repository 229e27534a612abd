"""Own operators (conv2d, max-pool, linear, ReLU): correctness, time per layer, LeNet-5 trained on them."""

from __future__ import annotations

from trainlab.hardware import Machine
from trainlab.lab.steps.base import Step, pick, trainlab
from trainlab.lenet.config import TrainConfig
from trainlab.ops.config import OpsBenchConfig, OpsCheckConfig


def steps(hw: Machine, size: str) -> list[Step]:
    dev = hw.device
    check = OpsCheckConfig(
        gelu=False,
        out="{out}",
        **pick(
            size,
            dict(op=["max_pool2d"], impl=["aten", "python"], dtype=["float32"], case=["batch1-overlap"]),
            dict(impl=["aten", "python", "cpp"]),
            dict(impl=["aten", "cuda", "triton"], batch=64),
        ),
    )
    bench = OpsBenchConfig(
        device=dev, out="{out}", **pick(size, dict(impl=["python"], layer=["pool1"], quick=True), dict(quick=True), {})
    )
    own = pick(size, "own=python", "own=cpp", "own=cuda")
    sub = pick(size, dict(epochs=1, train_subset=512, test_subset=256), dict(epochs=1, train_subset=16384), {})
    train = TrainConfig(device=dev, ops=own, progress=False, out="{out}/lenet-ops-" + own.replace("=", "-"), **sub)
    images = f" ({train.train_subset:,} images)" if train.train_subset else ""
    return [
        Step(
            "ops_check",
            "ops",
            "Own conv2d / max-pool / linear / ReLU against ATen",
            pick(size, 25, 35, hw.scale(120, "memory")),
            trainlab("ops", "check", config=check),
        ),
        Step(
            "ops_bench",
            "ops",
            "Own operators: time per LeNet-5 layer against ATen",
            pick(size, 20, 25, hw.scale(45, "memory")),
            trainlab("ops", "bench", config=bench),
        ),
        Step(
            "ops_train",
            "ops",
            f"LeNet-5 trained on our operators ({own})",
            pick(size, 35, 80, hw.scale(20, "memory")),
            trainlab("train", config=train),
            sizes={"ops": own, "epochs": f"{train.epochs}{images}"},
        ),
    ]
