"""`trainlab lab --out DIR [--budget 25m] [--parts lenet,gelu,ops,dp,gpt] [--device …] [--plan]`.

The whole lab in one command: every deliverable of the handout as a step (see `trainlab.lab.steps`),
sized to the hardware found, within a time budget, resumable (run the same command again), with its
report and one archive written after every step (`trainlab.lab.run`).
"""

from __future__ import annotations

import os
import re
import time

from trainlab.errors import ConfigError, UserError
from trainlab.flags import check_value, output_dir
from trainlab.hardware import Machine
from trainlab.lab.machine import detect_hardware, parse_sm
from trainlab.lab.steps import PARTS, SIZES

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(h|m|min|s)?\s*$")


def parse_budget(text: str) -> float:
    """'25m', '9m', '90s', '1.5h', '600' (seconds) → seconds."""
    m = _DURATION.match(str(text))
    if not m:
        raise ConfigError(f"--budget {text!r}: expected a duration such as 25m, 90s or 1h")
    value = float(m.group(1)) * {"h": 3600, "m": 60, "min": 60, "s": 1, None: 1}[m.group(2)]
    if not 0 < value <= 7 * 24 * 3600:
        raise ConfigError(f"--budget {text!r}: expected more than 0 and at most a week")
    return value


def parse_parts(text: str) -> list[str]:
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    bad = [p for p in parts if p not in PARTS]
    if bad or not parts:
        raise ConfigError(f"--parts {text!r}: expected a comma-separated subset of {','.join(PARTS)}")
    return parts


def format_sizes(steps, hw: Machine) -> str:
    """What --plan chose for a GPU machine beside the steps: the GPT rows (the planner's) and the LeNet
    data-parallel scaling runs."""
    from trainlab.lab.plan import format_gpt_plan, plan_gpt

    lines = [format_gpt_plan(plan_gpt(max(1, hw.gpus), hw.memory_bytes or 80 * 2**30, hw.sm or 90))]
    for s in steps:
        if s.part == "dp" and "scaling" in s.sizes:
            lines.append(f"LeNet-5 {s.name}: {s.sizes['modes']} on {s.sizes['ranks']} rank(s), {s.sizes['scaling']}")
    return "\n".join(lines)


def run_lab_command(args) -> int:
    from pathlib import Path

    from trainlab.lab.run import format_plan, load_state, plan, process_age_s, run_lab
    from trainlab.lab.steps import lab_steps

    check_value(args.out, output_dir, "--out")
    budget = parse_budget(args.budget)
    parts = parse_parts(args.parts)
    if args.gpus is not None and args.gpus < 1:
        raise ConfigError(f"--gpus {args.gpus}: expected at least 1")
    if args.peak_tflops is not None and not 0 < args.peak_tflops < 1e6:
        raise ConfigError(f"--peak-tflops {args.peak_tflops}: expected a positive number of TFLOP/s")
    if args.mnist is not None and not Path(args.mnist).is_file():
        raise ConfigError(f"--mnist {args.mnist}: no such file (make one with `trainlab data pack`)")
    hw = detect_hardware(
        args.device, args.device_name, args.gpus, args.peak_tflops, args.gpu_mem, args.plan, parse_sm(args.sm)
    )
    size = args.size or ("full" if hw.kind == "cuda" else "small")
    root = Path(
        os.path.abspath(args.out)
    )  # the steps run from the checkout: a relative --out means the caller's folder
    if args.plan:
        state = load_state(root) if (root / "results.json").exists() else {"steps": {}}
        steps = lab_steps(hw, size)
        print(format_plan(plan(steps, state, budget, parts), hw, size, budget))
        if hw.kind == "cuda":
            print(format_sizes(steps, hw))
        return 0
    state = run_lab(
        root,
        hw,
        size,
        budget,
        parts,
        args.command_line,
        mnist_pack=args.mnist,
        started_at=time.time() - process_age_s(),
    )
    bad = [n for n, s in state["steps"].items() if s.get("status") in ("failed", "timed out")]
    if bad:
        return 1
    if not any(s.get("status") == "ok" for s in state["steps"].values()):  # measured nothing: never "success"
        why = sorted({str(s.get("reason") or s.get("status")) for s in state["steps"].values()})
        raise UserError(
            f"lab {root}: nothing was measured: no step finished ok ({'; '.join(why)[:300] or 'no step selected'})"
        )
    return 0


def add_lab(p) -> None:
    p.description = (
        "Run the lab's deliverables (LeNet-5, GELU, own operators, data parallel, GPT-2) as steps "
        "sized to this machine, within a time budget. Run the same command again to resume: finished "
        "steps are kept, a killed step runs again. After every step: DIR/results.json, "
        "DIR/report/index.html, DIR/lab.tar.gz."
    )
    p.add_argument("--out", required=True, help="lab folder (results.json, steps/, report/, lab.tar.gz, cache/)")
    p.add_argument("--budget", default="25m", help="time for this call, e.g. 25m, 9m, 90s (default: 25m)")
    p.add_argument(
        "--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)} (default: all)"
    )
    p.add_argument("--device", default="auto", help="auto | cpu | cuda (default: auto)")
    p.add_argument(
        "--size",
        choices=SIZES,
        default=None,
        help="tiny (seconds per step, for CI) | small (the CPU hand-in: one 25-minute call on a quiet 2-core CPU) "
        "| full (GPU) (default: by the hardware found)",
    )
    p.add_argument("--plan", action="store_true", help="print the steps, their estimates and what fits; run nothing")
    p.add_argument(
        "--device-name",
        default=None,
        help="with --plan: plan for this CUDA device from any machine, its memory, compute capability, peak and "
        "bandwidth from the data-sheet table (e.g. 'NVIDIA H100 80GB HBM3', 'NVIDIA GeForce RTX 2080 Ti', 'Tesla T4')",
    )
    p.add_argument(
        "--sm",
        default=None,
        help="with --plan: plan for a GPU of this compute capability × 10, e.g. 75 (RTX 2080 Ti), 80 (A100), "
        "90 (H100) (default: the device's, or by --device-name); with --gpus and --gpu-mem it describes "
        "hypothetical hardware",
    )
    p.add_argument(
        "--gpus", type=int, default=None, help="GPUs to use (default: all found; with --device-name/--sm: 1)"
    )
    p.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help="dense 16-bit peak per device, bf16 (fp16 below sm80) (default: the data sheet's, by name)",
    )
    p.add_argument(
        "--gpu-mem",
        default=None,
        help="memory per device for the GPT plan, e.g. 80GiB (default: the device's; with --device-name: its "
        "data sheet's (trainlab.hardware.GPUS); with --sm alone: 80GiB)",
    )
    p.add_argument("--mnist", default=None, help="an MNIST pack (`trainlab data pack`) for a machine without network")
    p.set_defaults(func=run_lab_command)
