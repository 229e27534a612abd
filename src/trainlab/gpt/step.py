"""One GPT optimizer step: the seam where a loss or a way of running forward/backward plugs in.

Shaped after torchtitan's `Trainer`: `train_step` cuts the rank's batch into micro-batches and calls
`forward_backward_step` on each (a pipeline gets the whole batch; its schedule micro-batches it),
then one `optimizer_step`. Which class runs a step is decided once, from the plan (`make_step`):

  EagerStep     forward under the precision's autocast, the plan's loss, backward (GradScaler for
                fp16); gradient sync only on the last micro-step (DDP no_sync / FSDP2)
  HiddenLossStep  the same with a loss on the hidden states (the chunked cross-entropy), which the
                model runs inside its forward so the [B, T, V] logits never exist whole
  PipelineStep  torch.distributed.pipelining's schedule runs forward and backward of every micro-batch
  DeepSpeedStep DeepSpeed's engine scales, syncs and steps on its own (nvme)

A new lever is a plan field and a class or a table entry here, not an `if` in the engine, the bench and
the planner: a loss is one more entry in `plan.LOSSES` and `LOSS_FUNCTIONS` (`HiddenLossStep` if it needs the hidden states
rather than the logits), a CUDA-graph wrapper would wrap `EagerStep.forward_backward_step` as
torchtitan's wraps its own. None is written for GPT (issue 30): the 1.6B step is GEMM-bound (~0.5 s of
GPU work per optimizer step at micro-batch 16) and the host queues its few thousand launches ahead of the
GPU, so there is little launch time to save, while a captured step would pin its own memory pool on a
GPU the step already fills to ~70 GiB.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn

from trainlab.distributed.wrappers import gradient_sync
from trainlab.gpt.loss import chunked_lm_loss
from trainlab.gpt.model import lm_loss
from trainlab.gpt.parallel.amp import Precision
from trainlab.gpt.plan import HIDDEN_STATE_LOSSES, LOSSES, GPTPlan

# plan.loss (one of plan.LOSSES) → its function
LOSS_FUNCTIONS: dict[str, Callable] = {"cross_entropy": lm_loss, "chunked": chunked_lm_loss}
assert tuple(LOSS_FUNCTIONS) == LOSSES


def logits_of(impl: str) -> Callable[[nn.Module, torch.Tensor], torch.Tensor]:
    """How the model is called: ours takes tokens, HF's GPT2LMHeadModel input_ids (no KV cache)."""
    if impl == "hf":
        return lambda model, tokens: model(input_ids=tokens, use_cache=False).logits
    return lambda model, tokens: model(tokens)


class EagerStep:
    """Forward, loss and backward per micro-batch in this process; the optimizer steps once."""

    def __init__(self, plan: GPTPlan, model: nn.Module, optimizer: torch.optim.Optimizer, precision: Precision):
        self.model, self.optimizer, self.precision = model, optimizer, precision
        self.loss_fn, self.logits = LOSS_FUNCTIONS[plan.loss], logits_of(plan.impl)
        self.micro_batch, self.micro_steps = plan.micro_batch, plan.micro_steps

    def micro_batches(self, local: torch.Tensor):
        return local.split(self.micro_batch)

    def forward_backward_step(self, tokens: torch.Tensor, last: bool) -> torch.Tensor:
        """This micro-batch's share of the rank's mean loss (detached), its gradients accumulated."""
        with gradient_sync(self.model, last):
            with self.precision.autocast():
                # mean of equal-size micro-batch means = mean over the whole batch
                loss = self.loss(tokens) / self.micro_steps
            self.precision.backward(loss)
        return loss.detach().float()

    def loss(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.loss_fn(self.logits(self.model, tokens), tokens)

    def optimizer_step(self) -> None:
        self.precision.step(self.optimizer)
        self.optimizer.zero_grad(set_to_none=True)


class HiddenLossStep(EagerStep):
    """A loss on the hidden states and the LM head (`plan.HIDDEN_STATE_LOSSES`, e.g. the chunked
    cross-entropy): the model runs it inside its forward, so the whole [B, T, V] logits never exist."""

    def loss(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(tokens, targets=tokens, hidden_loss=self.loss_fn)


class PipelineStep(EagerStep):
    """The pipeline schedule runs every micro-batch's forward and backward (`parallel.pipeline`)."""

    def __init__(self, plan: GPTPlan, pipe, optimizer: torch.optim.Optimizer, precision: Precision):
        self.pipe, self.optimizer, self.precision = pipe, optimizer, precision

    def micro_batches(self, local: torch.Tensor):
        return [local]

    def forward_backward_step(self, tokens: torch.Tensor, last: bool) -> torch.Tensor:
        return torch.as_tensor(float(self.pipe.step(tokens)))


class DeepSpeedStep(EagerStep):
    """DeepSpeed's engine casts the model (its bf16/fp16 config), scales, skips the sync on inner
    micro-steps and steps the optimizer at the accumulation boundary itself."""

    def __init__(self, plan: GPTPlan, ds_engine):
        self.ds_engine, self.micro_batch, self.micro_steps = ds_engine, plan.micro_batch, plan.micro_steps
        self.loss_fn, self.logits = LOSS_FUNCTIONS[plan.loss], logits_of(plan.impl)

    def forward_backward_step(self, tokens: torch.Tensor, last: bool) -> torch.Tensor:
        loss = self.loss_fn(self.logits(self.ds_engine, tokens), tokens)
        self.ds_engine.backward(loss)
        self.ds_engine.step()
        return loss.detach().float() / self.micro_steps

    def optimizer_step(self) -> None:
        pass  # done by ds_engine.step() at the boundary


def make_step(plan: GPTPlan, model: nn.Module, optimizer, precision: Precision, pipe=None) -> EagerStep:
    """The step class this plan runs: the one place a new step mode (a CUDA-graph capture, a fused
    loss that needs the hidden states) is chosen, from a plan field. `model` is DeepSpeed's engine
    for nvme; `pipe` the `PipelineRunner` of a pipeline stage."""
    if plan.strategy.data_parallel == "nvme":
        return DeepSpeedStep(plan, model)
    if pipe is not None:
        return PipelineStep(plan, pipe, optimizer, precision)
    if plan.loss in HIDDEN_STATE_LOSSES:
        return HiddenLossStep(plan, model, optimizer, precision)
    return EagerStep(plan, model, optimizer, precision)


def train_step(step: EagerStep, local: torch.Tensor) -> torch.Tensor:
    """One optimizer step on this rank's batch: the mean loss over it (a device tensor, not synced)."""
    chunks = step.micro_batches(local)
    total = sum(step.forward_backward_step(mb, last=i == len(chunks) - 1) for i, mb in enumerate(chunks))
    step.optimizer_step()
    return total
