"""`trainlab dp compare`: the same LeNet-5 run under each data-parallel mode, and where the time goes.

Every mode trains from the same seed on the same global batches in the same order (the device
loader shards each global batch across ranks), so only the execution differs. Every run is its own
`trainlab worker SPEC.json` (ddp/allreduce/ring under torchrun), each rank timing its steps; rank 0 writes
its row to the JSON file the spec names, which this process collects. A run gets `--timeout` seconds;
one that fails or times out is marked in its row, the others still run, and --json/--md are rewritten
after every run, so what finished is never lost.
For the multi-process modes a second table sets the gradient all-reduce against the bandwidth bound:
a ring all-reduce of S bytes over W ranks must move 2(W−1)/W·S bytes through each rank's link, so with a
measured link bandwidth B (one ring hop, `ring.measure_link_bandwidth`) no all-reduce can take less than
2(W−1)/W·S/B. "Bus bandwidth" = S/t·2(W−1)/W (nccl-tests' definition) is comparable with B directly.
A second table sweeps DataLoader `num_workers` next to the device-resident loader, with the same
data / compute split — does a loader with workers catch up with data that already lives on the device?
"""

from __future__ import annotations

import os
import statistics
import tempfile
from pathlib import Path

import torch

from trainlab.distributed.launch import run_limited, worker_command, write_spec
from trainlab.errors import UserError
from trainlab.io import atomic_write_json, atomic_write_text, read_json
from trainlab.lenet.config import CompareConfig, TrainConfig, parse_modes, parse_workers
from trainlab.lenet.data_parallel import MULTI_PROCESS_MODES
from trainlab.lenet.lightning_row import lightning_missing, run_lightning_worker, skipped_row
from trainlab.lenet.loop import train
from trainlab.results.kinds import plan_record, stamp
from trainlab.telemetry.results import DP_COMPARE_COLUMNS
from trainlab.telemetry.rundir import RunDir


def _multi(mode: str) -> bool:
    return mode in MULTI_PROCESS_MODES or mode == "lightning"


def row_from_run(cfg: TrainConfig, summary: dict, history: list[dict]) -> dict:
    """One table row from a finished run (rank 0's view)."""
    st = summary.get("step_times") or {}
    med = lambda key: st[key]["median"] if st.get(key) else None  # noqa: E731
    epoch_seconds = statistics.median(h["epoch_seconds"] for h in history)
    n_train = history[0]["images_per_s"] * history[0]["epoch_seconds"]
    return {
        "mode": summary["parallel"],
        "world_size": summary["world_size"],
        "loader": cfg.loader,
        "workers": cfg.workers if cfg.loader == "dataloader" else None,
        "global_batch": cfg.batch_size,
        "epochs": len(history),
        "seed": cfg.seed,
        "optimizer": cfg.optimizer,
        "device": summary["device"],
        "epoch_seconds": epoch_seconds,
        "images_per_s": n_train / epoch_seconds,
        "steps": st.get("steps"),
        "data_ms": med("data_ms"),
        "compute_ms": med("compute_ms"),
        "comm_ms": med("comm_ms"),
        "comm_overlapped": st.get("comm_overlapped"),
        "step_times": st or None,
        "test_accuracy": summary["test_accuracy"],
        "test_loss": summary["test_loss"],
        "allreduce_ms": st.get("allreduce_ms"),
        **bandwidth(st.get("grad_bytes"), st.get("allreduce_ms"), summary["world_size"], st.get("link_bytes_per_s")),
        "bytes_sent_per_step": st.get("bytes_sent_per_step"),
    }


def bandwidth(
    grad_bytes: int | None, allreduce_ms: float | None, world_size: int, link_bytes_per_s: float | None
) -> dict:
    """The all-reduce against its bound: algorithm and bus bandwidth (GB/s) of one all-reduce of the
    gradient's bytes timed in isolation, the measured link bandwidth, and the fastest time any
    all-reduce could take over that link, 2(W−1)/W·S/B."""
    keys = ("grad_bytes", "algbw_gbps", "busbw_gbps", "link_gbps", "bound_comm_ms", "busbw_pct_of_link")
    if not grad_bytes or not allreduce_ms or world_size < 2:
        return dict.fromkeys(keys)
    factor = 2 * (world_size - 1) / world_size
    algbw = grad_bytes / (allreduce_ms / 1e3)
    link = link_bytes_per_s
    return dict(
        zip(
            keys,
            (
                grad_bytes,
                algbw / 1e9,
                algbw * factor / 1e9,
                link / 1e9 if link else None,
                factor * grad_bytes / link * 1e3 if link else None,
                100 * algbw * factor / link if link else None,
            ),
        )
    )


