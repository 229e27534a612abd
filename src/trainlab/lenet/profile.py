"""`trainlab profile`: where a LeNet-5 training step goes, layer by layer, forward and backward,
for PyTorch's layers and ours, and for training settings, side by side — the analysis the course
report did by hand.

Variants: `--ops aten|fused|auto|own[=IMPL]` (whose layers), and `--variant NAME:KEY=VALUE,...` for any mix of
training settings — ops, act, amp (bf16|off), channels_last (on|off), batchnorm, batchnorm_conv1,
batch_size, threads — e.g. `--variant bf16-cl-bn234:amp=bf16,channels_last=on,batchnorm=true,batchnorm_conv1=false`.
Layers are named conv1, bn1, relu1, pool1, conv2, bn2, …, fc3: a BatchNorm by the layer it follows
(bn2 follows conv2 even without bn1, bn3 follows fc1). `--wall-steps N` also times N steps of each
variant without the profiler (its own overhead is not the step's), interleaved by the shared timer
(trainlab.stats.time_interleaved), for the wall time per step and images/s.

How the time is attributed (torch.profiler, no guessing from wall clocks):
  * forward: each layer runs inside a `record_function("layer:<name>")` range opened and closed by
    module hooks, so a layer's forward time is its range's duration;
  * backward: every op recorded inside a layer's forward range carries the sequence number of the
    autograd node it created, and the profiler records each backward node as
    `autograd::engine::evaluate_function: <Node>` with that same sequence number — so each backward
    node is charged to the layer whose forward created it (weight and bias gradients included);
  * the rest of the step is the loss (forward range + its backward nodes), the optimizer
    (`Optimizer.step#…`, `Optimizer.zero_grad#…`), gradient accumulation into `.grad`
    (AccumulateGrad nodes) and "other" (what is left of the step's range: Python, hooks, the loader).
The variants are profiled in one session with their steps interleaved — step 1 of every variant,
then step 2, … in rotating order — because on a shared machine the load changes by the second,
and variants profiled one after the other are not comparable (measured: a 1.47x "slowdown" of one
variant that was 1.0x when interleaved). Each step runs in a `record_function("trainlab.step:<variant>")`
range; every number is per step (median and p10/p90 over the profiled steps; warm-up steps are run
first and not profiled). On a GPU the device time of the kernels is reported next to the CPU time.

Output, in the run directory: `profile.json/.md/.log` (the table; `trainlab report` renders
profile.json) and one Chrome trace with every variant's steps, `trace.json.gz` (open it in
Perfetto, https://ui.perfetto.dev, or chrome://tracing).
"""

from __future__ import annotations

import bisect
import sys
import time
from datetime import datetime
from pathlib import Path

import torch
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile, record_function

from trainlab.data.mnist import load_mnist
from trainlab.device import resolve_device, synchronize
from trainlab.io import record_written, write_json_output
from trainlab.lenet.batches import build_train_batches, to_device
from trainlab.lenet.config import ProfileConfig, TrainConfig
from trainlab.lenet.plan import resolve
from trainlab.lenet.setup import build_model, build_optimizer
from trainlab.lenet.step import make_step
from trainlab.ops.conv_relu_pool2d import ConvReluPool2d
from trainlab.results.kinds import plan_record, stamp
from trainlab.stats import summarize, time_interleaved
from trainlab.telemetry.env import collect_env, format_header
from trainlab.telemetry.results import write_results
from trainlab.telemetry.rundir import RunDir

STEP = "trainlab.step:"  # + the variant
LAYER_PREFIX = "layer:"
BACKWARD_PREFIX = "autograd::engine::evaluate_function: "


