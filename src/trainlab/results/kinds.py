"""Every result file trainlab writes says what it is and what it ran: `{"kind", "schema", "plan", ...}`.

`KINDS` is the one table of result kinds: each kind's family (the report module that renders it:
`report/sections/<family>.py`) and title. A writer stamps its record once (`stamp`), with the plan the
run resolved (`plan_record`: device, precision, threads, the dataset and its sizes, the model's shape,
and the workload's whole resolved plan), so a reader never guesses a file's kind from its keys and
never restates a fact it could read. A JSON without the stamp is not a trainlab result (the files
committed before the stamp existed were stamped once, with the facts they recorded).

Sits below every workload and the report: it imports nothing of trainlab's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SCHEMA = 1  # the record's version: a reader that meets a newer one says so instead of misreading it


@dataclass(frozen=True)
class Kind:
    family: str  # lenet | ops | dp | gpt | table: the report module that renders it
    title: str  # the report's heading for a file of this kind


KINDS: dict[str, Kind] = {
    "lenet_train": Kind("lenet", "LeNet-5 training run (trainlab train)"),
    "lenet_profile": Kind("lenet", "LeNet-5 per-layer profile (trainlab profile)"),
    "gelu_check": Kind("ops", "GELU correctness (trainlab ops check --op gelu)"),
    "gelu_bench": Kind("ops", "GELU speed (trainlab ops bench --op gelu)"),
    "ops_check": Kind("ops", "Layer operators vs ATen (trainlab ops check)"),
    "ops_bench": Kind("ops", "Layer operators, time per LeNet-5 layer (trainlab ops bench)"),
    "dp_compare": Kind("dp", "Data-parallel comparison (trainlab dp compare)"),
    "dp_loaders": Kind("dp", "DataLoader workers study (trainlab dp compare --workers)"),
    "dp_compile": Kind("dp", "LeNet-5 step: eager, torch.compile and CUDA graphs (benchmarks/dp_compile.py)"),
    "gpt_bench": Kind("gpt", "GPT benchmark (trainlab gpt bench)"),
    "gpt_plan": Kind("gpt", "GPT memory plan (trainlab gpt plan)"),
    "gpt_compare": Kind("gpt", "GPT strategy comparison (trainlab gpt compare)"),
    "gpt_ablation": Kind("gpt", "GPT-2: the speed-up broken down, from the handout's baseline"),
    "async_parallelism": Kind("table", "Asynchronous execution and automatic parallelism (trainlab async)"),
    "benchmark": Kind("table", "Benchmark table (benchmarks/)"),
}


def plan_record(
    device: str,
    *,
    device_name: str | None = None,
    precision: str | None = None,
    threads: int | None = None,
    dataset: dict | None = None,
    model: dict | None = None,
    resolved: dict | None = None,
) -> dict:
    """The facts a reader may state about a run, in one shape for every kind: `dataset` is
    {"name", "train", "test"} (images or sequences), `model` {"name", ...its shape}; `resolved` is the
    workload's own plan as it ran (LeNetPlan, GPTPlan, a benchmark's settings). A fact left None was
    not recorded, and the report does not print it."""
    return {
        "device": device,
        "device_name": device_name,
        "precision": precision,
        "threads": threads,
        "dataset": dataset,
        "model": model,
        "resolved": resolved,
    }


def stamp(kind: str, data: Any, plan: dict) -> dict:
    """The record a writer writes: its kind, the schema version and the plan first, then its data (a
    list of rows becomes {"rows": [...]})."""
    if kind not in KINDS:
        raise ValueError(f"unknown result kind {kind!r}: add it to trainlab.results.kinds.KINDS")
    body = data if isinstance(data, dict) else {"rows": data}
    clash = {"kind", "schema", "plan"} & set(body)
    if clash:  # the record's own keys: a writer's field of the same name would be silently replaced
        raise ValueError(
            f"result data holds the record's key(s) {sorted(clash)}: rename them, or pass them as the plan"
        )
    return {"kind": kind, "schema": SCHEMA, "plan": plan, **body}


def kind_of(data: Any) -> str | None:
    """The kind a stamped record names, or None (not stamped: a file from before the stamp)."""
    if isinstance(data, dict) and isinstance(data.get("kind"), str) and data["kind"] in KINDS:
        return data["kind"]
    return None


def busy_reason(load: Any) -> str | None:
    """Why a timing taken under this machine load (telemetry.env's `load` record) is not a quiet
    machine's, or None: a 1-minute load average above the cores, or another process on the GPU."""
    if not isinstance(load, dict):
        return None
    why = []
    avg, cpus = load.get("loadavg_1m"), load.get("cpus")
    if isinstance(avg, (int, float)) and isinstance(cpus, int) and cpus > 0 and avg > cpus:
        why.append(f"load average {avg:.1f} on {cpus} cores")
    others = load.get("gpu_other_processes")
    if isinstance(others, list) and others:
        why.append(f"{len(others)} other process(es) on the GPU")
    return "; ".join(why) or None