def run_worker(spec: dict) -> int:
    """One process (or one torchrun rank) of a comparison: train with step timing, rank 0 writes its row."""
    if spec.get("lightning"):  # the same batches and model, driven by Lightning's Trainer
        return run_lightning_worker(spec)
    cfg = TrainConfig.from_dict(spec["config"], source="dp compare spec")
    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    prefix = f"[{cfg.parallel}{'' if cfg.loader == 'device' else f' dataloader w={cfg.workers}'}] "
    summary = train(
        cfg, log=lambda line: print(prefix + line, flush=True) if line.startswith(("epoch", "done")) else None
    )
    if int(os.environ.get("RANK", "0")) == 0:
        row = row_from_run(cfg, summary, RunDir(cfg.out).read_metrics())
        atomic_write_json(
            spec["result"], {**row, "status": "ok", "torch_threads": torch.get_num_threads()}, private=True
        )
    return 0  # the dispatcher ends the process (launch.end_worker)


def _run_one(
    cfg: TrainConfig, nproc: int, workdir: Path, tag: str, threads: int | None, limit_s: float, lightning=False
) -> dict:
    """One run of one mode in processes of its own (`trainlab worker`, under torchrun for several), stopped
    after `limit_s`: its row, or a row marking why there is none. A row that rank 0 wrote is kept even if
    a rank then failed or hung at the end: the run's results were complete."""
    result = workdir / f"{tag}.row.json"
    spec = write_spec(
        workdir / f"{tag}.spec.json",
        "dp-compare",
        config=cfg.to_dict(),
        threads=threads,
        result=str(result),
        lightning=lightning,
    )
    cmd = worker_command(nproc, spec)
    print("launching: " + " ".join(cmd), flush=True)
    code, seconds = run_limited(cmd, limit_s, result=result)
    ended = f"stopped at the {limit_s:g} s limit (--timeout)" if code is None else f"exit code {code}"
    if result.exists():
        row = read_json(result)
        if code != 0:
            row["note"] = f"the results were written, then a rank failed or hung at the end: {ended}"
        return row
    return {
        **dict.fromkeys(DP_COMPARE_COLUMNS),
        "mode": "lightning" if lightning else cfg.parallel,
        "world_size": nproc,
        "loader": cfg.loader,
        "workers": cfg.workers if cfg.loader == "dataloader" else None,
        "status": "timeout" if code is None else "failed",
        "error": f"the {nproc}-process run wrote no results: {ended} after {seconds:.0f} s; see its output above",
    }


def compare(cc: CompareConfig, log=print, on_rows=None) -> tuple[list[dict], list[dict]]:
    """Run each mode (and the DataLoader sweep) on the same global batches; returns (mode rows, loader rows).

    Every run is its own process (or processes), stopped after `cc.timeout_s`; a mode that fails or times
    out gets a row with its status, and the others still run. `on_rows(rows, loader_rows)` hears the
    tables so far after every run (modes not run yet are left out).
    `threads`: torch CPU threads per process for every mode (default: torch's own choice for single-process
    runs, 1 per rank under torchrun). On a shared CPU, more threads than free cores makes OpenMP spin.
    `repeats`: run the whole list that many times, round-robin (so a burst of load from elsewhere hits
    every configuration alike), and report medians over the repeats with min–max of epoch seconds.
    """
    cc.validate()
    modes, workers = parse_modes(cc.modes), parse_workers(cc.workers)
    nproc, device, batch_size, threads, repeats = cc.nproc, cc.device, cc.batch_size, cc.threads, cc.repeats
    base = dict(
        epochs=cc.epochs,
        device=device,
        batch_size=batch_size,
        train_subset=cc.train_subset,
        test_subset=cc.test_subset,
        seed=cc.seed,
        optimizer=cc.optimizer,
        progress=False,
        tensorboard=False,
        gpu_telemetry=False,
        step_timing=True,
    )
    plan = [(mode, TrainConfig(**base, parallel="none" if mode == "lightning" else mode), nproc) for mode in modes]
    if workers:
        if "none" not in modes:
            plan.append(("device", TrainConfig(**base), 1))
        plan += [(f"dl{w}", TrainConfig(**base, loader="dataloader", workers=w), 1) for w in workers]
    runs: dict[str, list[dict]] = {tag: [] for tag, _, _ in plan}
    sweep_tags = (["none" if "none" in modes else "device"] + [f"dl{w}" for w in workers]) if workers else []
    tables = lambda: ([_combine(runs[m]) for m in modes if runs[m]], [_combine(runs[t]) for t in sweep_tags if runs[t]])  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="trainlab_dp_compare_") as tmp:
        work = Path(tmp)
        for r in range(repeats):
            for tag, cfg, n in plan:
                multi = _multi(tag)
                log(
                    f"== {_describe(tag, cfg, n if multi else 1)}"
                    + (f"  (repeat {r + 1}/{repeats})" if repeats > 1 else "")
                )
                run_cfg = TrainConfig(**{**cfg.to_dict(), "out": str(work / f"{tag}-{r}")})
                missing = lightning_missing() if tag == "lightning" else None
                row = (
                    skipped_row(n, missing)
                    if missing
                    else _run_one(
                        run_cfg, n if multi else 1, work, f"{tag}-{r}", threads, cc.timeout_s, tag == "lightning"
                    )
                )
                if row["status"] != "ok" or row.get("note"):
                    log(f"   {row['status']}: {row.get('error') or row.get('note')}")
                runs[tag].append(row)
                if on_rows is not None:
                    on_rows(*tables())
    return tables()


