"""`TrainConfig`: every setting of a LeNet-5 run, one field each, with its flag's help text; presets. And the
configs of the other LeNet commands (`dp compare`, `profile`, `sweep`).

The flags of `trainlab train` are derived from these fields (`trainlab.flags`), and `config.json` in a
run directory is this dataclass as JSON. Each field declares its range or choices (`check=`);
`validate()` applies them and the checks that span fields, before any data is loaded.

Building the flags imports no torch (`trainlab train --help` must be instant): the registries a choice is
checked against (models, activations, modes, …) live in modules that do, so they are named here with
`flags.names_of` and read when a value is checked, and the cross-field checks import their modules.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainlab.errors import ConfigError
from trainlab.flags import (
    Config,
    at_least,
    between,
    check_value,
    int_range,
    json_opt,
    names_of,
    non_negative,
    one_of,
    opt,
    output_dir,
    output_file,
    positive,
    process_count,
    seed_value,
    thread_count,
    timeout_seconds,
)

if TYPE_CHECKING:
    from trainlab.data.augment import Distortion

ACTIVATIONS = names_of("trainlab.lenet.activations:ACTIVATIONS")
DATASETS = names_of("trainlab.data.datasets:DATASETS")
MODELS = names_of("trainlab.lenet.models:MODELS")
MODES = names_of("trainlab.lenet.data_parallel:MODES")
POOLS = names_of("trainlab.lenet.model:POOLS")

# the hand-written ones are lenet.manual_optim.MANUAL_OPTIMIZERS and lenet.muon's (a test holds them equal; those
# modules import torch)
OPTIMIZERS = ("adamw", "adam", "sgd", "manual-sgd", "manual-adamw", "muon")
SCHEDULES = ("onecycle", "cosine", "constant", "linear")
LOADERS = ("device", "dataloader")

# Fields a resumed run may change: they do not change its result, or (epochs) change it as documented
# in `lenet.checkpoint.restore_checkpoint`. `trainlab train --resume` refuses any other changed flag.
RESUME_OVERRIDES = (
    "epochs",
    "device",
    "progress",
    "tensorboard",
    "histograms",
    "gpu_telemetry",
    "dist_timeout",
    "step_timing",
    "stop_after",
)
# Fields about where and how a run was started, not what it computes: never compared on resume.
RUN_PLACEMENT = ("out", "name", "overwrite")


@dataclass
class TrainConfig(Config):
    """LeNet-5 on MNIST. The defaults (5 epochs, batch 256, OneCycle AdamW at 5e-3) reach ≥99.0% test
    accuracy; they were chosen for time-to-99%, measured in benchmarks/lenet_time_to_99.py."""

    # what to train
    model: str = opt(
        "lenet5",
        "architecture: linear | mlp | one-conv | lenet5 | lenet5-bn | resnet18 (CIFAR form: "
        "3×3 stem, no max-pool); see trainlab.lenet.models",
        check=one_of(MODELS),
    )
    act: str = opt(
        "relu", "activation: relu, gelu, gelu-python, gelu-cpp, gelu-triton, gelu-cuda, …", check=one_of(ACTIVATIONS)
    )
    pool: str = opt("max", "LeNet pooling: max | avg", check=one_of(POOLS))
    batchnorm: bool = opt(False, "BatchNorm after convs and hidden FCs (the `best` preset)")
    batchnorm_conv1: bool = opt(
        True,
        "with --batchnorm, also after conv1 (off: conv2 and the hidden FCs only; cheaper on a CPU, the `fast` preset)",
    )
    ops: str = opt(
        "aten",
        "whose layers: aten (PyTorch's) | fused (PyTorch's, but conv1+ReLU+max-pool is our fused C++ "
        "CPU operator) | auto (fused on a CPU where it applies, else aten) | own (ours: trainlab.ops "
        "conv2d/max_pool2d/linear/relu in C++; BatchNorm stays PyTorch's) | own=python|cpp|triton|cuda "
        "(one rung of the ladder)",
        metavar="aten|auto|fused|own[=IMPL]",
    )
    # data
    dataset: str = opt(
        "mnist",
        "mnist | fashion-mnist (Zalando's, same IDX format; from the Debian package "
        "dataset-fashion-mnist or --data-dir)",
        check=one_of(DATASETS),
    )
    data_dir: str | None = opt(
        None,
        "directory with the dataset's IDX files (default: embedded MNIST; Fashion-MNIST: "
        "/usr/share/datasets/fashion-mnist)",
    )
    loader: str = opt(
        "device", "device (whole set resident on the device) | dataloader (torch DataLoader)", check=one_of(LOADERS)
    )
    workers: int = opt(0, "DataLoader worker processes (--loader dataloader)", check=process_count(0))
    augment: bool = opt(False, "random affine augmentation on the device (ranges: --augment-degrees/-translate/-scale)")
    augment_degrees: float = opt(15.0, "affine augmentation: rotation range ± degrees", check=between(0, 180))
    augment_translate: float = opt(
        0.1, "affine augmentation: shift range ± this fraction of the width/height", check=between(0, 1, hi_open=True)
    )
    augment_scale: float = opt(
        0.2, "affine augmentation: zoom range 1 ± this fraction", check=between(0, 1, hi_open=True)
    )
    augment_p: float = opt(
        1.0,
        "probability that a training image is distorted (affine/elastic); the rest stay as is",
        check=between(0, 1, lo_open=True),
    )
    elastic_alpha: float = opt(
        0.0,
        "elastic distortion (Simard et al. 2003) strength α in pixels, on the device "
        "with the affine; 0 = off, the paper uses 34",
        check=non_negative,
    )
    elastic_sigma: float = opt(
        4.0, "elastic distortion smoothness: Gaussian σ of the displacement field in pixels", check=positive
    )
    train_subset: int | None = opt(None, "train on the first N images (tests, quick looks)", check=at_least(1))
    test_subset: int | None = opt(None, "evaluate on the first N test images", check=at_least(1))
    holdout: int | None = opt(
        None,
        "validation: train on all but the last N training images and evaluate on those N "
        "instead of the test set (to choose a recipe without looking at the test set)",
        check=at_least(1),
    )
    # optimization
    epochs: int = opt(5, "passes over the training set", check=at_least(1))
    batch_size: int = opt(256, "global batch size (split across ranks when data-parallel)", check=at_least(1))
    warmup_batch_size: int | None = opt(
        None,
        "batch-size warm-up: the first --batch-warmup-epochs of data go in "
        "global batches of this size, then --batch-size (device loader)",
        check=at_least(1),
    )
    batch_warmup_epochs: float = opt(
        0.25,
        "with --warmup-batch-size: how much of the first epoch goes in the small batches (0–1]",
        check=between(0, 1, lo_open=True),
    )
    optimizer: str = opt(
        "adamw",
        "adamw | adam | sgd (torch.optim) | manual-sgd | manual-adamw (the same updates written out over the "
        "parameter list, lenet/manual_optim.py) | muon (Muon for the hidden weight matrices, AdamW for the rest; "
        "lenet/muon.py)",
        check=one_of(OPTIMIZERS),
    )
    lr: float = opt(5e-3, "peak learning rate (OneCycle max / constant value)", check=positive)
    weight_decay: float = opt(1e-4, "weight decay (decoupled for AdamW, L2 for SGD/Adam)", check=non_negative)
    momentum: float = opt(0.9, "SGD momentum (Nesterov)", cli=False, check=between(0, 1, hi_open=True))
    schedule: str = opt(
        "onecycle",
        "onecycle | cosine | constant | linear (linear warm-up, then linear decay to 0)",
        check=one_of(SCHEDULES),
    )
    warmup_epochs: float = opt(
        0.0, "linear warm-up for cosine/constant/linear (OneCycle has its own)", check=non_negative
    )
    label_smoothing: float = opt(0.0, "cross-entropy label smoothing", check=between(0, 1, hi_open=True))
    ema: float = opt(
        0.0,
        "keep an exponential moving average of the weights with this decay (e.g. 0.999) and "
        "evaluate/checkpoint it; 0 = off",
        check=between(0, 1, hi_open=True),
    )
    ema_warmup: int = opt(
        10,
        "EMA warm-up N: after t updates the decay is min(--ema, (1 + t)/(N + t)); 10 keeps the first steps "
        "out, and caps a short run's decay (one epoch of `fast`: 0.983); 1 lets it reach --ema",
        check=at_least(1),
    )
    scale_lr: str = opt(
        "none",
        "linear | sqrt | none: multiply lr by (global batch / 128) or its sqrt",
        check=one_of(("linear", "sqrt", "none")),
    )
    # execution
    device: str = opt("auto", "auto (CUDA if available) | cpu | cuda | cuda:N")
    amp: str = opt(
        "auto",
        "auto (CUDA: bf16 autocast on sm80+, fp16 with a GradScaler below; CPU: off) | bf16 "
        "(fp16 on a GPU without bf16, below sm80; fp32 on a CPU without bf16 units) | fp16 | off",
        check=one_of(("auto", "bf16", "fp16", "off")),
    )
    channels_last: str = opt("auto", "auto (on CUDA) | on | off", check=one_of(("auto", "on", "off")))
    compile: bool = opt(
        False, "torch.compile the model (compile time reported separately); the same as --step-mode compile"
    )
    step_mode: str = opt(
        "auto",
        "the training step (trainlab.lenet.step): eager | compile (torch.compile) | cudagraph "
        "(forward, backward and optimizer captured as one CUDA graph; CUDA only) | auto "
        "(cudagraph on CUDA where the recipe permits, else eager)",
        check=one_of(names_of("trainlab.lenet.plan:STEP_MODES", "auto")),
    )
    tf32: str = opt(
        "off",
        "TF32 tensor cores for fp32 matmuls/convolutions on Ampere+ GPUs (recorded in the summary)",
        choices=("on", "off"),
    )
    matmul_precision: str | None = opt(
        None,
        "float32 matmul precision (torch.set_float32_matmul_precision): highest (fp32) | high (TF32, = --tf32 on) "
        "| medium (bf16 passes allowed); default: what --tf32 says",
        metavar="highest|high|medium",
    )
    parallel: str = opt("none", "none | dp | ddp | allreduce | ring (see `trainlab dp`)", check=one_of(MODES))
    rank_devices: str | None = opt(
        None,
        "a mixed world: one device per rank, e.g. cpu,cuda (one CPU rank and one GPU rank over gloo, "
        "--parallel allreduce; pair with --shard-weights auto so the slower device gets its share)",
        metavar="DEV1,DEV2,…",
    )
    sync_bn: bool = opt(
        False,
        "with --parallel ddp|allreduce: BatchNorm statistics over the global batch (one all-reduce per "
        "BatchNorm layer and step, lenet/sync_bn.py), so W ranks equal one process; off: each rank's shard",
    )
    shard_weights: str | None = opt(
        None,
        "split each global batch across ranks in proportion to these weights (one per "
        "rank, e.g. 2,1) or to each rank's throughput measured in the first steps (auto); "
        "losses stay those of the even split (default: even)",
        metavar="auto|W1,W2,…",
    )
    seed: int = opt(0, "seeds init, shuffling and augmentation; same seed → same curve on CPU", check=seed_value)
    tta: bool = opt(
        False,
        "also report test accuracy under test-time augmentation (mean softmax over fixed "
        "shifted views), separately from test_accuracy",
    )
    eval_batch_size: int = opt(2000, "test-set batch size (no gradients, so large is fine)", check=at_least(1))
    step_timing: bool = opt(False, "split each step into data / compute / communication time (syncs every step)")
    dist_timeout: float | None = opt(
        None,
        "process-group timeout in seconds: a dead or hung rank fails the "
        "others after this long (default: $TRAINLAB_DIST_TIMEOUT_S, else 120)",
        metavar="S",
        check=timeout_seconds,
    )
    # bookkeeping
    out: str | None = opt(None, "run directory (default runs/<name>); must be new or empty unless --resume/--overwrite")
    name: str | None = opt(None, "run name (default <act>-<timestamp>)")
    overwrite: bool = opt(
        False, "replace the run already in --out (its files are deleted when this run starts writing)"
    )
    progress: bool = opt(True, "progress bar within each epoch")
    tensorboard: bool = opt(True, "write TensorBoard events")
    histograms: bool = opt(
        False,
        "TensorBoard histograms of every weight and its last gradient after each epoch (rank 0; its seconds "
        "are recorded per epoch as histogram_seconds in metrics.jsonl)",
    )
    gpu_telemetry: bool = opt(True, "sample GPU utilization/memory/power with NVML")
    stop_after: int | None = opt(None, "stop after N epochs as if interrupted (to try --resume)", check=at_least(1))
    preset: str = opt(
        "default",
        "default | fast (time-to-99%: BatchNorm, Muon, bf16 where the device has it, 1 epoch) | best (~99.55%: "
        "BatchNorm, augmentation, EMA, 30 epochs)",
        choices=("default", "fast", "best"),
    )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def validate(self) -> None:
        from trainlab.lenet.data_parallel import parse_rank_devices
        from trainlab.lenet.model import check_model_options
        from trainlab.lenet.models import check_model_choice
        from trainlab.lenet.shard_weights import parse_shard_weights

        super().validate()
        check_model_choice(self.model, self.batchnorm, self.ops, self.pool)
        check_model_options(
            self.act, self.pool, self.batchnorm or self.model == "lenet5-bn", self.ops, self.batchnorm_conv1
        )  # the model flags, together
        if self.preset not in PRESETS:
            raise ConfigError(f"--preset {self.preset!r}: expected one of {', '.join(PRESETS)}")
        if self.schedule == "onecycle" and self.warmup_epochs:
            raise ConfigError(
                f"--warmup-epochs {self.warmup_epochs:g}: OneCycle has its own warm-up; "
                "use --schedule cosine or constant"
            )
        if self.warmup_batch_size is not None and self.loader != "device":
            raise ConfigError(
                f"--warmup-batch-size {self.warmup_batch_size}: the batch-size warm-up needs "
                f"--loader device, not {self.loader}"
            )
        if self.warmup_batch_size is not None and self.warmup_batch_size > self.batch_size:
            raise ConfigError(
                f"--warmup-batch-size {self.warmup_batch_size}: a warm-up starts below --batch-size "
                f"{self.batch_size} and grows to it; expected at most {self.batch_size}"
            )
        if self.name is not None and (not self.name or "/" in self.name or self.name in (".", "..")):
            raise ConfigError(f"--name {self.name!r}: expected a plain name (it becomes runs/<name>)")
        from trainlab.hardware import matmul_precision

        matmul_precision(self.tf32, self.matmul_precision)  # the two flags, together
        if self.histograms and not self.tensorboard:
            raise ConfigError("--histograms: the histograms go to TensorBoard; drop --no-tensorboard")
        if self.sync_bn and not (self.batchnorm or self.model in ("lenet5-bn", "resnet18")):
            raise ConfigError(f"--sync-bn: --model {self.model} has no BatchNorm to synchronize (add --batchnorm)")
        if self.sync_bn and self.parallel not in ("ddp", "allreduce"):
            raise ConfigError(
                f"--sync-bn with --parallel {self.parallel}: synchronized BatchNorm needs --parallel ddp or allreduce "
                "(ring's communication thread would interleave its collectives with BatchNorm's)"
            )
        self.distortion()  # the augmentation flags, together (raises ConfigError naming the flag)
        parse_shard_weights(self.shard_weights)  # its syntax; the rank count is checked at launch
        parse_rank_devices(self.rank_devices)  # likewise

    def distortion(self) -> Distortion:
        """The training augmentation these flags ask for."""
        from trainlab.data.augment import Distortion

        return Distortion(
            affine=self.augment,
            degrees=self.augment_degrees,
            translate=self.augment_translate,
            scale=self.augment_scale,
            elastic_alpha=self.elastic_alpha,
            elastic_sigma=self.elastic_sigma,
            p=self.augment_p,
        )

    def result_differences(self, other: TrainConfig) -> list[str]:
        """Fields that change what a run computes and differ between `self` and `other`."""
        skip = set(RESUME_OVERRIDES) | set(RUN_PLACEMENT)
        return [
            f.name
            for f in dataclasses.fields(self)
            if f.name not in skip and getattr(self, f.name) != getattr(other, f.name)
        ]


# Presets set several fields at once; explicit flags given by the user still win (see lenet.cli).
PRESETS: dict[str, dict[str, Any]] = {
    "default": {},
    # Time-to-99% in ONE epoch (benchmarks/lenet_time_to_99.py), every lever chosen on a validation split
    # (--holdout 10000, never the test set; benchmarks/lenet_recipe_ablation.py, lenet_accuracy.py):
    # BatchNorm after conv2, fc1, fc2 + label smoothing 0.1 + a linear warm-up over the first 0.3 epoch to
    # the peak lr and a linear decay to 0 at the epoch's last step + Muon for the hidden weight matrices
    # (conv1, conv2, fc1, fc2; AdamW for the classifier, biases and BatchNorm; lenet/muon.py). With AdamW
    # for every weight the recipe left 8 of 20 validation seeds below 99 % and every fewer-step or EMA
    # variant missed on a seed (lenet_fast_validation.md, lenet_fast_validation_ema.md); Muon kept 20 of 20
    # (lenet_fast_validation_r3.md; r6 after its step became capturable). Its test-set run at batch 96:
    # lenet_accuracy_fast_relu.md.
    # Batch 192 with average pooling (LeNet-5's own subsampling), peak lr 3.5e-2: 313 steps (issue 40, round 7).
    # It kept every validation seed at 99 % or more on PyTorch's layers (lenet_fast_validation_r11_parts/), 18 of
    # 20 on our fused first stage (r12: the same function, other rounding), and over seeds 20-39 it scored as
    # batch 128 with max-pooling did (r13: the same mean, one seed below 99 % each): the same accuracy in two thirds
    # of the steps. A warm-up over 0.3 epoch instead of 0.2 kept all 40 of those seeds at 99 % or more on the fused
    # stage (r14: the same mean, 99.12, a narrower spread; chosen on five of them, quick_screen.txt): the preset
    # since. With max-pooling, batch 160 to 256 missed on a seed under every lr, smoothing, warm-up, weight
    # decay, BatchNorm on conv1, EMA and batch-size warm-up tried (r4, r9, r10, r11). On a GPU the step is
    # launch-bound (0.57 ms at batch 96 and at 128 on an H200), so time to 99 % falls with the step count. Its
    # test-set run: lenet_accuracy_fast_b192_avg_w03.md.
    # On a GPU the whole step, Muon's included, is one CUDA graph (lenet.step; lenet.muon batches its matrices).
    # bf16 autocast runs the convolutions on the CPU's bf16 units (AMX/AVX512-BF16; oneDNN) and
    # channels-last speeds them up further. A CPU without them (the same 2-core box on 11-28 exposed AVX2
    # only) trains in fp32 (lenet.plan): emulated bf16 made its step 3.7x longer there
    # (lenet_cpu_step_fp32.md); in fp32 the recipe kept every validation seed at 99 % or more (batch 96:
    # lenet_fast_validation_r7_parts/; batch 128: r8). conv1's BatchNorm is
    # left out: on 6×28×28 channels-last activations it costs more than all the convolutions it would help
    # (`trainlab profile --variant ...`, benchmarks/results/lenet_cpu_profile.md).
    # On a CPU the first stage (conv1 → ReLU → pool) runs as our fused C++ operator (`ops="auto"`,
    # trainlab.ops.conv_relu_pool) and conv2 computes in NCHW: with AdamW's fused CPU kernel, 1.74× the
    # step of the same recipe on PyTorch's layers at batch 256 (benchmarks/results/lenet_cpu_step_nchw2.md);
    # with average pooling at batch 192, 1.25x PyTorch's layers and 1.04x the images/s of batch 128 with
    # max-pooling (2 threads, lenet_cpu_step_b192_avg.md). On a GPU `auto` is cuDNN's layers.
    "fast": dict(
        batchnorm=True,
        batchnorm_conv1=False,
        epochs=1,
        batch_size=192,
        pool="avg",
        schedule="linear",
        warmup_epochs=0.3,
        lr=3.5e-2,
        label_smoothing=0.1,
        optimizer="muon",
        amp="bf16",
        channels_last="on",
        ops="auto",
    ),
    # Accuracy: BatchNorm + a moderate affine (±10°, ±10% shift, ±10% zoom) on half the images (the
    # untouched half keeps the crisp test digits in distribution) + label smoothing 0.1 + batch 128 + a
    # 30-epoch OneCycle + an EMA of the weights (evaluated and checkpointed). Chosen on a validation split
    # (--holdout 10000, never the test set; benchmarks/results/best_validation/lenet_best_validation.md):
    # against the old recipe cut to 30 epochs (99.43 / 99.57 %), batch 128 + smoothing 0.1 gave 99.49 /
    # 99.61, and with augment-p 0.5 99.55 / 99.54 / 99.55 (the same mean, a higher minimum); distorting
    # every image lowered it (99.36 / 99.42), weight decay 5e-2 and EMA 0.9998 changed nothing; 60 epochs
    # of the old recipe gave +0.05 on the one seed measured, of this one nothing (99.48 / 99.57). Test set,
    # once (benchmarks/results/lenet_accuracy_best_relu.md, 5 seeds): 99.55 ± 0.03 %, min 99.51 (the old
    # 60-epoch recipe: 99.55 ± 0.08, min 99.47) in half the epochs; with --tta, reported apart, 99.63 %,
    # min 99.58.
    # Elastic distortion (--elastic-alpha) was measured and is not used: it lowered LeNet-5's accuracy.
    "best": dict(
        batchnorm=True,
        augment=True,
        augment_degrees=10.0,
        augment_translate=0.1,
        augment_scale=0.1,
        augment_p=0.5,
        epochs=30,
        batch_size=128,
        lr=5e-3,
        label_smoothing=0.1,
        weight_decay=5e-4,
        ema=0.999,
    ),
}


def apply_preset(cfg: TrainConfig, preset: str, explicit: set[str] | None = None) -> TrainConfig:
    explicit = explicit or set()
    if preset not in PRESETS:
        raise ConfigError(f"--preset {preset!r}: expected one of {', '.join(PRESETS)}")
    values = {k: v for k, v in PRESETS[preset].items() if k not in explicit}
    return dataclasses.replace(cfg, preset=preset, **values)


# ----------------------------------------------------------------------------- dp compare, profile, sweep

MODES_HELP = (
    "comma-separated: none (single process), dp (nn.DataParallel, ≥2 GPUs), ddp, allreduce (hand-written), "
    "ring (ring all-reduce from send/recv), lightning (PyTorch Lightning's Trainer, its DDP strategy, on "
    "trainlab's model, optimizer and batches; optional extra: pip install '.[lightning]')"
)


@dataclass
class CompareConfig(Config):
    """`trainlab dp compare`: which modes, on which data, how often."""

    modes: str = opt("none,ddp,allreduce,ring", MODES_HELP)
    nproc: int = opt(2, "processes for ddp/allreduce/ring (one per GPU on CUDA)", check=at_least(1))
    epochs: int = opt(1, "passes over the training set per mode", check=at_least(1))
    device: str = opt("auto", "auto | cpu | cuda")
    batch_size: int = opt(
        128, "global batch, split across ranks (128: the reference batch of --scale-lr)", check=at_least(1)
    )
    train_subset: int | None = opt(None, "train on the first N images", check=at_least(1))
    test_subset: int | None = opt(None, "evaluate on the first N test images", check=at_least(1))
    workers: str = opt("0,1,2,4", "DataLoader num_workers sweep ('' to skip)")
    seed: int = opt(0, "seed of every mode", check=seed_value)
    optimizer: str = opt(
        "adamw",
        "every mode's optimizer: adamw | adam | sgd | manual-sgd | manual-adamw (the update written out, "
        "lenet/manual_optim.py; with allreduce/ring nothing in the step is torch.optim's) | muon (lenet/muon.py)",
        check=one_of(OPTIMIZERS),
    )
    repeats: int = opt(1, "run everything R times round-robin; report medians", check=at_least(1))
    threads: int | None = opt(
        None,
        "torch CPU threads per process for every mode (default: torch's choice single-process, 1 per rank)",
        check=thread_count,
    )
    json: str | None = opt(
        None, "write the rows (and OUT.loaders.json for the sweep)", metavar="OUT.json", check=output_file
    )
    md: str | None = opt(None, "write the tables as markdown", metavar="OUT.md", check=output_file)
    timeout_s: float = opt(
        1800.0,
        "seconds each run of a mode may take: past it, its processes are stopped and the "
        "mode is marked 'timeout' (the other modes' rows are kept)",
        flag="--timeout",
        check=positive,
    )

    def validate(self) -> None:
        from trainlab.lenet.data_parallel import MULTI_PROCESS_MODES, check_launch

        super().validate()
        for mode in parse_modes(self.modes):  # every problem is reported before the first run starts
            launched = "ddp" if mode == "lightning" else mode  # Lightning's DDP: the same launch as ours
            multi = mode in MULTI_PROCESS_MODES or mode == "lightning"
            check_launch(launched, self.nproc if multi else 1, self.device, self.batch_size)
        parse_workers(self.workers)


def parse_modes(text: str) -> list[str]:
    modes = list(dict.fromkeys(m.strip() for m in text.split(",") if m.strip()))
    if not modes:
        raise ConfigError("--modes: expected a comma-separated list such as none,ddp,allreduce")
    compare_modes = (*MODES, "lightning")  # lightning: a row of dp compare, not a training mode
    for m in modes:
        if m not in compare_modes:
            raise ConfigError(f"--modes: unknown mode {m!r}; expected some of {', '.join(compare_modes)}")
    return modes


def parse_workers(text: str) -> list[int]:
    try:
        workers = [int(w) for w in text.split(",") if w.strip()]
    except ValueError:
        raise ConfigError(f"--workers {text!r}: expected a comma-separated list of integers such as 0,1,2,4") from None
    if any(w < 0 for w in workers):
        raise ConfigError(f"--workers {text!r}: worker counts must be >= 0")
    from trainlab.hardware import check_process_count

    for w in workers:
        check_process_count(w, "--workers")
    return workers


# Training settings a --variant may set (TrainConfig fields, plus the CPU threads of its steps).
VARIANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+=,-]{0,63}")
VARIANT_KEYS = ("ops", "act", "amp", "channels_last", "batchnorm", "batchnorm_conv1", "batch_size", "threads")


@dataclass
class ProfileConfig(Config):
    """Per-layer forward/backward time of LeNet-5 training steps (`trainlab profile`)."""

    ops: list[str] | None = opt(
        None,
        "variants side by side: aten, fused, auto, own, own=python|cpp|triton|cuda (repeatable; "
        "default: aten and own, or none with --variant)",
        metavar="aten|fused|auto|own[=IMPL]",
    )
    variant: list[str] | None = opt(
        None,
        f"a training-settings variant NAME:KEY=VALUE,... (repeatable); keys: {', '.join(VARIANT_KEYS)}",
        metavar="NAME:KEY=V,...",
    )
    wall_steps: int = opt(
        0,
        "also time this many steps of each variant without the profiler (interleaved): wall ms per step and images/s",
        check=at_least(0),
    )
    steps: int | None = opt(None, "profile this many training steps (default: one epoch)", check=at_least(1))
    warmup: int = opt(
        3, "steps run before profiling (extension build, allocator, caches), not measured", check=at_least(0)
    )
    batch_size: int = opt(256, "training batch size", check=at_least(1))
    act: str = opt("relu", "activation: relu | gelu | gelu-tanh", check=one_of(ACTIVATIONS))
    train_subset: int | None = opt(
        None, "use the first N training images (the epoch is then shorter)", check=at_least(1)
    )
    device: str = opt("auto", "auto | cpu | cuda")
    threads: int | None = opt(None, "torch CPU threads (default: torch's choice)", check=thread_count)
    seed: int = opt(0, "seeds the initial weights and the batch order (the same for every variant)", check=seed_value)
    trace: bool = opt(True, "write the Chrome trace (trace.json.gz, every variant's steps)")
    out: str | None = opt(None, "run directory (default runs/profile-<timestamp>); new or empty unless --overwrite")
    overwrite: bool = opt(False, "replace what --out holds (its files go when this run starts writing)")
    json: str | None = json_opt(
        "write the result as JSON to PATH ('-': print it instead of the table, the log goes to stderr)"
    )

    @property
    def variants(self) -> list[str]:
        return list(self.ops or ([] if self.variant else ["aten", "own"])) + [
            parse_variant(v)[0] for v in self.variant or []
        ]

    def settings(self) -> dict[str, dict]:
        """{variant name: its settings} (an --ops variant sets ops alone)."""
        return {
            **{ops: {"ops": ops} for ops in self.ops or ([] if self.variant else ["aten", "own"])},
            **dict(parse_variant(v) for v in self.variant or []),
        }

    def validate(self) -> None:
        from trainlab.lenet.model import check_model_options

        super().validate()
        if len(set(self.variants)) < len(self.variants):
            raise ConfigError(
                f"--ops {' '.join(self.variants)}: each variant once (they are told apart by name in the trace)"
            )
        for name, s in self.settings().items():  # every flag fails here, before data loads
            check_model_options(
                s.get("act", self.act),
                "max",
                s.get("batchnorm", False),
                s.get("ops", "aten"),
                s.get("batchnorm_conv1", True),
            )


def parse_variant(spec: str) -> tuple[str, dict]:
    """'NAME:key=value,...' (or 'key=value,...', named by itself) -> (name, {key: typed value}); the
    values are checked as TrainConfig checks its flags, and a bad one is one line naming --variant."""
    name, sep, body = spec.partition(":")
    if not sep:
        name, body = spec, spec
    settings = {}
    for item in (i.strip() for i in body.split(",")):
        key, eq, raw = (part.strip() for part in item.partition("="))
        key = key.replace("-", "_")
        if not eq or key not in VARIANT_KEYS:
            raise ConfigError(
                f"--variant {spec!r}: {item!r} is not KEY=VALUE with KEY one of {', '.join(VARIANT_KEYS)}"
            )
        kind = type(getattr(TrainConfig, key, 1))  # threads: an int like batch_size
        try:
            settings[key] = (
                {"true": True, "on": True, "false": False, "off": False}[raw.lower()]
                if kind is bool
                else int(raw)
                if kind is int
                else raw
            )
        except (KeyError, ValueError):
            raise ConfigError(
                f"--variant {spec!r}: {key}={raw!r} is not {'true/false' if kind is bool else 'an integer'}"
            ) from None
    try:
        TrainConfig(**{k: v for k, v in settings.items() if k != "threads"}).validate()
        check_value(settings.get("threads", 1), thread_count, "threads")
    except ConfigError as e:
        raise ConfigError(f"--variant {spec!r}: {e}") from None
    if not VARIANT_NAME.fullmatch(name.strip()):  # it names the variant in the trace, the table and file names
        raise ConfigError(
            f"--variant {spec!r}: the name {name.strip()!r} is not a plain name (letters, digits, "
            "'.', '_', '+', '-', at most 64; write NAME:KEY=VALUE,...)"
        )
    return name.strip(), settings


# TrainConfig fields the sweep sets itself: each run's directory and name.
NOT_SWEPT = ("out", "name", "stop_after")


MAX_RUNS = 10_000  # a sweep of more runs is a typo (at seconds per run, it would take days)


@dataclass
class SweepConfig(Config):
    """`trainlab sweep`: where the runs go and how they are scheduled (the swept flags are TrainConfig's)."""

    out: str | None = opt(
        None, "sweep directory; each run is OUT/<flag>=<value>_…_seed=<s> (default runs/sweep-<time>)", check=output_dir
    )
    seeds: int | None = opt(
        None,
        "seeds 0..N-1 for every configuration (same as --seed 0,1,…,N-1)",
        metavar="N",
        check=int_range(1, MAX_RUNS),
    )
    gpus: str = opt(
        "auto",
        "auto (one run per visible GPU when there are several) | none (one run after another "
        "on --device) | comma-separated GPU indices",
    )
    dry_run: bool = opt(False, "print the runs and exit")


# ----------------------------------------------------------------------------- async


@dataclass
class AsyncConfig(Config):
    """`trainlab async`: the asynchronous-execution and automatic-parallelism experiments."""

    device: str = opt("auto", "auto (CUDA if available) | cpu | cuda | cuda:N")
    ops: int = opt(1000, "N in t1 + N·t2 + t3: ops per timed run of the exercise", check=at_least(1))
    size: int = opt(
        256, "n of the n×n float32 matmuls (the exercise, the chains, the compute the copy overlaps)", check=at_least(8)
    )
    chain: int = opt(40, "matmuls per chain (experiments 3-5)", check=at_least(1))
    steps: int = opt(30, "LeNet-5 training steps per queued-vs-finished run", check=at_least(1))
    batch_size: int = opt(256, "LeNet-5 batch (synthetic images: only the time is measured)", check=at_least(1))
    copy_mb: int = opt(64, "host→device copy size in MiB (experiment 4)", check=at_least(1))
    repeats: int = opt(5, "timed repeats of every measurement; medians reported", check=at_least(1))
    threads: int | None = opt(None, "torch CPU threads (default: torch's choice)", check=thread_count)
    json: str | None = opt(None, "write the result (rows + config)", metavar="OUT.json", check=output_file)
    md: str | None = opt(None, "write the table as Markdown", metavar="OUT.md", check=output_file)

    def validate(self) -> None:
        super().validate()
        if self.size > 8192:
            raise ConfigError(f"--size {self.size}: expected at most 8192 (an n×n matmul chain of n = 8192 is 256 MiB)")
        if self.copy_mb > 8192:
            raise ConfigError(f"--copy-mb {self.copy_mb}: expected at most 8192 (8 GiB of host and device memory)")
        if self.ops > 100_000:
            raise ConfigError(f"--ops {self.ops}: expected at most 100000")
