"""`trainlab gpt bench`: time one GPT-2 strategy on seeded random tokens, the same way for all.

The run is one resolved `GPTPlan` (the worker spec is that plan as JSON). Every rank builds a
`GPTEngine` from it, runs `warmup` steps (compilation, allocator warm-up; excluded)
and `steps` timed steps. A step is timed from a barrier to the returned loss (a host sync: the
loss is a Python float) with the device synchronized on both ends, and the slowest rank's time is
the step time. Tokens for step i are drawn from a generator seeded by `seed`, so every strategy
trains on exactly the same global batches.

A NaN/inf loss stops the benchmark (`TrainingDiverged`): every rank learns of it through the
per-step all-reduce that already takes the slowest rank's time, so all stop at the same step.
`--out` is owned like a training run directory (`RunDir.claim`).
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import replace

import torch
import torch.distributed as dist

from trainlab.device import (
    device_name,
    free_memory,
    peak_memory,
    peak_tflops,
    reset_peak_memory,
    set_matmul_precision,
    synchronize,
)
from trainlab.distributed.launch import (
    describe_timeout,
    init_distributed,
    keep_alive,
    launch_workers,
    needs_launch,
    release_group,
    under_torchrun,
)
from trainlab.errors import HardwareError, TrainingDiverged
from trainlab.gpt.config import GPTBenchConfig
from trainlab.gpt.engine import GPTEngine
from trainlab.gpt.flops import flops_per_token, handout_param_count, handout_tflops, hardware_flops_per_token, mfu
from trainlab.gpt.plan import GPTPlan
from trainlab.gpt.planner import measure_step_peak_bytes, memory_shortfall, out_of_memory_line
from trainlab.gpt.record import stamp_bench
from trainlab.gpt.shape import count_params
from trainlab.hardware import is_out_of_memory
from trainlab.io import write_json_output
from trainlab.stats import format_spread, summarize
from trainlab.telemetry.env import BusySnapshot, collect_env, format_header
from trainlab.telemetry.rundir import RunDir, check_run_dir
from trainlab.telemetry.tensorboard import make_writer

GiB = 1024**3


def token_batches(vocab_size: int, global_batch: int, seq_len: int, n: int, seed: int):
    """`n` global batches of uniformly random token ids, as the handout's `get_dataloader` draws
    (`torch.randint(vocab_size, ...)`), from a generator seeded by `seed`."""
    gen = torch.Generator().manual_seed(seed + 12345)  # distinct from the weight-init streams
    for _ in range(n):
        yield torch.randint(vocab_size, (global_batch, seq_len), generator=gen)


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _fmt_bytes(n) -> str:
    if n is None:
        return "n/a"
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / 2**20:.1f} MiB"


def _rank_peak(device: torch.device) -> dict:
    mem = peak_memory(device)
    mem["peak_bytes"] = (
        mem["peak_allocated_bytes"] if mem.get("peak_allocated_bytes") is not None else mem.get("peak_rss_bytes")
    )
    return mem


def run_bench(plan: GPTPlan, log=print) -> dict | None:
    """Run the benchmark of `plan` in this process (a torchrun worker or the only process).

    Returns the summary on rank 0 and None on other ranks; writes --json / --out on rank 0. A rank with
    peers leaves its process group as it is: the worker ends by `launch.end_worker` (barrier, os._exit).
    """
    tf32 = set_matmul_precision(plan.matmul_precision)  # --tf32 / --matmul-precision, resolved in the plan
    info = init_distributed(device=plan.device)
    main = info.rank == 0
    say = log if main else (lambda *a, **k: None)
    run, finished = None, False
    rec = None
    try:
        run = RunDir.claim(plan.out, overwrite=plan.overwrite, resumable=False) if main and plan.out else None
        config = {**plan.to_dict(), "dist_timeout": describe_timeout(None)}
        env = collect_env(info.device)
        say(format_header(config, env))
        engine, build_s = _build_engine(plan, info)
        rec = StepRecorder(plan, info, run, say)
        say(
            f"built {plan.strategy.text} on {info.world_size} rank(s) of {device_name(info.device)} in {build_s:.1f} s; "
            f"params {rec.params:,}; peak {rec.peak if rec.peak else 'n/a'} TFLOPS ({rec.peak_src})"
        )
        rec.start(config, env)
        tokens = _timed_steps(engine, plan, info, rec)
        rec.finish_busy(env)
        all_mem = _peak_memory_per_rank(engine, tokens, plan, info, say)
        if not main:
            finished = True
            return None
        summary = stamp_bench(_summary(plan, engine, info, rec, all_mem, build_s, tf32, config, env), plan)
        _say_summary(summary, all_mem, say)
        if plan.json:
            write_json_output(plan.json, summary)
        if run is not None:
            run.write_json("summary.json", summary)
        finished = True
        return summary
    except (RuntimeError, MemoryError) as e:
        if not is_out_of_memory(e):
            raise
        # one line, not a failed row or "a bug in trainlab": what the planner expected, what was free
        raise HardwareError(
            out_of_memory_line(plan.predicted_peak_bytes, free_memory(info.device), f"{info.device}, at run time")
        ) from None
    finally:
        if rec is not None:
            rec.close()
        if run is not None:
            run.release(failed=not finished)
        release_group()  # a group of one; a rank with peers ends by launch.end_worker


def _build_engine(plan: GPTPlan, info) -> tuple[GPTEngine, float]:
    t0 = time.perf_counter()
    engine = GPTEngine(plan, info)
    keep_alive(engine)  # its DDP/FSDP destructors can block on gloo once a peer has gone (launch.keep_alive)
    return engine, time.perf_counter() - t0


class StepRecorder:
    """Everything a benchmark step reports, kept out of the timed loop: the step line, metrics.jsonl and
    TensorBoard (rank 0 with --out), the peak-memory reset and the nvidia-smi snapshot of busy steps."""

    def __init__(self, plan: GPTPlan, info, run: RunDir | None, say):
        self.cfg, self.run, self.say, self.main = plan, run, say, info.rank == 0
        self.device, self.world = torch.device(info.device), info.world_size
        self.params = count_params(plan.model)
        self.peak, self.peak_src = peak_tflops(self.device)
        self.model_fpt = flops_per_token(plan.model, plan.seq, checkpointing=False)
        self.tokens_per_step = plan.global_batch * plan.seq
        self.losses, self.times, self.warm_times = [], [], []
        self.busy = BusySnapshot()  # nvidia-smi during the timed steps (env.json's is taken idle)
        self.writer = None

    def start(self, config: dict, env: dict) -> None:
        if self.run is not None:
            self.run.write_json("config.json", config)
            self.run.write_json("env.json", env)
            self.run.write_metrics([])
            self.writer = make_writer(self.run.path)

    def before_step(self, i: int) -> None:
        if i == self.cfg.warmup:  # the first timed step: peaks and the busy snapshot count from here
            reset_peak_memory(self.device)
            if self.main:
                self.busy.start()

    def after_step(self, i: int, loss: float, dt: float) -> None:
        cfg, timed = self.cfg, i >= self.cfg.warmup
        self.losses.append(loss)
        (self.times if timed else self.warm_times).append(dt)
        tok_s = self.tokens_per_step / dt
        tfl = self.model_fpt * tok_s / self.world / 1e12
        u = mfu(tfl, self.peak)
        mem = _rank_peak(self.device)
        tag = f"step {i + 1 - cfg.warmup}/{cfg.steps}" if timed else f"warmup {i + 1}/{cfg.warmup}"
        self.say(
            f"{tag:>14}  loss {loss:.4f}  {dt * 1e3:9.1f} ms  {tok_s:12,.0f} tok/s  {tfl:8.3f} TFLOPS/dev  "
            f"MFU {'n/a' if u is None else f'{100 * u:5.1f}%'}  peak {_fmt_bytes(mem['peak_bytes'])}"
        )
        if self.run is not None:
            self.run.append_metric(
                {
                    "step": i + 1,
                    "timed": timed,
                    "loss": loss,
                    "step_s": dt,
                    "tokens_per_s": tok_s,
                    "tflops_per_device": tfl,
                    "mfu": u,
                    "peak_bytes": mem["peak_bytes"],
                }
            )
            self._scalars(
                i + 1,
                loss=loss,
                step_ms=dt * 1e3,
                tokens_per_s=tok_s,
                tflops_per_device=tfl,
                mfu=u,
                peak_memory_gib=None if mem["peak_bytes"] is None else mem["peak_bytes"] / GiB,
            )

    def _scalars(self, step: int, **values) -> None:
        for name, value in values.items():
            if value is not None:
                self.writer.add_scalar(name, value, step)

    def finish_busy(self, env: dict) -> None:
        snapshot = self.busy.finish() if self.main else None
        if snapshot is not None:
            env["nvidia_smi_busy"] = snapshot
            if self.run is not None:
                self.run.write_json("env.json", env)
                self.run.write_text("nvidia-smi-busy.txt", snapshot["text"])

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _timed_steps(engine: GPTEngine, cfg: GPTPlan, info, rec: StepRecorder) -> torch.Tensor:
    """`warmup` + `steps` steps, each timed from a barrier to the returned loss; the slowest rank's time
    is the step's. Returns the last batch (for --track-memory)."""
    device, world = torch.device(info.device), info.world_size
    batches = token_batches(cfg.model.vocab_size, cfg.global_batch, cfg.seq, cfg.warmup + cfg.steps, cfg.seed)
    for i, tokens in enumerate(batches):
        rec.before_step(i)
        if world > 1:
            dist.barrier()
        synchronize(device)
        t = time.perf_counter()
        loss = engine.train_step(tokens)
        synchronize(device)
        dt = time.perf_counter() - t
        diverged = not math.isfinite(loss)
        if world > 1:  # the step is as slow as its slowest rank; a NaN on any rank stops them all
            dt_t = torch.tensor(
                [dt, float(diverged)], dtype=torch.float64, device=device if device.type == "cuda" else "cpu"
            )
            dist.all_reduce(dt_t, op=dist.ReduceOp.MAX)
            dt, diverged = float(dt_t[0].item()), bool(dt_t[1].item())
        if diverged:
            raise TrainingDiverged(
                f"gpt bench: the loss became non-finite ({loss} on rank {info.rank}) at step {i + 1} "
                f"(--lr {cfg.lr:g} too high?); the benchmark stopped, no summary was written"
            )
        rec.after_step(i, loss, dt)
    return tokens


