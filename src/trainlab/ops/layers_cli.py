"""`trainlab ops check|bench`: flags into the command's config (ops.layers_config), then the library.

`ops check` also runs the GELU check (ops.check, unchanged) unless --no-gelu, so one command covers
every operator trainlab writes by hand; `trainlab gelu check|bench` keep working as before.
"""

from __future__ import annotations

import json
import sys

import torch

from trainlab.device import resolve_device
from trainlab.flags import add_command, explicit_values
from trainlab.ops import check as gelu_check
from trainlab.ops.layers_bench import run_layer_bench, write_bench_results
from trainlab.ops.layers_bench import format_table as format_bench_table
from trainlab.ops.layers_check import run_layer_check
from trainlab.ops.layers_check import format_table as format_check_table
from trainlab.ops.layers_config import OpsBenchConfig, OpsCheckConfig
from trainlab.telemetry.env import collect_env, format_header
from trainlab.telemetry.results import write_results


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("ops", help="our conv2d / max_pool2d / linear / relu operators: check and benchmark vs ATen")
    sub = p.add_subparsers(dest="ops_command", metavar="{check,bench}")
    sub.required = True
    add_command(sub, "check", "every implementation against ATen in float64: errors, gradcheck, opcheck, edge values "
                "(then the GELU check)", OpsCheckConfig, run_check_cmd)
    add_command(sub, "bench", "forward and backward time of each LeNet-5 layer per implementation vs ATen",
                OpsBenchConfig, run_bench_cmd)


def run_check_cmd(args) -> int:
    cc = OpsCheckConfig(**explicit_values(args, OpsCheckConfig))
    cc.validate()
    kwargs = {k: v for k, v in (("ops", cc.op), ("impls", cc.impl), ("dtypes", cc.dtype)) if v}
    progress = None if cc.json else (lambda r: print(
        f"  {r['op']:<10} {r['case']:<17} {r['impl']:<7} {r['dtype']:<9} "
        f"{'skipped' if r['skipped'] else ('ok' if r['ok'] else 'FAIL')}", file=sys.stderr, flush=True))
    result = run_layer_check(cases=cc.case, batch=cc.batch, progress=progress, **kwargs)
    table = format_check_table(result)
    gelu = None
    if cc.gelu:
        gelu = gelu_check.run_check()
        table += "\n\nGELU (trainlab gelu check):\n" + gelu_check.format_table(gelu)
    if cc.out:
        env = collect_env("cpu")
        text = f"{format_header({'command': args.command_line}, env)}\n\n{table}"
        write_results(cc.out, "ops_check", {**result, "gelu": gelu}, f"# Operator check\n\n```\n{text}\n```", [text],
                      args.command_line, env=env)
    print(json.dumps({**result, "gelu": gelu}, indent=2) if cc.json else table)
    return 0 if result["ok"] and (gelu is None or gelu["ok"]) else 1


def run_bench_cmd(args) -> int:
    explicit = explicit_values(args, OpsBenchConfig)
    bc = OpsBenchConfig(**explicit)
    bc.validate()
    batches = bc.batches(explicit_batch="batch" in explicit)
    if bc.threads is not None:
        torch.set_num_threads(bc.threads)
    device = resolve_device(bc.device)
    progress = None if bc.json else (lambda r: print(
        f"  {r['batch']:>5} {r['layer']:<6} {r['impl']:<11} fwd {r['fwd_median_s'] * 1e3:9.3f} ms  "
        f"bwd {r['bwd_median_s'] * 1e3:9.3f} ms", file=sys.stderr, flush=True))
    result = run_layer_bench(batches=batches, impls=bc.impl, layers=bc.layer, device=device,
                             budget_s=0.1 if bc.quick else bc.budget, min_runs=3 if bc.quick else 5, progress=progress)
    table = format_bench_table(result)
    if bc.out:
        write_bench_results(bc.out, result, table, command=args.command_line)
    print(json.dumps(result, indent=2) if bc.json else table)
    return 0
