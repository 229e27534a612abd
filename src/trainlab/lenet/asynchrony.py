"""`trainlab async`: the notes' asynchronous-execution and automatic-parallelism experiments, measured.

Five experiments, each a row that sets the run without overlap beside the run with it and says what
the overlap bought (milliseconds and percent of the serial time):

1. queued vs finished — N LeNet-5 training steps (`lenet.step`, eager, and on CUDA the captured
   `cudagraph` step) timed without a synchronize (what the host *queued*) and with one (what the
   device *finished*): the gap is host time free for other work while the device runs.
2. the notes' exercise, t1 + N·t2 + t3 — the host hands an op to the device's queue (t1, the launch),
   the device runs it (t2), the host fetches the result (t3, a device→host copy that waits for it).
   Fetching every result before issuing the next op costs N·(t1 + t2 + t3); queueing all N and fetching
   once costs t1 + N·t2 + t3 when t2 ≥ t1 (the host stays ahead), and N·t1 + t2 + t3 otherwise (the
   device starves: launch-bound). Both are predicted from the measured t1, t2, t3 and then measured.
   The op is one n×n float32 matmul. t1: host seconds per launch with an idle device and a short burst
   (the queue never fills); t2: device seconds per op (CUDA events around N back-to-back ops); t3:
   fetching one element of a finished result (`.item()`).
3. two independent matmul chains on one CUDA stream vs two streams: a small matmul does not fill a
   big GPU, so two streams can run both chains' kernels at once. The results are checked equal.
4. a host-to-device copy overlapped with compute: the copy on a side stream while a matmul chain
   runs, from pinned memory (a DMA the GPU runs on its own) and from pageable memory (the driver
   stages it through a pinned buffer with the host's help: little or no overlap).
5. the CPU and the GPU working at once: a GPU matmul chain is queued and, while it runs, the host
   computes a CPU matmul chain; against running one after the other.

On a CPU, the host executes every op itself before returning: nothing is queued, so (1) and (2)
measure queued = finished and sync = async (the rows say so), (3) runs its CPU analogue (the two
chains in two host threads — inter-op parallelism — against one after the other), and (4) and (5),
which need a device beside the host, say why they do not apply.
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from trainlab.device import resolve_device, synchronize
from trainlab.io import atomic_write_json, atomic_write_text
from trainlab.lenet.config import AsyncConfig
from trainlab.results.kinds import plan_record, stamp

KIND = "async_parallelism"  # results.kinds.KINDS
NO_QUEUE = "the CPU runs each op before returning: nothing is queued"


# ------------------------------------------------------------------------------------------ timing


def _median_s(fn, device: torch.device, repeats: int) -> float:
    """Median wall seconds of `fn()`, the device idle before and synchronized after each call."""
    fn()  # warm-up: kernels loaded, allocator primed
    times = []
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _row(experiment, setting, without_s, with_s, bought, **extra) -> dict:
    saved = None if without_s is None or with_s is None else without_s - with_s
    return {
        "experiment": experiment,
        "setting": setting,
        "without_overlap_ms": None if without_s is None else without_s * 1e3,
        "with_overlap_ms": None if with_s is None else with_s * 1e3,
        "saved_ms": None if saved is None else saved * 1e3,
        "saved_pct": None if saved is None else 100 * saved / without_s,
        "applies": without_s is not None,
        "bought": bought,
        **extra,
    }


def _not_applicable(experiment: str, setting: str, why: str) -> dict:
    return _row(experiment, setting, None, None, f"not run: {why}", why_not=why)


def _matrices(n: int, device: torch.device, count: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    # scaled so a chain of products keeps values O(1): no overflow, no denormals to slow the CPU
    return [(torch.randn(n, n, generator=g) / n**0.5).to(device) for _ in range(count)]


def _chain(x: torch.Tensor, w: torch.Tensor, k: int) -> torch.Tensor:
    for _ in range(k):
        x = x @ w
    return x


# ------------------------------------------------------------------------------- 1. queued/finished


def _lenet_step(device: torch.device, mode: str, batch: int):
    from trainlab.lenet.config import TrainConfig
    from trainlab.lenet.plan import resolve
    from trainlab.lenet.setup import build_model, build_optimizer
    from trainlab.lenet.step import make_step

    cfg = TrainConfig(device=str(device), lr=1e-3, schedule="constant", amp="off", channels_last="off", step_mode=mode)
    plan = resolve(cfg, device)
    model = build_model(plan)
    step = make_step(plan, model, build_optimizer(plan, model))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 1, 28, 28, generator=g).to(device)
    y = torch.randint(0, 10, (batch,), generator=g).to(device)
    if step.needs_prepare:
        step.prepare(x, y)
    for _ in range(3):
        step(x, y)
    return step, x, y


def queued_finished(step, batches, device: torch.device) -> tuple[float, float]:
    """Seconds per step as the host sees it without a sync (queued) and with one at the end (finished)."""
    synchronize(device)
    t0 = time.perf_counter()
    for x, y in batches:
        step(x, y)
    queued = time.perf_counter() - t0
    synchronize(device)
    finished = time.perf_counter() - t0
    return queued / len(batches), finished / len(batches)


def queued_vs_finished(cfg: AsyncConfig, device: torch.device, mode: str) -> dict:
    exp = "queued vs finished"
    setting = f"LeNet-5 {mode} step × {cfg.steps}, batch {cfg.batch_size}"
    if mode == "cudagraph" and device.type != "cuda":
        return _not_applicable(exp, setting, "CUDA graphs need a CUDA device")
    step, x, y = _lenet_step(device, mode, cfg.batch_size)
    runs = [queued_finished(step, [(x, y)] * cfg.steps, device) for _ in range(cfg.repeats)]
    q, f = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
    if device.type == "cuda":
        bought = (
            f"the host was free after {q * 1e3:.3f} of every {f * 1e3:.3f} ms per step: {100 * (1 - q / f):.0f} % of "
            "the step for data, logging or the next launch while the GPU ran"
        )
    else:
        bought = f"nothing: {NO_QUEUE} (queued {q * 1e3:.3f} ≈ finished {f * 1e3:.3f} ms/step)"
    # the row's 'without overlap' is what the device finished, 'with' what the host had to wait for
    return _row(exp, setting, f, q, bought, queued_ms_per_step=q * 1e3, finished_ms_per_step=f * 1e3)


# ------------------------------------------------------------------------------- 2. t1 + N·t2 + t3


def _device_seconds(device: torch.device, fn) -> float:
    """Seconds the device spent in `fn()` (CUDA events; on a CPU the wall time, the host being the device)."""
    if device.type != "cuda":
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def exercise(cfg: AsyncConfig, device: torch.device) -> dict:
    n_ops = cfg.ops
    a, w = _matrices(cfg.size, device, 2, seed=1)
    box = [a]

    def op():  # one op, the same every time; its result kept for the fetch
        box[0] = a @ w

    burst = min(n_ops, 16)  # short: the launch queue (~1000 entries on CUDA) never fills

    def launches():
        synchronize(device)
        t0 = time.perf_counter()
        for _ in range(burst):
            op()
        t = (time.perf_counter() - t0) / burst
        synchronize(device)
        return t

    def fetch():
        op()
        synchronize(device)
        t0 = time.perf_counter()
        box[0][0, 0].item()
        return time.perf_counter() - t0

    op()
    synchronize(device)
    t2 = statistics.median(
        _device_seconds(device, lambda: [op() for _ in range(n_ops)]) / n_ops for _ in range(cfg.repeats)
    )
    t3 = statistics.median(fetch() for _ in range(cfg.repeats))
    if device.type == "cuda":
        t1 = statistics.median(launches() for _ in range(cfg.repeats))
    else:
        # the host is the device, so a launch is the op itself: t1 is the frontend's share, the
        # Python + dispatcher cost of an op too small to compute anything (a 1-element add)
        s = torch.zeros(1)
        tiny = lambda: s.add_(1)  # noqa: E731
        t1 = _median_s(lambda: [tiny() for _ in range(n_ops)], device, cfg.repeats) / n_ops
        t2 = max(t2 - t1, 0.0)

    def synchronous():
        for _ in range(n_ops):
            op()
            box[0][0, 0].item()  # the frontend waits for each result

    def asynchronous():
        for _ in range(n_ops):
            op()
        box[0][0, 0].item()  # one wait, at the end

    sync_s = _median_s(synchronous, device, cfg.repeats)
    async_s = _median_s(asynchronous, device, cfg.repeats)
    pred_sync = n_ops * (t1 + t2 + t3)
    pred_async = (t1 + n_ops * t2 if t2 >= t1 else n_ops * t1 + t2) + t3
    bound = "t1 + N·t2 + t3 (device-bound: t2 ≥ t1)" if t2 >= t1 else "N·t1 + t2 + t3 (launch-bound: t1 > t2)"
    if device.type == "cuda":
        bought = (
            f"{(sync_s - async_s) * 1e3:.1f} ms of {sync_s * 1e3:.1f}: N·(t1+t2+t3) predicted {pred_sync * 1e3:.1f}, "
            f"measured {sync_s * 1e3:.1f}; {bound} predicted {pred_async * 1e3:.1f}, measured {async_s * 1e3:.1f}"
        )
    else:
        bought = (
            f"nothing: {NO_QUEUE}, so async = sync ≈ N·(t1+t2) + t3 (predicted {(n_ops * (t1 + t2) + t3) * 1e3:.1f} ms, "
            f"measured {async_s * 1e3:.1f}); t1 + N·t2 + t3 needs a device with its own queue"
        )
    return _row(
        "t1 + N·t2 + t3",
        f"N = {n_ops} matmuls {cfg.size}×{cfg.size}",
        sync_s,
        async_s,
        bought,
        t1_us=t1 * 1e6,
        t2_us=t2 * 1e6,
        t3_us=t3 * 1e6,
        predicted_sync_ms=pred_sync * 1e3,
        predicted_async_ms=pred_async * 1e3,
        regime="device-bound" if t2 >= t1 else "launch-bound",
    )


# --------------------------------------------------------------------------- 3. two chains, streams


def two_chains(cfg: AsyncConfig, device: torch.device) -> dict:
    xa, wa, xb, wb = _matrices(cfg.size, device, 4, seed=2)
    k = cfg.chain
    results = {}

    def serial():
        results["serial"] = (_chain(xa, wa, k), _chain(xb, wb, k))

    if device.type == "cuda":
        s1, s2 = torch.cuda.Stream(device), torch.cuda.Stream(device)

        def overlapped():
            main = torch.cuda.current_stream(device)
            s1.wait_stream(main)
            s2.wait_stream(main)
            with torch.cuda.stream(s1):
                ra = _chain(xa, wa, k)
            with torch.cuda.stream(s2):
                rb = _chain(xb, wb, k)
            main.wait_stream(s1)
            main.wait_stream(s2)
            ra.record_stream(main), rb.record_stream(main)  # made on side streams, read on the main one
            results["overlapped"] = (ra, rb)

        setting = f"2 chains × {k} matmuls {cfg.size}×{cfg.size}: one stream vs two"
        how = "two CUDA streams let the chains' kernels share the GPU"
    else:
        pool = ThreadPoolExecutor(2)

        def overlapped():
            fa, fb = pool.submit(_chain, xa, wa, k), pool.submit(_chain, xb, wb, k)
            results["overlapped"] = (fa.result(), fb.result())

        setting = (
            f"2 chains × {k} matmuls {cfg.size}×{cfg.size}: one after the other vs two host threads "
            f"(CPU analogue of two streams; torch threads {torch.get_num_threads()})"
        )
        how = "two host threads (inter-op parallelism; matmul releases the GIL)"
    serial_s = _median_s(serial, device, cfg.repeats)
    over_s = _median_s(overlapped, device, cfg.repeats)
    same = all(torch.equal(p, q) for p, q in zip(results["serial"], results["overlapped"]))
    saved = serial_s - over_s
    bought = (
        f"{saved * 1e3:.2f} ms ({100 * saved / serial_s:.0f} %): {how}"
        if saved > 0
        else f"nothing ({-saved * 1e3:.2f} ms slower): {how}, but one chain already keeps the "
        f"{'GPU' if device.type == 'cuda' else 'CPU cores'} busy"
    )
    if device.type != "cuda":
        pool.shutdown()
    return _row("independent ops", setting, serial_s, over_s, bought, same_result=same)


# -------------------------------------------------------------------------- 4. copy behind compute


def copy_overlap(cfg: AsyncConfig, device: torch.device) -> list[dict]:
    exp = "copy ∥ compute"
    if device.type != "cuda":
        return [
            _not_applicable(
                exp,
                f"{cfg.copy_mb} MiB host→device, {kind}",
                "no host→device copy on a CPU: the data is already where it is computed",
            )
            for kind in ("pinned", "pageable")
        ]
    x, w = _matrices(cfg.size, device, 2, seed=3)
    numel = cfg.copy_mb * 2**20 // 4
    dst = torch.empty(numel, device=device)
    side = torch.cuda.Stream(device)
    rows = []
    compute_s = _median_s(lambda: _chain(x, w, cfg.chain), device, cfg.repeats)
    for kind in ("pinned", "pageable"):
        src = torch.ones(numel, pin_memory=kind == "pinned")
        copy_s = _median_s(lambda: dst.copy_(src, non_blocking=True), device, cfg.repeats)

        def serial():
            dst.copy_(src, non_blocking=True)
            _chain(x, w, cfg.chain)

        def overlapped():
            main = torch.cuda.current_stream(device)
            side.wait_stream(main)
            with torch.cuda.stream(side):
                dst.copy_(src, non_blocking=True)
            _chain(x, w, cfg.chain)
            main.wait_stream(side)

        serial_s = _median_s(serial, device, cfg.repeats)
        over_s = _median_s(overlapped, device, cfg.repeats)
        ideal = min(copy_s, compute_s)
        rows.append(
            _row(
                exp,
                f"{cfg.copy_mb} MiB host→device, {kind}, beside {cfg.chain} matmuls {cfg.size}×{cfg.size}",
                serial_s,
                over_s,
                f"{(serial_s - over_s) * 1e3:.2f} ms of the {ideal * 1e3:.2f} ms a perfect overlap could hide "
                f"(copy {copy_s * 1e3:.2f} ms = {cfg.copy_mb / 1024 / copy_s:.1f} GiB/s, compute {compute_s * 1e3:.2f} ms)"
                + (
                    ""
                    if kind == "pinned"
                    else "; pageable memory is staged by the host, so the copy cannot run on its own"
                ),
                copy_ms=copy_s * 1e3,
                compute_ms=compute_s * 1e3,
                copy_gib_per_s=cfg.copy_mb / 1024 / copy_s,
            )
        )
    return rows


# ------------------------------------------------------------------------------------ 5. CPU ∥ GPU


def cpu_and_gpu(cfg: AsyncConfig, device: torch.device) -> dict:
    exp = "CPU ∥ GPU"
    setting = f"{cfg.chain} matmuls {cfg.size}×{cfg.size} on the GPU, the same on the CPU"
    if device.type != "cuda":
        return _not_applicable(
            exp, setting, "needs a GPU beside the CPU (the host is free while the GPU runs its queue)"
        )
    xg, wg = _matrices(cfg.size, device, 2, seed=4)
    xc, wc = _matrices(cfg.size, torch.device("cpu"), 2, seed=4)

    def serial():
        _chain(xg, wg, cfg.chain)
        torch.cuda.synchronize(device)  # the GPU's work done before the CPU starts
        _chain(xc, wc, cfg.chain)

    def overlapped():
        _chain(xg, wg, cfg.chain)  # queued: returns at once
        _chain(xc, wc, cfg.chain)  # the host computes meanwhile

    gpu_s = _median_s(lambda: _chain(xg, wg, cfg.chain), device, cfg.repeats)
    cpu_s = _median_s(lambda: _chain(xc, wc, cfg.chain), torch.device("cpu"), cfg.repeats)
    serial_s = _median_s(serial, device, cfg.repeats)
    over_s = _median_s(overlapped, device, cfg.repeats)
    return _row(
        exp,
        setting,
        serial_s,
        over_s,
        f"{(serial_s - over_s) * 1e3:.2f} ms of the {min(gpu_s, cpu_s) * 1e3:.2f} ms the shorter side could hide "
        f"(GPU {gpu_s * 1e3:.2f} ms, CPU {cpu_s * 1e3:.2f} ms)",
        gpu_ms=gpu_s * 1e3,
        cpu_ms=cpu_s * 1e3,
    )


# ----------------------------------------------------------------------------------------- driver


def run_experiments(cfg: AsyncConfig, log=print) -> dict:
    """Every experiment on `cfg.device` → the result: kind, schema, the plan (device, its name, threads,
    the resolved config) and the rows."""
    cfg.validate()
    device = resolve_device(cfg.device)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    rows: list[dict] = []
    steps = (
        ("queued vs finished, eager", lambda: [queued_vs_finished(cfg, device, "eager")]),
        ("queued vs finished, cudagraph", lambda: [queued_vs_finished(cfg, device, "cudagraph")]),
        ("t1 + N·t2 + t3", lambda: [exercise(cfg, device)]),
        ("two independent chains", lambda: [two_chains(cfg, device)]),
        ("copy overlapped with compute", lambda: copy_overlap(cfg, device)),
        ("CPU and GPU at once", lambda: [cpu_and_gpu(cfg, device)]),
    )
    for name, run in steps:
        log(f"== {name}")
        for row in run():
            rows.append(row)
            log(f"   {row['setting']}: {row['bought']}")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    plan = plan_record(str(device), device_name=name, threads=torch.get_num_threads(), resolved=cfg.to_dict())
    return stamp(KIND, {"rows": rows}, plan)


def _ms(v) -> str:
    return "—" if v is None else f"{v:.3f}"


def markdown(result: dict) -> str:
    plan = result["plan"]
    lines = [
        f"Asynchronous execution and automatic parallelism on {plan['device_name']} ({plan['device']}, "
        f"torch threads {plan['threads']}); medians of {plan['resolved']['repeats']} repeats.",
        "",
        "| experiment | setting | without overlap (ms) | with overlap (ms) | what the overlap bought |",
        "| --- | --- | ---: | ---: | --- |",
    ]
    for r in result["rows"]:
        cells = (r["experiment"], r["setting"], _ms(r["without_overlap_ms"]), _ms(r["with_overlap_ms"]), r["bought"])
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    ex = next((r for r in result["rows"] if r["experiment"] == "t1 + N·t2 + t3"), None)
    if ex is not None:
        lines += [
            "",
            f"The exercise: t1 = {ex['t1_us']:.2f} µs (launch), t2 = {ex['t2_us']:.2f} µs (run), "
            f"t3 = {ex['t3_us']:.2f} µs (fetch); {ex['regime']}. For queued-vs-finished rows, 'without' is what "
            "the device finished and 'with' what the host waited for.",
        ]
    return "\n".join(lines) + "\n"


def run_async_cmd(cfg: AsyncConfig, log=print) -> dict:
    """`trainlab async`: run, print the table, write --json/--md."""
    result = run_experiments(cfg, log)
    text = markdown(result)
    log(text)
    if cfg.json:
        atomic_write_json(cfg.json, result)
    if cfg.md:
        atomic_write_text(cfg.md, text)
    return result
