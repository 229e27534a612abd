"""`trainlab gpt profile`: where one GPT training step's time goes, by kernel category, for any plan (issue 35).

The plan is `gpt bench`'s (the same flags, resolved once); its engine runs `warmup` untimed steps (compile,
allocator), then `steps` steps under `torch.profiler`. Each kernel the step ran is put in one category by
its name (`CATEGORIES`, first match wins): GEMM, attention forward/backward, copies/casts, LayerNorm,
GELU/elementwise, loss, optimizer, other. On a GPU the times are the CUDA kernels' own (device time); on
the CPU they are the ATen operators' self times (the CPU's "kernels"), so the same table, and its tests, run
without a GPU. Beside the table: the device's busy time against the wall time of the profiled steps (the union
of the kernels' intervals; below ~90 % the host is the bottleneck), the SDPA backend the step actually ran
(read from the operators it called), and the GEMM and attention TFLOP/s (hardware FLOPs of `gpt.flops`
over those categories' times).

Single process only: a profile of one rank of a parallel strategy is `gpt bench` territory.
"""

from __future__ import annotations

import re
import time

import torch

from trainlab.errors import ConfigError
from trainlab.gpt.config import ProfileConfig
from trainlab.gpt.flops import attention_flops_per_token, hardware_flops_per_token
from trainlab.gpt.plan import GPTPlan

# (category, pattern over the lower-cased kernel/operator name), first match wins. CUDA names: cuBLAS/cutlass
# GEMMs (sm90_xmma, nvjet, cutlass, gemm), FlashAttention (flash_fwd/bwd), cuDNN's SDPA (cudnn ... fprop/bprop),
# inductor's fused Triton kernels (triton_per/red/poi_fused_<ops>). CPU names: aten::<op>.
CATEGORIES: tuple[tuple[str, str], ...] = (
    ("optimizer", r"adam|_foreach_|multi_tensor|fused_sgd"),
    ("attention bwd", r"(flash|fmha|attention|attn|sdpa|cudnn_generated_fort_native_sdpa).*(bwd|backward|bprop|dgrad)"),
    ("attention fwd", r"flash|fmha|attention|attn|sdpa"),
    ("loss", r"log_softmax|nll_loss|cross_entropy|logsumexp|softmax|_linearcrossentropy"),
    ("LayerNorm", r"layer_norm|layernorm"),
    ("GEMM", r"gemm|xmma|nvjet|cutlass|cublas|aten::(mm|addmm|bmm|matmul|linear|baddbmm)$"),
    # before elementwise: CUDA's copies are elementwise_kernel<direct_copy_kernel…>, inductor's casts triton_*_to_copy
    (
        "copies/casts",
        r"copy|cast|aten::to$|contiguous|clone|aten::cat$|catarray|transpose|permute|fill|zero_|memset|aten::(constant_)?pad",
    ),
    (
        "GELU/elementwise",
        r"gelu|tanh|elementwise|vectorized|triton_|aten::(add|mul|sub|div|pow|exp|neg|where|addcmul|rsub)_?$",
    ),
)
SDPA_BACKENDS = (  # ATen operator (lower case) → the backend SDPA dispatched to
    ("_cudnn_attention_forward", "cudnn"),
    ("_scaled_dot_product_cudnn_attention", "cudnn"),
    ("_flash_attention_forward", "flash"),
    ("_scaled_dot_product_flash_attention_for_cpu", "flash-cpu"),
    ("_scaled_dot_product_flash_attention", "flash"),
    ("_efficient_attention_forward", "efficient"),
    ("_scaled_dot_product_efficient_attention", "efficient"),
    ("_scaled_dot_product_attention_math", "math"),
)
_PATTERNS = [(name, re.compile(p)) for name, p in CATEGORIES]


def category(kernel: str) -> str:
    """The category of a kernel or operator name (`CATEGORIES`), "other" when none matches."""
    low = kernel.lower()
    for name, pattern in _PATTERNS:
        if pattern.search(low):
            return name
    return "other"


def sdpa_backend(op_names) -> str:
    """The SDPA backend a step ran, from the ATen operators it called ("none" without attention)."""
    low = {n.lower() for n in op_names}
    for op, backend in SDPA_BACKENDS:
        if any(op in n for n in low):
            return backend
    return "none"


