"""`trainlab gpt ablation`: from the handout's baseline to ours, each change alone and cumulatively (issue 30).

The baseline is the handout's training: HF `GPT2LMHeadModel`, fp32 with TF32 off, activation
checkpointing, the loop's AdamW. `CHANGES` lists what our fastest configuration changes, in the order
they are added; TF32 comes first (the handout's fp32 baseline with TF32 on), then every other change
*alone* on top of baseline + TF32 (a lever of our model alone also takes our model, a 16-bit one bf16),
then *cumulatively*: the `max-micro-batch` row is `gpt_best`, and issue 35's glue levers follow it (off in
`gpt_best` until a GPU shows they pay: the 16-bit residual, the fused block boundary, the weights cast once
per optimizer step, the chunked loss only where the logits do not fit). A *peer* row is what a user would write
instead: HF's model with SDPA, bf16 autocast, `torch.compile`, fused AdamW, the largest micro-batch
that fits. FP8 has a *separate* row beside the headline, never in it: `gpt_best` with torchao's float8 block
Linears (its MFU also against the FP8 peak), or one line saying why it cannot run here.

Every row is one `gpt bench` process (`compare.run_one`: isolated OOMs, timeouts, the planner's
pre-flight check) with the same global batch, sequence length, timed steps and seed, so every row
trains the same total tokens on the same batches (保证不同的加速策略下训练的总数据量相同). A
setting reached by two rows (ours alone = the second cumulative row) runs once. The output
`ablation.json` follows the report's schema (`trainlab.report.ablation`), beside ablation.md/.log
and each run's json/log.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace

from trainlab.errors import ConfigError, UserError
from trainlab.flags import Config, opt, output_dir, positive
from trainlab.gpt.config import GPTBenchConfig
from trainlab.gpt.plan import Machine, fp8_problem
from trainlab.gpt.shape import get_preset
from trainlab.gpt.strategy import parse_strategy
from trainlab.io import read_json, refuse_foreign
from trainlab.schema import INT, NUMBER, STR, Obj, Opt, check


def _strategy(cfg: GPTBenchConfig, add: str = "", drop: str = "") -> GPTBenchConfig:
    parts = [p for p in cfg.strategy.split("+") if p and p != "none" and p != drop] + ([add] if add else [])
    return replace(cfg, strategy=parse_strategy("+".join(parts) or "none").text)


@dataclass(frozen=True)
class Change:
    name: str
    label: str
    apply: Callable[[GPTBenchConfig], GPTBenchConfig]
    # what the change needs to do anything alone: "ours" (a lever of our model), "amp" (a 16-bit lever:
    # the ablation's precision change, bf16 or fp16)
    needs: tuple[str, ...] = ()


CHANGES: tuple[Change, ...] = (
    Change("tf32", "TF32 on", lambda c: replace(c, tf32="on")),
    Change("ours", "our GPT (nn.Linear, SDPA)", lambda c: replace(c, impl="ours")),
    Change("bf16", "bf16 autocast", lambda c: _strategy(c, add="amp")),
    Change("no-ckpt", "no recomputation", lambda c: _strategy(c, drop="ckpt")),
    Change("compile", "torch.compile of each block", lambda c: _strategy(c, add="compile")),
    Change("fused-adamw", "fused AdamW", lambda c: replace(c, fused_optimizer=True)),
    Change("vocab-pad", "vocabulary padded to a multiple of 64", lambda c: replace(c, vocab_multiple=64), ("ours",)),
    Change("fused-qkv", "fused QKV (one GEMM)", lambda c: replace(c, fused_qkv=True), ("ours",)),
    Change("chunked-ce", "chunked cross-entropy", lambda c: replace(c, loss="chunked"), ("ours",)),
    # the planner's layout (auto): heads padded to a multiple of 8 on a GPU under amp, plain elsewhere
    Change("pad-heads", "heads padded for cuDNN attention (auto)", lambda c: replace(c, attention="auto"), ("ours",)),
    Change("max-micro-batch", "fastest micro-batch that fits (planner)", lambda c: replace(c, micro_batch_auto=True)),
    # issue 35's glue, after gpt_best
    Change(
        "residual-16bit",
        "residual stream in 16-bit (LayerNorm statistics fp32)",
        lambda c: replace(c, residual_16bit=True),
        ("ours", "amp"),
    ),
    Change(
        "fused-boundary",
        "block boundary fused (add + next LayerNorm)",
        lambda c: replace(c, fused_boundary=True),
        ("ours",),
    ),
    Change(
        "cast-once",
        "16-bit weights made once per optimizer step",
        lambda c: replace(c, cast_once=True),
        ("ours", "amp"),
    ),
    Change(
        "loss-auto",
        "chunked loss only where the logits do not fit (planner)",
        lambda c: replace(c, loss="auto"),
        ("ours",),
    ),
)
# issue 35's glue levers: in the command's default list and in the lab's gpt_best under bf16; the lab's
# timed ablation stops before them (its 9-minute call holds no more rows): benchmarks/gpu_gpt.py --parts
# glue measures them on top of issue 30's levers
GLUE = ("residual-16bit", "fused-boundary", "cast-once", "loss-auto")
# Below sm80 (the course's RTX 2080 Ti: no bf16) in place of "bf16", by name (`--changes ...,fp16,...`): fp16
# autocast with a GradScaler. Not in the default list, which adds bf16.
FP16 = Change("fp16", "fp16 autocast + GradScaler", lambda c: _strategy(c, add="fp16"))
GROUPS = ("baseline", "alone", "cumulative", "peer", "separate")


def baseline(bench: GPTBenchConfig) -> GPTBenchConfig:
    """The handout's training: HF's model, fp32, TF32 off, checkpointing, the loop's AdamW."""
    return replace(
        bench,
        impl="hf",
        strategy="ckpt",
        tf32="off",
        fused_optimizer=False,
        vocab_multiple=1,
        fused_qkv=False,
        attention="plain",
        loss="cross_entropy",
        residual_16bit=False,
        fused_boundary=False,
        cast_once=False,
        micro_batch_auto=False,
        json=None,
        out=None,
    )


