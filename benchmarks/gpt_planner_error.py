"""Planner prediction vs measured peak memory of one training step, per strategy and micro-batch.

CPU: the peak of live tensor bytes, tracked at every ATen op (exact, no allocator rounding).
CUDA: torch.cuda.max_memory_allocated over the second step (the first creates optimizer states).
Single-process strategies only (the engine runs in this process), all on ONE build of the model
(`GPTEngine(plan, model=...)`): a 1.6B build costs more than a step. Results are written after every
row, so a killed run keeps what it measured; `trainlab lab` runs it last. Each row is one `GPTPlan`
resolved on this machine (device type, compute capability, cuDNN: the SDPA kernel PyTorch runs there),
which the engine runs and the planner predicts (`predict_plan`, the one translation); `--attention math`
forces SDPA's math path (torch.nn.attention.sdpa_kernel) in the measurement and the prediction: on
CPU this validates the s×s-scores term that fp32 with head width 50 needs on a GPU.

    python benchmarks/gpt_planner_error.py --out /tmp/r          # tiny model on CPU
    python benchmarks/gpt_planner_error.py --attention math --name gpt_planner_error_cpu_tiny_math
    python benchmarks/gpt_planner_error.py --model gpt2-1.6b --device cuda --strategies none,amp+ckpt \
        --micro-batches 1,4,8 --name gpt_planner_error_1.6b_h100
    python benchmarks/gpt_planner_error.py --model gpt2-1.6b --device cuda --strategies amp,amp+ckpt --fused \
        --micro-batches 8,16 --vocab-multiple 64 --fused-qkv --loss chunked --name gpt_planner_error_levers_h100
"""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dataclasses import replace  # noqa: E402

from _common import add_output_args, check_output, save  # noqa: E402

from trainlab.distributed.launch import DistInfo  # noqa: E402
from trainlab.gpt.attention_backend import AttentionChoice  # noqa: E402
from trainlab.gpt.config import GPTBenchConfig  # noqa: E402
from trainlab.gpt.engine import GPTEngine  # noqa: E402
from trainlab.gpt.model import build_gpt
from trainlab.gpt.plan import Machine  # noqa: E402
from trainlab.gpt.planner import measure_step_peak_bytes, predict_plan  # noqa: E402
from trainlab.gpt.shape import get_preset

MiB = 1024**2


