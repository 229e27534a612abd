"""The plan a GPT result file records (`results.kinds.plan_record`): the model's name and shape, the
sequence and batch in tokens, the device, the precision and the threads, one helper for every GPT
writer (bench, compare, ablation, plan), so each states its facts the same way."""

from __future__ import annotations

import torch

from trainlab.gpt.shape import GPTConfig, get_preset
from trainlab.results.kinds import plan_record, stamp


def model_shape(name: str, model: GPTConfig | None = None, seq: int | None = None) -> dict:
    cfg = model if model is not None else get_preset(name)
    return {
        "name": name,
        "hidden": cfg.n_embd,
        "heads": cfg.n_head,
        "layers": cfg.n_layer,
        "vocab": cfg.vocab_size,
        "seq": seq or cfg.n_positions,
    }


def gpt_plan_record(
    name: str,
    device: str,
    *,
    precision: str | None,
    model: GPTConfig | None = None,
    seq: int | None = None,
    device_name: str | None = None,
    tokens: dict | None = None,
    resolved: dict | None = None,
) -> dict:
    """`tokens`: {"global_batch", "steps", "total"} where the writer knows them (random tokens: the
    handout's baseline trains on random ids, so the "dataset" is their count)."""
    return plan_record(
        device,
        device_name=device_name,
        precision=precision,
        threads=torch.get_num_threads() if device == "cpu" else None,
        dataset={"name": "random tokens", **(tokens or {})},
        model=model_shape(name, model, seq),
        resolved=resolved,
    )


def stamp_bench(summary: dict, plan) -> dict:
    """`gpt bench`'s summary as a `gpt_bench` record: the plan it ran (a GPTPlan) in the common shape."""
    device = summary["device"].split(":")[0]
    record = gpt_plan_record(
        plan.model_name,
        device,
        precision=plan.amp or ("tf32" if device == "cuda" and plan.tf32 != "off" else "fp32"),
        model=plan.model,
        seq=plan.seq,
        device_name=summary.get("device_name"),
        tokens={
            "global_batch": plan.global_batch,
            "steps": plan.steps,
            "total": summary["tokens_per_step"] * plan.steps,
        },
        resolved=summary.get("config"),
    )
    return stamp("gpt_bench", summary, record)