def layer_names(model: nn.Module) -> dict[str, nn.Module]:
    """conv1, bn1, relu1, pool1, …, fc3 → module, in forward order (Identity placeholders skipped; the
    fused first stage of --ops fused is conv1+relu1+pool1).
    A BatchNorm is named by the layer it normalizes: bn2 follows conv2 even without bn1, bn3 fc1."""
    names, counts = {}, {}
    for module in list(model.features) + list(model.classifier):
        if isinstance(module, nn.Identity):
            continue
        if isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d)):
            names[f"bn{counts.get('conv', 0) + counts.get('fc', 0)}"] = module
            continue
        if isinstance(module, ConvReluPool2d):  # --ops fused: one module, three layers' names
            for kind in ("conv", "relu", "pool"):
                counts[kind] = counts.get(kind, 0) + 1
            names[f"conv{counts['conv']}+relu{counts['relu']}+pool{counts['pool']}"] = module
            continue
        kind = (
            "conv"
            if isinstance(module, nn.Conv2d)
            else "fc"
            if isinstance(module, nn.Linear)
            else "pool"
            if isinstance(module, (nn.MaxPool2d, nn.AvgPool2d))
            else "flatten"
            if isinstance(module, nn.Flatten)
            else type(module).__name__.lower()
        )
        counts[kind] = counts.get(kind, 0) + 1
        names[kind if kind == "flatten" else f"{kind}{counts[kind]}"] = module
    return names


def instrument(model: nn.Module) -> list:
    """Wrap every layer's forward in a record_function range (module hooks); returns the handles."""
    handles = []
    for name, module in layer_names(model).items():
        ranges = []

        def enter(_module, _inputs, name=name, ranges=ranges):
            ranges.append(record_function(LAYER_PREFIX + name).__enter__())

        def leave(_module, _inputs, _output, ranges=ranges):
            ranges.pop().__exit__(None, None, None)

        handles += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
    return handles


def _descendants(event):
    for child in event.cpu_children:
        yield child
        yield from _descendants(child)


def attribute(events) -> dict[str, list[dict]]:
    """{variant: per profiled step {part: (cpu_us, device_us)}} for each layer's forward and
    backward and the rest of the step, from the profiler's events (see the module docstring)."""
    steps = sorted((e for e in events if e.name.startswith(STEP)), key=lambda e: e.time_range.start)
    owner: dict[tuple, str] = {}  # (thread, sequence_nr) of a forward op -> the part that created it
    for e in events:
        part = e.name[len(LAYER_PREFIX) :] if e.name.startswith(LAYER_PREFIX) else "loss" if e.name == "loss" else None
        if part:
            for d in _descendants(e):
                if d.sequence_nr >= 0:
                    owner[(d.thread, d.sequence_nr)] = part
    per_step = [{} for _ in steps]
    starts = [s.time_range.start for s in steps]

    def charge(event, part):
        start = event.time_range.start
        i = bisect.bisect_right(starts, start) - 1  # the last step that began before this event
        if i >= 0 and start <= steps[i].time_range.end:
            cpu, dev = per_step[i].get(part, (0.0, 0.0))
            per_step[i][part] = (cpu + event.time_range.elapsed_us(), dev + (event.device_time_total or 0.0))

    for e in events:
        if e.name.startswith(LAYER_PREFIX):
            charge(e, e.name[len(LAYER_PREFIX) :] + ".fwd")
        elif e.name == "loss":
            charge(e, "loss.fwd")
        elif e.name.startswith(BACKWARD_PREFIX):
            node = e.name[len(BACKWARD_PREFIX) :]
            part = owner.get((e.fwd_thread if e.fwd_thread is not None else e.thread, e.sequence_nr))
            charge(e, f"{part}.bwd" if part else "accumulate_grad" if "AccumulateGrad" in node else "other_bwd")
        elif e.name.startswith("Optimizer.step#"):
            charge(e, "optimizer.step")
        elif e.name.startswith("Optimizer.zero_grad#"):
            charge(e, "optimizer.zero_grad")
    by_variant: dict[str, list[dict]] = {}
    for i, s in enumerate(steps):
        per_step[i]["step"] = (s.time_range.elapsed_us(), s.device_time_total or 0.0)
        accounted = sum(cpu for part, (cpu, _) in per_step[i].items() if part != "step")
        per_step[i]["other"] = (max(0.0, per_step[i]["step"][0] - accounted), 0.0)
        by_variant.setdefault(s.name[len(STEP) :], []).append(per_step[i])
    return by_variant