def _peak_memory_per_rank(engine: GPTEngine, tokens, cfg: GPTPlan, info, say) -> list[dict]:
    """Every rank's peaks (gathered on all ranks); with --track-memory, live tensor bytes of one more step."""
    device = torch.device(info.device)
    rank_mem = _rank_peak(device)
    if cfg.track_memory:
        # after timing: the per-op bookkeeping slows the step, and this step is not in the losses
        try:
            rank_mem["peak_tensor_bytes"] = measure_step_peak_bytes(engine, tokens, warm=True)
        except Exception as e:  # the measurement is an extra; never lose the timed results for it
            say(f"  --track-memory failed on this strategy: {type(e).__name__}: {e}")
            rank_mem["peak_tensor_bytes"] = None
    if info.world_size == 1:
        return [rank_mem]
    all_mem = [None] * info.world_size
    dist.all_gather_object(all_mem, rank_mem)
    return all_mem


def _summary(
    cfg: GPTPlan,
    engine: GPTEngine,
    info,
    rec: StepRecorder,
    all_mem: list[dict],
    build_s: float,
    tf32,
    config: dict,
    env: dict,
) -> dict:
    device, world, params, tokens_per_step = torch.device(info.device), info.world_size, rec.params, rec.tokens_per_step
    model_cfg, spec, seq = cfg.model, cfg.strategy, cfg.seq
    st = summarize(rec.times)
    med = st["median"]
    tok_s = tokens_per_step / med
    tfl_model = rec.model_fpt * tok_s / world / 1e12
    hw_fpt = hardware_flops_per_token(model_cfg, seq, spec.ckpt)
    return {
        "strategy": spec.text,
        "predicted_peak_bytes": cfg.predicted_peak_bytes,  # the plan's: the pre-flight check used the same
        "impl": cfg.impl,
        "model": cfg.model_name,
        "world_size": world,
        "degrees": {"dp": engine.degrees.dp, "tp": engine.degrees.tp, "pp": engine.degrees.pp},
        "params": params,
        "global_batch": cfg.global_batch,
        "micro_batch": cfg.micro_batch,
        "seq_len": seq,
        "tokens_per_step": tokens_per_step,
        "warmup_steps": cfg.warmup,
        "timed_steps": cfg.steps,
        "build_seconds": build_s,
        "warmup_seconds": sum(rec.warm_times),
        "step_seconds_median": med,
        "step_seconds": st,
        "step_seconds_all": rec.times,
        "tokens_per_s": tok_s,
        "tokens_per_s_per_device": tok_s / world,
        # model FLOPs (6N + 12·L·C·T per token), the MFU basis
        "tflops_per_device": tfl_model,
        "tflops_per_device_6n_ckpt": flops_per_token(model_cfg, seq, checkpointing=spec.ckpt == "full")
        * tok_s
        / world
        / 1e12,  # the "+2N with ckpt"
        "tflops_per_device_hardware": hw_fpt * tok_s / world / 1e12,  # with the recomputation done
        # the handout's get_tflops with the handout's get_model_size (tied embedding counted twice) …
        "params_handout": handout_param_count(model_cfg),
        "tflops_per_device_handout": handout_tflops(handout_param_count(model_cfg), cfg.global_batch, seq, med) / world,
        # … and the same 8·N·B·T formula with the distinct parameter count
        "tflops_per_device_8n": handout_tflops(params, cfg.global_batch, seq, med) / world,
        "flops_per_token": rec.model_fpt,
        "peak_tflops": rec.peak,
        "peak_tflops_source": rec.peak_src,
        "mfu": mfu(tfl_model, rec.peak),
        # FP8's dense peak is twice bf16's on Hopper (H100/H200 data sheets: 1979 vs 989 TFLOP/s)
        "mfu_fp8_peak": mfu(tfl_model, 2 * rec.peak) if cfg.fp8 and rec.peak else None,
        "hfu": mfu(hw_fpt * tok_s / world / 1e12, rec.peak),
        "peak_memory_bytes": max((m["peak_bytes"] or 0) for m in all_mem),
        "peak_memory_kind": "allocated" if device.type == "cuda" else "process RSS",
        "peak_memory_per_rank": all_mem,
        "peak_tensor_bytes": max((m.get("peak_tensor_bytes") or 0) for m in all_mem) or None,
        "losses": rec.losses,
        # the tokens are uniform over the vocabulary, new every step: no model's expected loss is below
        # their entropy ln V (ln 50257 = 10.82 for GPT-2), so a loss near it is the floor, not a failure to learn
        "loss_floor_uniform_tokens": math.log(model_cfg.vocab_size),
        "device": str(device),
        "device_name": device_name(device),
        "tf32": tf32,
        "config": config,
        "env": env,
    }


