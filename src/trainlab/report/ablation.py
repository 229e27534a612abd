"""The GPT-2 speed-up broken down: from the handout's baseline to ours, each change alone and cumulatively.

The ablation result file (issue 30, goal 2), written by the lab's GPT ablation step (any file under
a `gpt` step's folder, e.g. `steps/gpt_ablation/ablation.json`) or given to `trainlab report`, is one
JSON object:

    {
      "total_tokens": 262144,            # every row trains exactly this many tokens (the handout's rule:
                                         # 保证不同的加速策略下训练的总数据量相同)
      "model": "gpt2-1.6b",              # optional, shown
      "device_name": "NVIDIA H100 80GB HBM3",          # optional, shown
      "peak_tflops": 989.0,              # MFU's denominator, per device
      "peak_tflops_source": "data sheet (NVIDIA H100 80GB HBM3, dense bf16)",
      "rows": [                          # in the order to show them; the first "baseline" row is the reference
        {
          "label": "handout's baseline (HF GPT2LMHeadModel, fp32, checkpointing)",
          "group": "baseline",           # baseline | alone | cumulative | peer | separate (e.g. FP8)
          "changes": ["tf32"],           # optional: what differs from the baseline
          "status": "ok",                # or a one-line reason the row has no numbers
          "tokens": 262144,              # tokens this row trained
          "tokens_per_s": 2678.0,
          "step_seconds_median": 6.12,
          "total_seconds": 97.9,         # wall time for `tokens` tokens (timed steps only)
          "peak_memory_bytes": 32530000000,
          "tflops_per_device": 27.6,     # 6N + attention FLOPs per token × tokens/s
          "tflops_per_device_handout": 35.1,   # the handout's get_tflops: 8·N·B·T / step time
          "mfu": 0.028                   # a fraction: tflops_per_device / peak_tflops
        }
      ]
    }

Rows are rendered with their speed-up over the baseline row; a row whose `tokens` differs from
`total_tokens` is named in a note (it breaks the handout's rule). Without such a file the lab report
shows the GPT benchmarks it has (`bench_rows`), saying that they time different numbers of tokens.
"""

from __future__ import annotations

from trainlab.report import format as fmt
from trainlab.report.blocks import Block, para

COLUMNS = [
    "row",
    "group",
    "tokens",
    "tokens/s",
    "step time",
    "total time",
    "peak memory",
    "TFLOP/s, 6N + attention",
    "TFLOP/s, 8·N·B·T (handout)",
    "MFU",
    "speed-up",
]


def _speedup(tps, ref) -> str:
    return f"{tps / ref:.2f}×" if fmt.is_number(tps) and fmt.is_number(ref) and ref > 0 else fmt.MISSING


def _table(rows: list[dict], tokens_key: str) -> list[list[str]]:
    base = next((r for r in rows if r.get("group") == "baseline" and fmt.is_number(r.get("tokens_per_s"))), None)
    ref = base.get("tokens_per_s") if base else None
    table = [COLUMNS]
    for r in rows:
        status = r.get("status", "ok")
        if status != "ok":
            table.append(
                [str(r.get("label")), str(r.get("group", fmt.MISSING)), f"not measured: {status}"]
                + [fmt.MISSING] * (len(COLUMNS) - 3)
            )
            continue
        tflops_8n = r.get("tflops_per_device_handout", r.get("tflops_per_device_8n"))
        table.append(
            [
                str(r.get("label")),
                str(r.get("group", fmt.MISSING)),
                fmt.count(r.get(tokens_key)),
                fmt.count(round(r["tokens_per_s"])) if fmt.is_number(r.get("tokens_per_s")) else fmt.MISSING,
                fmt.seconds(r.get("step_seconds_median")),
                fmt.seconds(r.get("total_seconds")),
                fmt.value("peak_memory_bytes", r.get("peak_memory_bytes")),
                fmt.number(r.get("tflops_per_device")),
                fmt.number(tflops_8n),
                fmt.value("mfu", r.get("mfu")),
                _speedup(r.get("tokens_per_s"), ref),
            ]
        )
    return table


