"""Full LeNet-5 training run per GELU implementation; test accuracy side by side.

    .venv/bin/python benchmarks/gelu_lenet_accuracy.py --epochs 10
    .venv/bin/python benchmarks/gelu_lenet_accuracy.py --acts gelu-torch,gelu-cpp --epochs 1 --device cpu

Runs `trainlab train --act ACT --epochs N --out RUNS/ACT --device DEVICE` (RUNS: --runs, default runs/gelu_acc) for each
activation (gelu-triton only with a GPU unless --allow-interpreter, which sets TRITON_INTERPRET=1 —
very slow; gelu-cuda only with a GPU), reads each run's summary.json, and writes
<--out>/gelu_lenet_accuracy.{json,md,log} (default benchmarks/results; existing files need --force).
The "accuracy per impl" table of docs/results.md comes from here.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
from _common import add_output_args, check_output

from trainlab.results.kinds import plan_record
from trainlab.telemetry.env import collect_env, format_header
from trainlab.telemetry.results import write_results

ROOT = Path(__file__).resolve().parent.parent
ALL_ACTS = ["gelu-torch", "gelu-python", "gelu-cpp", "gelu-triton", "gelu-cuda"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--acts", default=",".join(ALL_ACTS))
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--device", default="auto")
    p.add_argument("--runs", default=str(ROOT / "runs" / "gelu_acc"), help="parent of the run directories")
    p.add_argument("--allow-interpreter", action="store_true", help="run gelu-triton on CPU under TRITON_INTERPRET=1")
    p.add_argument("--extra", default="", help="extra arguments passed to `trainlab train`, e.g. '--seed 0'")
    add_output_args(p)
    args = p.parse_args(argv)
    check_output(args.out, "gelu_lenet_accuracy", force=args.force)

    gpu = torch.cuda.is_available()
    rows = []
    for act in [a.strip() for a in args.acts.split(",") if a.strip()]:
        env = dict(os.environ)
        if act == "gelu-cuda" and not gpu:
            rows.append({"act": act, "status": "skipped", "reason": "no CUDA GPU"})
            continue
        if act == "gelu-triton" and not gpu:
            if not args.allow_interpreter:
                rows.append(
                    {"act": act, "status": "skipped", "reason": "no GPU (pass --allow-interpreter to run interpreted)"}
                )
                continue
            env["TRITON_INTERPRET"] = "1"
        out = Path(args.runs) / act
        cmd = [
            sys.executable,
            "-m",
            "trainlab",
            "train",
            "--act",
            act,
            "--epochs",
            str(args.epochs),
            "--out",
            str(out),
            "--overwrite",
            "--device",
            args.device,
            *args.extra.split(),
        ]  # its own runs, redone
        print("$", " ".join(cmd), flush=True)
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env=env)
        seconds = time.perf_counter() - t0
        row = {"act": act, "command": " ".join(cmd), "returncode": proc.returncode, "seconds": round(seconds, 1)}
        summary_path = out / "summary.json"
        if proc.returncode == 0 and summary_path.exists():
            summary = json.loads(summary_path.read_text())
            row.update(
                status="ok",
                accuracy=summary["test_accuracy"],
                test_loss=summary["test_loss"],
                train_seconds=summary["train_seconds"],
            )
        else:
            row.update(status="failed")
        rows.append(row)

    lines = [f"{'act':<12} {'status':<8} {'accuracy':>9} {'seconds':>8}"]
    for r in rows:
        acc = r.get("accuracy")
        lines.append(f"{r['act']:<12} {r['status']:<8} {acc if acc is not None else '-':>9} {r.get('seconds', '-'):>8}")
    table = "\n".join(lines)
    print(table)
    env_info = collect_env(args.device)
    command = "python " + " ".join(["benchmarks/gelu_lenet_accuracy.py"] + (argv if argv is not None else sys.argv[1:]))
    header = format_header({"command": command, "epochs": args.epochs, "device": args.device}, env_info)
    write_results(
        args.out,
        "gelu_lenet_accuracy",
        rows,
        f"# LeNet-5 accuracy per GELU implementation\n\n```\n{header}\n\n{table}\n```",
        [header, "", table],
        command,
        kind="benchmark",
        plan=plan_record(str(args.device), model={"name": "lenet5"}, dataset={"name": "mnist"}),
        env=env_info,
    )
    return 0 if all(r["status"] in ("ok", "skipped") for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