class Variant:
    """One LeNet-5 variant ready to train: model (instrumented), optimizer, precision, memory format,
    threads, its own batch order — built as `trainlab train` builds them from the same settings."""

    def __init__(self, name: str, settings: dict, cfg: ProfileConfig, data, device: torch.device):
        train_settings = {
            "act": cfg.act,
            "batch_size": cfg.batch_size,
            "amp": "off",
            "channels_last": "off",
            **{k: v for k, v in settings.items() if k != "threads"},
        }
        # the profiled step is the eager one: torch.compile and CUDA graphs would hide the layers
        tcfg = TrainConfig(
            **train_settings, seed=cfg.seed, train_subset=cfg.train_subset, device=str(device), step_mode="eager"
        )
        plan = resolve(tcfg, device)
        self.name, self.settings, self.batch_size = name, settings, tcfg.batch_size
        self.threads, self.device, self.channels_last = settings.get("threads"), device, plan.channels_last
        self.model = build_model(plan)  # every variant starts from the same weights (the seed)
        self.training_step = make_step(plan, self.model, build_optimizer(plan, self.model), annotate=True)
        self.batches = build_train_batches(tcfg, data, device)
        self.layers = list(layer_names(self.model))
        self.handles = instrument(self.model)
        self.epoch, self.it = -1, iter(())

    def next_batch(self):
        try:
            return next(self.it)
        except StopIteration:  # epoch 0 is the warm-up's; profiled steps start at epoch 1
            self.epoch += 1
            self.batches.set_epoch(self.epoch)
            self.it = iter(self.batches)
            return next(self.it)

    def step(self) -> None:
        x, y = to_device(*self.next_batch(), self.device, self.channels_last)
        before = torch.get_num_threads()
        if self.threads:
            torch.set_num_threads(self.threads)
        try:
            with record_function(STEP + self.name):
                self.training_step(x, y)  # the library's step (lenet.step), the loss in its own range
        finally:
            torch.set_num_threads(before)


def profile_variants(cfg: ProfileConfig, data, device: torch.device, out: Path, log=print) -> dict:
    """Warm every variant up, optionally time `cfg.wall_steps` steps of each without the profiler,
    then profile `cfg.steps` (or one epoch of) training steps of each, the variants' steps
    interleaved in rotating order, in one profiler session."""
    runs = [Variant(name, settings, cfg, data, device) for name, settings in cfg.settings().items()]
    variants = [run.name for run in runs]
    for run in runs:
        for _ in range(cfg.warmup):
            run.step()
    wall = {}
    if cfg.wall_steps:
        for run in runs:  # the hooks' record_function ranges cost next to nothing outside a profiler
            run.epoch, run.it = 0, iter(())
        wall = time_interleaved(
            {run.name: run.step for run in runs}, warmup=0, rounds=cfg.wall_steps, sync=lambda: synchronize(device)
        )
        for run in runs:
            ms = wall[run.name]["median"] * 1e3
            log(f"{run.name:<32} wall {ms:8.2f} ms/step  {run.batch_size / ms * 1e3:>9,.0f} images/s (no profiler)")
    for run in runs:
        run.epoch, run.it = 0, iter(())  # profiled steps: from the start of epoch 1, in order
    n_steps = cfg.steps or len(runs[0].batches)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    synchronize(device)
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        for i in range(n_steps):
            for run in runs[i % len(runs) :] + runs[: i % len(runs)]:
                run.step()
            synchronize(device)
    wall_s = time.perf_counter() - t0
    for run in runs:
        for h in run.handles:
            h.remove()
    trace = None
    if cfg.trace:
        trace = out / "trace.json.gz"
        prof.export_chrome_trace(str(trace))
        record_written(trace)
    per_step = attribute(prof.events())
    log(
        f"profiled {n_steps} steps of each of {', '.join(variants)} in {wall_s:.1f} s"
        + (f"; trace {trace}" if trace else "")
    )
    return {
        "steps": n_steps,
        "wall_s": wall_s,
        "trace": str(trace) if trace else None,
        "variants": [
            {
                "variant": run.name,
                "settings": run.settings,
                "batch_size": run.batch_size,
                "layers": run.layers,
                "per_step": per_step.get(run.name, []),
                "wall_ms_per_step": wall[run.name]["median"] * 1e3 if run.name in wall else None,
            }
            for run in runs
        ],
    }


