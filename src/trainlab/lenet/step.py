"""`make_step(plan, model, optimizer) → Step`: THE LeNet-5 training step, in one of three modes.

One optimizer step is forward (autocast per the plan) → cross-entropy (+ label smoothing) → backward →
`after_backward` (the hand-written all-reduce) → optimizer step → the weights' EMA (`--ema`), and it returns the batch's loss and
correct-prediction count as device tensors (no host sync). The loop, `--shard-weights auto`'s timing,
`trainlab profile` and the benchmarks all run this one step, so what they time is what trains. As in
torchtitan, where `forward_backward_step` is the seam its CUDA-graph wrapper wraps, a speed-up is a
mode here, not another copy of the loop body:

- `eager`: the step as written, one kernel launch per op.
- `compile`: the model through `torch.compile` (inductor; compile time is paid in `prepare`).
- `cudagraph` (CUDA only): forward, backward and the optimizer step captured once into one CUDA graph
  and replayed: static input buffers (each batch is copied in), a capturable optimizer (the fused
  AdamW/Adam, or `--optimizer muon`: lenet.muon) whose state and learning rate live on the device
  (the scheduler writes the lr tensor in place), and the loss and correct count left in static outputs.
  LeNet-5's step is launch-bound on a GPU, ~100 small kernels; replaying them as one graph measured 5.0x
  faster on an H100 (benchmarks/dp_compile.py).
  The EMA's update (`--ema`) is in the graph too: its decay is computed on the device from a device
  count (`lenet.ema`), so averaging the weights adds no launch of its own per step.
  Under OneCycle (the default recipe) the graph holds forward + backward only, and the fused AdamW
  step and the EMA run after each replay as in eager mode (`LeNetPlan.optimizer_in_graph`: OneCycle's
  beta1 is a host float the fused kernel takes as an argument), their host work overlapping the replay.
  Only batches of the captured shape replay the graph: a shorter last batch runs the same step
  eagerly (same optimizer, same lr tensor), so every image is trained on and the result is the eager
  run's; dropping it would change the recipe, padding it would change the loss.

The seed-style loop in benchmarks/lenet_time_to_99.py does not use this: it is the baseline, the
handout's loop as students write it, and must stay independent of what it is compared against.
"""

from __future__ import annotations

import copy
import time
from contextlib import contextmanager, nullcontext

import torch
import torch.nn.functional as F
from torch.profiler import record_function

from trainlab.device import synchronize
from trainlab.distributed.wrappers import unwrap
from trainlab.errors import ConfigError
from trainlab.lenet.ema import EMA
from trainlab.lenet.plan import LeNetPlan
from trainlab.lenet.setup import autocast

GRAPH_WARMUP_STEPS = 3  # eager steps on a side stream before capture (PyTorch's recipe: lazy state, cuBLAS/cuDNN plans)