def measure(model, plan, device, attention):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if attention == "math":
        with sdpa_kernel([SDPBackend.MATH]):
            return measure(model, plan, device, "auto")
    torch.manual_seed(0)
    b, seq = plan.global_batch, plan.seq
    tokens = torch.randint(plan.model.vocab_size, (b, seq))
    eng = GPTEngine(plan, DistInfo(device=device), model=model)
    try:
        if device.type == "cuda":
            eng.train_step(tokens)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            eng.train_step(tokens)
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
        return measure_step_peak_bytes(eng, tokens), None
    finally:
        del eng
        model.zero_grad(set_to_none=True)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--strategies", default="none,amp,ckpt,ckpt-selective,amp+ckpt")
    ap.add_argument("--micro-batches", default="4,16")
    ap.add_argument("--seq", type=int, default=None)
    ap.add_argument("--fused", action="store_true", help="fused AdamW (GPU)")
    ap.add_argument("--name", default="gpt_planner_error_cpu_tiny")
    ap.add_argument("--vocab-multiple", type=int, default=1, help="issue 30's levers, as gpt bench's flags")
    ap.add_argument("--fused-qkv", action="store_true")
    ap.add_argument("--loss", default="cross_entropy", choices=("cross_entropy", "chunked"))
    ap.add_argument(
        "--attention",
        default="auto",
        choices=("auto", "math"),
        help="auto: the kernel PyTorch picks; math: force SDPA's math path (measured and predicted)",
    )
    add_output_args(ap)
    args = ap.parse_args()
    check_output(args.out, args.name, force=args.force)

    cfg = replace(get_preset(args.model), vocab_multiple=args.vocab_multiple, fused_qkv=args.fused_qkv)
    seq = args.seq or cfg.n_positions
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", 0)
    machine = Machine.detect()
    model = build_gpt(cfg, seed=0, device=device)  # once, on the device, for every strategy
    rows, log, optimizer = [], [], "-"  # the plans' AdamW kernel, for the table's heading
    head = f"{'strategy':<20}{'micro':>6}{'predicted MiB':>15}{'measured MiB':>14}{'error':>8}  phases (MiB)"
    print(head)
    log.append(head)
    for strategy in args.strategies.split(","):
        for b in map(int, args.micro_batches.split(",")):
            plan = GPTBenchConfig(
                model=args.model,
                strategy=strategy,
                device=device.type,
                global_batch=b,
                micro_batch=b,
                seq=seq,
                fused_optimizer=args.fused,
                vocab_multiple=args.vocab_multiple,
                fused_qkv=args.fused_qkv,
                loss=args.loss,
            ).plan(machine)
            if args.attention == "math":
                plan = replace(plan, attention=AttentionChoice("math", cfg.head_dim, cfg.head_dim, True, "forced"))
            optimizer = plan.optimizer_kernel
            pred = predict_plan(plan)
            try:
                measured, reserved = measure(model, plan, device, args.attention)
                err = pred["total_bytes"] / measured - 1
            except torch.OutOfMemoryError:
                measured, reserved, err = None, None, None
            row = {
                "strategy": strategy,
                "micro_batch": b,
                "seq": seq,
                "predicted_bytes": pred["total_bytes"],
                "measured_bytes": measured,
                "measured_reserved_bytes": reserved,
                "relative_error": err,
                "phases": pred["phase_bytes"],
                "attention": pred["attention"]["label"],
            }
            rows.append(row)
            phases = " ".join(f"{k}={v / MiB:.1f}" for k, v in pred["phase_bytes"].items())
            line = (
                f"{strategy:<20}{b:>6}{pred['total_bytes'] / MiB:>15.2f}"
                f"{'OOM' if measured is None else f'{measured / MiB:.2f}':>14}"
                f"{'-' if err is None else f'{100 * err:+.1f}%':>8}  {phases}  [{pred['attention']['label']}]"
            )
            print(line, flush=True)
            log.append(line)
            write(args, rows, log, seq, device, optimizer, final=False)  # as it goes: a kill loses one row
    write(args, rows, log, seq, device, optimizer, final=True)


def write(args, rows, log, seq, device, optimizer, final: bool) -> None:
    errs = [abs(r["relative_error"]) for r in rows if r["relative_error"] is not None]
    summary = (
        f"max |error| {100 * max(errs):.1f}%, mean |error| {100 * sum(errs) / len(errs):.1f}% over {len(errs)} runs"
        if errs
        else "no measurement yet"
    )
    if not final:
        summary += " (so far: the run is still going)"
    else:
        print(summary)
        log = log + [summary]
    kind = "torch.cuda.max_memory_allocated" if device.type == "cuda" else "peak live tensor bytes (TorchDispatchMode)"
    md = [
        f"Model {args.model}, seq {seq}, device {device}, AdamW {optimizer}, attention {args.attention}. "
        f"Measured: {kind}, second step.",
        "",
        "| strategy | micro-batch | attention (SDPA kernel) | predicted MiB | measured MiB | error |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        m = "OOM" if r["measured_bytes"] is None else f"{r['measured_bytes'] / MiB:.2f}"
        e = "-" if r["relative_error"] is None else f"{100 * r['relative_error']:+.1f}%"
        md.append(
            f"| {r['strategy']} | {r['micro_batch']} | {r['attention']} | {r['predicted_bytes'] / MiB:.2f} | {m} | {e} |"
        )
    md += ["", summary]
    save(args.name, rows, "\n".join(md), log, device=device, out=args.out)


if __name__ == "__main__":
    main()
