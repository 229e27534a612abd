"""TF32 on/off for the LeNet-5 default recipe in fp32 (issue 29, goal 4; report 000's trick): the same
recipe (`--amp off`, the step `--step-mode auto` picks) trained with `--matmul-precision highest`
(= `--tf32 off`), `high` (= `--tf32 on`) and `medium` (bf16 passes allowed, report 000's setting),
alternating, so a busy neighbour slows all alike; images/s and ms per step, median over rounds.

    python benchmarks/lenet_tf32.py --device cuda [--epochs 2 --rounds 2]

TF32 is a tensor-core mode of NVIDIA GPUs (Ampere and newer) for float32 matmuls and convolutions: on
a CPU it does not apply, and this script writes that row instead of training.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

from _common import add_output_args, check_output, save

from trainlab.device import resolve_device
from trainlab.lenet.config import TrainConfig
from trainlab.lenet.loop import train

NOT_APPLICABLE = "TF32 does not apply: it is a tensor-core mode of NVIDIA GPUs (Ampere+), not of a CPU"


PRECISIONS = ("highest", "high", "medium")  # --matmul-precision; the first is the baseline (--tf32 off)


def one_run(device, precision: str, epochs: int, seed: int, log) -> dict:
    with tempfile.TemporaryDirectory() as d:
        cfg = TrainConfig(
            device=str(device),
            amp="off",
            matmul_precision=precision,
            epochs=epochs,
            seed=seed,
            progress=False,
            tensorboard=False,
            gpu_telemetry=False,
            out=d,
        )
        s = train(cfg, log=lambda line: log("  " + line) if line.startswith(("epoch", "done")) else None)
    return {
        "matmul_precision": precision,
        "tf32": "off" if precision == "highest" else "on",
        "images_per_s": s["images_per_s_median"],
        "ms_per_step": s["ms_per_step"],
        "step_mode": s["step_mode"],
        "batch_size": s["batch_size"],
        "test_accuracy": s["test_accuracy"],
        "train_seconds": s["train_seconds"],
        "tf32_state": s["tf32"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--epochs", type=int, default=2, help="epochs per run (images/s is the median epoch's)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of highest/high/medium, alternating")
    ap.add_argument("--name", default="lenet_tf32", help="result file stem")
    add_output_args(ap)
    args = ap.parse_args()
    for flag, v in (("--epochs", args.epochs), ("--rounds", args.rounds)):
        if v < 1:
            ap.error(f"{flag} {v}: expected an integer >= 1")
    device = resolve_device(args.device)
    check_output(args.out, args.name, force=args.force)
    lines: list[str] = []

    def log(line):
        print(line, flush=True)
        lines.append(line)

    if device.type != "cuda":
        rows = [{"recipe": "LeNet-5 default, fp32", "device": str(device), "tf32": "n/a", "note": NOT_APPLICABLE}]
        text = (
            f"| recipe | device | TF32 |\n| --- | --- | --- |\n| LeNet-5 default, fp32 | {device} | {NOT_APPLICABLE} |"
        )
        log(text)
        save(args.name, {"rows": rows}, text, lines, device, out=args.out)
        return
    runs = []
    for r in range(args.rounds):
        for precision in PRECISIONS:
            log(f"[round {r + 1}] --matmul-precision {precision}")
            runs.append({"round": r + 1, **one_run(device, precision, args.epochs, r, log)})
    rows = []
    for precision in PRECISIONS:
        rs = [x for x in runs if x["matmul_precision"] == precision]
        rows.append(
            {
                "recipe": "LeNet-5 default, fp32",
                "device": str(device),
                "matmul_precision": precision,
                "tf32": rs[0]["tf32"],
                "step_mode": rs[0]["step_mode"],
                "batch_size": rs[0]["batch_size"],
                "images_per_s": statistics.median(x["images_per_s"] for x in rs),
                "ms_per_step": statistics.median(x["ms_per_step"] for x in rs),
                "test_accuracy": statistics.median(x["test_accuracy"] for x in rs),
                "runs": len(rs),
            }
        )
    for r in rows[1:]:
        r["speedup_vs_tf32_off"] = r["images_per_s"] / rows[0]["images_per_s"]
    speedup = rows[1]["speedup_vs_tf32_off"]
    md = [
        "| recipe | matmul precision | TF32 | step | batch | images/s (median) | ms/step | test acc (%) | ÷ highest |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    md += [
        f"| {r['recipe']} | {r['matmul_precision']} | {r['tf32']} | {r['step_mode']} | {r['batch_size']} | "
        f"{r['images_per_s']:,.0f} | {r['ms_per_step']:.3f} | {r['test_accuracy']:.2f} | "
        f"{r.get('speedup_vs_tf32_off', 1.0):.2f}× |"
        for r in rows
    ]
    text = (
        "\n".join(md)
        + f"\n\nTF32 on (high) ÷ off (highest): {speedup:.2f}× images/s ({args.rounds} alternating rounds of "
        f"{args.epochs} epochs)."
    )
    log(text)
    save(args.name, {"rows": rows, "runs": runs, "speedup": speedup}, text, lines, device, out=args.out)


if __name__ == "__main__":
    main()