def _union_us(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals (µs)."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def kernel_table(events, device_type: str) -> tuple[dict[str, float], float, list[str]]:
    """(µs per category, busy µs, operator names) from the profiler's events: CUDA kernels' device time on a
    GPU, ATen operators' self time on the CPU (self: a parent's time without its children's, so nothing is
    counted twice; the autograd engine's own bookkeeping is left out)."""
    per: dict[str, float] = {}
    intervals, names = [], []
    # the optimizer's own operators (the CPU's AdamW is a loop of elementwise ops): inside torch's
    # "Optimizer.step#…" ranges
    steps = [(e.time_range.start, e.time_range.end) for e in events if e.name.startswith("Optimizer.step")]
    for e in events:
        names.append(e.name)
        if device_type == "cuda":
            if e.device_type != torch.autograd.DeviceType.CUDA:
                continue
            dt = e.time_range.elapsed_us()
        else:
            if e.device_type != torch.autograd.DeviceType.CPU or not e.name.startswith("aten::"):
                continue
            dt = e.self_cpu_time_total
        inside_step = any(a <= e.time_range.start and e.time_range.end <= b for a, b in steps)
        cat = "optimizer" if device_type == "cpu" and inside_step else category(e.name)
        per[cat] = per.get(cat, 0.0) + dt
        intervals.append((e.time_range.start, e.time_range.end))
    return per, _union_us(intervals), names


def profile_plan(plan: GPTPlan, steps: int = 2, trace: str | None = None) -> dict:
    """Profile `steps` optimizer steps of `plan` (after its warm-up) in this process → the profile dict."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from trainlab.device import set_tf32
    from trainlab.distributed.launch import DistInfo
    from trainlab.gpt.bench import token_batches
    from trainlab.gpt.engine import GPTEngine

    if plan.world_size != 1:
        raise ConfigError(f"--nproc {plan.world_size}: gpt profile runs one process (profile a rank with gpt bench)")
    set_tf32(plan.tf32)
    device = torch.device("cuda", 0) if plan.device == "cuda" else torch.device("cpu")
    engine = GPTEngine(plan, DistInfo(device=device))
    batches = list(token_batches(plan.model.vocab_size, plan.global_batch, plan.seq, plan.warmup + steps, plan.seed))
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for tokens in batches[: plan.warmup]:
        engine.train_step(tokens)
    sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch_profile(activities=activities) as prof:
        t0 = time.perf_counter()
        for tokens in batches[plan.warmup :]:
            engine.train_step(tokens)  # returns a float: the step ends synchronized
        sync()
        wall_us = (time.perf_counter() - t0) * 1e6
    if trace:
        prof.export_chrome_trace(trace)
    per, busy_us, names = kernel_table(prof.events(), device.type)
    return summarize(plan, per, busy_us, wall_us, steps, sdpa_backend(names))


def summarize(plan: GPTPlan, per_us: dict[str, float], busy_us: float, wall_us: float, steps: int, backend: str):
    """The profile dict: ms per step and share per category, busy/wall, the SDPA backend, GEMM/attention TFLOP/s."""
    cfg = plan.model
    tokens = plan.global_batch * plan.seq
    attn_flops = attention_flops_per_token(cfg, plan.seq) * cfg.n_head * cfg.head_width / cfg.n_embd * tokens
    gemm_flops = hardware_flops_per_token(cfg, plan.seq, plan.checkpointing) * tokens - attn_flops
    total = sum(per_us.values()) or 1.0
    order = [c for c, _ in CATEGORIES] + ["other"]
    rows = [
        {"category": c, "ms_per_step": per_us[c] / 1e3 / steps, "share": per_us[c] / total}
        for c in sorted(per_us, key=order.index)
    ]

    def tflops(flops: float, *cats: str) -> float | None:
        us = sum(per_us.get(c, 0.0) for c in cats) / steps
        return flops / (us * 1e-6) / 1e12 if us else None

    return {
        "kind": "gpt_profile",
        "strategy": plan.strategy.text,
        "device": plan.device,
        "micro_batch": plan.micro_batch,
        "micro_steps": plan.micro_steps,
        "attention_layout": cfg.attention_layout,
        "sdpa_backend": backend,
        "sdpa_backend_planned": plan.attention.backend,
        "steps": steps,
        "wall_ms_per_step": wall_us / 1e3 / steps,
        "busy_ms_per_step": busy_us / 1e3 / steps,
        "busy_fraction": min(1.0, busy_us / wall_us) if wall_us else None,
        "gemm_tflops": tflops(gemm_flops, "GEMM"),
        "attention_tflops": tflops(attn_flops, "attention fwd", "attention bwd"),
        "categories": rows,
        "plan": plan.to_dict(),
    }


def format_profile(p: dict) -> str:
    def num(x, fmt):
        return "n/a" if x is None else format(x, fmt)

    where = "GPU kernels" if p["device"] == "cuda" else "CPU operators (self time)"
    lines = [
        f"gpt profile: {p['strategy']}, micro-batch {p['micro_batch']} x {p['micro_steps']}, "
        f"attention layout {p['attention_layout']}, SDPA ran {p['sdpa_backend']} (planned {p['sdpa_backend_planned']})",
        f"{where}: busy {p['busy_ms_per_step']:.1f} ms of {p['wall_ms_per_step']:.1f} ms wall per step "
        f"({num(p['busy_fraction'] and 100 * p['busy_fraction'], '.0f')} %)",
        f"{'category':<18}{'ms/step':>10}{'share':>8}",
    ]
    lines += [f"{r['category']:<18}{r['ms_per_step']:>10.2f}{100 * r['share']:>7.1f}%" for r in p["categories"]]
    lines.append(
        f"GEMM {num(p['gemm_tflops'], '.3g')} TFLOP/s, attention {num(p['attention_tflops'], '.3g')} TFLOP/s "
        "(hardware FLOPs of gpt.flops over the category's time)"
    )
    return "\n".join(lines)


def profile_command(pc: ProfileConfig, log=print) -> int:
    from trainlab.io import write_json_output

    pc.validate()
    plan = pc.bench.plan()
    result = profile_plan(plan, pc.profile_steps, pc.trace)
    if pc.json:
        write_json_output(pc.json, result)
    if pc.json != "-":
        log(format_profile(result))
    return 0
