"""Issue 35's GPU goals in one run (≤ 8 minutes on one H100/H200): `PYTHONPATH=src python3 benchmarks/gpu_gpt.py`.

What each step writes under --out (default $OUT, else benchmarks/results/gpu/<device>), with its command and raw
log beside it (`<step>.cmd`, `<step>.log`), after `env.txt` (the command, versions, nvidia-smi):

  attention     the micro-table: causal SDPA fwd+bwd on [16, 32, 1024, d] × 48 layers, bf16, for the head
                layouts plain (head_dim 50, views of a fused projection), pad56 and pad64 (contiguous heads
                already that wide, scale 1/√50), each under flash and cuDNN (refused: said so)
  gpt_best      the lab's gpt_best at global batch 16 (amp+accum+compile, --micro-batch-auto, fused AdamW,
                TF32, vocabulary 64, fused QKV; issue 35's glue: residual in bf16, fused boundary, cast once,
                --loss auto; --attention auto → pad56)
  gpt_plain     the same with --attention plain (the layout lever alone, same run)
  peer          the ablation's peer row: HF GPT2LMHeadModel + SDPA + bf16 + compile + fused AdamW, same tokens
  fp8           gpt_best with --fp8 (torchao float8 block Linears; without --cast-once, which FP8 refuses)
                beside the headline, or why not
  profile       `trainlab gpt profile` of gpt_best: kernel time by category, busy vs wall, SDPA backend, TFLOP/s
  pytest        `pytest -m gpu` of the GPT tests and the cudagraph LeNet test issue 35 fixed
  summary.md    the table: ms/step, tok/s, MFU (FP8 row also against the FP8 peak), ours/peer, the goals
                (≥ 46 % MFU, ≥ 1.2× the peer) met or not

`--parts glue` (a second ≤ 8-minute call) measures issue 35's glue levers instead, each a `gpt bench` row on
top of gpt_best at a fixed 8 × 2 (accumulation on, so --cast-once has a recast to save), same tokens:
  glue_base        gpt_best without the glue (issue 30's levers, --loss chunked) at micro-batch 8 (8 × 2)
  glue_residual    + --residual-16bit (the residual stream in bf16, LayerNorm statistics fp32)
  glue_boundary    + --fused-boundary (the last residual add and the next LayerNorm in one compiled function)
  glue_cast_once   + --cast-once (the blocks' bf16 weights made once per optimizer step, not per micro-step)
  glue_loss_auto   + --loss auto (the whole logits where the planner predicts they fit, else chunked)
  glue_all         all four together
summary.md then holds their table: ms/step, tok/s, MFU, peak GiB, and each row's speed against glue_base.

Steps run in that order, each in its own process with a timeout; a step that would start past --budget is
recorded as skipped. `--dry-run` runs the same steps on the CPU with the tiny model (no compile, one step),
to check the script itself on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from trainlab.flags import to_argv  # noqa: E402  (src/ on the path first)
from trainlab.gpt.config import GPTBenchConfig  # noqa: E402
from trainlab.lab.plan import GLUE_LEVERS, LEVERS, best_levers  # noqa: E402


def lever_flags(levers: dict, over: dict | None = None) -> list[str]:
    """The `gpt bench` flags that set `levers` (on top of the levers `over`, or of the defaults), read from the
    lab's own plan (lab.plan) so that this script and the lab cannot drift."""
    return to_argv(GPTBenchConfig(**{**(over or {}), **levers}), defaults=GPTBenchConfig(**(over or {})))


# the lab's gpt_best on a GPU: amp+accum+compile at the planner's micro-batch, fused AdamW, TF32
GPT_BEST_RUN = ["--strategy", "amp+accum+compile", "--micro-batch-auto", "--fused-optimizer", "--tf32", "on"]
LEVERS_30 = [*GPT_BEST_RUN, *lever_flags(LEVERS)]  # before issue 35's glue: the glue rows' base
GLUE_ALL = lever_flags(GLUE_LEVERS, over=LEVERS)  # after LEVERS_30 on a command line
BEST = [*GPT_BEST_RUN, *lever_flags(best_levers("bf16"))]  # lab.plan's gpt_best on a bf16 GPU
PEER = ["--impl", "hf", "--strategy", "amp+compile", "--tf32", "on", "--fused-optimizer", "--micro-batch-auto"]
MFU_GOAL, PEER_GOAL = 0.46, 1.2
GLUE = {
    "glue_base": [],
    "glue_residual": ["--residual-16bit"],
    "glue_boundary": ["--fused-boundary"],
    "glue_cast_once": ["--cast-once"],
    "glue_loss_auto": ["--loss", "auto"],
    "glue_all": GLUE_ALL,
}