def _say_summary(summary: dict, all_mem: list[dict], say) -> None:
    s, world, params = summary, summary["world_size"], summary["params"]
    say(
        f"summary {s['strategy']} ({world} rank(s), {s['impl']}): step {format_spread(s['step_seconds'], 1e3, ' ms')}  "
        f"{s['tokens_per_s']:,.0f} tok/s ({s['tokens_per_s_per_device']:,.0f}/device)  TFLOPS/device: 6N+attn "
        f"{s['tflops_per_device']:.3f}, +2N ckpt {s['tflops_per_device_6n_ckpt']:.3f}, handout 8·N·B·T "
        f"{s['tflops_per_device_handout']:.3f} (N = {s['params_handout']:,}, its get_model_size), 8·N·B·T "
        f"{s['tflops_per_device_8n']:.3f} (N = {params:,})  MFU {_pct(s['mfu'])}"
    )
    say(
        f"  loss {s['losses'][0]:.4f} → {s['losses'][-1]:.4f}; floor for uniform random tokens: "
        f"ln V = ln {s['config']['model']['vocab_size']} = "
        f"{s['loss_floor_uniform_tokens']:.2f} (no model predicts fresh uniform tokens better)"
    )
    if s["predicted_peak_bytes"] is not None:
        say(
            f"  planner predicted peak {_fmt_bytes(s['predicted_peak_bytes'])} per device "
            "(compare with peak allocated on CUDA; on CPU RSS includes the runtime)"
        )
    for r, m in enumerate(all_mem):
        say(
            f"  rank {r}: peak allocated {_fmt_bytes(m.get('peak_allocated_bytes'))}, reserved "
            f"{_fmt_bytes(m.get('peak_reserved_bytes'))}, RSS {_fmt_bytes(m.get('peak_rss_bytes'))}"
            + (f", live tensors {_fmt_bytes(m['peak_tensor_bytes'])}" if m.get("peak_tensor_bytes") else "")
        )


