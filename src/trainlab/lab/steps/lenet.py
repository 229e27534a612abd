"""LeNet-5: the default recipe's run, time to 99 %, and TF32 off/on."""

from __future__ import annotations

from trainlab.hardware import Machine
from trainlab.lab.steps.base import Step, pick, script, trainlab
from trainlab.lab.steps.scripts import TF32Config, TimeTo99Config
from trainlab.lenet.config import TrainConfig

TF32_CPU = "not applicable: TF32 is a tensor-core mode of NVIDIA GPUs (Ampere+), not of a CPU"


def no_tf32(hw: Machine) -> str | None:
    """Why TF32 does not apply here, or None."""
    if not hw.gpu:
        return TF32_CPU
    if hw.sm and hw.sm < 80:
        return f"not applicable: TF32 needs sm80+ (Ampere), this GPU is sm{hw.sm}"
    return None


def steps(hw: Machine, size: str) -> list[Step]:
    dev = hw.device
    # tiny: 2,048 images, seconds; small (the CPU hand-in) and full: the default recipe, 5 epochs (≥ 99 %)
    tiny = dict(epochs=1, train_subset=2048, test_subset=1024) if size == "tiny" else {}
    train = TrainConfig(device=dev, progress=False, out="{out}/lenet-default", **tiny)
    # On a GPU: the fast recipe's CUDA-graph step on 10 seeds (issue 29: ≥ 99 % on ≥ 9 of 10), the
    # seed-style loop (~30 s a seed there) on 3 of them for the ratio; on a CPU one seed of each.
    t99 = TimeTo99Config(
        device=dev,
        loops="fast,seed-style",
        seeds="0,1,2,3,4,5,6,7,8,9" if hw.gpu else "0",
        baseline_seeds="0,1,2" if hw.gpu else None,
        max_epochs=8,
        out="{out}",
    )
    return [
        Step(
            "lenet_train",
            "lenet",
            "LeNet-5, default recipe: curves, accuracy, telemetry",
            pick(size, 25, 280, hw.scale(15, "memory")),
            trainlab("train", config=train),
            sizes={"epochs": pick(size, "1 (2,048 images)", train.epochs, train.epochs)},
        ),
        Step(
            "lenet_time_to_99",
            "lenet",
            "Time to 99 % test accuracy: fast recipe vs the seed-style loop",
            pick(size, 0, 190, hw.scale(120, "memory")),
            script(t99),
            sizes={"seeds": len(t99.seeds.split(",")), "seed-style seeds": 3 if hw.gpu else 1},
            cannot_run="trains to 99 % on full MNIST: no tiny size" if size == "tiny" else None,
        ),
        Step(
            "lenet_tf32",
            "lenet",
            "TF32 off/on: the LeNet-5 default recipe in fp32",
            pick(size, 0, 0, hw.scale(30, "fp32")),
            script(TF32Config(device=dev, out="{out}")),
            sizes={"epochs": 2, "rounds": 2},
            cannot_run=no_tf32(hw),
        ),
    ]