def _describe(tag: str, cfg: TrainConfig, nproc: int) -> str:
    if cfg.loader == "dataloader":
        return f"loader sweep: DataLoader num_workers={cfg.workers}"
    if tag == "device":
        return "loader sweep: device-resident loader"
    return f"mode {cfg.parallel}" + (f" × {nproc} processes" if nproc > 1 else "")


def _combine(runs: list[dict]) -> dict:
    """One row from repeated runs of one configuration: medians of the timings, all epoch times kept.
    Runs that failed or timed out are counted; with none that finished, the row is the last failure."""
    done = [r for r in runs if r["status"] == "ok"]
    if not done:
        return {**runs[-1], "repeats": len(runs)}
    failed = len(runs) - len(done)
    row = dict(
        done[0],
        **(
            {"failed_repeats": failed, "error": next(r["error"] for r in runs if r["status"] != "ok")} if failed else {}
        ),
    )
    notes = [r["note"] for r in done if r.get("note")]
    if notes:
        row["note"] = notes[0]
    runs = done
    for key in (
        "epoch_seconds",
        "images_per_s",
        "data_ms",
        "compute_ms",
        "comm_ms",
        "allreduce_ms",
        "algbw_gbps",
        "busbw_gbps",
        "link_gbps",
        "bound_comm_ms",
        "busbw_pct_of_link",
    ):
        values = [r[key] for r in runs if r.get(key) is not None]  # the lightning row has no step split
        row[key] = statistics.median(values) if values else None
    row["repeats"] = len(runs)
    row["epoch_seconds_runs"] = [r["epoch_seconds"] for r in runs]
    row["test_accuracy_runs"] = [r["test_accuracy"] for r in runs]
    return row


def _ms(x) -> str:
    return "–" if x is None else f"{x:.2f}"


def _spread(r: dict) -> str:
    runs = r.get("epoch_seconds_runs") or [r["epoch_seconds"]]
    return f"{r['epoch_seconds']:.2f}" + (f" [{min(runs):.2f}–{max(runs):.2f}]" if len(runs) > 1 else "")


