"""GELU speed table: every impl next to F.gelu, 1K…64M elements, forward and forward+backward.

    .venv/bin/python benchmarks/gelu_bench.py                 # full sweep, float32, exact GELU
    .venv/bin/python benchmarks/gelu_bench.py --quick         # 1K, 64K, 1M
    .venv/bin/python benchmarks/gelu_bench.py --sizes 16M --threads 1 --tag 16M_t1

Writes benchmarks/results/gelu_bench[_TAG].{json,md,log} (atomically): the exact command, machine,
versions, and the table. Target recorded here, never asserted in tests: cpp forward+backward
<= 1.2x F.gelu at 16M float32 on the CPU; GPU kernels >= 85 % of copy bandwidth at 64M.
"""

from __future__ import annotations

import argparse
import sys

import torch

from _common import add_output_args, check_output
from trainlab.device import resolve_device
from trainlab.ops.bench import DEFAULT_SIZES, QUICK_SIZES, format_table, parse_size, run_bench, write_bench_results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", help="comma-separated, e.g. 1K,1M,16M")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--impl", action="append")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--approximate", default="none")
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--budget", type=float, default=0.5, help="seconds of timed runs per impl and size")
    p.add_argument("--tag", default="", help="suffix for the result files")
    add_output_args(p)
    args = p.parse_args(argv)
    stem = "gelu_bench" + (f"_{args.tag}" if args.tag else "")
    check_output(args.out, stem, force=args.force)
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = [parse_size(s) for s in args.sizes.split(",")] if args.sizes else (QUICK_SIZES if args.quick else DEFAULT_SIZES)
    result = run_bench(sizes=sizes, impls=args.impl, dtype=args.dtype, approximate=args.approximate,
                       device=resolve_device(args.device), budget_s=args.budget,
                       progress=lambda r: print(f"  {r['size']:>9} {r['impl']:<7}{r['pass']:<8} "
                                                f"{r['median_s'] * 1e3:9.3f} ms  x{r['ratio_to_torch']:.2f}", flush=True))
    table = format_table(result)
    print(table)
    paths = write_bench_results(args.out, result, table, command="python " + " ".join(["benchmarks/gelu_bench.py"] + sys.argv[1:]), stem=stem)
    print("wrote", ", ".join(paths.values()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