def _peak_line(peak, source) -> str:
    if not fmt.is_number(peak):
        return "MFU: no peak recorded."
    return f"MFU = TFLOP/s (6N + attention) ÷ {fmt.number(float(peak))} TFLOP/s per device ({source or 'source not recorded'})."


# TF32 is a mode of NVIDIA tensor cores: on a CPU the "+ TF32" row times the baseline again
NO_TF32 = "does not apply on a CPU (TF32 is a mode of NVIDIA GPUs' tensor cores); not reported"


def _on_cpu(data: dict) -> bool:
    plan, config = data.get("plan") or {}, data.get("config") or {}
    return plan.get("device") == "cpu" or config.get("device") == "cpu"


def _applicable(data: dict) -> list[dict]:
    """The rows, with a TF32-only row on a CPU marked as not applying instead of timed."""
    rows = [r for r in data.get("rows", []) if isinstance(r, dict)]
    if not _on_cpu(data):
        return rows
    return [{**r, "status": NO_TF32} if r.get("changes") == ["tf32"] else r for r in rows]


def overall_speedup(data: dict) -> tuple[str, float] | None:
    """(label, speed-up) of the last cumulative row over the baseline row: the number the ablation's own
    table shows for it, so a page quoting it states one figure for one quantity."""
    rows = [r for r in _applicable(data) if r.get("status", "ok") == "ok" and fmt.is_number(r.get("tokens_per_s"))]
    base = next((r for r in rows if r.get("group") == "baseline"), None)
    last = [r for r in rows if r.get("group") == "cumulative"]
    if base is None or not last or base["tokens_per_s"] <= 0:
        return None
    return str(last[-1].get("label")), last[-1]["tokens_per_s"] / base["tokens_per_s"]


def ablation_blocks(data: dict) -> list:
    """The ablation file's table, its token rule and the peak its MFU is over."""

    rows = _applicable(data)
    total = data.get("total_tokens")
    where = ", ".join(str(data[k]) for k in ("model", "device_name") if data.get(k))
    blocks = [
        para(
            f"Every row trains {fmt.count(total)} tokens" + (f" ({where})" if where else "") + "; speed-up over the "
            "baseline row's tokens/s. " + _peak_line(data.get("peak_tflops"), data.get("peak_tflops_source"))
        ),
        Block("table", rows=_table(rows, "tokens")),
    ]
    off = [str(r.get("label")) for r in rows if r.get("status", "ok") == "ok" and r.get("tokens") != total]
    if off:
        blocks.append(
            Block("note", f"Not on the same total tokens ({fmt.count(total)}), the handout's rule: {', '.join(off)}.")
        )
    elif total is not None:
        blocks.append(para(f"Checked: every timed row trained {fmt.count(total)} tokens."))
    return blocks


def bench_rows(benches: list[tuple[str, str, dict]]) -> list:
    """Without an ablation file: the GPT benchmarks the lab ran, (label, group, bench.json) each, in one
    table of the same columns, with the tokens each one timed — which differ, and the note says so."""

    rows = []
    for label, group, d in benches:
        per_step, steps = d.get("tokens_per_step"), d.get("timed_steps")
        tokens = per_step * steps if fmt.is_number(per_step) and fmt.is_number(steps) else None
        tps = d.get("tokens_per_s")
        rows.append(
            {
                **d,
                "label": label,
                "group": group,
                "tokens": tokens,
                "status": "ok",
                "total_seconds": tokens / tps if tokens and fmt.is_number(tps) and tps > 0 else None,
            }
        )
    if not rows:
        return []
    peak = next((r for r in rows if fmt.is_number(r.get("peak_tflops"))), {})
    counts = {r["tokens"] for r in rows}
    blocks = [Block("table", rows=_table(rows, "tokens"))]
    note = (
        "Tokens: the tokens each benchmark timed (tokens per step × timed steps); total time: those tokens at the "
        "measured rate. " + _peak_line(peak.get("peak_tflops"), peak.get("peak_tflops_source"))
    )
    if len(counts) > 1:
        note += (
            " These rows time different numbers of tokens, and each mixes several changes at once: the ablation "
            "(every change alone and cumulatively, on the same total tokens) is not in this lab folder."
        )
    blocks.append(para(note))
    return blocks
