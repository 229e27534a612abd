"""`trainlab gpt bench`: time one GPT-2 strategy on seeded random tokens, the same way for all.

Every rank builds a `GPTEngine`, runs `warmup` steps (compilation, allocator warm-up; excluded)
and `steps` timed steps. A step is timed from a barrier to the returned loss (a host sync: the
loss is a Python float) with the device synchronized on both ends, and the slowest rank's time is
the step time. Tokens for step i are drawn from a generator seeded by `seed`, so every strategy
trains on exactly the same global batches.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, fields, replace

import torch

from trainlab.errors import ConfigError

GiB = 1024**3


@dataclass
class BenchConfig:
    model: str = "tiny"               # preset name (trainlab.models.gpt.PRESETS)
    strategy: str = "none"            # '+'-joined strategy (trainlab.parallel.strategy)
    nproc: int = 1                    # processes (one per GPU); >1 relaunches under torchrun
    steps: int = 10                   # timed optimizer steps
    warmup: int = 2                   # untimed steps before them (compile, allocator, caches)
    global_batch: int = 8             # sequences per optimizer step, identical for every strategy
    micro_batch: int = 8              # sequences per forward/backward on one rank
    seq: int | None = None            # sequence length (default: the model's n_positions)
    device: str = "auto"              # auto | cpu | cuda
    impl: str = "ours"                # ours | hf (HF GPT2LMHeadModel, the handout's baseline)
    tp: int = 1                       # tensor-parallel degree (with tp; default: all ranks)
    pp: int = 1                       # pipeline stages (with pp; default: all ranks)
    pp_schedule: str = "1f1b"         # 1f1b | gpipe
    microbatches: int | None = None   # pipeline micro-batches (default: per-rank batch / micro-batch)
    lr: float = 5e-4                  # the handout's learning rate
    seed: int = 0                     # weights and tokens
    fused_optimizer: bool = False     # AdamW(fused=True) (GPU)
    track_memory: bool = False        # one extra, untimed step counting live tensor bytes (CPU: exact peak)
    json: str | None = None           # write the summary here
    out: str | None = None            # run directory: config, env, metrics.jsonl, TensorBoard, summary

    def to_argv(self, with_nproc: bool = True) -> list[str]:
        """This config as `trainlab gpt bench` arguments. Under torchrun the world size comes from
        the environment, and `--nproc` must not be passed: torchrun's own parser takes it as an
        ambiguous abbreviation of --nproc-per-node even after the module name."""
        argv = ["gpt", "bench"]
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "nproc" and not with_nproc:
                continue
            if value is None or value is False:
                continue
            flag = "--" + f.name.replace("_", "-")
            argv += [flag] if value is True else [flag, str(value)]
        return argv


def token_batches(vocab_size: int, global_batch: int, seq_len: int, n: int, seed: int):
    """`n` global batches of uniformly random token ids, as the handout's `get_dataloader` draws
    (`torch.randint(vocab_size, ...)`), from a generator seeded by `seed`."""
    gen = torch.Generator().manual_seed(seed + 12345)  # distinct from the weight-init streams
    for _ in range(n):
        yield torch.randint(vocab_size, (global_batch, seq_len), generator=gen)


def validate(cfg: BenchConfig):
    """Everything that can be checked before launching processes; returns (model cfg, spec, seq)."""
    from trainlab.models.gpt import get_preset
    from trainlab.parallel.strategy import parse_strategy, validate_strategy

    model_cfg = get_preset(cfg.model)
    spec = parse_strategy(cfg.strategy)
    if cfg.steps < 1:
        raise ConfigError(f"--steps {cfg.steps}: expected >= 1")
    if cfg.warmup < 0:
        raise ConfigError(f"--warmup {cfg.warmup}: expected >= 0")
    if cfg.lr <= 0:
        raise ConfigError(f"--lr {cfg.lr}: expected > 0")
    if cfg.pp_schedule not in ("1f1b", "gpipe"):
        raise ConfigError(f"--pp-schedule {cfg.pp_schedule!r}: expected 1f1b or gpipe")
    seq = cfg.seq or model_cfg.n_positions
    if cfg.device not in ("auto", "cpu", "cuda") and not cfg.device.startswith("cuda:"):
        raise ConfigError(f"--device {cfg.device!r}: expected auto, cpu or cuda")
    device = cfg.device if cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if cfg.global_batch >= 1 and cfg.micro_batch >= 1 and cfg.global_batch % cfg.micro_batch:
        raise ConfigError(f"--micro-batch {cfg.micro_batch}: must divide --global-batch {cfg.global_batch}")
    validate_strategy(spec, model_cfg, cfg.nproc, cfg.global_batch, cfg.micro_batch, device, tp=cfg.tp, pp=cfg.pp,
                      microbatches=cfg.microbatches, impl=cfg.impl, seq_len=seq, pp_schedule=cfg.pp_schedule)
    return model_cfg, spec, seq


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _fmt_bytes(n) -> str:
    if n is None:
        return "n/a"
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / 2**20:.1f} MiB"


def _rank_peak(device: torch.device) -> dict:
    from trainlab.device import peak_memory

    mem = peak_memory(device)
    mem["peak_bytes"] = mem["peak_allocated_bytes"] if mem.get("peak_allocated_bytes") is not None else mem.get("peak_rss_bytes")
    return mem


def _predicted_peak(cfg: BenchConfig, model_cfg, spec, engine, seq: int, device: torch.device) -> int | None:
    """The planner's prediction for this run (ours only; HF's model differs in its activations)."""
    from trainlab.bench.planner import predict_memory

    if cfg.impl != "ours" or spec.compile:  # compiled graphs fuse and free differently
        return None
    try:
        opt = "fused" if cfg.fused_optimizer else ("foreach" if device.type == "cuda" else "forloop")
        steps = engine.micro_steps
        micro = engine.per_rank_batch // steps if spec.pp else cfg.micro_batch  # pp: the pipeline's micro-batch
        return predict_memory(model_cfg, spec, engine.dist.world_size, micro, seq, tp=cfg.tp, pp=cfg.pp,
                              microbatches=steps if spec.pp else None, pp_schedule=cfg.pp_schedule,
                              accumulation_steps=1 if spec.pp else steps, optimizer=opt)["total_bytes"]
    except Exception:  # a prediction must never break a measurement
        return None


def _with_world_size(cfg: BenchConfig) -> BenchConfig:
    """In a torchrun worker the world size comes from the environment (relaunch drops --nproc)."""
    if "WORLD_SIZE" in os.environ:
        return replace(cfg, nproc=int(os.environ["WORLD_SIZE"]))
    return cfg


def run_bench(cfg: BenchConfig, log=print) -> dict | None:
    """Run the benchmark in this process (a torchrun worker or the only process).

    Returns the summary on rank 0 and None on other ranks; writes --json / --out on rank 0.
    """
    import torch.distributed as dist

    from trainlab.bench.flops import flops_per_token, handout_tflops, hardware_flops_per_token, mfu
    from trainlab.bench.stats import format_spread, summarize
    from trainlab.device import device_name, peak_tflops, reset_peak_memory, synchronize
    from trainlab.models.gpt import count_params
    from trainlab.parallel.engine import GPTEngine
    from trainlab.parallel.launch import destroy_distributed, init_distributed
    from trainlab.telemetry.env import collect_env, format_header

    cfg = _with_world_size(cfg)
    model_cfg, spec, seq = validate(cfg)
    info = init_distributed(device=None if cfg.device == "auto" else cfg.device)
    main = info.rank == 0
    say = log if main else (lambda *a, **k: None)
    device = torch.device(info.device)
    writer = None
    try:
        config = {k: v for k, v in asdict(cfg).items()}
        config.update(seq=seq, strategy=spec.text, world_size=info.world_size)
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

        if main and cfg.out:
            from torch.utils.tensorboard import SummaryWriter

            from trainlab.io import atomic_write_json

            os.makedirs(cfg.out, exist_ok=True)
            atomic_write_json(os.path.join(cfg.out, "config.json"), config)
            atomic_write_json(os.path.join(cfg.out, "env.json"), env)
            writer = SummaryWriter(cfg.out)
            metrics_path = os.path.join(cfg.out, "metrics.jsonl")
            open(metrics_path, "w").close()

        losses, times = [], []
        warm_times = []
        batches = token_batches(model_cfg.vocab_size, cfg.global_batch, seq, cfg.warmup + cfg.steps, cfg.seed)
        for i, tokens in enumerate(batches):
            timed = i >= cfg.warmup
            if i == cfg.warmup:
                reset_peak_memory(device)
            if world > 1:
                dist.barrier()
            synchronize(device)
            t = time.perf_counter()
            loss = engine.train_step(tokens)
            synchronize(device)
            dt = time.perf_counter() - t
            if world > 1:  # the step is as slow as its slowest rank
                dt_t = torch.tensor([dt], dtype=torch.float64, device=device if device.type == "cuda" else "cpu")
                dist.all_reduce(dt_t, op=dist.ReduceOp.MAX)
                dt = float(dt_t.item())
            losses.append(loss)
            (times if timed else warm_times).append(dt)
            tok_s = tokens_per_step / dt
            tfl = model_fpt * tok_s / world / 1e12
            u = mfu(tfl, peak)
            mem = _rank_peak(device)
            tag = f"step {i + 1 - cfg.warmup}/{cfg.steps}" if timed else f"warmup {i + 1}/{cfg.warmup}"
            say(f"{tag:>14}  loss {loss:.4f}  {dt * 1e3:9.1f} ms  {tok_s:12,.0f} tok/s  {tfl:8.3f} TFLOPS/dev  "
                f"MFU {'n/a' if u is None else f'{100 * u:5.1f}%'}  peak {_fmt_bytes(mem['peak_bytes'])}")
            if main and cfg.out:
                rec = {"step": i + 1, "timed": timed, "loss": loss, "step_s": dt, "tokens_per_s": tok_s,
                       "tflops_per_device": tfl, "mfu": u, "peak_bytes": mem["peak_bytes"]}
                with open(metrics_path, "a") as f:
                    f.write(json.dumps(rec) + "\n")
                writer.add_scalar("loss", loss, i + 1)
                writer.add_scalar("step_ms", dt * 1e3, i + 1)
                writer.add_scalar("tokens_per_s", tok_s, i + 1)
                writer.add_scalar("tflops_per_device", tfl, i + 1)
                if u is not None:
                    writer.add_scalar("mfu", u, i + 1)
                if mem["peak_bytes"] is not None:
                    writer.add_scalar("peak_memory_gib", mem["peak_bytes"] / GiB, i + 1)

        rank_mem = _rank_peak(device)
        if cfg.track_memory:
            from trainlab.bench.planner import measure_step_peak_bytes

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
            "tflops_per_device_handout": handout_tflops(params, cfg.global_batch, seq, med) / world,
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
            "config": config,
            "env": env,
        }
        say(f"summary {spec.text} ({world} rank(s), {cfg.impl}): step {format_spread(st, 1e3, ' ms')}  "
            f"{tok_s:,.0f} tok/s ({tok_s / world:,.0f}/device)  TFLOPS/device: 6N+attn {tfl_model:.3f}, "
            f"+2N ckpt {summary['tflops_per_device_6n_ckpt']:.3f}, handout 8·N·B·T {summary['tflops_per_device_handout']:.3f}  "
            f"MFU {_pct(summary['mfu'])}")
        if summary["predicted_peak_bytes"] is not None:
            say(f"  planner predicted peak {_fmt_bytes(summary['predicted_peak_bytes'])} per device "
                "(compare with peak allocated on CUDA; on CPU RSS includes the runtime)")
        for r, m in enumerate(all_mem):
            say(f"  rank {r}: peak allocated {_fmt_bytes(m.get('peak_allocated_bytes'))}, reserved "
                f"{_fmt_bytes(m.get('peak_reserved_bytes'))}, RSS {_fmt_bytes(m.get('peak_rss_bytes'))}"
                + (f", live tensors {_fmt_bytes(m['peak_tensor_bytes'])}" if m.get("peak_tensor_bytes") else ""))
        from trainlab.io import atomic_write_json

        if cfg.json:
            atomic_write_json(cfg.json, summary)
        if cfg.out:
            atomic_write_json(os.path.join(cfg.out, "summary.json"), summary)
        if world > 1:
            dist.barrier()
        return summary
    finally:
        if writer is not None:
            writer.close()
        destroy_distributed()


def bench_command(cfg: BenchConfig) -> int:
    """CLI entry: validate, relaunch under torchrun when --nproc > 1, else run here."""
    from trainlab.parallel.launch import exit_worker, relaunch_with_torchrun, under_torchrun

    cfg = _with_world_size(cfg)
    validate(cfg)  # fail before launching N processes
    rc = relaunch_with_torchrun(cfg.nproc, cfg.to_argv(with_nproc=False))
    if rc is not None:
        return rc
    run_bench(cfg, log=lambda *a: print(*a, flush=True))
    if under_torchrun():
        exit_worker(0)  # results are written; don't let a stuck gloo teardown hang torchrun
    return 0