def _cpu(args: list[str]) -> list[str]:
    """--dry-run: no compile (minutes on 2 cores), the planner's auto on the CPU's memory."""
    out = []
    for a in args:
        out.append(a.replace("+compile", "") if "+" in a or a == "compile" else a)
    return out


def _without(argv: list[str], flag: str, values: int = 1) -> list[str]:
    """`argv` without `flag` and its `values` values."""
    i = argv.index(flag)
    return argv[:i] + argv[i + 1 + values :]


class Runner:
    def __init__(self, out: Path, budget_s: float, dry: bool):
        self.out, self.budget_s, self.dry, self.t0 = out, budget_s, dry, time.monotonic()
        self.status: dict[str, str] = {}

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.t0)

    def run(self, name: str, cmd: list[str], timeout_s: float, env: dict | None = None) -> bool:
        (self.out / f"{name}.cmd").write_text(shlex.join(cmd) + "\n")
        if self.left() < 20:
            self.status[name] = f"skipped: the {self.budget_s:.0f} s budget is spent"
            print(f"[{name}] {self.status[name]}", flush=True)
            return False
        limit = max(10.0, min(timeout_s, self.left()))
        t = time.monotonic()
        print(f"[{name}] {shlex.join(cmd)} (limit {limit:.0f} s)", flush=True)
        with open(self.out / f"{name}.log", "w") as log:
            try:
                rc = subprocess.run(
                    cmd,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    timeout=limit,
                    cwd=ROOT,
                    env={**os.environ, **(env or {})},
                ).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        dt = time.monotonic() - t
        self.status[name] = f"exit {rc} in {dt:.0f} s"
        print(f"[{name}] {self.status[name]}", flush=True)
        return rc == 0


def write_env(out: Path, argv: list[str]) -> None:
    import torch

    lines = [f"command: {shlex.join(['python3', 'benchmarks/gpu_gpt.py', *argv])}", f"date: {time.ctime()}"]
    lines += [f"python: {platform.python_version()}", f"torch: {torch.__version__}", f"cuda: {torch.version.cuda}"]
    lines.append(f"cudnn: {torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None}")
    for mod in ("transformers", "triton", "torchao"):
        try:
            lines.append(f"{mod}: {__import__(mod).__version__}")
        except Exception as e:  # noqa: BLE001 - any import failure is a fact to record
            lines.append(f"{mod}: not importable ({type(e).__name__}: {str(e).splitlines()[0][:120]})")
    try:
        smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        smi = "nvidia-smi: not available"
    (out / "env.txt").write_text("\n".join(lines) + "\n\n" + smi)


