"""`trainlab ops check|bench --op <operators of ops/registry.py>`: flags into the command's config
(ops.config), then ops.check / ops.bench. `trainlab gelu check|bench` is the same command with the
operator fixed to gelu (and only GELU's flags): it runs through the same two functions below.
"""

from __future__ import annotations

import json
import sys

from trainlab.errors import ConfigError, HardwareError
from trainlab.flags import add_command, explicit_values
from trainlab.ops import registry
from trainlab.ops.config import BenchConfig, CheckConfig, OpsBenchConfig, OpsCheckConfig
from trainlab.results.kinds import plan_record, stamp


def add_ops(p) -> None:
    p.description = f"Our operators ({', '.join(registry.OPS)}): check and benchmark every rung vs aten."
    sub = p.add_subparsers(dest="ops_command", metavar="{check,bench}")
    sub.required = True
    add_command(
        sub,
        "check",
        "every rung against a float64 reference: errors, gradcheck, opcheck, edge values",
        OpsCheckConfig,
        run_check_cmd,
    )
    add_command(
        sub,
        "bench",
        "forward and backward time of each rung vs aten: LeNet-5's layers, GELU over sizes",
        OpsBenchConfig,
        run_bench_cmd,
    )


def add_gelu(p) -> None:
    sub = p.add_subparsers(dest="gelu_command", metavar="{check,bench}")
    sub.required = True
    add_command(
        sub, "check", "error table vs a float64 reference, gradcheck, opcheck, edge cases", CheckConfig, run_check_cmd
    )
    add_command(sub, "bench", "forward and forward+backward timing vs F.gelu", BenchConfig, run_bench_cmd)


def _progress(r: dict) -> None:
    status = r["status"] if r["status"] != "skipped" else f"skipped ({r['reason']})"
    print(f"  {r['op']:<10} {r['case']:<17} {r['impl']:<7} {r['dtype']:<9} {status}", file=sys.stderr, flush=True)


def nothing_ran(rows: list[dict], what: str, hint: str) -> None:
    """A command that measured or checked nothing must not pass: HardwareError (one line) naming why
    when every requested row was skipped (also when none was produced)."""
    if all(r["skipped"] for r in rows):
        why = "; ".join(sorted({f"{r['impl']}: {r['reason']}" for r in rows})) or "no row matched the selection"
        raise HardwareError(f"nothing was {what}: every requested row was skipped ({why}); {hint}")


def run_check_cmd(args) -> int:
    import torch

    from trainlab.ops import check
    from trainlab.telemetry.env import collect_env, format_header
    from trainlab.telemetry.results import write_results

    alias = args.command == "gelu"  # `trainlab gelu check`: `ops check --op gelu` with GELU's flags
    cls = CheckConfig if alias else OpsCheckConfig
    cc = cls(**explicit_values(args, cls))
    ops = ["gelu"] if alias else cc.validate()
    if alias:
        cc.validate()
    result = check.run_check(
        ops=ops,
        impls=cc.impl or check.IMPLS,
        dtypes=cc.dtype,
        cases=getattr(cc, "case", None),
        variants=cc.approximate,
        n=cc.n,
        batch=getattr(cc, "batch", 8),
        progress=None if cc.json else _progress,
    )
    table = check.format_table(result)
    kind = "gelu_check" if list(ops) == ["gelu"] else "ops_check"
    if getattr(cc, "out", None) or cc.json:  # a result written or printed carries its record (results.kinds)
        env = collect_env("cpu")
        plan = plan_record(
            "cpu" if not env["gpus"] else "cpu+cuda",
            device_name=", ".join([env["cpu"], *env["gpus"]]),
            precision=",".join(cc.dtype) if cc.dtype else "each operator's dtypes",
            threads=torch.get_num_threads(),
            resolved={"ops": list(ops), "impls": list(cc.impl or check.IMPLS), "n": cc.n},
        )
    if getattr(cc, "out", None):
        text = f"{format_header({'command': args.command_line}, env)}\n\n{table}"
        write_results(
            cc.out,
            "ops_check",
            result,
            f"# Operator check\n\n```\n{text}\n```",
            [text],
            args.command_line,
            kind=kind,
            plan=plan,
            env=env,
        )
    print(json.dumps(stamp(kind, result, plan), indent=2) if cc.json else table)
    # the case rows are what was asked for (the autograd table is float64 whatever --dtype says)
    nothing_ran(
        result["rows"], "checked", "ask for rungs and dtypes that can run here, e.g. --impl cpp --dtype float32"
    )
    return 0 if result["ok"] else 1


