"""`trainlab gpt compare`: run a matrix of strategies on the same tokens, one subprocess each.

Each strategy runs as its own `trainlab gpt bench` process, so an out-of-memory error, a crash or
a hang is isolated and reported in the table ("OOM", "failed", "timeout", "invalid", "diverged") next to the
planner's predicted memory, instead of ending the comparison. Each gets `--timeout` seconds, after which
all its processes are stopped; a summary its rank 0 wrote is kept even if a rank then failed or hung at
the end (a "note" says so). `--budget` bounds the whole comparison: each row's timeout is cut to what
is left, and rows it leaves no time for are "skipped" (the lab's share for a slow row such as CPU
offload on one GPU). compare.json/.md/.csv/.log are rewritten after every strategy.
"""

from __future__ import annotations

import csv
import io
import math
import os
import subprocess
import tempfile
import time
from dataclasses import replace

from trainlab.distributed.launch import run_limited, worker_command, write_spec
from trainlab.errors import ConfigError, HardwareError, UserError
from trainlab.gpt.config import CompareConfig, GPTBenchConfig, plan_for_strategy
from trainlab.gpt.parallel.nvme import NotInstalled
from trainlab.gpt.plan import GPTPlan, Machine
from trainlab.gpt.planner import memory_shortfall
from trainlab.gpt.record import gpt_plan_record
from trainlab.gpt.shape import get_preset
from trainlab.gpt.strategy import mesh_rows
from trainlab.hardware import OOM_MARKERS, matmul_precision
from trainlab.io import atomic_write_text, read_json, record_written, refuse_foreign
from trainlab.telemetry.env import collect_env, format_header
from trainlab.telemetry.results import write_results

GiB = 1024**3
MIN_ROW_S = 10.0  # less --budget left than this: the remaining rows are "skipped", not started to be killed


def default_matrix(nproc: int) -> list[str]:
    """The handout's list — single device, DP/ZeRO, pipeline, tensor parallel, mixed precision,
    accumulation, checkpointing, offload — each alone and in useful combinations."""
    single = ["none", "amp", "ckpt", "ckpt-selective", "accum", "amp+ckpt", "offload", "compile", "amp+compile"]
    if nproc < 2:
        return single
    multi = [
        "ddp",
        "ddp+accum",
        "ddp+amp",
        "zero1",
        "zero2",
        "zero3",
        "zero3+amp+ckpt",
        "zero3+offload",
        "tp",
        "tp+amp",
        "pp",
        "pp+amp",
    ]
    if nproc >= 4 and nproc % 2 == 0:
        multi.append("tp+pp")
    return single + multi + mesh_rows(nproc)


def _classify(rc: int, text: str) -> str:
    if rc == 0:
        return "ok"
    if any(m.lower() in text.lower() for m in OOM_MARKERS):
        return "OOM"
    if "loss became non-finite" in text:  # gpt bench's TrainingDiverged (exit 3)
        return "diverged"
    if "trainlab: error:" in text:  # rc 2 directly, or torchrun's rc 1 around a worker's exit 2
        return "invalid"
    return "failed"


def _error_line(text: str) -> str:
    lines = text.strip().splitlines()
    for marker in ("trainlab: error:", *OOM_MARKERS):
        for line in lines:
            if marker.lower() in line.lower():
                return line.strip()[:200]
    for line in reversed(lines):
        line = line.strip()
        if line.startswith("trainlab: error:") or "Error" in line:
            return line[:200]
    return (text.strip().splitlines() or [""])[-1][:200]


def _child_env(run: GPTPlan) -> dict:
    """On CPU every process gets one thread — a "device" is one core, as torchrun's workers get
    (OMP_NUM_THREADS=1). Two threads per process on a busy 2-core box measured 30× slower steps
    (OpenMP spin-waiting), which would compare thread contention instead of strategies."""
    env = dict(os.environ)
    if run.device == "cpu":
        env["OMP_NUM_THREADS"] = "1"
    return env


