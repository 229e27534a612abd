"""`trainlab gpt bench|plan|compare` — parse arguments, call trainlab.bench.gpt_bench / planner / gpt_compare."""

from __future__ import annotations

import argparse

from trainlab.bench.gpt_bench import BenchConfig


def _add_run_args(p: argparse.ArgumentParser, strategy: bool = True) -> None:
    d = BenchConfig()
    p.add_argument("--model", default="gpt2-1.6b", help="preset: gpt2-1.6b, gpt2, gpt2-medium, gpt2-large, gpt2-xl, tiny, tiny-8l")
    if strategy:
        p.add_argument("--strategy", default=d.strategy, help="e.g. none, ddp, zero3+amp+ckpt, tp+pp ('+'-joined)")
    p.add_argument("--nproc", type=int, default=d.nproc, help="processes, one per GPU (relaunches under torchrun)")
    p.add_argument("--steps", type=int, default=d.steps, help="timed steps")
    p.add_argument("--warmup", type=int, default=d.warmup, help="untimed warm-up steps")
    p.add_argument("--global-batch", type=int, default=d.global_batch, help="sequences per optimizer step (same for every strategy)")
    p.add_argument("--micro-batch", type=int, default=d.micro_batch, help="sequences per forward/backward per rank")
    p.add_argument("--seq", type=int, default=None, help="sequence length (default: the model's n_positions)")
    p.add_argument("--device", default=d.device, help="auto, cpu or cuda")
    p.add_argument("--impl", default=d.impl, choices=["ours", "hf"], help="our GPT or HF GPT2LMHeadModel (handout baseline)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (with tp)")
    p.add_argument("--pp", type=int, default=1, help="pipeline stages (with pp)")
    p.add_argument("--pp-schedule", default=d.pp_schedule, help="1f1b or gpipe")
    p.add_argument("--microbatches", type=int, default=None, help="pipeline micro-batches")
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--seed", type=int, default=d.seed, help="weights and tokens")
    p.add_argument("--fused-optimizer", action="store_true", help="AdamW(fused=True)")
    p.add_argument("--track-memory", action="store_true",
                   help="one extra untimed step that counts live tensor bytes (exact peak on CPU)")


def _bench_config(args) -> BenchConfig:
    return BenchConfig(model=args.model, strategy=getattr(args, "strategy", "none"), nproc=args.nproc,
                       steps=args.steps, warmup=args.warmup, global_batch=args.global_batch,
                       micro_batch=args.micro_batch, seq=args.seq, device=args.device, impl=args.impl, tp=args.tp,
                       pp=args.pp, pp_schedule=args.pp_schedule, microbatches=args.microbatches, lr=args.lr,
                       seed=args.seed, fused_optimizer=args.fused_optimizer,
                       track_memory=args.track_memory, json=getattr(args, "json", None),
                       out=getattr(args, "out", None))


def _bench(args) -> int:
    from trainlab.bench.gpt_bench import bench_command

    return bench_command(_bench_config(args))


def _plan(args) -> int:
    import json

    from trainlab.bench.planner import format_plan, parse_bytes, plan
    from trainlab.models.gpt import get_preset

    cfg = get_preset(args.model)
    strategies = [s for s in args.strategies.split(",") if s] if args.strategies else None
    result = plan(cfg, args.gpus, parse_bytes(args.gpu_mem), args.micro_batch, args.seq, strategies,
                  optimizer=args.optimizer, model_name=args.model)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(format_plan(result))
    return 0


def _compare(args) -> int:
    from trainlab.bench.gpt_compare import CompareConfig, run_compare
    from trainlab.errors import ConfigError

    strategies = [s for s in args.strategies.split(",") if s] if args.strategies else None
    if args.timeout <= 0:
        raise ConfigError(f"--timeout {args.timeout}: expected seconds > 0")
    run_compare(CompareConfig(bench=_bench_config(args), strategies=strategies, out=args.out, timeout_s=args.timeout),
                log=lambda *a: print(*a, flush=True))
    return 0


def add_parser(subparsers) -> None:
    gpt = subparsers.add_parser("gpt", help="GPT-2 strategies: run one, predict memory, run a matrix")
    sub = gpt.add_subparsers(dest="gpt_command", metavar="{bench,plan,compare}")
    sub.required = True

    b = sub.add_parser("bench", help="time one strategy (tokens/s, TFLOPS, MFU, peak memory)")
    _add_run_args(b)
    b.add_argument("--json", default=None, help="write the summary JSON here")
    b.add_argument("--out", default=None, help="run directory (config, env, metrics.jsonl, TensorBoard, summary)")
    b.set_defaults(func=_bench)

    p = sub.add_parser("plan", help="predict per-device memory of every strategy")
    p.add_argument("--model", default="gpt2-1.6b")
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--gpu-mem", default="80GiB", help="memory per device, e.g. 80GiB, 40GB")
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=None, help="sequence length (default: the model's n_positions)")
    p.add_argument("--strategies", default=None, help="comma-separated list (default: a matrix for --gpus)")
    p.add_argument("--optimizer", default="foreach", choices=["foreach", "fused", "forloop"],
                   help="AdamW implementation (its temporaries differ)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_plan)

    c = sub.add_parser("compare", help="run a matrix of strategies on the same tokens, one subprocess each")
    _add_run_args(c, strategy=False)
    c.add_argument("--strategies", default=None, help="comma-separated list (default: the handout's list and combos)")
    c.add_argument("--out", default="runs/gpt_compare", help="directory for tables, plots and logs")
    c.add_argument("--timeout", type=float, default=1800.0, help="seconds per strategy")
    c.set_defaults(func=_compare)
