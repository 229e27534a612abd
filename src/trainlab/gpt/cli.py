"""`trainlab gpt bench|plan|compare|ablation|profile`: flags into the command's config (gpt.config), then the library."""

from __future__ import annotations

import argparse

from trainlab.flags import add_command, add_flags, explicit_values
from trainlab.gpt.config import (
    COMPARE_EXCLUDED_BENCH_FLAGS,
    PROFILE_EXCLUDED_BENCH_FLAGS,
    CompareConfig,
    GPTBenchConfig,
    PlanConfig,
    ProfileConfig,
)
from trainlab.io import write_json_output


def _bench(args: argparse.Namespace) -> int:
    from trainlab.gpt.bench import bench_command

    return bench_command(GPTBenchConfig(**explicit_values(args, GPTBenchConfig)))


def _plan(args: argparse.Namespace) -> int:
    from trainlab.gpt.planner import default_strategies, format_plan, parse_bytes, plan
    from trainlab.gpt.shape import get_preset
    from trainlab.hardware import amp_for_sm

    pc = PlanConfig(**explicit_values(args, PlanConfig))
    pc.validate()
    get_preset(pc.model)  # an unknown preset is one error, not one per strategy
    strategies = pc.strategy_list
    if strategies is None and amp_for_sm(pc.sm) == "fp16":
        # no bf16 below sm80: the autocast rows in fp16 (with a GradScaler); pp's schedule has no scaler,
        # so its rows stay fp32
        strategies = list(dict.fromkeys(_fp16_row(s) for s in default_strategies(pc.gpus)))
    result = plan(pc.resolver(), pc.gpus, parse_bytes(pc.gpu_mem), pc.micro_batch, strategies, model_name=pc.model)
    if pc.json:
        from trainlab.gpt.record import gpt_plan_record
        from trainlab.results.kinds import stamp

        plan_rec = gpt_plan_record(
            pc.model,
            "cuda",
            precision="per strategy",
            device_name=f"{pc.gpus} GPU(s) of {pc.gpu_mem} (a prediction: nothing ran)",
            resolved=pc.to_dict(),
        )
        write_json_output(pc.json, stamp("gpt_plan", result, plan_rec))
    if pc.json != "-":
        print(format_plan(result))
    return 0


def _fp16_row(strategy: str) -> str:
    parts = strategy.split("+")
    return (
        "+".join(p for p in parts if p != "amp")
        if "pp" in parts
        else "+".join("fp16" if p == "amp" else p for p in parts)
    )


def _compare(args: argparse.Namespace) -> int:
    from trainlab.gpt.compare import run_compare

    bench = GPTBenchConfig(**explicit_values(args, GPTBenchConfig, exclude=COMPARE_EXCLUDED_BENCH_FLAGS))
    cc = CompareConfig(bench=bench, **explicit_values(args, CompareConfig))
    cc.validate()
    run_compare(cc, log=lambda *a: print(*a, flush=True), command=args.command_line)
    return 0


def _ablation(args: argparse.Namespace) -> int:
    from trainlab.gpt.ablation import ABLATION_EXCLUDED_BENCH_FLAGS, AblationConfig, run_ablation

    bench = GPTBenchConfig(**explicit_values(args, GPTBenchConfig, exclude=ABLATION_EXCLUDED_BENCH_FLAGS))
    ac = AblationConfig(bench=bench, **explicit_values(args, AblationConfig))
    run_ablation(ac, log=lambda *a: print(*a, flush=True), command=args.command_line)
    return 0


def _profile(args: argparse.Namespace) -> int:
    from trainlab.gpt.profile import profile_command

    bench = GPTBenchConfig(**explicit_values(args, GPTBenchConfig, exclude=PROFILE_EXCLUDED_BENCH_FLAGS))
    return profile_command(ProfileConfig(bench=bench, **explicit_values(args, ProfileConfig)))


def add_gpt(gpt: argparse.ArgumentParser) -> None:
    sub = gpt.add_subparsers(dest="gpt_command", metavar="{bench,plan,compare,ablation,profile}")
    sub.required = True

    add_command(sub, "bench", "time one strategy (tokens/s, TFLOPS, MFU, peak memory)", GPTBenchConfig, _bench)
    add_command(sub, "plan", "predict per-device memory of every strategy", PlanConfig, _plan)
    c = add_command(
        sub, "compare", "run a matrix of strategies on the same tokens, one subprocess each", CompareConfig, _compare
    )
    add_flags(c, GPTBenchConfig, exclude=COMPARE_EXCLUDED_BENCH_FLAGS)  # the settings every strategy shares
    from trainlab.gpt.ablation import ABLATION_EXCLUDED_BENCH_FLAGS, AblationConfig

    a = add_command(
        sub,
        "ablation",
        "from the handout's baseline to ours: each change alone and cumulatively, the same tokens per row",
        AblationConfig,
        _ablation,
    )
    add_flags(a, GPTBenchConfig, exclude=ABLATION_EXCLUDED_BENCH_FLAGS)

    p = add_command(
        sub,
        "profile",
        "one step's kernel time by category, busy vs wall, the SDPA backend run",
        ProfileConfig,
        _profile,
    )
    add_flags(p, GPTBenchConfig, exclude=PROFILE_EXCLUDED_BENCH_FLAGS)
