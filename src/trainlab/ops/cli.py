"""`trainlab gelu check|bench`: parse arguments, call trainlab.ops.check / trainlab.ops.bench."""

from __future__ import annotations

import json
import sys


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("gelu", help="verify and benchmark the GELU implementations")
    sub = p.add_subparsers(dest="gelu_command", metavar="{check,bench}")
    sub.required = True

    c = sub.add_parser("check", help="error table vs a float64 reference, gradcheck, opcheck, edge cases")
    c.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    c.add_argument("--impl", action="append", help="only these impls (repeatable; default: all)")
    c.add_argument("--approximate", action="append", choices=["none", "tanh"], help="only these (repeatable)")
    c.add_argument("--dtype", action="append", choices=["float32", "float64", "bfloat16"], help="only these (repeatable)")
    c.add_argument("--n", type=int, default=4096, help="random elements per row besides the edge values")
    c.set_defaults(func=run_check_cmd)

    b = sub.add_parser("bench", help="forward and forward+backward timing vs F.gelu")
    b.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    b.add_argument("--sizes", help="comma-separated element counts, e.g. 1K,1M,16M (default 1K…64M)")
    b.add_argument("--quick", action="store_true", help="sizes 1K,64K,1M and a short time budget")
    b.add_argument("--impl", action="append", help="only these impls (repeatable; torch is always included)")
    b.add_argument("--dtype", default="float32", help="float32 | bfloat16 | float64")
    b.add_argument("--approximate", default="none", help="none | tanh")
    b.add_argument("--device", default="auto", help="auto | cpu | cuda")
    b.add_argument("--budget", type=float, default=0.5, help="seconds of timed runs per measurement (min 5 runs)")
    b.add_argument("--out", help="also write gelu_bench.json/.md/.log into this directory")
    b.set_defaults(func=run_bench_cmd)


def _validated_impls(names):
    from trainlab.errors import ConfigError
    from trainlab.ops.gelu import IMPLS

    for name in names or []:
        if name not in IMPLS:
            raise ConfigError(f"--impl {name!r}: unknown implementation; choose one of {', '.join(IMPLS)}")
    return names


def run_check_cmd(args) -> int:
    from trainlab.ops.check import format_table, run_check
    from trainlab.ops.gelu import APPROXIMATIONS, IMPLS

    impls = _validated_impls(args.impl) or IMPLS
    progress = None if args.json else (lambda r: print(
        f"  {r['impl']:<7}{r['approximate']:<6}{r['dtype']:<9} {'skipped' if r['skipped'] else ('ok' if r['ok'] else 'FAIL')}",
        file=sys.stderr, flush=True))
    result = run_check(impls=impls, approximations=args.approximate or APPROXIMATIONS,
                       dtypes=args.dtype or ("float32", "float64", "bfloat16"), n=args.n, progress=progress)
    print(json.dumps(result, indent=2) if args.json else format_table(result))
    return 0 if result["ok"] else 1


def run_bench_cmd(args) -> int:
    from trainlab.device import resolve_device
    from trainlab.ops.bench import DEFAULT_SIZES, QUICK_SIZES, format_table, parse_size, run_bench

    sizes = [parse_size(s) for s in args.sizes.split(",")] if args.sizes else (QUICK_SIZES if args.quick else DEFAULT_SIZES)
    device = resolve_device(args.device)
    progress = None if args.json else (lambda r: print(
        f"  {r['size']:>9} {r['impl']:<7}{r['pass']:<8} {r['median_s'] * 1e3:9.3f} ms", file=sys.stderr, flush=True))
    result = run_bench(sizes=sizes, impls=_validated_impls(args.impl), dtype=args.dtype, approximate=args.approximate,
                       device=device, budget_s=0.1 if args.quick else args.budget, progress=progress)
    table = format_table(result)
    if args.out:
        from trainlab.ops.bench import write_results

        write_results(args.out, result, table, command=" ".join(["trainlab"] + sys.argv[1:]))
    print(json.dumps(result, indent=2) if args.json else table)
    return 0