def run_compare(cc: CompareConfig, log=print, command: str = "trainlab gpt compare") -> dict:
    """Run every strategy; write compare.md/.csv/.json/.log and plots under `cc.out`; return the table."""
    get_preset(cc.bench.model)  # an unknown preset is one error, not one per strategy
    matmul_precision(cc.bench.tf32, cc.bench.matmul_precision)  # so are --tf32 on --matmul-precision highest
    strategies = cc.strategy_list or default_matrix(cc.bench.nproc)
    runs = [plan_for_strategy(cc.bench, s) for s in strategies]  # ConfigError for unknown names, up front
    slugs = [r.strategy.replace("+", "_") for r in runs]
    refuse_foreign(
        [
            os.path.join(cc.out, name)
            for name in [f"{s}{ext}" for s in slugs for ext in (".json", ".log", ".spec.json")]
            + [f"compare.{ext}" for ext in ("json", "md", "log", "csv")]
            + ["throughput.png", "memory.png"]
        ],
        "--out",
    )  # it removes and rewrites these: never a file trainlab did not write
    os.makedirs(cc.out, exist_ok=True)
    env = collect_env(cc.bench.device)
    header = format_header({"strategies": ",".join(strategies), **cc.bench.to_dict()}, env)
    log(header)
    lines = header.splitlines()
    rows = []

    def write_tables(rows: list[dict]) -> dict:
        _check_same_start(rows)
        result = {"config": cc.bench.to_dict(), "env": env, "rows": rows}
        write_results(
            cc.out,
            "compare",
            result,
            header_md(cc) + to_markdown(rows),
            lines + ["", to_markdown(rows)],
            command,
            kind="gpt_compare",
            plan=gpt_plan_record(
                cc.bench.model,
                "cuda" if env["cuda_available"] and cc.bench.device != "cpu" else "cpu",
                precision="per strategy",
                seq=cc.bench.seq,
                device_name=", ".join(env["gpus"]) or env["cpu"],
                tokens={"global_batch": cc.bench.global_batch, "steps": cc.bench.steps},
                resolved=cc.bench.to_dict(),
            ),
            env=env,
        )
        atomic_write_text(os.path.join(cc.out, "compare.csv"), to_csv(rows))
        return result

    machine = Machine.detect()
    deadline = None if cc.budget_s is None else time.monotonic() + cc.budget_s
    for cfg in runs:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left < MIN_ROW_S:
            row = {"strategy": cfg.strategy, "nproc": cfg.nproc, "micro_batch": cfg.micro_batch}
            row.update(status="skipped", error=f"not run: the --budget of {cc.budget_s:g} s was spent")
        else:  # a row gets its --timeout, or what is left of the --budget
            timeout = cc.timeout_s if left is None else min(cc.timeout_s, left)
            row = run_one(cfg, cc.out, cfg.strategy.replace("+", "_"), machine, timeout)
        rows.append(row)
        lines.append(_row_line(row, "strategy"))
        log(lines[-1])
        write_tables(rows)  # after every strategy: what finished is on disk whatever happens next

    result = write_tables(rows)
    plot(rows, cc.out)
    log("\n" + to_markdown(rows))
    log(f"wrote {cc.out}/compare.md, compare.csv, compare.json, compare.log, throughput.png, memory.png")
    if not any(r.get("status") == "ok" for r in rows):  # measured nothing: never "success" (as dp compare)
        raise UserError(f"gpt compare: nothing was measured: no strategy finished ok (see {cc.out}/compare.md)")
    return {"command": command, **result}


