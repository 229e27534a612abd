"""`trainlab gelu check|bench`: flags into the command's config (ops.config), then ops.check / ops.bench."""

from __future__ import annotations

import json
import sys

from trainlab.device import resolve_device
from trainlab.errors import ConfigError
from trainlab.flags import add_command, explicit_values
from trainlab.ops.bench import run_bench, write_bench_results
from trainlab.ops.bench import format_table as format_bench_table
from trainlab.ops.check import format_table as format_check_table
from trainlab.ops.check import run_check
from trainlab.ops.config import BenchConfig, CheckConfig
from trainlab.ops.gelu import APPROXIMATIONS, IMPLS


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("gelu", help="verify and benchmark the GELU implementations")
    sub = p.add_subparsers(dest="gelu_command", metavar="{check,bench}")
    sub.required = True

    add_command(sub, "check", "error table vs a float64 reference, gradcheck, opcheck, edge cases", CheckConfig,
                run_check_cmd)
    add_command(sub, "bench", "forward and forward+backward timing vs F.gelu", BenchConfig, run_bench_cmd)


def _validated_impls(names):
    for name in names or []:
        if name not in IMPLS:
            raise ConfigError(f"--impl {name!r}: unknown implementation; choose one of {', '.join(IMPLS)}")
    return names


def run_check_cmd(args) -> int:
    cc = CheckConfig(**explicit_values(args, CheckConfig))
    cc.validate()
    impls = _validated_impls(cc.impl) or IMPLS
    progress = None if cc.json else (lambda r: print(
        f"  {r['impl']:<7}{r['approximate']:<6}{r['dtype']:<9} {'skipped' if r['skipped'] else ('ok' if r['ok'] else 'FAIL')}",
        file=sys.stderr, flush=True))
    result = run_check(impls=impls, approximations=cc.approximate or APPROXIMATIONS,
                       dtypes=cc.dtype or ("float32", "float64", "bfloat16"), n=cc.n, progress=progress)
    print(json.dumps(result, indent=2) if cc.json else format_check_table(result))
    return 0 if result["ok"] else 1


def run_bench_cmd(args) -> int:
    bc = BenchConfig(**explicit_values(args, BenchConfig))
    sizes = bc.validate()
    device = resolve_device(bc.device)
    progress = None if bc.json else (lambda r: print(
        f"  {r['size']:>9} {r['impl']:<7}{r['pass']:<8} {r['median_s'] * 1e3:9.3f} ms", file=sys.stderr, flush=True))
    result = run_bench(sizes=sizes, impls=_validated_impls(bc.impl), dtype=bc.dtype, approximate=bc.approximate,
                       device=device, budget_s=0.1 if bc.quick else bc.budget, progress=progress)
    table = format_bench_table(result)
    if bc.out:
        write_bench_results(bc.out, result, table, command=args.command_line)
    print(json.dumps(result, indent=2) if bc.json else table)
    return 0