def attention_table(dry: bool) -> list[dict]:
    """Causal SDPA forward + backward per layout and backend; ms per step (× layers)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dev = "cpu" if dry else "cuda"
    B, H, T, D, L = (2, 4, 64, 10, 2) if dry else (16, 32, 1024, 50, 48)
    dtype = torch.float32 if dry else torch.bfloat16
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    rows = []
    for layout, width in (("plain", D), ("pad56", -(-D // 8) * 8), ("pad64", 64 if not dry else 16)):
        # q, k, v as the model makes them: views of one fused [B, T, 3·H·width] projection, heads `width` wide
        qkv = torch.randn(B, T, 3, H, width, device=dev, dtype=dtype)
        qkv[..., D:] = 0
        qkv.requires_grad_(True)
        for name, backend in backends.items():
            row = {"layout": layout, "head_width": width, "backend": name}
            try:
                q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
                with sdpa_kernel([backend]):

                    def step():
                        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=D**-0.5)
                        y.backward(torch.ones_like(y))

                    for _ in range(3):
                        step()
                    if dev == "cuda":
                        torch.cuda.synchronize()
                    n, t = 10, time.perf_counter()
                    for _ in range(n):
                        step()
                    if dev == "cuda":
                        torch.cuda.synchronize()
                row["ms_per_step"] = (time.perf_counter() - t) / n * 1e3 * L
            except RuntimeError as e:
                row["refused"] = str(e).splitlines()[0][:160]
            rows.append(row)
            print(f"[attention] {row}", flush=True)
    return rows


def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def glue_summary(out: Path, status: dict) -> str:
    """The glue rows beside glue_base (same tokens, same 8 × 2 layout)."""
    lines = ["| row | ms/step | tok/s | MFU | peak GiB | vs glue_base | status |", "|---|---|---|---|---|---|---|"]
    base = _load(out / "glue_base.json")
    for name in GLUE:
        r = _load(out / f"{name}.json")
        if not r:
            lines.append(f"| {name} | - | - | - | - | - | {status.get(name, 'not run')} |")
            continue
        mfu, peak = r.get("mfu"), r.get("peak_memory_bytes")
        ratio = f"{r['tokens_per_s'] / base['tokens_per_s']:.3f}×" if base else "-"
        lines.append(
            f"| {name} | {1e3 * r['step_seconds_median']:.0f} | {r['tokens_per_s']:,.0f} | "
            f"{'-' if mfu is None else f'{100 * mfu:.1f} %'} | {'-' if peak is None else f'{peak / 2**30:.1f}'} | "
            f"{ratio} | {status.get(name, '')} |"
        )
    return "\n".join(lines) + "\n"


def summary(out: Path, status: dict, fp8_why: str | None) -> str:
    rows = [("gpt_best", "gpt_best"), ("gpt_plain", "gpt_best, --attention plain"), ("peer", "peer (HF)")]
    rows.append(("fp8", "FP8 row (beside, not in, the headline)"))
    lines = [
        "| run | heads | micro × accum | ms/step | tok/s | MFU | MFU vs FP8 peak | status |",
        "|---|---|---|---|---|---|---|---|",
    ]
    got = {}
    for name, label in rows:
        r = _load(out / f"{name}.json")
        got[name] = r
        if not r:
            why = fp8_why if name == "fp8" and fp8_why else status.get(name, "not run")
            lines.append(f"| {label} | - | - | - | - | - | - | {why} |")
            continue
        mfu = r.get("mfu")
        f8 = r.get("mfu_fp8_peak")
        pad = (r.get("config") or {}).get("model", {}).get("head_dim_padded")
        heads = "HF's" if r.get("impl") == "hf" else f"pad{pad}" if pad else "plain"
        lines.append(
            f"| {label} | {heads} | {r['micro_batch']} × {r['global_batch'] // r['micro_batch']} | "
            f"{1e3 * r['step_seconds_median']:.0f} | {r['tokens_per_s']:,.0f} | "
            f"{'-' if mfu is None else f'{100 * mfu:.1f} %'} | {'-' if f8 is None else f'{100 * f8:.1f} %'} | "
            f"{status.get(name, '')} |"
        )
    best, peer = got.get("gpt_best"), got.get("peer")
    lines.append("")
    if best and best.get("mfu") is not None:
        lines.append(
            f"- MFU goal ≥ {100 * MFU_GOAL:.0f} %: {100 * best['mfu']:.1f} % → {'met' if best['mfu'] >= MFU_GOAL else 'NOT met'}"
        )
    if best and peer:
        ratio = best["tokens_per_s"] / peer["tokens_per_s"]
        lines.append(
            f"- ours / peer (same run): {ratio:.2f}× → {'met' if ratio >= PEER_GOAL else 'NOT met'} (goal ≥ {PEER_GOAL}×)"
        )
    prof = _load(out / "profile.json")
    if prof:
        lines.append(
            f"- profile: SDPA ran {prof['sdpa_backend']}, busy {100 * (prof['busy_fraction'] or 0):.0f} % of wall, "
            f"GEMM {prof['gemm_tflops'] or 0:.0f} TFLOP/s, attention {prof['attention_tflops'] or 0:.0f} TFLOP/s"
        )
        lines += [
            f"  - {c['category']}: {c['ms_per_step']:.1f} ms ({100 * c['share']:.0f} %)" for c in prof["categories"]
        ]
    att = _load(out / "attention.json") or []
    if att:
        lines += ["", "| layout | backend | ms/step (× layers) |", "|---|---|---|"]
        for a in att:
            lines.append(
                f"| {a['layout']} | {a['backend']} | {a.get('ms_per_step', 0):.1f} |"
                if "ms_per_step" in a
                else f"| {a['layout']} | {a['backend']} | refused: {a['refused']} |"
            )
    lines += ["", f"- pytest -m gpu: {status.get('pytest', 'not run')} (pytest.log)"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", default=None, help="result folder (default $OUT, else benchmarks/results/gpu/<device>)")
    ap.add_argument("--budget", type=float, default=480.0, help="seconds for the whole run (default 480: 8 minutes)")
    ap.add_argument("--dry-run", action="store_true", help="the same steps on the CPU, tiny model, to check the script")
    ap.add_argument(
        "--parts", choices=("goals", "glue"), default="goals", help="goals (the default) or the glue levers' rows"
    )
    argv = sys.argv[1:] if argv is None else argv
    args = ap.parse_args(argv)
    import torch

    from trainlab.gpt.plan import Machine, fp8_problem

    if not args.dry_run and not torch.cuda.is_available():
        print("gpu_gpt.py: error: no CUDA GPU here; use --dry-run to check the script on the CPU", file=sys.stderr)
        return 2
    device = "cpu" if args.dry_run else torch.cuda.get_device_name(0).replace(" ", "_")
    out = Path(args.out or os.environ.get("OUT") or ROOT / "benchmarks" / "results" / "gpu" / device)
    out.mkdir(parents=True, exist_ok=True)
    write_env(out, argv)
    r = Runner(out, args.budget, args.dry_run)
    py = [sys.executable, "-m", "trainlab", "gpt"]
    if args.dry_run:
        shape = [
            "--model",
            "tiny",
            "--device",
            "cpu",
            "--global-batch",
            "4",
            "--seq",
            "64",
            "--steps",
            "1",
            "--warmup",
            "1",
        ]
        best, base30, peer = _cpu(BEST), _cpu(LEVERS_30), _cpu(PEER)
    else:
        shape = ["--model", "gpt2-1.6b", "--device", "cuda", "--global-batch", "16", "--steps", "5", "--warmup", "2"]
        best, base30, peer = BEST, LEVERS_30, PEER
    env = {"PYTHONPATH": str(ROOT / "src")}
    if args.parts == "glue":
        base = [*_without(base30, "--micro-batch-auto", 0), "--micro-batch", "2" if args.dry_run else "8"]
        for name, extra in GLUE.items():
            r.run(name, [*py, "bench", *shape, *base, *extra, "--json", str(out / f"{name}.json")], 150, env)
        text = glue_summary(out, r.status)
        (out / "summary.md").write_text(text)
        (out / "status.json").write_text(json.dumps(r.status, indent=1))
        print(text)
        return 0

    t = time.monotonic()
    rows = attention_table(args.dry_run)
    (out / "attention.json").write_text(json.dumps(rows, indent=1))
    r.status["attention"] = f"done in {time.monotonic() - t:.0f} s"

    # in the order of the goals: the headline and its peer, the tests, then the profile and the rows beside
    r.run("gpt_best", [*py, "bench", *shape, *best, "--json", str(out / "gpt_best.json")], 150, env)
    r.run("peer", [*py, "bench", *shape, *peer, "--json", str(out / "peer.json")], 150, env)
    tests = [
        "tests/test_gpt_levers.py",
        "tests/test_gpt_glue.py",
        "tests/test_gpt_attention_layout.py",
        "tests/test_gpt_plan.py",
        "tests/test_gpt_planner.py",
        "tests/test_gpt_profile.py",
        "tests/test_lenet_step.py",
    ]
    pytest = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", *tests, "-k", "not lenet_step or cudagraph_steps"]
    r.run("pytest", pytest + (["--collect-only"] if args.dry_run else []), 150, env)
    prof_shape = _without(shape, "--steps")
    profile = [*py, "profile", *prof_shape, *best, "--profile-steps", "2", "--json", str(out / "profile.json")]
    r.run("profile", profile, 120, env)
    fp8_why = fp8_problem(Machine() if args.dry_run else Machine.detect())
    if fp8_why is None:
        r.run(
            "fp8",
            [*py, "bench", *shape, *_without(best, "--cast-once", 0), "--fp8", "--json", str(out / "fp8.json")],
            150,
            env,
        )
    else:
        r.status["fp8"] = f"not measured: {fp8_why}"
        (out / "fp8.log").write_text(r.status["fp8"] + "\n")
    plain = [*py, "bench", *shape, *best, "--attention", "plain", "--json", str(out / "gpt_plain.json")]
    r.run("gpt_plain", plain, 150, env)

    text = summary(out, r.status, fp8_why)
    (out / "summary.md").write_text(text)
    (out / "status.json").write_text(json.dumps(r.status, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