def peer(bench: GPTBenchConfig) -> GPTBenchConfig:
    """What a user would write instead: HF's GPT2LMHeadModel (SDPA attention, transformers' default),
    bf16 autocast, torch.compile, fused AdamW, TF32 on, the largest micro-batch the planner predicts fits
    (sized by our model's prediction, the planner has none of HF's)."""
    return replace(baseline(bench), strategy="amp+compile", tf32="on", fused_optimizer=True, micro_batch_auto=True)


def rows_for(
    bench: GPTBenchConfig, changes: list[str], groups: list[str], machine: Machine | None = None
) -> list[dict]:
    """The rows to show, in order: {label, group, changes, config} (config None: not measured, with status).
    The FP8 row is the last cumulative row with --fp8 on `machine` (default: a CPU), or why it cannot run."""
    by_name = {c.name: c for c in (*CHANGES, FP16)}
    chosen = [by_name[n] for n in changes]
    base = baseline(bench)
    rows = []

    def apply(names: list[Change]) -> GPTBenchConfig:
        cfg = base
        for ch in names:
            cfg = ch.apply(cfg)
        return cfg

    if "baseline" in groups:
        rows.append(
            {
                "label": "handout's baseline (HF GPT2LMHeadModel, fp32, TF32 off, checkpointing)",
                "group": "baseline",
                "changes": [],
                "config": base,
            }
        )
    first, rest = chosen[:1], chosen[1:]
    if "alone" in groups:
        precision = next((c for c in chosen if c.name in ("bf16", "fp16")), by_name["bf16"])
        for ch in rest:
            needed = [by_name["ours"] if n == "ours" else precision for n in ch.needs]
            names = first + [c for c in needed if c not in first] + [ch]
            rows.append(
                {
                    "label": f"+ {' + '.join(c.label for c in names)}",
                    "group": "alone",
                    "changes": [c.name for c in names],
                    "config": apply(names),
                }
            )
    if "cumulative" in groups:
        for k in range(1, len(chosen) + 1):
            rows.append(
                {
                    "label": ("+ " if k == 1 else "… + ") + chosen[k - 1].label,
                    "group": "cumulative",
                    "changes": [c.name for c in chosen[:k]],
                    "config": apply(chosen[:k]),
                }
            )
    if "peer" in groups:
        rows.append(
            {
                "label": "peer: HF GPT2LMHeadModel, SDPA, bf16 autocast, torch.compile, fused AdamW, "
                "largest micro-batch",
                "group": "peer",
                "changes": ["peer"],
                "config": peer(bench),
            }
        )
    if "separate" in groups:
        why = fp8_problem(machine or Machine())
        best = apply(chosen)
        # torchao casts the block Linears itself: no 16-bit weight cache beside it
        fp8 = _strategy(replace(best, fp8=True, cast_once=False), drop="compile", add="compile") if not why else None
        row = {"label": "FP8 (torchao float8 block Linears, compile)", "group": "separate", "changes": ["fp8"]}
        rows.append({**row, "config": fp8, **({"status": f"not measured: {why}"} if why else {})})
    return rows