def run_one(cfg: GPTBenchConfig, out: str, slug: str, machine: Machine, timeout_s: float) -> dict:
    """One `gpt bench` of `cfg` in its own process (--timeout), its summary read back as a table row:
    `out/<slug>.json|.log|.spec.json`. A run that is invalid, predicted not to fit, fails, hangs or
    runs out of memory is a row with its status and one error line, never an exception."""
    json_path = os.path.join(out, f"{slug}.json")
    log_path = os.path.join(out, f"{slug}.log")
    row = {"strategy": cfg.strategy, "nproc": cfg.nproc, "micro_batch": cfg.micro_batch, "predicted_bytes": None}
    try:
        run = replace(cfg, json=json_path).plan(machine)  # every check and the prediction, as `gpt bench` does
    except NotInstalled as e:  # an optional backend (deepspeed for nvme): a row that says so
        row.update(status="not installed", error=str(e))
        return row
    except (ConfigError, HardwareError) as e:
        row.update(status="invalid", error=str(e))
        return row
    row.update(micro_batch=run.micro_batch, predicted_bytes=run.predicted_peak_bytes)
    shortfall = memory_shortfall(run)  # the planner's estimate against free memory, before building anything
    if shortfall:
        row.update(status="OOM", error=shortfall)
        return row
    if os.path.exists(json_path):  # this command's own result from an earlier run (checked up front)
        os.remove(json_path)
    spec = write_spec(os.path.join(out, f"{slug}.spec.json"), "gpt-bench", plan=run.to_dict())
    cmd = worker_command(run.world_size, spec)
    with tempfile.TemporaryFile("w+", errors="replace") as output:  # a file: no pipe a stuck rank could hold
        rc, row["wall_s"] = run_limited(
            cmd, timeout_s, stdout=output, stderr=subprocess.STDOUT, env=_child_env(run), result=json_path
        )
        output.seek(0)
        text = output.read()
    status = "timeout" if rc is None else _classify(rc, text)
    atomic_write_text(log_path, "$ " + " ".join(cmd) + "\n" + text)
    if not os.path.exists(json_path):
        row.update(
            status=status if status != "ok" else "failed",
            error=f"stopped at the {timeout_s:g} s limit (--timeout)" if rc is None else _error_line(text),
        )
        return row
    s = read_json(json_path)  # rank 0 wrote the summary: the run's results are complete
    if status != "ok":
        row["note"] = (
            f"the results were written, then a rank failed or hung at the end: "
            f"{f'stopped at the {timeout_s:g} s limit (--timeout)' if rc is None else f'exit code {rc}'}"
        )
    row.update(
        status="ok",
        step_ms_median=s["step_seconds_median"] * 1e3,
        step_seconds_median=s["step_seconds_median"],
        step_ms_p10=s["step_seconds"]["p10"] * 1e3,
        step_ms_p90=s["step_seconds"]["p90"] * 1e3,
        tokens_per_s=s["tokens_per_s"],
        tokens_per_s_per_device=s["tokens_per_s_per_device"],
        tokens=s["tokens_per_step"] * s["timed_steps"],
        total_seconds=sum(s["step_seconds_all"]),
        tflops_per_device=s["tflops_per_device"],
        tflops_per_device_handout=s["tflops_per_device_handout"],
        tflops_per_device_8n=s.get("tflops_per_device_8n"),
        mfu=s["mfu"],
        peak_tflops=s.get("peak_tflops"),
        peak_tflops_source=s.get("peak_tflops_source"),
        device_name=s.get("device_name"),
        peak_memory_bytes=s["peak_memory_bytes"],
        peak_memory_kind=s["peak_memory_kind"],
        peak_tensor_bytes=s.get("peak_tensor_bytes"),
        loss_floor_uniform_tokens=s.get("loss_floor_uniform_tokens"),
        first_loss=s["losses"][0],
        last_loss=s["losses"][-1],
        losses=s["losses"],
    )
    return row


def _check_same_start(rows: list[dict]) -> None:
    """Same seed and tokens ⇒ the first loss is the same for every strategy (up to precision), and an
    fp32 strategy that is exact (ddp, zero, tp, pp and their mesh) trains like `none` step by step:
    `loss_max_diff_vs_none` is the largest |Δ loss| over the steps both ran."""
    ref = next((r for r in rows if r.get("status") == "ok" and r["strategy"] == "none"), None)
    for r in rows:
        if r.get("status") == "ok" and ref is not None:
            r["first_loss_diff_vs_none"] = r["first_loss"] - ref["first_loss"]
            r["loss_max_diff_vs_none"] = max(abs(a - b) for a, b in zip(r["losses"], ref["losses"]))


def _gib(x) -> str:
    return "-" if x is None else f"{x / GiB:.3f}"


def _mib(x) -> str:
    return "-" if x is None else f"{x / 2**20:.2f}"


def _row_line(r: dict, key: str = "strategy") -> str:
    """One log line of a row, named by `r[key]` (compare: the strategy; the ablation: its label)."""
    if r.get("status") != "ok":
        return f"{r[key]:<22} {r['status']}: {r.get('error', '')}  (predicted {_gib(r.get('predicted_bytes'))} GiB)"
    return (
        f"{r[key]:<22} {r['step_ms_median']:9.1f} ms  {r['tokens_per_s']:10,.0f} tok/s  "
        f"{r['tflops_per_device']:.3f} TFLOPS/dev  peak {_gib(r['peak_memory_bytes'])} GiB, tensors "
        f"{_gib(r.get('peak_tensor_bytes'))} GiB (predicted {_gib(r['predicted_bytes'])})  "
        f"loss {r['first_loss']:.4f}→{r['last_loss']:.4f}" + (f"  [{r['note']}]" if r.get("note") else "")
    )


COLUMNS = [
    "strategy",
    "nproc",
    "micro_batch",
    "status",
    "step_ms_median",
    "step_ms_p10",
    "step_ms_p90",
    "tokens_per_s",
    "tokens_per_s_per_device",
    "tflops_per_device",
    "tflops_per_device_handout",
    "tflops_per_device_8n",
    "mfu",
    "peak_memory_bytes",
    "peak_tensor_bytes",
    "predicted_bytes",
    "first_loss",
    "last_loss",
    "first_loss_diff_vs_none",
    "loss_max_diff_vs_none",
    "error",
    "note",
]