def bench_command(cfg: GPTBenchConfig) -> int:
    """CLI entry: resolve the plan (every check, the planner's prediction), refuse a run that will not fit,
    then start --nproc workers under torchrun (the plan as JSON), else run here."""
    if under_torchrun() and "WORLD_SIZE" in os.environ:  # a user's own torchrun: its world is the run's
        cfg = replace(cfg, nproc=int(os.environ["WORLD_SIZE"]))
    plan = cfg.plan()  # fail before launching N processes
    shortfall = memory_shortfall(plan)  # the planner's estimate against free memory, before building anything
    if shortfall:
        raise HardwareError(shortfall)
    if plan.out:
        check_run_dir(plan.out, overwrite=plan.overwrite, resumable=False)
    if needs_launch(plan.world_size):
        return launch_workers(plan.world_size, "gpt-bench", plan=plan.to_dict())
    run_bench(plan, log=_log_for(plan))
    return 0


def _log_for(plan: GPTPlan):
    """Progress lines go to stdout, or to stderr when stdout carries the JSON (`--json -`)."""
    stream = sys.stderr if plan.json == "-" else sys.stdout
    return lambda *a: print(*a, file=stream, flush=True)


def bench_worker(spec: dict) -> int:
    """`trainlab worker SPEC.json` for "gpt-bench": one process (or torchrun rank) of a benchmark."""
    plan = GPTPlan.from_dict(spec.get("plan"), source="gpt bench spec")
    run_bench(plan, log=_log_for(plan))
    return 0  # the dispatcher ends the process (launch.end_worker)