class Step:
    """Call `step(x, y)` → (loss, correct) device tensors; `prepare(x, y)` first (compiles/captures)."""

    def __init__(
        self,
        plan: LeNetPlan,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        after_backward=None,
        annotate: bool = False,
        ema: EMA | None = None,
    ):
        self.plan, self.mode, self.optimizer = plan, plan.step_mode, optimizer
        self.device, self.precision = plan.torch_device, plan.amp_dtype
        self.module = unwrap(model)  # the parameters and buffers the step changes
        self.model = torch.compile(model, mode=plan.compile_mode) if self.mode == "compile" else model  # what runs
        self.after_backward = after_backward
        self.ema = ema  # moved after every optimizer step, by the step itself (so a graph can hold it)
        self.annotate = annotate  # `trainlab profile`: the loss in its own record_function range
        self.graph: torch.cuda.CUDAGraph | None = None
        # fp16 (a GPU below sm80): the loss is scaled so small gradients survive fp16's range; the
        # scaler unscales them and skips a step whose gradients overflowed (the same on every rank:
        # the gradients it inspects are already reduced). Not with cudagraph (plan: refused there).
        self.scaler = torch.amp.GradScaler(self.device.type) if plan.grad_scaler else None

    # ---- the step ------------------------------------------------------------------------------
    def forward_backward(self, x, y, scale=None, cache: bool = True):
        """The seam (torchtitan's forward_backward_step): autocast forward, loss, backward → (loss, correct)."""
        with autocast(self.device, self.precision, cache):
            logits = self.model(x)
        with record_function("loss") if self.annotate else nullcontext():
            loss = F.cross_entropy(logits.float(), y, label_smoothing=self.plan.label_smoothing)
        # `scale`: this rank's weight under uneven shards, so the averaged gradient is the global batch's
        term = loss if scale is None else loss * scale
        (term if self.scaler is None else self.scaler.scale(term)).backward()
        return loss.detach(), (logits.detach().argmax(1) == y).sum()

    def eager(self, x, y, scale=None):
        """One step, op by op (the eager and compile modes, and a graph's odd-shaped batch)."""
        self.optimizer.zero_grad(set_to_none=True)
        loss, correct = self.forward_backward(x, y, scale)
        if self.after_backward is not None:
            self.after_backward(self.model)  # hand-written all-reduce; DDP/DP reduce inside backward
        if self.scaler is None:
            self.optimizer.step()
        else:  # unscales, and skips the step if a gradient overflowed
            self.scaler.step(self.optimizer)
            self.scaler.update()
        if self.ema is not None:
            self.ema.update()
        return loss, correct

    def __call__(self, x, y, scale=None):
        if self.graph is None or x.shape != self.static_x.shape:
            return self.eager(x, y, scale)
        self.static_x.copy_(x)
        self.static_y.copy_(y)
        self.graph.replay()
        if not self.plan.optimizer_in_graph:
            # the gradients the replay wrote, bound again: an eager (odd-shaped) step set .grad to None
            for p, g in self.graph_grads:
                p.grad = g
            self.optimizer.step()
        if self.ema is not None:  # in the graph it has run already (the host keeps its count)
            self.ema.update(replayed=self.plan.optimizer_in_graph)
        # the next replay overwrites the static outputs: keep this step's (device copies, no sync)
        return self.static_loss.clone(), self.static_correct.clone()

    # ---- before the first step -----------------------------------------------------------------
    @property
    def needs_prepare(self) -> bool:
        return self.mode != "eager" or self.device.type == "cuda"

    def prepare(self, x, y) -> float:
        """Seconds spent getting ready on a real batch, the model and optimizer left exactly as they
        were: cudagraph warms up and captures; compile, and eager on CUDA, run one forward/backward
        (compilation, cuDNN autotuning); eager on a CPU needs nothing."""
        synchronize(self.device)
        t0 = time.perf_counter()
        if self.mode == "cudagraph":
            self._capture(x, y)
        elif self.needs_prepare:
            with self.preserved():
                self.forward_backward(x, y)
        synchronize(self.device)
        return time.perf_counter() - t0

    @contextmanager
    def preserved(self):
        """Run steps inside and leave weights, buffers (BatchNorm statistics), gradients, optimizer state
        and the EMA as they were: for warm-ups and timings that must not change the run. Not for a captured
        step: loading a state dict replaces tensors the graph holds (`_capture` restores in place)."""
        if self.graph is not None:
            raise RuntimeError("Step.preserved() after capture would detach the graph from the optimizer state")
        model_state = copy.deepcopy(self.module.state_dict())
        optimizer_state = copy.deepcopy(self.optimizer.state_dict())
        ema_state = copy.deepcopy(self.ema.state_dict()) if self.ema is not None else None
        try:
            yield
        finally:
            self.module.load_state_dict(model_state)
            self.optimizer.load_state_dict(optimizer_state)
            self.optimizer.zero_grad(set_to_none=True)
            if ema_state is not None:
                self.ema.load_state_dict(ema_state)

    def _capture(self, x, y) -> None:
        """Capture forward + backward (+ the optimizer step if `plan.optimizer_in_graph`) on buffers like (x, y)."""
        self.static_x, self.static_y = x.clone(), y.clone()  # clone keeps x's memory format (channels-last)
        in_graph = self.plan.optimizer_in_graph
        for group in self.optimizer.param_groups if in_graph else ():
            # The graph must read the lr from a device tensor the scheduler fills in place; a float would
            # be frozen into the graph at its capture-time value, and a checkpoint's lr may come back
            # as a float or a CPU tensor.
            if not torch.is_tensor(group["lr"]) or group["lr"].device.type != "cuda":
                group["lr"] = torch.tensor(float(group["lr"]), dtype=torch.float32, device=self.device)
        saved_model = copy.deepcopy(self.module.state_dict())
        saved_ema = copy.deepcopy(self.ema.state_dict()) if self.ema is not None else None
        saved_state = {
            p: {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()}
            for p, s in self.optimizer.state.items()
        }
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the capture stream, as torch.cuda.graph requires
            for _ in range(GRAPH_WARMUP_STEPS):
                self.eager(self.static_x, self.static_y)  # the EMA's kernels too, before the capture
        torch.cuda.current_stream().wait_stream(side)
        # Undo the warm-up IN PLACE: the graph will read and write these very tensors. Optimizer state
        # the warm-up created (a fresh run) goes back to its initial zeros, as if it had never stepped.
        with torch.no_grad():
            self.module.load_state_dict(saved_model)  # copies into the existing parameters and buffers
            if saved_ema is not None:
                self.ema.load_state_dict(saved_ema)  # in place too, its device count included
            for p, state in self.optimizer.state.items():
                for k, v in state.items():
                    if torch.is_tensor(v) and p in saved_state:
                        v.copy_(saved_state[p][k])
                    elif torch.is_tensor(v):
                        v.zero_()
        self.optimizer.zero_grad(set_to_none=True)  # backward inside the graph allocates .grad from its pool
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.static_loss, self.static_correct = self.forward_backward(self.static_x, self.static_y, cache=False)
            if in_graph:
                self.optimizer.step()
                if self.ema is not None:
                    self.ema.advance()
        self.graph_grads = [(p, p.grad) for p in self.module.parameters() if p.grad is not None]


def make_step(
    plan: LeNetPlan,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    after_backward=None,
    annotate: bool = False,
    ema: EMA | None = None,
) -> Step:
    """The training step `plan.step_mode` asks for, over `model` (wrapped or not) and `optimizer`, moving
    `ema` (if any) after each optimizer step."""
    if plan.step_mode == "cudagraph":
        if plan.torch_device.type != "cuda":
            raise ConfigError(f"--step-mode cudagraph: CUDA graphs need a CUDA device, not {plan.device}")
        if plan.grad_scaler:
            raise ConfigError(
                "--step-mode cudagraph: not with fp16 autocast (its GradScaler decides on the host "
                "whether to step); use --step-mode eager or compile"
            )
        if plan.optimizer_in_graph and not optimizer.param_groups[0].get("capturable"):
            raise ConfigError(
                "--step-mode cudagraph: the optimizer must be capturable (build it with "
                "lenet.setup.build_optimizer from the same plan)"
            )
    return Step(plan, model, optimizer, after_backward=after_backward, annotate=annotate, ema=ema)