def to_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow(r)
    return buf.getvalue()


def header_md(cc: CompareConfig) -> str:
    b = cc.bench
    vocab = get_preset(b.model).vocab_size
    return (
        f"# GPT strategy comparison: {b.model}\n\nglobal batch {b.global_batch} × seq {b.seq or 'n_positions'}, "
        f"{b.steps} timed steps after {b.warmup} warm-up, seed {b.seed}, device {b.device}, impl {b.impl}. "
        "Step time: median [p10–p90]. TFLOPS per device: 6N + 12·L·C·T model FLOPs; the handout's 8·N·B·T "
        "with its get_model_size N (tied embedding counted twice), and 8·N·B·T with the distinct N, in their "
        "columns. On CPU each process runs one thread (a device = a core). Peak memory: max allocated per rank "
        "on CUDA, process RSS on CPU; live tensors: peak bytes of "
        "live tensors in one extra untimed step (CPU), the figure the planner predicts. "
        f"The tokens are uniform random, new every step: no loss goes below ln V = ln {vocab} = {math.log(vocab):.2f}.\n\n"
    )


def _g2(x) -> str:
    return "-" if x is None else f"{x:.2g}"


def _f3(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def to_markdown(rows: list[dict]) -> str:
    lines = [
        "| strategy | ranks | micro | step ms (p10–p90) | tokens/s | tokens/s/dev | TFLOPS/dev | TFLOPS/dev (handout) "
        "| TFLOPS/dev (8N) | MFU | peak mem GiB | live tensors MiB | predicted MiB | loss first→last "
        "| max Δloss vs none |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.get("status") != "ok":
            lines.append(
                f"| {r['strategy']} | {r['nproc']} | {r['micro_batch']} | **{r['status']}** | | | | | | | | | "
                f"{_mib(r.get('predicted_bytes'))} | {r.get('error', '')[:80]} | |"
            )
            continue
        mfu = "-" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
        lines.append(
            f"| {r['strategy']} | {r['nproc']} | {r['micro_batch']} | {r['step_ms_median']:.1f} "
            f"({r['step_ms_p10']:.1f}–{r['step_ms_p90']:.1f}) | {r['tokens_per_s']:,.0f} | "
            f"{r['tokens_per_s_per_device']:,.0f} | {r['tflops_per_device']:.3f} | "
            f"{r['tflops_per_device_handout']:.3f} | {_f3(r.get('tflops_per_device_8n'))} | {mfu} | "
            f"{_gib(r['peak_memory_bytes'])} | "
            f"{_mib(r.get('peak_tensor_bytes'))} | {_mib(r['predicted_bytes'])} | "
            f"{r['first_loss']:.4f}→{r['last_loss']:.4f} | {_g2(r.get('loss_max_diff_vs_none'))} |"
        )
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], out: str) -> None:
    """throughput.png (tokens/s per strategy) and memory.png (measured vs predicted peak)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["strategy"] for r in rows]
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(rows)), 4))
    tps = [r.get("tokens_per_s") or 0 for r in rows]
    ax.bar(x, tps, color=["tab:blue" if r.get("status") == "ok" else "tab:red" for r in rows])
    for i, r in enumerate(rows):
        if r.get("status") != "ok":
            ax.text(i, 0, r["status"], ha="center", va="bottom", rotation=90, color="tab:red")
    ax.set_xticks(list(x), names, rotation=45, ha="right")
    ax.set_ylabel("tokens/s (total)")
    ax.set_title("throughput per strategy (same tokens)")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "throughput.png"), dpi=120)
    record_written(os.path.join(out, "throughput.png"))
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(rows)), 4))
    w = 0.4
    # measured: live tensor bytes where counted (CPU), else the allocator's peak (CUDA)
    measured = [r.get("peak_tensor_bytes") or r.get("peak_memory_bytes") or 0 for r in rows]
    predicted = [r.get("predicted_bytes") or 0 for r in rows]
    scale, unit = (GiB, "GiB") if max(measured + predicted + [0]) >= GiB else (2**20, "MiB")
    ax.bar([i - w / 2 for i in x], [m / scale for m in measured], w, label="measured peak")
    ax.bar([i + w / 2 for i in x], [p / scale for p in predicted], w, label="predicted (planner)")
    ax.set_xticks(list(x), names, rotation=45, ha="right")
    ax.set_ylabel(f"{unit} per device")
    ax.set_title("peak memory per strategy")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "memory.png"), dpi=120)
    record_written(os.path.join(out, "memory.png"))
    plt.close(fig)