@dataclass
class AblationConfig(Config):
    """The ablation's own flags; the bench flags (model, global batch, steps, …) are shared by every row."""

    bench: GPTBenchConfig = opt(None, "the settings every row shares", cli=False)
    changes: str = opt(
        ",".join(c.name for c in CHANGES),
        "comma-separated changes in the order they are added (the first is also the base of the 'alone' rows)",
    )
    groups: str = opt(",".join(GROUPS), "comma-separated: " + ", ".join(GROUPS))
    out: str = opt("runs/gpt_ablation", "directory for ablation.json/.md/.log and each row's run", check=output_dir)
    timeout_s: float = opt(1800.0, "seconds per row", flag="--timeout", check=positive)

    def __post_init__(self):
        if self.bench is None:
            self.bench = GPTBenchConfig()

    def validate(self) -> None:
        super().validate()
        known = {c.name for c in (*CHANGES, FP16)}
        for name in self.change_list:
            if name not in known:
                raise ConfigError(f"--changes {name!r}: expected some of {', '.join(known)}")
        if not self.change_list:
            raise ConfigError("--changes: expected at least one change")
        for g in self.group_list:
            if g not in GROUPS:
                raise ConfigError(f"--groups {g!r}: expected some of {', '.join(GROUPS)}")

    @property
    def change_list(self) -> list[str]:
        return [s for s in self.changes.split(",") if s]

    @property
    def group_list(self) -> list[str]:
        return [s for s in self.groups.split(",") if s]


# `gpt ablation` takes the shared bench flags; these are per row there.
ABLATION_EXCLUDED_BENCH_FLAGS = (
    "strategy",
    "impl",
    "tf32",
    "matmul_precision",  # TF32 is a row's change (--tf32 on = --matmul-precision high)
    "fused_optimizer",
    "vocab_multiple",
    "fused_qkv",
    "attention",
    "fp8",
    "loss",
    "residual_16bit",
    "fused_boundary",
    "cast_once",
    "micro_batch_auto",
    "json",
    "out",
    "overwrite",
)
ROW_KEYS = (
    "status",
    "tokens",
    "tokens_per_s",
    "step_seconds_median",
    "step_ms_median",
    "total_seconds",
    "peak_memory_bytes",
    "peak_memory_kind",
    "device_name",
    "peak_tflops",
    "peak_tflops_source",
    "tflops_per_device",
    "tflops_per_device_handout",
    "tflops_per_device_8n",
    "mfu",
    "mfu_fp8_peak",
    "micro_batch",
    "predicted_bytes",
    "first_loss",
    "last_loss",
    "error",
    "strategy",
)


# A kept row is read back from a file the user may have edited: every number the tables compute with
# must be one (`tokens_per_s: "fast"` was a ValueError in the middle of a resumed call).
_NUMBERS = ("tokens", "tokens_per_s", "step_seconds_median", "step_ms_median", "total_seconds")
KEPT_ROW = Obj(
    {
        **{k: NUMBER for k in _NUMBERS},
        **{k: Opt(NUMBER) for k in ("peak_memory_bytes", "peak_tflops", "tflops_per_device", "mfu", "first_loss")},
        **{k: Opt(NUMBER) for k in ("tflops_per_device_handout", "tflops_per_device_8n", "last_loss")},
        **{k: Opt(INT) for k in ("micro_batch", "predicted_bytes")},
        **{k: Opt(STR) for k in ("peak_memory_kind", "device_name", "peak_tflops_source", "strategy")},
        "bench": STR,
    },
    required=("status", "bench", *_NUMBERS),
)


