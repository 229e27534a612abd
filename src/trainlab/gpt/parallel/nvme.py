"""NVMe offload through DeepSpeed ZeRO-Infinity (optional backend).

PyTorch has no native NVMe offload, so `nvme` hands the model to DeepSpeed: ZeRO stage 3 with
parameters and optimizer states swapped to files under `nvme_path` (async I/O), the AdamW step run
by DeepSpeed's CPU Adam. It needs the `deepspeed` package (the optional extra `pip install '.[offload]'`,
with its async-io op buildable: libaio) and a CUDA GPU; without them the run fails before launching
with one line (`NotInstalled`, which `gpt compare` shows as a "not installed" row, or HardwareError).
"""

from __future__ import annotations

import importlib.util
import os
from typing import TYPE_CHECKING

from trainlab.errors import HardwareError

if TYPE_CHECKING:
    import torch

DEFAULT_NVME_PATH = os.environ.get("TRAINLAB_NVME_PATH", "/tmp/trainlab_nvme")


INSTALL_HINT = "pip install '.[offload]'"


class NotInstalled(HardwareError):
    """The optional backend is missing: a row that says so in one line, not a failure."""


def check_nvme_available(device_type: str = "cuda") -> None:
    """NotInstalled unless deepspeed is importable; HardwareError unless a CUDA GPU is the training device."""
    if importlib.util.find_spec("deepspeed") is None:
        raise NotInstalled(f"--strategy nvme: deepspeed is not installed (the optional extra: {INSTALL_HINT})")
    import torch  # here: the plan checks this before anything imports torch

    if device_type != "cuda" or not torch.cuda.is_available():
        raise HardwareError("--strategy nvme needs a CUDA GPU (DeepSpeed's NVMe offload swaps to it from NVMe)")


def deepspeed_config(
    *,
    micro_batch: int,
    accumulation_steps: int,
    world_size: int,
    lr: float,
    betas=(0.9, 0.95),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    amp: str | None = None,
    nvme_path: str = DEFAULT_NVME_PATH,
) -> dict:
    """The DeepSpeed config: ZeRO-3 with params and optimizer states on NVMe; same AdamW as ours."""
    return {
        "train_batch_size": micro_batch * accumulation_steps * world_size,
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": accumulation_steps,
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": lr, "betas": list(betas), "eps": eps, "weight_decay": weight_decay},
        },
        "bf16": {"enabled": amp == "bf16"},
        "fp16": {"enabled": amp == "fp16"},
        "zero_optimization": {
            "stage": 3,
            "offload_param": {"device": "nvme", "nvme_path": nvme_path, "pin_memory": True},
            "offload_optimizer": {"device": "nvme", "nvme_path": nvme_path, "pin_memory": True},
            "overlap_comm": True,
            "contiguous_gradients": True,
        },
        "aio": {"block_size": 1048576, "queue_depth": 8, "single_submit": False, "overlap_events": True},
        "steps_per_print": 10**9,  # we log ourselves
    }


def build_deepspeed_engine(model: torch.nn.Module, config: dict):
    """`deepspeed.initialize` on an existing (CPU, full) model; returns the DeepSpeed engine, which
    partitions the parameters and owns the optimizer (`engine.backward(loss)`, `engine.step()`)."""
    check_nvme_available("cuda")
    import deepspeed

    os.makedirs(config["zero_optimization"]["offload_param"]["nvme_path"], exist_ok=True)
    engine, _optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    return engine


def gathered_state_dict(engine) -> dict[str, torch.Tensor]:
    """Full fp32 copies of all parameters (collective: every rank must call it)."""
    import deepspeed

    module = engine.module
    out = {}
    named = dict(module.named_parameters())
    with deepspeed.zero.GatheredParameters(list(named.values()), modifier_rank=None):
        for name, p in named.items():
            out[name] = p.detach().float().cpu().clone()
    if "wte.weight" in out and "lm_head.weight" not in out:
        out["lm_head.weight"] = out["wte.weight"]
    return out
