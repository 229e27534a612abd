"""One training-step engine for every GPT strategy.

Construction order (the same for all strategies, so the same seed gives the same start):
1. build the full GPT on the meta device, allocate it on its device (the CPU for DeepSpeed's NVMe
   offload, else this rank's device) and draw its deterministic init there (`init_gpt_weights`);
2. activation checkpointing flags;
3. model parallelism on the [dp, pp, tp] mesh (`parallel.mesh`): cut this rank's pipeline stage, then
   tensor-parallel split of its blocks;
4. `torch.compile` of each block's forward (module hooks — FSDP's — stay eager outside it);
5. data parallelism: DDP / FSDP2 (on the mesh's dp dimension) / DeepSpeed; then the pipeline schedule
   around the (wrapped) stage;
6. AdamW (betas 0.9/0.95, weight decay 0 by default so equivalence tests are exact);
7. the step (`gpt.step.make_step`): how forward/backward run for this plan.

Everything comes from one resolved `gpt.plan.GPTPlan`; nothing is re-derived or re-checked here.
`train_step` takes the *global* batch on every rank, keeps this rank's data-parallel slice, runs the
step (micro-steps with gradients synchronized only on the last, one optimizer step) and returns the
global mean loss, identical on all ranks.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor import DTensor

from trainlab.distributed.failure import raise_if_peer_failure
from trainlab.distributed.launch import DistInfo, ensure_process_group
from trainlab.distributed.wrappers import unwrap, wrap_ddp
from trainlab.errors import ConfigError
from trainlab.gpt.model import (
    build_gpt,
    build_hf_model,
    cast_weights_once,
    float8_block_linears,
    gpt_state_dict_from_hf,
    set_activation_checkpointing,
    strip_heads_state_dict,
    transformer_blocks,
)
from trainlab.gpt.parallel import nvme
from trainlab.gpt.parallel.amp import Precision
from trainlab.gpt.parallel.fsdp import apply_fsdp
from trainlab.gpt.parallel.mesh import average_gradients_before_step, build_mesh
from trainlab.gpt.parallel.pipeline import PipelineRunner, split_stage
from trainlab.gpt.parallel.tensor import apply_tensor_parallel
from trainlab.gpt.parallel.zero1 import build_zero1_optimizer
from trainlab.gpt.plan import GPTPlan
from trainlab.gpt.step import LOSS_FUNCTIONS, make_step, train_step

BETAS = (0.9, 0.95)
EPS = 1e-8


class GPTEngine:
    """Model + optimizer + strategy for one rank. See the module docstring for the order of set-up."""

    def __init__(self, plan: GPTPlan, dist_info: DistInfo, *, model: nn.Module | None = None):
        if dist_info.world_size != plan.world_size:
            raise ConfigError(
                f"the plan is for {plan.world_size} rank(s), this process is one of {dist_info.world_size}"
            )
        self.plan, self.spec, self.degrees = plan, plan.strategy, plan.degrees
        self.dist = dist_info
        self.device = torch.device(dist_info.device)
        self.model_cfg, self.impl = plan.model, plan.impl
        self.dp_rank = dist_info.rank if self.spec.data_parallel else 0
        if self.spec.distributed:
            ensure_process_group(dist_info)
        self.precision = Precision(self.spec.amp, self.device, sharded=self.spec.uses_fsdp)
        self._pipe = None
        self._ds_engine = None
        self.mesh = None  # the [dp, pp, tp] mesh where tp or pp take part

        model = self._build_full_model() if model is None else self._adopt(model)
        if self.spec.data_parallel == "nvme":
            self._setup_nvme(model)
            self.step = make_step(plan, self._ds_engine, self.optimizer, self.precision)
            return
        if self.spec.pp or self.spec.tp:
            model = self._setup_model_parallel(model)
        else:
            model = model.to(self.device) if not self.spec.uses_fsdp else model
        if plan.fp8:  # before compile, so inductor fuses the float8 casts into the blocks
            float8_block_linears(unwrap(model))
        if plan.cast_once:  # before compile: the compiled blocks read the 16-bit copies as inputs
            cast_weights_once(unwrap(model), self.precision.dtype)
        if self.spec.compile:
            for block in transformer_blocks(unwrap(model)):
                block.forward = torch.compile(block.forward)
        self.model = self._wrap_data_parallel(model)
        if self.spec.pp:
            self._pipe = self._pipeline(self.model)
        self.optimizer = self._build_optimizer()
        if plan.cast_once:
            unwrap(self.model).weight_cache.watch(self.optimizer)  # the copies are stale after each step
        self.step = make_step(plan, self.model, self.optimizer, self.precision, self._pipe)

    # ---------------------------------------------------------------- set-up

    def _build_full_model(self) -> nn.Module:
        # On the target device: a 1.6B model built and initialised on the CPU took ~60 s (ours) and
        # ~100 s (HF) of single-threaded fills before every GPU step (issue 18). DeepSpeed takes a
        # CPU model and places it itself.
        device = torch.device("cpu") if self.spec.data_parallel == "nvme" else self.device
        seed = self.plan.seed
        if self.impl == "hf":
            return build_hf_model(
                self.model_cfg, gradient_checkpointing=self.spec.ckpt != "none", seed=seed, device=device
            )
        model = build_gpt(self.model_cfg, seed, device)
        set_activation_checkpointing(model, self.spec.ckpt)
        return model

    def _adopt(self, model: nn.Module) -> nn.Module:
        """A model built once for several engines in turn (a benchmark measuring strategies on one 1.6B
        build): only single-process, uncompiled strategies of our implementation, whose set-up changes
        nothing in the module but its checkpointing flag."""
        if self.impl != "ours" or self.spec.distributed or self.spec.compile:
            raise ConfigError(
                f"strategy {self.spec.text}: a prebuilt model serves only single-process, uncompiled "
                "strategies of --impl ours"
            )
        model.zero_grad(set_to_none=True)  # the previous engine's gradients are not this strategy's memory
        set_activation_checkpointing(model, self.spec.ckpt)
        return model.to(self.device)

    def _setup_model_parallel(self, model: nn.Module) -> nn.Module:
        """Cut this rank's pipeline stage and split its blocks over the tp group, on the [dp, pp, tp]
        mesh (`parallel.mesh`); the pipeline runner is made after data parallelism wraps the stage."""
        self.mesh = build_mesh(self.device.type, self.degrees)
        self.dp_rank = self.mesh.dp_rank
        if self.mesh.pp is not None:
            split_stage(model, self.mesh.stage, self.degrees.pp)
        model = model.to(self.device)
        if self.mesh.tp is not None:
            apply_tensor_parallel(model, self.mesh.tp)
        return model

    def _pipeline(self, stage_module: nn.Module) -> PipelineRunner:
        return PipelineRunner(
            stage_module,
            self.mesh.stage,
            self.degrees.pp,
            self.device,
            self.mesh.pp,
            self.mesh.tied_pairs(),
            self.plan.micro_steps,
            self.plan.pp_schedule,
            loss_fn=LOSS_FUNCTIONS[self.plan.loss],
            autocast_factory=self.precision.autocast,
        )

    def _wrap_data_parallel(self, model: nn.Module) -> nn.Module:
        kind = self.spec.data_parallel
        dp_mesh = self.mesh.dp if self.mesh is not None else None
        if kind in ("ddp", "zero1"):
            # with tp/pp the optimizer averages the gradients over dp (`_build_optimizer`): DDP takes no DTensors
            return wrap_ddp(model, self.device) if self.mesh is None else model
        if kind in ("zero2", "zero3"):
            return apply_fsdp(
                model, self.device, reshard_after_forward=kind == "zero3", offload=self.spec.offload, mesh=dp_mesh
            )
        return model

    def _build_optimizer(self) -> torch.optim.Optimizer:
        # SGD exists for the equivalence tests: its update is linear in the gradient, so a gradient
        # that is wrongly scaled (summed instead of averaged over ranks or micro-steps) shows up,
        # whereas AdamW's update m/sqrt(v) is invariant to that scale.
        # The kernel is the plan's (`plan.optimizer_kernel`: tp's mix of DTensors and plain tensors
        # takes the per-parameter loop, which foreach/fused kernels cannot replace).
        plan = self.plan
        params = [p for p in self.model.parameters() if p.requires_grad]
        opt_cls = torch.optim.SGD if plan.optimizer == "sgd" else torch.optim.AdamW
        kwargs = dict(lr=plan.lr, weight_decay=plan.weight_decay)
        if opt_cls is torch.optim.AdamW:
            kwargs.update(betas=BETAS, eps=EPS)
        fused = plan.optimizer_kernel == "fused"
        group = self.mesh.dp_group if self.mesh is not None else None
        if self.spec.data_parallel == "zero1":
            optimizer = build_zero1_optimizer(
                params, optimizer_class=opt_cls, fused=fused, process_group=group, **kwargs
            )
        else:
            if plan.optimizer_kernel == "forloop" and self.spec.tp:
                kwargs["foreach"] = False
            elif fused:
                kwargs["fused"] = True
            optimizer = opt_cls(params, **kwargs)  # foreach: torch's own default on CUDA
        if self.spec.data_parallel in ("ddp", "zero1") and self.mesh is not None:
            average_gradients_before_step(optimizer, params, group, self.degrees.dp)
        return optimizer

    def _setup_nvme(self, model: nn.Module) -> None:
        plan = self.plan
        cfg = nvme.deepspeed_config(
            micro_batch=plan.micro_batch,
            accumulation_steps=plan.micro_steps,
            world_size=self.dist.world_size,
            lr=plan.lr,
            betas=BETAS,
            eps=EPS,
            weight_decay=plan.weight_decay,
            amp=self.spec.amp,
            nvme_path=plan.nvme_path or nvme.DEFAULT_NVME_PATH,
        )
        self._ds_engine = nvme.build_deepspeed_engine(model, cfg)
        self.model = self._ds_engine
        self.optimizer = self._ds_engine.optimizer

    # ---------------------------------------------------------------- training

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
        plan = self.plan
        if tuple(tokens.shape) != (plan.global_batch, plan.seq):
            raise ConfigError(
                f"train_step: expected tokens of shape ({plan.global_batch}, {plan.seq}), got {tuple(tokens.shape)}"
            )
        start = self.dp_rank * plan.per_rank_batch
        local = tokens[start : start + plan.per_rank_batch].to(self.device, non_blocking=True)
        total = train_step(self.step, local)
        if self.degrees.dp > 1:  # the replicas' losses (tp/pp ranks of one replica hold the same)
            dist.all_reduce(total, group=self.mesh.dp_group if self.mesh is not None else None)  # SUM: gloo has no AVG
            total /= self.degrees.dp
        return float(total)

    # ---------------------------------------------------------------- results

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """Full fp32 parameters on rank 0 with our GPT's names, unpadded heads; None on other ranks. Collective:
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
        sd = strip_heads_state_dict(sd, self.model_cfg)  # the padded head layout is not a checkpoint's
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
        return {**self.plan.describe(), "device": str(self.device)}

    @property
    def core_model(self) -> nn.Module:
        """The GPT (or HF model / pipeline stage) inside any wrapper."""
        if self._ds_engine is not None:
            return self._ds_engine.module
        return unwrap(self.model)
