"""One training-step engine for every GPT strategy.

Construction order (the same for all strategies, so the same seed gives the same start):
1. build the full GPT on the meta device, allocate it on its device (the CPU for DeepSpeed's NVMe
   offload, else this rank's device) and draw its deterministic init there (`init_gpt_weights`);
2. activation checkpointing flags;
3. model parallelism: cut this rank's pipeline stage, then tensor-parallel split of its blocks;
4. `torch.compile` of each block's forward (module hooks — FSDP's — stay eager outside it);
5. data parallelism: DDP / FSDP2 / DeepSpeed;
6. AdamW (betas 0.9/0.95, weight decay 0 by default so equivalence tests are exact).

`train_step` takes the *global* batch on every rank, keeps this rank's data-parallel slice, runs the
micro-steps (gradients synchronized only on the last) and one optimizer step, and returns the global
mean loss, identical on all ranks.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from trainlab.distributed.failure import raise_if_peer_failure
from trainlab.distributed.launch import DistInfo, ensure_process_group
from trainlab.distributed.wrappers import gradient_sync, unwrap, wrap_ddp
from trainlab.errors import ConfigError
from trainlab.gpt.model import (build_gpt, build_hf_model, gpt_state_dict_from_hf, lm_loss,
                                set_activation_checkpointing, transformer_blocks)
from trainlab.gpt.parallel import nvme
from trainlab.gpt.parallel.amp import Precision
from trainlab.gpt.parallel.fsdp import apply_fsdp
from trainlab.gpt.parallel.pipeline import PipelineRunner, split_stage
from trainlab.gpt.parallel.tensor import apply_tensor_parallel
from trainlab.gpt.parallel.zero1 import build_zero1_optimizer
from trainlab.gpt.strategy import StrategySpec, parse_strategy, validate_strategy

BETAS = (0.9, 0.95)
EPS = 1e-8


class GPTEngine:
    """Model + optimizer + strategy for one rank. See the module docstring for the order of set-up."""

    def __init__(self, model_cfg, spec: StrategySpec | str, dist_info: DistInfo, *, lr: float = 5e-4, seed: int = 0,
                 global_batch: int, micro_batch: int, seq_len: int, impl: str = "ours", tp: int = 1, pp: int = 1,
                 pp_schedule: str = "1f1b", microbatches: int | None = None, fused_optimizer: bool = False,
                 weight_decay: float = 0.0, nvme_path: str | None = None, optimizer: str = "adamw",
                 model: nn.Module | None = None):
        self.spec = parse_strategy(spec) if isinstance(spec, str) else spec
        self.dist = dist_info
        self.device = torch.device(dist_info.device)
        self.model_cfg = model_cfg
        if optimizer not in ("adamw", "sgd"):
            raise ConfigError(f"--optimizer {optimizer!r}: expected adamw or sgd")
        self.optimizer_name = optimizer
        self.impl = impl
        self.global_batch, self.micro_batch, self.seq_len = global_batch, micro_batch, seq_len
        self.degrees = validate_strategy(self.spec, model_cfg, dist_info.world_size, global_batch, micro_batch,
                                         self.device.type, tp=tp, pp=pp, microbatches=microbatches, impl=impl,
                                         seq_len=seq_len, pp_schedule=pp_schedule)
        if self.spec.data_parallel == "nvme" and optimizer != "adamw":
            raise ConfigError(f"--optimizer {optimizer}: nvme (DeepSpeed) runs AdamW only")
        self.data_parallel_size = self.degrees.dp
        self.dp_rank = dist_info.rank if self.spec.data_parallel else 0
        self.per_rank_batch = global_batch // self.degrees.dp
        self.micro_steps = self.per_rank_batch // micro_batch
        if self.spec.distributed:
            ensure_process_group(dist_info)
        self.precision = Precision(self.spec.amp, self.device, sharded=self.spec.uses_fsdp)
        self._pipe = None
        self._ds_engine = None

        model = self._build_full_model(seed) if model is None else self._adopt(model)
        if self.spec.data_parallel == "nvme":
            self._setup_nvme(model, lr, weight_decay, nvme_path)
            return
        if self.spec.pp or self.spec.tp:
            model = self._setup_model_parallel(model, pp_schedule, microbatches)
        else:
            model = model.to(self.device) if not self.spec.uses_fsdp else model
        if self.spec.compile:
            for block in transformer_blocks(unwrap(model)):
                block.forward = torch.compile(block.forward)
        model = self._wrap_data_parallel(model)
        self.model = model
        self.optimizer = self._build_optimizer(lr, weight_decay, fused_optimizer)
        if self._pipe is not None:
            self.micro_steps = self._pipe.n_microbatches

    # ---------------------------------------------------------------- set-up

    def _build_full_model(self, seed: int) -> nn.Module:
        # On the target device: a 1.6B model built and initialised on the CPU took ~60 s (ours) and
        # ~100 s (HF) of single-threaded fills before every GPU step (issue 18). DeepSpeed takes a
        # CPU model and places it itself.
        device = torch.device("cpu") if self.spec.data_parallel == "nvme" else self.device
        if self.impl == "hf":
            return build_hf_model(self.model_cfg, gradient_checkpointing=self.spec.ckpt != "none", seed=seed, device=device)
        model = build_gpt(self.model_cfg, seed, device)
        set_activation_checkpointing(model, self.spec.ckpt)
        return model

    def _adopt(self, model: nn.Module) -> nn.Module:
        """A model built once for several engines in turn (a benchmark measuring strategies on one 1.6B
        build): only single-process, uncompiled strategies of our implementation, whose set-up changes
        nothing in the module but its checkpointing flag."""
        if self.impl != "ours" or self.spec.distributed or self.spec.compile:
            raise ConfigError(f"strategy {self.spec.text}: a prebuilt model serves only single-process, uncompiled "
                              "strategies of --impl ours")
        model.zero_grad(set_to_none=True)  # the previous engine's gradients are not this strategy's memory
        set_activation_checkpointing(model, self.spec.ckpt)
        return model.to(self.device)

    def _setup_model_parallel(self, model: nn.Module, pp_schedule: str, microbatches: int | None) -> nn.Module:
        deg = self.degrees
        if deg.pp > 1 and deg.tp > 1:
            mesh = init_device_mesh(self.device.type, (deg.pp, deg.tp), mesh_dim_names=("pp", "tp"))
            pp_mesh, tp_mesh = mesh["pp"], mesh["tp"]
            ranks = mesh.mesh.tolist()
        elif deg.pp > 1:
            pp_mesh, tp_mesh = init_device_mesh(self.device.type, (deg.pp,), mesh_dim_names=("pp",)), None
            ranks = [[r] for r in pp_mesh.mesh.tolist()]
        else:
            pp_mesh, tp_mesh = None, init_device_mesh(self.device.type, (deg.tp,), mesh_dim_names=("tp",))
            ranks = None
        if pp_mesh is not None:
            stage = pp_mesh.get_local_rank()
            split_stage(model, stage, deg.pp)
        model = model.to(self.device)
        if tp_mesh is not None:
            apply_tensor_parallel(model, tp_mesh)
        if pp_mesh is not None:
            n_mb = microbatches if microbatches is not None else self.per_rank_batch // self.micro_batch
            self._pipe = PipelineRunner(model, stage, deg.pp, self.device, pp_mesh, ranks, n_mb, pp_schedule,
                                        loss_fn=lm_loss, autocast_factory=self.precision.autocast)
        return model

    def _wrap_data_parallel(self, model: nn.Module) -> nn.Module:
        kind = self.spec.data_parallel
        if kind in ("ddp", "zero1"):
            return wrap_ddp(model, self.device)
        if kind in ("zero2", "zero3"):
            return apply_fsdp(model, self.device, reshard_after_forward=kind == "zero3", offload=self.spec.offload)
        return model

    def _build_optimizer(self, lr: float, weight_decay: float, fused: bool) -> torch.optim.Optimizer:
        # SGD exists for the equivalence tests: its update is linear in the gradient, so a gradient
        # that is wrongly scaled (summed instead of averaged over ranks or micro-steps) shows up,
        # whereas AdamW's update m/sqrt(v) is invariant to that scale.
        params = [p for p in self.model.parameters() if p.requires_grad]
        opt_cls = torch.optim.SGD if self.optimizer_name == "sgd" else torch.optim.AdamW
        kwargs = dict(lr=lr, weight_decay=weight_decay)
        if opt_cls is torch.optim.AdamW:
            kwargs.update(betas=BETAS, eps=EPS)
        if self.spec.data_parallel == "zero1":
            return build_zero1_optimizer(params, optimizer_class=opt_cls, fused=fused, **kwargs)
        if self.spec.tp:
            # foreach/fused kernels cannot take a list mixing DTensor (split layers) and plain tensors
            # (replicated embeddings/LayerNorms): use the per-parameter loop.
            kwargs["foreach"] = False
        elif fused:
            kwargs["fused"] = True
        return opt_cls(params, **kwargs)

    def _setup_nvme(self, model: nn.Module, lr: float, weight_decay: float, nvme_path: str | None) -> None:
        cfg = nvme.deepspeed_config(micro_batch=self.micro_batch, accumulation_steps=self.micro_steps,
                               world_size=self.dist.world_size, lr=lr, betas=BETAS, eps=EPS, weight_decay=weight_decay,
                               amp=self.spec.amp, nvme_path=nvme_path or nvme.DEFAULT_NVME_PATH)
        self._ds_engine = nvme.build_deepspeed_engine(model, cfg)
        self.model = self._ds_engine
        self.optimizer = self._ds_engine.optimizer

    # ---------------------------------------------------------------- training

    def _forward_loss(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.impl == "hf":
            logits = self.model(input_ids=tokens, use_cache=False).logits
        else:
            logits = self.model(tokens)
        return lm_loss(logits, tokens)

    def train_step(self, tokens: torch.Tensor) -> float:
        """One optimizer step on the global batch `tokens` [global_batch, seq_len]; returns the global mean loss.

        A collective that fails because another rank died or hung past the process-group timeout
        becomes a one-line HardwareError naming the timeout instead of a hang or a deep traceback.
        """
        try:
            return self._train_step(tokens)
        except (RuntimeError, dist.DistError) as e:
            if self.dist.world_size > 1:
                raise_if_peer_failure(e, self.dist.rank, self.dist.world_size, self.dist.timeout_s)
            raise

    def _train_step(self, tokens: torch.Tensor) -> float:
        if tuple(tokens.shape) != (self.global_batch, self.seq_len):
            raise ConfigError(f"train_step: expected tokens of shape ({self.global_batch}, {self.seq_len}), got {tuple(tokens.shape)}")
        start = self.dp_rank * self.per_rank_batch
        local = tokens[start:start + self.per_rank_batch].to(self.device, non_blocking=True)

        if self._pipe is not None:
            loss = self._pipe.step(local)
            self.precision.step(self.optimizer)
            self.optimizer.zero_grad(set_to_none=True)
            return float(loss)

        total = torch.zeros((), device=self.device)
        for i, mb in enumerate(local.split(self.micro_batch)):
            last = i == self.micro_steps - 1
            if self._ds_engine is not None:  # DeepSpeed scales and skips sync on its own
                loss = self._forward_loss(mb)  # DeepSpeed's bf16/fp16 config casts the model itself
                self._ds_engine.backward(loss)
                self._ds_engine.step()
                total += loss.detach().float() / self.micro_steps
                continue
            with gradient_sync(self.model, last):
                with self.precision.autocast():
                    # mean of equal-size micro-batch means = mean over the whole batch
                    loss = self._forward_loss(mb) / self.micro_steps
                self.precision.backward(loss)
            total += loss.detach().float()
        if self._ds_engine is None:
            self.precision.step(self.optimizer)
            self.optimizer.zero_grad(set_to_none=True)
        if self.data_parallel_size > 1:
            dist.all_reduce(total)  # SUM (gloo has no AVG)
            total /= self.data_parallel_size
        return float(total)

    # ---------------------------------------------------------------- results

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """Full fp32 parameters on rank 0 with our GPT's names; None on other ranks. Collective:
        every rank must call it (shards are all-gathered, pipeline stages gathered to rank 0)."""
        if self._ds_engine is not None:
            sd = nvme.gathered_state_dict(self._ds_engine)
        else:
            sd = {}
            for name, value in unwrap(self.model).state_dict().items():
                if isinstance(value, DTensor):
                    if value.device.type != self.device.type:  # CPU-offloaded shard, NCCL mesh
                        value = value.to(self.device)
                    value = value.full_tensor()
                sd[name] = value.detach().to("cpu", torch.float32).clone()
        if self.impl == "hf":
            sd = gpt_state_dict_from_hf(sd)  # drops HF's causal-mask buffers, splits c_attn into q/k/v
        if self._pipe is not None:
            parts = [None] * self.dist.world_size if self.dist.rank == 0 else None
            dist.gather_object(sd, parts, dst=0)
            if self.dist.rank == 0:
                sd = {}
                for part in parts:
                    sd.update(part)
        return sd if self.dist.rank == 0 else None

    def local_parameter_bytes(self) -> int:
        """Bytes of parameters held by this rank (its shard under FSDP/TP, its stage under PP) —
        for comparing with the memory planner."""
        seen, total = set(), 0
        for p in self.core_model.parameters():
            t = p.to_local() if isinstance(p, DTensor) else p
            if id(p) not in seen:
                seen.add(id(p))
                total += t.numel() * t.element_size()
        return total

    def describe(self) -> dict:
        """The resolved set-up, for the run's config log."""
        return {
            "strategy": self.spec.text, "impl": self.impl, "world_size": self.dist.world_size,
            "dp": self.degrees.dp, "tp": self.degrees.tp, "pp": self.degrees.pp,
            "global_batch": self.global_batch, "per_rank_batch": self.per_rank_batch,
            "micro_batch": self.micro_batch, "micro_steps": self.micro_steps, "seq_len": self.seq_len,
            "amp": self.spec.amp, "activation_checkpointing": self.spec.ckpt, "offload": self.spec.offload,
            "compile": self.spec.compile, "optimizer": self.optimizer_name, "device": str(self.device),
        }

    @property
    def core_model(self) -> nn.Module:
        """The GPT (or HF model / pipeline stage) inside any wrapper."""
        if self._ds_engine is not None:
            return self._ds_engine.module
        return unwrap(self.model)

