"""`trainlab gpt bench`: time one GPT-2 strategy on seeded random tokens, the same way for all.

Every rank builds a `GPTEngine`, runs `warmup` steps (compilation, allocator warm-up; excluded)
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
import time
from dataclasses import asdict, replace

import torch
import torch.distributed as dist

from trainlab.device import (device_name, free_memory, is_out_of_memory, peak_memory, peak_tflops, reset_peak_memory, set_tf32,
                             synchronize)
from trainlab.distributed.launch import (describe_timeout, destroy_distributed, exit_worker, init_distributed,
                                         launch_workers, needs_launch, under_torchrun)
from trainlab.errors import HardwareError, TrainingDiverged
from trainlab.gpt.config import BenchConfig
from trainlab.gpt.engine import GPTEngine
from trainlab.gpt.flops import flops_per_token, handout_param_count, handout_tflops, hardware_flops_per_token, mfu
from trainlab.gpt.model import count_params
from trainlab.gpt.planner import (measure_step_peak_bytes, memory_shortfall, out_of_memory_line, predict_memory,
                                  predicted_bytes)
from trainlab.io import atomic_write_json
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
    mem["peak_bytes"] = mem["peak_allocated_bytes"] if mem.get("peak_allocated_bytes") is not None else mem.get("peak_rss_bytes")
    return mem


def _predicted_peak(cfg: BenchConfig, model_cfg, spec, engine, seq: int, device: torch.device) -> int | None:
    """The planner's prediction for this run (ours only; HF's model differs in its activations)."""
    if cfg.impl != "ours" or spec.compile:  # compiled graphs fuse and free differently
        return None
    try:
        opt = "fused" if cfg.fused_optimizer else ("foreach" if device.type == "cuda" else "forloop")
        steps = engine.micro_steps
        micro = engine.per_rank_batch // steps if spec.pp else cfg.micro_batch  # pp: the pipeline's micro-batch
        return predict_memory(model_cfg, spec, engine.dist.world_size, micro, seq, tp=cfg.tp, pp=cfg.pp,
                              microbatches=steps if spec.pp else None, pp_schedule=cfg.pp_schedule,
                              accumulation_steps=1 if spec.pp else steps, optimizer=opt,
                              **device_attention_kwargs(device))["total_bytes"]
    except Exception:  # a prediction must never break a measurement
        return None


def device_attention_kwargs(device: torch.device) -> dict:
    """What decides the SDPA kernel on this device, for the planner: type, compute capability, cuDNN."""
    if device.type != "cuda":
        return {"device_type": device.type}
    major, minor = torch.cuda.get_device_capability(device)
    return {"device_type": "cuda", "sm": 10 * major + minor, "cudnn_version": torch.backends.cudnn.version()}


def _with_world_size(cfg: BenchConfig) -> BenchConfig:
    """In a torchrun worker the world size is the number of processes torchrun started."""
    if "WORLD_SIZE" in os.environ:
        return replace(cfg, nproc=int(os.environ["WORLD_SIZE"]))
    return cfg


def run_bench(cfg: BenchConfig, log=print, exit_when_done: bool = False) -> dict | None:
    """Run the benchmark in this process (a torchrun worker or the only process).

    Returns the summary on rank 0 and None on other ranks; writes --json / --out on rank 0.
    `exit_when_done` (torchrun workers): end the process once the results are written, without returning.
    """
    cfg = _with_world_size(cfg)
    model_cfg, spec, seq = cfg.validate()
    tf32 = set_tf32(cfg.tf32)
    info = init_distributed(device=None if cfg.device == "auto" else cfg.device)
    main = info.rank == 0
    say = log if main else (lambda *a, **k: None)
    device = torch.device(info.device)
    writer = None
    run, finished = None, False
    try:
        run = RunDir.claim(cfg.out, overwrite=cfg.overwrite, resumable=False) if main and cfg.out else None
        config = {k: v for k, v in asdict(cfg).items()}
        config.update(seq=seq, strategy=spec.text, world_size=info.world_size, dist_timeout=describe_timeout(None))
        env = collect_env(device)
        say(format_header(config, env))
        t0 = time.perf_counter()
        engine = GPTEngine(model_cfg, spec, info, lr=cfg.lr, seed=cfg.seed, global_batch=cfg.global_batch,
                           micro_batch=cfg.micro_batch, seq_len=seq, impl=cfg.impl, tp=cfg.tp, pp=cfg.pp,
                           pp_schedule=cfg.pp_schedule, microbatches=cfg.microbatches,
                           fused_optimizer=cfg.fused_optimizer)
        build_s = time.perf_counter() - t0
        params = count_params(model_cfg)
        world = info.world_size
        peak, peak_src = peak_tflops(device)
        model_fpt = flops_per_token(model_cfg, seq, checkpointing=False)
        ckpt_fpt = flops_per_token(model_cfg, seq, checkpointing=spec.ckpt == "full")
        hw_fpt = hardware_flops_per_token(model_cfg, seq, spec.ckpt)
        tokens_per_step = cfg.global_batch * seq
        say(f"built {spec.text} on {world} rank(s) of {device_name(device)} in {build_s:.1f} s; params {params:,}; "
            f"peak {peak if peak else 'n/a'} TFLOPS ({peak_src})")

        if run is not None:
            run.write_json("config.json", config)
            run.write_json("env.json", env)
            run.write_metrics([])
            writer = make_writer(run.path)

        losses, times = [], []
        warm_times = []
        busy = BusySnapshot()   # nvidia-smi during the timed steps (env.json's is taken idle)
        batches = token_batches(model_cfg.vocab_size, cfg.global_batch, seq, cfg.warmup + cfg.steps, cfg.seed)
        for i, tokens in enumerate(batches):
            timed = i >= cfg.warmup
            if i == cfg.warmup:
                reset_peak_memory(device)
            if world > 1:
                dist.barrier()
            synchronize(device)
            t = time.perf_counter()
            if i == cfg.warmup and main:
                busy.start()
            loss = engine.train_step(tokens)
            synchronize(device)
            dt = time.perf_counter() - t
            diverged = not math.isfinite(loss)
            if world > 1:  # the step is as slow as its slowest rank; a NaN on any rank stops them all
                dt_t = torch.tensor([dt, float(diverged)], dtype=torch.float64, device=device if device.type == "cuda" else "cpu")
                dist.all_reduce(dt_t, op=dist.ReduceOp.MAX)
                dt, diverged = float(dt_t[0].item()), bool(dt_t[1].item())
            if diverged:
                raise TrainingDiverged(f"gpt bench: the loss became non-finite ({loss} on rank {info.rank}) at step {i + 1} "
                                       f"(--lr {cfg.lr:g} too high?); the benchmark stopped, no summary was written")
            losses.append(loss)
            (times if timed else warm_times).append(dt)
            tok_s = tokens_per_step / dt
            tfl = model_fpt * tok_s / world / 1e12
            u = mfu(tfl, peak)
            mem = _rank_peak(device)
            tag = f"step {i + 1 - cfg.warmup}/{cfg.steps}" if timed else f"warmup {i + 1}/{cfg.warmup}"
            say(f"{tag:>14}  loss {loss:.4f}  {dt * 1e3:9.1f} ms  {tok_s:12,.0f} tok/s  {tfl:8.3f} TFLOPS/dev  "
                f"MFU {'n/a' if u is None else f'{100 * u:5.1f}%'}  peak {_fmt_bytes(mem['peak_bytes'])}")
            if run is not None:
                run.append_metric({"step": i + 1, "timed": timed, "loss": loss, "step_s": dt, "tokens_per_s": tok_s,
                                   "tflops_per_device": tfl, "mfu": u, "peak_bytes": mem["peak_bytes"]})
                writer.add_scalar("loss", loss, i + 1)
                writer.add_scalar("step_ms", dt * 1e3, i + 1)
                writer.add_scalar("tokens_per_s", tok_s, i + 1)
                writer.add_scalar("tflops_per_device", tfl, i + 1)
                if u is not None:
                    writer.add_scalar("mfu", u, i + 1)
                if mem["peak_bytes"] is not None:
                    writer.add_scalar("peak_memory_gib", mem["peak_bytes"] / GiB, i + 1)

        snapshot = busy.finish() if main else None
        if snapshot is not None:
            env["nvidia_smi_busy"] = snapshot
            if run is not None:
                run.write_json("env.json", env)
                run.write_text("nvidia-smi-busy.txt", snapshot["text"])
        rank_mem = _rank_peak(device)
        if cfg.track_memory:
            # after timing: the per-op bookkeeping slows the step, and this step is not in `losses`
            try:
                rank_mem["peak_tensor_bytes"] = measure_step_peak_bytes(engine, tokens, warm=True)
            except Exception as e:  # the measurement is an extra; never lose the timed results for it
                say(f"  --track-memory failed on this strategy: {type(e).__name__}: {e}")
                rank_mem["peak_tensor_bytes"] = None
        all_mem = [None] * world
        if world > 1:
            dist.all_gather_object(all_mem, rank_mem)
        else:
            all_mem = [rank_mem]
        if not main:
            dist.barrier()  # leave together: tearing down gloo while a peer still works can hang
            finished = True
            return None

        st = summarize(times)
        med = st["median"]
        tok_s = tokens_per_step / med
        tfl_model = model_fpt * tok_s / world / 1e12
        summary = {
            "strategy": spec.text,
            "predicted_peak_bytes": _predicted_peak(cfg, model_cfg, spec, engine, seq, device),
            "impl": cfg.impl,
            "model": cfg.model,
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
            "warmup_seconds": sum(warm_times),
            "step_seconds_median": med,
            "step_seconds": st,
            "step_seconds_all": times,
            "tokens_per_s": tok_s,
            "tokens_per_s_per_device": tok_s / world,
            # model FLOPs (6N + 12·L·C·T per token), the MFU basis
            "tflops_per_device": tfl_model,
            "tflops_per_device_6n_ckpt": ckpt_fpt * tok_s / world / 1e12,   # the "+2N with ckpt"
            "tflops_per_device_hardware": hw_fpt * tok_s / world / 1e12,    # with the recomputation done
            # the handout's get_tflops with the handout's get_model_size (tied embedding counted twice) …
            "params_handout": handout_param_count(model_cfg),
            "tflops_per_device_handout": handout_tflops(handout_param_count(model_cfg), cfg.global_batch, seq, med) / world,
            # … and the same 8·N·B·T formula with the distinct parameter count
            "tflops_per_device_8n": handout_tflops(params, cfg.global_batch, seq, med) / world,
            "flops_per_token": model_fpt,
            "peak_tflops": peak,
            "peak_tflops_source": peak_src,
            "mfu": mfu(tfl_model, peak),
            "hfu": mfu(hw_fpt * tok_s / world / 1e12, peak),
            "peak_memory_bytes": max((m["peak_bytes"] or 0) for m in all_mem),
            "peak_memory_kind": "allocated" if device.type == "cuda" else "process RSS",
            "peak_memory_per_rank": all_mem,
            "peak_tensor_bytes": max((m.get("peak_tensor_bytes") or 0) for m in all_mem) or None,
            "losses": losses,
            "device": str(device),
            "device_name": device_name(device),
            "tf32": tf32,
            "config": config,
            "env": env,
        }
        say(f"summary {spec.text} ({world} rank(s), {cfg.impl}): step {format_spread(st, 1e3, ' ms')}  "
            f"{tok_s:,.0f} tok/s ({tok_s / world:,.0f}/device)  TFLOPS/device: 6N+attn {tfl_model:.3f}, "
            f"+2N ckpt {summary['tflops_per_device_6n_ckpt']:.3f}, handout 8·N·B·T {summary['tflops_per_device_handout']:.3f} "
            f"(N = {summary['params_handout']:,}, its get_model_size), 8·N·B·T {summary['tflops_per_device_8n']:.3f} (N = {params:,})  "
            f"MFU {_pct(summary['mfu'])}")
        if summary["predicted_peak_bytes"] is not None:
            say(f"  planner predicted peak {_fmt_bytes(summary['predicted_peak_bytes'])} per device "
                "(compare with peak allocated on CUDA; on CPU RSS includes the runtime)")
        for r, m in enumerate(all_mem):
            say(f"  rank {r}: peak allocated {_fmt_bytes(m.get('peak_allocated_bytes'))}, reserved "
                f"{_fmt_bytes(m.get('peak_reserved_bytes'))}, RSS {_fmt_bytes(m.get('peak_rss_bytes'))}"
                + (f", live tensors {_fmt_bytes(m['peak_tensor_bytes'])}" if m.get("peak_tensor_bytes") else ""))
        if cfg.json:
            atomic_write_json(cfg.json, summary)
        if run is not None:
            run.write_json("summary.json", summary)
        if world > 1:
            dist.barrier()
        finished = True
        return summary
    except (RuntimeError, MemoryError) as e:
        if not is_out_of_memory(e):
            raise
        # one line, not a failed row or "a bug in trainlab": what the planner expected, what was free
        raise HardwareError(out_of_memory_line(predicted_bytes(cfg), free_memory(device), f"{device}, at run time")) from None
    finally:
        if writer is not None:
            writer.close()
        if run is not None:
            run.release(failed=not finished)
        if finished and exit_when_done:
            # A torchrun worker whose results are written ends here, inside this frame. Returning would
            # destroy the DDP model and its gloo process group on this thread, and that destructor can
            # block for good once the peer rank has exited (a hung 2-rank `gpt bench` under load,
            # py-spy: the worker idle in the return from run_bench, after the summary was printed).
            exit_worker(0)
        destroy_distributed()


def bench_command(cfg: BenchConfig) -> int:
    """CLI entry: validate, start --nproc workers under torchrun (the config as JSON), else run here."""
    cfg.validate()  # fail before launching N processes
    shortfall = memory_shortfall(cfg)  # the planner's estimate against free memory, before building anything
    if shortfall:
        raise HardwareError(shortfall)
    if cfg.out:
        check_run_dir(cfg.out, overwrite=cfg.overwrite, resumable=False)
    if needs_launch(cfg.nproc):
        return launch_workers(cfg.nproc, "gpt-bench", config=cfg.to_dict())
    run_bench(cfg, log=lambda *a: print(*a, flush=True))
    return 0


def bench_worker(spec: dict) -> int:
    """`trainlab worker SPEC.json` for "gpt-bench": one process (or torchrun rank) of a benchmark."""
    run_bench(BenchConfig.from_dict(spec["config"], source="gpt bench spec"), log=lambda *a: print(*a, flush=True),
              exit_when_done=under_torchrun())
    return 0