def to_markdown(result: dict) -> str:
    lines = [
        f"# GPT-2 ablation: {result.get('model')}\n",
        f"Every row trains {result['total_tokens']:,} tokens. "
        f"MFU over {result.get('peak_tflops')} TFLOP/s ({result.get('peak_tflops_source')}).\n",
        "| row | group | micro | tokens | tokens/s | step s | total s | peak GiB | TFLOP/s 6N+attn | "
        "TFLOP/s 8NBT (handout) | MFU | speed-up |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    ref = next((r.get("tokens_per_s") for r in result["rows"] if r["group"] == "baseline"), None)
    for r in result["rows"]:
        if r.get("status") != "ok":
            lines.append(
                f"| {r['label']} | {r['group']} | | | **{r.get('status')}** {r.get('error', '')[:100]} |||||||"
            )
            continue
        up = f"{r['tokens_per_s'] / ref:.2f}×" if ref else "-"
        mfu = "-" if r.get("mfu") is None else f"{100 * r['mfu']:.1f}%"
        lines.append(
            f"| {r['label']} | {r['group']} | {r['micro_batch']} | {r['tokens']:,} | {r['tokens_per_s']:,.0f} | "
            f"{r['step_seconds_median']:.3f} | {r['total_seconds']:.2f} | {r['peak_memory_bytes'] / 2**30:.2f} | "
            f"{r['tflops_per_device']:.2f} | {r['tflops_per_device_handout']:.2f} | {mfu} | {up} |"
        )
    return "\n".join(lines) + "\n"


def run_ablation(ac: AblationConfig, log=print, command: str = "trainlab gpt ablation") -> dict:
    """Run every row (each distinct setting once); write ablation.json/.md/.log under `ac.out`."""
    # here, not at the top: `gpt ablation --help` and the lab's plan read this module's config and rows
    # without the runner (torch, the launcher)
    from trainlab.gpt.compare import _row_line, run_one
    from trainlab.gpt.record import gpt_plan_record
    from trainlab.telemetry.env import collect_env, format_header
    from trainlab.telemetry.results import write_results

    ac.validate()
    get_preset(ac.bench.model)
    rows = rows_for(ac.bench, ac.change_list, ac.group_list, Machine.detect())
    # a row's files are named by its settings: a resumed run with other --changes never reuses a name
    slugs = {
        _key(r["config"]): f"row-{zlib.crc32(_key(r['config']).encode()):08x}" for r in rows if r["config"] is not None
    }
    refuse_foreign(
        [os.path.join(ac.out, f"{s}{ext}") for s in slugs.values() for ext in (".json", ".log", ".spec.json")]
        + [os.path.join(ac.out, f"ablation.{ext}") for ext in ("json", "md", "log")],
        "--out",
    )
    os.makedirs(ac.out, exist_ok=True)
    env = collect_env(ac.bench.device)
    header = format_header({"changes": ac.changes, "groups": ac.groups, **ac.bench.to_dict()}, env)
    log(header)
    lines = header.splitlines()
    seq = ac.bench.seq or get_preset(ac.bench.model).n_positions
    plan = gpt_plan_record(
        ac.bench.model,
        "cuda" if env["cuda_available"] and ac.bench.device != "cpu" else "cpu",
        precision="per row",
        seq=seq,
        device_name=", ".join(env["gpus"]) or env["cpu"],
        tokens={
            "global_batch": ac.bench.global_batch,
            "steps": ac.bench.steps,
            "total": ac.bench.global_batch * seq * ac.bench.steps,
        },
        resolved=ac.bench.to_dict(),
    )
    machine, done = Machine.detect(), _finished(ac.out)
    result = {
        "model": ac.bench.model,
        "total_tokens": ac.bench.global_batch * seq * ac.bench.steps,
        "baseline": "HF GPT2LMHeadModel, fp32, TF32 off, activation checkpointing (the handout's)",
        "config": ac.bench.to_dict(),
        "rows": [],
    }
    for r in rows:
        out = {k: v for k, v in r.items() if k != "config"}
        if r["config"] is not None:
            key = _key(r["config"])
            if key in done:
                lines.append(f"kept (ok in an earlier run of this folder): {r['label']}")
                log(lines[-1])
            else:
                done[key] = {**run_one(r["config"], ac.out, slugs[key], machine, ac.timeout_s), "bench": key}
            measured = done[key]
            out.update({k: measured[k] for k in ROW_KEYS if k in measured})
            out.update(run=slugs[key], bench=key)
            for k in ("device_name", "peak_tflops", "peak_tflops_source"):
                if measured.get(k) is not None:
                    result.setdefault(k, measured[k])
        result["rows"].append(out)
        lines.append(_row_line({**out, "label": f"[{out['group']}] {out['label']}"}, "label"))
        log(lines[-1])
        write_results(
            ac.out, "ablation", result, to_markdown(result), lines, command, kind="gpt_ablation", plan=plan, env=env
        )
    log("\n" + to_markdown(result))
    log(f"wrote {ac.out}/ablation.json, ablation.md, ablation.log")
    if not any(r.get("status") == "ok" for r in result["rows"]):  # measured nothing: never "success"
        raise UserError(f"gpt ablation: nothing was measured: no row finished ok (see {ac.out}/ablation.md)")
    return result


def _finished(out: str) -> dict[str, dict]:
    """Rows an earlier, interrupted run of this folder measured (status ok), by their bench settings: a
    second call resumes instead of measuring them again (the lab reruns a killed step in its folder)."""
    path = os.path.join(out, "ablation.json")
    if not os.path.exists(path):
        return {}
    try:
        rows = read_json(path).get("rows", [])
    except (UserError, OSError, ValueError, AttributeError):
        return {}
    kept = {}
    for i, r in enumerate(rows if isinstance(rows, list) else []):
        if not (isinstance(r, dict) and r.get("status") == "ok"):
            continue
        try:
            kept[check(r, KEPT_ROW, path, f"'rows'[{i}]")["bench"]] = r
        except UserError as e:  # damaged or edited: measured again, never trusted
            print(f"note: {e}; measuring that row again", flush=True)
    return kept


def _key(cfg: GPTBenchConfig) -> str:
    return repr(sorted(cfg.to_dict().items()))