def run_bench_cmd(args) -> int:
    import torch

    from trainlab.device import resolve_device
    from trainlab.ops import bench

    alias = args.command == "gelu"
    cls = BenchConfig if alias else OpsBenchConfig
    explicit = explicit_values(args, cls)
    bc = cls(**explicit)
    sizes = bc.validate()
    ops = ["gelu"] if alias else bc.operators()
    if getattr(bc, "threads", None) is not None:
        torch.set_num_threads(bc.threads)
    device = resolve_device(bc.device)
    if device.type == "cpu" and getattr(bc, "threads", None) is None:
        # one thread per timing process on a CPU: a shared OpenMP pool stalls small ops (F.gelu on 1K
        # elements took 15.9 ms with 2 threads, 0.012 ms with 1), and that stall would read as a speed-up
        torch.set_num_threads(1)
    quiet = bc.json
    results, tables = {}, []
    layer_ops = [op for op in ops if registry.module(op).BENCH]
    chosen_layers = getattr(bc, "layer", None)  # the alias `gelu bench` has no --layer, --batch, --threads
    if chosen_layers:
        unknown = sorted(set(chosen_layers) - set(bench.LAYER_NAMES))
        if unknown:
            raise ConfigError(f"--layer {unknown[0]!r}: choose from {', '.join(bench.LAYER_NAMES)}")
        theirs = {op: [layer.name for layer in bench.LAYERS if layer.op == op] for op in layer_ops}
        if not any(name in chosen_layers for names in theirs.values() for name in names):
            have = (
                "; ".join(f"{op}: {', '.join(names)}" for op, names in theirs.items())
                or "none (gelu is timed over sizes)"
            )
            raise ConfigError(f"--layer {','.join(chosen_layers)}: not a layer of the chosen operators ({have})")
    batches = bc.batches(explicit_batch="batch" in explicit) if layer_ops else []
    asked = [i for i in bc.impl or [] if i != "aten"]  # aten is always timed: the baseline
    if asked and device.type != "cuda" and all(i in ("cuda", "cuda-atomic") for i in asked):  # before timing aten
        nothing_ran(
            [{"impl": i, "skipped": True, "reason": f"runs on a CUDA GPU, the device is {device}"} for i in asked],
            "timed",
            "ask for rungs that run here, e.g. --impl cpp on a CPU",
        )
    if layer_ops:
        layers = [
            layer.name
            for layer in bench.LAYERS
            if layer.op in layer_ops and (not chosen_layers or layer.name in chosen_layers)
        ]
        result = bench.run_layer_bench(
            batches=batches,
            impls=bc.impl,
            layers=layers,
            device=device,
            budget_s=0.1 if bc.quick else bc.budget,
            min_runs=3 if bc.quick else 5,
            progress=None
            if quiet
            else (
                lambda r: print(
                    f"  {r['batch']:>5} {r['layer']:<6} {r['impl']:<11} fwd {r['fwd_median_s'] * 1e3:9.3f} ms  "
                    f"bwd {r['bwd_median_s'] * 1e3:9.3f} ms",
                    file=sys.stderr,
                    flush=True,
                )
            ),
        )
        results["layers"] = (result, bench.format_layer_table(result), "ops_bench")
    if "gelu" in ops:
        result = bench.run_gelu_bench(
            sizes=sizes,
            impls=[i for i in bc.impl or [] if i != "cuda-atomic"] or None,
            dtype=bc.dtype,
            approximate=bc.approximate,
            device=device,
            budget_s=0.1 if bc.quick else bc.budget,
            progress=None
            if quiet
            else (
                lambda r: print(
                    f"  {r['size']:>9} {r['impl']:<7}{r['pass']:<8} {r['median_s'] * 1e3:9.3f} ms",
                    file=sys.stderr,
                    flush=True,
                )
            ),
        )
        results["gelu"] = (result, bench.format_gelu_table(result), "gelu_bench")
    for result, table, stem in results.values():
        if bc.out:
            bench.write_bench_results(bc.out, result, table, command=args.command_line, stem=stem)
        tables.append(table)
    if quiet:
        # stamped as the files under --out are (results.kinds): `trainlab report` reads the copy too
        docs = {k: stamp(stem, r, bench.bench_plan(r, args.command_line)) for k, (r, _, stem) in results.items()}
        print(json.dumps(next(iter(docs.values())) if len(docs) == 1 else docs, indent=2))
    else:
        print("\n\n".join(tables))
    # what was asked for is the rungs besides aten (or aten alone): at least one of them must have been timed
    rows = [
        {"impl": r["impl"], "skipped": False, "reason": None}
        for result, _, _ in results.values()
        for r in result["rows"]
        if not asked or r["impl"] in asked
    ]
    skipped = [
        {"impl": i, "skipped": True, "reason": why}
        for result, _, _ in results.values()
        for i, why in result["skipped"].items()
        if not asked or i in asked
    ]
    nothing_ran(rows + skipped, "timed", "ask for rungs that run here, e.g. --impl cpp on a CPU")
    return 0