def summarize_parts(result: dict) -> list[dict]:
    """One row per part (layers in order, then loss, optimizer, accumulate_grad, other, step):
    median/p10/p90 ms per step of forward and backward (CPU time; device time on a GPU)."""
    parts = [*result["layers"], "loss"]
    rows = []

    def series(key, idx):
        return [s.get(key, (0.0, 0.0))[idx] / 1e3 for s in result["per_step"]]

    for part in parts:
        fwd, bwd = summarize(series(f"{part}.fwd", 0)), summarize(series(f"{part}.bwd", 0))
        rows.append(
            {
                "variant": result["variant"],
                "layer": part,
                "fwd_ms_median": fwd["median"],
                "fwd_ms_p10": fwd["p10"],
                "fwd_ms_p90": fwd["p90"],
                "bwd_ms_median": bwd["median"],
                "bwd_ms_p10": bwd["p10"],
                "bwd_ms_p90": bwd["p90"],
                "fwd_device_ms_median": summarize(series(f"{part}.fwd", 1))["median"],
                "bwd_device_ms_median": summarize(series(f"{part}.bwd", 1))["median"],
            }
        )
    for part in ("optimizer.zero_grad", "optimizer.step", "accumulate_grad", "other_bwd", "other", "step"):
        s = summarize(series(part, 0))
        rows.append(
            {
                "variant": result["variant"],
                "layer": part,
                "fwd_ms_median": None,
                "fwd_ms_p10": None,
                "fwd_ms_p90": None,
                "bwd_ms_median": None,
                "bwd_ms_p10": None,
                "bwd_ms_p90": None,
                "total_ms_median": s["median"],
                "total_ms_p10": s["p10"],
                "total_ms_p90": s["p90"],
                "total_device_ms_median": summarize(series(part, 1))["median"],
            }
        )
    for r in rows:
        r.setdefault("total_ms_median", (r["fwd_ms_median"] or 0.0) + (r["bwd_ms_median"] or 0.0))
    return rows


def format_table(rows: list[dict], variants: list[str], walls: dict | None = None) -> str:
    """Layers down, variants across: fwd / bwd ms per step (medians), and each variant's total
    against the first variant's; then, when measured, each variant's wall time without the profiler
    (`walls`: {variant: (ms per step, batch size)})."""
    by = {(r["variant"], r["layer"]): r for r in rows}
    per_variant = [[r["layer"] for r in rows if r["variant"] == v] for v in variants]
    layers = list(dict.fromkeys(max(per_variant, key=len) + [r["layer"] for r in rows]))  # BatchNorm rows in place
    w = max(16, *(len(v) + 5 for v in variants))
    rw = max(22, *(len(variants[0]) + len(v) + 6 for v in variants))
    head = f"{'part':<20}" + "".join(f"{v + ' fwd':>{w}}{v + ' bwd':>{w}}" for v in variants)
    if len(variants) > 1:
        head += "".join(f"{'x ' + variants[0] + ' (' + v + ')':>{rw}}" for v in variants[1:])
    lines = [
        "ms per training step, median over the profiled steps, variants interleaved step by step "
        "(CPU time; p10/p90 in profile.json)",
        head,
    ]
    for layer in layers:
        cells = []
        for v in variants:
            r = by.get((v, layer))
            if r is None:
                cells += ["-", "-"]
            elif r["fwd_ms_median"] is None:  # not split into forward/backward
                cells += [f"{r['total_ms_median']:.3f}", ""]
            else:
                cells += [f"{r['fwd_ms_median']:.3f}", f"{r['bwd_ms_median']:.3f}"]
        line = f"{layer:<20}" + "".join(f"{c:>{w}}" for c in cells)
        base = by.get((variants[0], layer))
        for v in variants[1:]:
            r = by.get((v, layer))
            ok = base and r and base["total_ms_median"]
            line += f"{(r['total_ms_median'] / base['total_ms_median']) if ok else float('nan'):>{rw}.2f}"
        lines.append(line)
    for v, (ms, batch) in (walls or {}).items():
        lines.append(f"wall, no profiler: {v} {ms:.2f} ms/step, {batch / ms * 1e3:,.0f} images/s (batch {batch})")
    return "\n".join(lines)