def format_table(rows: list[dict], title: str) -> str:
    lines = [
        f"### {title}",
        "",
        "| mode | world size | threads/proc | loader | epoch s, median [min–max] | images/s | data ms/step | compute ms/step | comm ms/step | test acc (%) |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        loader = r["loader"] if r["loader"] == "device" else f"dataloader ×{r['workers']} workers"
        if r["status"] != "ok":
            lines.append(f"| {r['mode']} | {r['world_size']} | – | {loader} | **{r['status']}** | | | | | |")
            continue
        comm = _ms(r["comm_ms"]) + (" (overlapped)" if r.get("comm_overlapped") else "")
        lines.append(
            f"| {r['mode']} | {r['world_size']} | {r.get('torch_threads')} | {loader} | {_spread(r)} | {r['images_per_s']:,.0f} | "
            f"{_ms(r['data_ms'])} | {_ms(r['compute_ms'])} | {comm} | {r['test_accuracy']:.2f} |"
        )
    remarks = [
        f"- {r['mode']} × {r['world_size']}: {r.get('error') or r['note']}"
        for r in rows
        if r.get("error") or r.get("note")
    ]
    return "\n".join(lines + ([""] + remarks if remarks else []))


def format_bandwidth(rows: list[dict]) -> str | None:
    rows = [r for r in rows if r.get("busbw_gbps") is not None]
    if not rows:
        return None
    g = lambda x, f="{:.3f}": "–" if x is None else f.format(x)  # noqa: E731
    lines = [
        "### Gradient all-reduce against the 2(W−1)/W bound",
        "",
        "| mode | world size | gradient bytes (S) | bytes sent/rank/step | all-reduce ms (isolated) | bound ms (2(W−1)/W·S/B) | "
        "algbw GB/s | busbw GB/s | link GB/s (B) | busbw / link |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['mode']} | {r['world_size']} | {r['grad_bytes']:,} | {g(r.get('bytes_sent_per_step'), '{:,}')} | "
            f"{g(r['allreduce_ms'])} | {g(r['bound_comm_ms'])} | {g(r['algbw_gbps'])} | {g(r['busbw_gbps'])} | "
            f"{g(r['link_gbps'])} | {g(r['busbw_pct_of_link'], '{:.0f} %')} |"
        )
    return "\n".join(lines)


NOTES = """Per-step times are medians over the steps of a run (then over repeats) (synchronized at each step boundary on CUDA).
data = fetching the (per-rank) batch and moving it to the device; comm = gradient all-reduce: exposed for
`allreduce` (nothing runs meanwhile), for `ddp` measured by a comm hook from launch to completion and for
`ring` the communication thread's busy time — both *overlapped* with the backward pass, so part of
compute there, not additional to it.
Bound: any all-reduce of S gradient bytes over W ranks sends ≥ 2(W−1)/W·S bytes per rank (the ring
sends exactly that: "bytes sent"), so it takes ≥ 2(W−1)/W·S/B over a link of B bytes/s (B measured:
one ring hop of S bytes, over the same send/recv calls the ring uses). "All-reduce ms" times one
all-reduce of S bytes by the mode's algorithm (ring: ours; ddp/allreduce: dist.all_reduce) with every
rank starting together, median of 20 — the comm ms/step of the first table also holds waits for a
slower peer. busbw = S/t·2(W−1)/W; busbw/link is the fraction of the bound reached — for small
messages the 2(W−1) per-hop latencies, not bandwidth, dominate. B includes the per-call overhead of
Python send/recv, so a C++ collective (gloo's all_reduce) can exceed 100 % of it; the ring, built from
those very calls, should not (beyond noise).
All modes use the same global batch, seed and sample order; images/s counts global images."""


def format_report(rows: list[dict], loader_rows: list[dict]) -> str:
    parts = [format_table(rows, "Data-parallel modes")]
    if format_bandwidth(rows):
        parts.append(format_bandwidth(rows))
    if loader_rows:
        parts.append(
            format_table(loader_rows, "DataLoader num_workers sweep vs the device-resident loader (single process)")
        )
    parts.append(NOTES)
    return "\n\n".join(parts) + "\n"


def run_compare(cc: CompareConfig, log=print) -> str:
    """`trainlab dp compare`: run, print the tables, write --json (the rows; the sweep beside it) and --md.

    The files are rewritten (atomically) after every run, so whatever finished is on disk even if a later
    mode hangs or the comparison is interrupted; a mode that failed or timed out ends the command with
    one error line once the others have run."""
    rows, loader_rows = compare(cc, log=log, on_rows=lambda *tables: _write(cc, *tables))
    report = _write(cc, rows, loader_rows)
    log(report)
    # a skipped row (Lightning not installed) says why in the table; it is not a failure
    failed = [f"{r['mode']} ({r['status']})" for r in rows + loader_rows if r["status"] not in ("ok", "skipped")]
    if failed:
        kept = f"; the rows that finished are in {cc.json}" if cc.json else ""
        raise UserError(f"dp compare: {', '.join(failed)} did not finish (see the table above){kept}")
    return report


def _plan_record(cc: CompareConfig) -> dict:
    """What every mode ran (the rows add their own world size and loader); a subset left None is the
    whole set, whose size the rows' runs recorded, not this file."""
    device = "cuda" if cc.device != "cpu" and torch.cuda.is_available() else "cpu"
    return plan_record(
        device,
        threads=cc.threads,
        dataset={"name": "mnist", "train": cc.train_subset, "test": cc.test_subset},
        model={"name": "lenet5"},
        resolved=cc.to_dict(),
    )


def _write(cc: CompareConfig, rows: list[dict], loader_rows: list[dict]) -> str:
    report = format_report(rows, loader_rows)
    if cc.json:
        plan = _plan_record(cc)
        atomic_write_json(cc.json, stamp("dp_compare", rows, plan))  # {kind, schema, plan, rows: one per mode}
        if loader_rows:
            sweep = cc.json[:-5] if cc.json.endswith(".json") else cc.json
            atomic_write_json(sweep + ".loaders.json", stamp("dp_loaders", loader_rows, plan))
    if cc.md:
        atomic_write_text(cc.md, report)
    return report
