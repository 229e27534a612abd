"""Collect `trainlab gpt bench --json` results from a directory into one table (md + json).

python benchmarks/gpt_summarize.py DIR [--out OUT] [--force]   # writes OUT/summary.{md,json} (OUT: DIR)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

GiB = 1024**3


def _tf32(s: dict) -> str:
    t = s.get("tf32")
    return "?" if t is None else ("on" if t.get("matmul_allow_tf32") else "off")


def table(rows: list[dict]) -> str:
    lines = [
        "| run | impl | strategy | TF32 | micro × accum | step ms median [p10–p90] | tokens/s | TFLOPS/dev 6N+attn "
        "| TFLOPS/dev handout (8·N·B·T, N = its get_model_size) | TFLOPS/dev 8N (distinct N) | MFU | peak alloc GiB | reserved GiB "
        "| predicted GiB | loss first→last |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, s in rows:
        st = s["step_seconds"]
        mem = s["peak_memory_per_rank"][0]
        res = mem.get("peak_reserved_bytes")
        pred = s.get("predicted_peak_bytes")
        mfu = "-" if s.get("mfu") is None else f"{100 * s['mfu']:.1f}%"
        accum = s["global_batch"] // s["world_size"] // s["micro_batch"]
        lines.append(
            f"| {name} | {s['impl']} | {s['strategy']} | {_tf32(s)} | {s['micro_batch']} × {accum} | {1e3 * st['median']:.1f} "
            f"[{1e3 * st['p10']:.1f}–{1e3 * st['p90']:.1f}] | {s['tokens_per_s']:,.0f} | {s['tflops_per_device']:.1f} | "
            f"{s['tflops_per_device_handout']:.1f} | {s.get('tflops_per_device_8n', float('nan')):.1f} | {mfu} | {s['peak_memory_bytes'] / GiB:.2f} | "
            f"{'-' if res is None else f'{res / GiB:.2f}'} | {'-' if pred is None else f'{pred / GiB:.2f}'} | "
            f"{s['losses'][0]:.3f}→{s['losses'][-1]:.3f} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir")
    ap.add_argument("--out", default=None, help="where summary.{md,json} go (default: DIR)")
    ap.add_argument("--force", action="store_true", help="overwrite an existing summary there")
    args = ap.parse_args()
    d = Path(args.dir)
    out = Path(args.out or args.dir)
    if (out / "summary.md").exists() and not args.force and args.out is not None:
        sys.exit(f"gpt_summarize.py: error: {out / 'summary.md'} exists; pass --force to overwrite it")
    rows = []
    for p in sorted(d.glob("*.json")):
        try:
            s = json.loads(p.read_text())
        except json.JSONDecodeError:
            continue
        if isinstance(s, dict) and "step_seconds_median" in s:
            rows.append((p.stem, s))
    from trainlab.io import atomic_write_json, atomic_write_text, set_force

    set_force(args.force)  # the writers refuse a summary trainlab did not write unless forced

    md = table(rows)
    first = rows[0][1] if rows else {}
    head = (
        f"Device: {first.get('device_name', '?')}; peak {first.get('peak_tflops')} TFLOPS "
        f"({first.get('peak_tflops_source', '')}); model {first.get('model')}; seq {first.get('seq_len')}; "
        f"global batch {first.get('global_batch')}.\n\n"
    )
    atomic_write_text(out / "summary.md", head + md + "\n")
    atomic_write_json(
        out / "summary.json", [{"run": n, **{k: v for k, v in s.items() if k not in ("env",)}} for n, s in rows]
    )
    print(head + md)


if __name__ == "__main__":
    main()