def run_profile(cfg: ProfileConfig, command: str = "trainlab profile", log=print) -> dict:
    cfg.validate()
    variants = cfg.variants
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    device = resolve_device(cfg.device)
    path = Path(cfg.out) if cfg.out else Path("runs") / f"profile-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    with RunDir.claim(path, overwrite=cfg.overwrite, resumable=False) as run:
        data = load_mnist(None)
        env = collect_env(device)
        header = format_header({**cfg.to_dict(), "variants": ",".join(variants), "run_dir": str(run.path)}, env)
        log(header)
        run.write_json("config.json", cfg.to_dict())  # the first write (with --overwrite: the old files go now)
        result = profile_variants(cfg, data, device, run.path, log)
        rows = [r for res in result["variants"] for r in summarize_parts(res)]
        table = format_table(
            rows,
            variants,
            {
                res["variant"]: (res["wall_ms_per_step"], res["batch_size"])
                for res in result["variants"]
                if res["wall_ms_per_step"]
            },
        )
        payload = {
            "config": cfg.to_dict(),
            "device": str(device),
            "torch_threads": torch.get_num_threads(),
            "variants": variants,
            "steps": result["steps"],
            "batch_size": cfg.batch_size,
            "rows": rows,
            "trace": result["trace"],
            "wall_s": result["wall_s"],
            "interleaved": True,
            # the raw attribution: per variant, per step, {part: [cpu_us, device_us]}
            "per_step": {res["variant"]: res["per_step"] for res in result["variants"]},
            "settings": {res["variant"]: res["settings"] for res in result["variants"]},
            "wall_ms_per_step": {res["variant"]: res["wall_ms_per_step"] for res in result["variants"]},
        }
        plan = plan_record(
            str(device),
            device_name=env["gpus"][0] if device.type == "cuda" and env["gpus"] else env["cpu"],
            threads=torch.get_num_threads(),
            model={"name": "lenet5"},
            resolved=cfg.to_dict(),
        )
        write_results(
            run.path,
            "profile",
            payload,
            f"# LeNet-5 per-layer profile\n\n```\n{table}\n```",
            [header, "", table],
            command,
            kind="lenet_profile",
            plan=plan,
            env=env,
        )
    # the --json copy is the record the run folder holds (stamped: `trainlab report` reads either)
    return {
        **stamp("lenet_profile", {"command": command, "env": env, **payload}, plan),
        "table": table,
        "run_dir": str(run.path),
    }


def run_profile_cmd(cfg: ProfileConfig, command: str) -> int:
    result = run_profile(
        cfg, command, log=(lambda *a, **k: print(*a, file=sys.stderr, **k)) if cfg.json == "-" else print
    )
    if cfg.json:
        write_json_output(cfg.json, {k: v for k, v in result.items() if k != "table"})
    if cfg.json != "-":
        print(result["table"])
        print(
            f"wrote {result['run_dir']}/profile.{{json,md,log}}" + (f", {result['trace']}" if result["trace"] else "")
        )
    return 0
