"""Quoted output in the docs, made by the commands that print it.

A fenced block right after a marker is an excerpt:

    <!-- output: trainlab gpt plan --model gpt2-1.6b --micro-batch 8 -->      what the command prints
    <!-- output-log: benchmarks/results/x.log -->                             lines of a committed raw log

A figure in running text is generated the same way, from a committed result file:

    <!-- fig: h100.t99_s -->2.3 s<!-- /fig -->                                 FIGURES["h100.t99_s"]()

`python docs/excerpts.py` runs every `output:` command (in-process, cheap deterministic commands only:
plan tables, --help, data show…) and rewrites its block; `--check` rewrites nothing and exits 1 naming
each block that no longer matches. An `output-log:` block quotes a long run: each of its lines must be
a line of that log (the run's own record), so it is checked without running it again. Before comparing,
timings (`12.3 s`, `4.5 ms`) and this checkout's path are normalised. A `fig:` value must equal what
FIGURES computes from the results now, exactly: rerunning a benchmark with --force without regenerating
the docs fails tests/test_quoted_figures.py, as a quote of changed output fails tests/test_walkthrough.py.

"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ("README.md", "docs/*.md")
_BLOCK = re.compile(r"<!-- (output|output-log): (.+?) -->\n(```[a-z]*\n)(.*?)(```)", re.DOTALL)
_FIG = re.compile(r"<!-- fig: ([\w.]+) -->(.*?)<!-- /fig -->", re.DOTALL)
_TIMING = re.compile(r"\b\d+(?:\.\d+)?\s?(?:s|ms|µs|min)\b")


@dataclass
class Excerpt:
    doc: Path
    kind: str  # "output" (run the command) or "output-log" (lines of a committed log)
    source: str  # the command line, or the log's path relative to the repository
    quoted: str  # the block's text as the doc has it
    span: tuple[int, int]  # where the block's text sits in the doc


def doc_paths(root: Path = ROOT) -> list[Path]:
    return sorted({p for pattern in DOCS for p in root.glob(pattern)})


def excerpts(doc: Path, text: str | None = None) -> list[Excerpt]:
    text = doc.read_text() if text is None else text
    return [Excerpt(doc, m.group(1), m.group(2).strip(), m.group(4), m.span(4)) for m in _BLOCK.finditer(text)]


def normalise(text: str) -> str:
    text = text.replace(str(ROOT) + "/", "")
    return "\n".join(_TIMING.sub("<time>", line).rstrip() for line in text.strip("\n").splitlines())


def run(command: str) -> str:
    """What `command` (a `trainlab …` line) prints on stdout, run in this process."""
    from trainlab import cli

    argv = shlex.split(command)
    if argv[:1] != ["trainlab"]:
        raise ValueError(f"not a trainlab command: {command}")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            code = cli.main(argv[1:])
        except SystemExit as e:  # --help
            code = e.code
    if code:
        raise RuntimeError(f"{command}: exit {code}")
    return out.getvalue()


def problem(ex: Excerpt, root: Path = ROOT) -> str | None:
    """Why the excerpt no longer matches its source, or None."""
    quoted = normalise(ex.quoted)
    if ex.kind == "output":
        fresh = normalise(run(ex.source))
        return None if fresh == quoted else f"{ex.doc.name}: the output of `{ex.source}` changed:\n{fresh}"
    log = root / ex.source
    if not log.is_file():
        return f"{ex.doc.name}: {ex.source}: no such log"
    lines = set(normalise(log.read_text()).splitlines())
    missing = [line for line in quoted.splitlines() if line.strip() and line not in lines]
    return f"{ex.doc.name}: not in {ex.source}: {missing[0]!r}" if missing else None


# ---------------------------------------------------------------------------------- figures from results

RESULTS = ROOT / "benchmarks" / "results"
H100 = RESULTS / "gpu" / "h100" / "lab"
H200 = RESULTS / "gpu" / "h200"
CPU_LAB = RESULTS / "lab_cpu_quiet"


def _json(path: Path):
    return json.loads(path.read_text())


def _t99(path: Path, loop: str = "fast") -> dict:
    return _json(path)["summary"][loop]


def _step_ms(variant: str) -> float:
    return {r["variant"]: r for r in _json(RESULTS / "lenet_cpu_step_nchw2.json")["steps"]}[variant]["median_ms"]


def _fp32_step_ms(variant: str) -> float:
    """lenet_cpu_step_fp32: the fast preset's step with and without bf16 autocast on a CPU without bf16 units."""
    return {r["variant"]: r for r in _json(RESULTS / "lenet_cpu_step_fp32.json")["rows"]}[variant]["median_ms"]


def _gelu(path: Path, impl: str, pass_: str, key: str) -> float:
    rows = _json(path)["rows"]
    size = max(r["size"] for r in rows)
    return next(r[key] for r in rows if r["impl"] == impl and r["pass"] == pass_ and r["size"] == size)


def _plan_gib(strategy: str) -> str:
    rows = {r["strategy"]: r for r in _json(RESULTS / "gpt_plan_1.6b_1x80GiB.json")["strategies"]}
    return f"{rows[strategy]['total_bytes'] / 2**30:.1f} GiB"


def _dp(mode: str, loader: str = "device") -> list[dict]:
    name = "dp_compare.json" if loader == "device" else "dp_compare.loaders.json"
    return [r for r in _json(RESULTS / name)["rows"] if r["mode"] == mode and r["loader"] == loader]


def _span(values) -> tuple[float, float]:
    values = sorted(values)
    return values[0], values[-1]


def _lab_minutes(results: Path) -> str:
    return f"{round(sum(c['used_s'] for c in _json(results)['calls']) / 60)} min"


def _lab_ok(results: Path) -> str:
    steps = _json(results)["steps"].values()
    return f"{sum(s['status'] == 'ok' for s in steps)} of {len(steps)}"


_BASE, _FAST = "bn234+bf16+cl@1", "bn234+bf16+cl+fused1+fused@1"
_DEFAULT, _BEST = RESULTS / "lenet_accuracy_default_relu.json", RESULTS / "lenet_accuracy_best_relu.json"
_T99, _T99_RERUN = RESULTS / "lenet_time_to_99_cpu.json", RESULTS / "lenet_time_to_99_cpu_rerun.json"
_T99_AVX2 = RESULTS / "lenet_time_to_99_cpu_avx2.json"  # the same box type without bf16 units, fp32
_T99_R5 = RESULTS / "lenet_time_to_99_cpu_r5.json"  # the preset at batch 128 beside batch 96 (fast=fast-muon)
_TEST_B128 = RESULTS / "lenet_accuracy_fast_b128.json"
_STEP_B128 = RESULTS / "lenet_cpu_step_fp32_b128.json"
_R8 = RESULTS / "lenet_fast_validation_r8_parts" / "lenet_fast_validation_r8.json"
_R10 = RESULTS / "lenet_fast_validation_r10_parts" / "lenet_fast_validation_r10.json"
# issue 40, round 7: batch 192 with average pooling, the preset since (fast=fast-b128-max: the preset before)
_R11 = RESULTS / "lenet_fast_validation_r11_parts" / "lenet_fast_validation_r11.json"
_R12 = RESULTS / "lenet_fast_validation_r12_parts" / "lenet_fast_validation_r12.json"  # again on the fused stage
_R13 = RESULTS / "lenet_fast_validation_r13_parts" / "lenet_fast_validation_r13.json"  # seeds 20-39, both recipes
_R14 = RESULTS / "lenet_fast_validation_r14_parts" / "lenet_fast_validation_r14.json"  # warm-up 0.3, seeds 0-39
_TEST_B192 = RESULTS / "lenet_accuracy_fast_b192_avg.json"
_TEST_W03 = RESULTS / "lenet_accuracy_fast_b192_avg_w03.json"  # the preset since r14
_T99_R8 = RESULTS / "lenet_time_to_99_cpu_r8.json"
_STEP_B192 = RESULTS / "lenet_cpu_step_b192_avg.json"
_T99_R7 = RESULTS / "lenet_time_to_99_cpu_r7.json"


def _misses(path: Path) -> str:
    """A screen of candidates, each stopped at its first seed below 99 %: how many missed, and the range of
    the missing scores."""
    rows = _json(path)["rows"]
    low = [
        min(r["test_accuracy"] for r in rows if r["variant"] == v) for v in dict.fromkeys(r["variant"] for r in rows)
    ]
    missed = [a for a in low if a < 99.0]
    return f"{len(missed)} of {len(low)} candidates missed, at {min(missed):.2f} to {max(missed):.2f} %"


def _val(path: Path, precision: str | None = None, variant: str | None = None) -> str:
    """A validation screen's verdict: how many seeds reached 99 % (of those that ran in `precision`, of
    `variant` where the screen holds several)."""
    acc = [
        r["test_accuracy"]
        for r in _json(path)["rows"]
        if precision in (None, r.get("precision")) and variant in (None, r.get("variant"))
    ]
    return f"{sum(a >= 99.0 for a in acc)} of {len(acc)} seeds, min {min(acc):.2f} %"


def _r13(variant: str | None, path: Path = _R13) -> str:
    """A validation screen without --stop-below (r13: seeds 20-39, the preset as variant None or the batch-128
    one; r14: seeds 0-39): how many reached 99 %, and the mean."""
    acc = [r["test_accuracy"] for r in _json(path)["rows"] if r.get("variant") == variant]
    return f"{sum(a >= 99.0 for a in acc)} of {len(acc)} seeds at 99 % or more, mean {sum(acc) / len(acc):.2f} %"


def _t99_beside_b128(name: str, path: Path) -> dict:
    """A CPU time-to-99 run of the preset beside the batch-128 one (fast=fast-b128-max): its four figures."""
    b128 = "fast=fast-b128-max"
    return {
        f"{name}_s": lambda: f"{_t99(path)['median_s']:.1f} s",
        f"{name}_seeds": lambda: "{reached}/{of}".format(**_t99(path)),
        f"{name}_b128_s": lambda: f"{_t99(path, b128)['median_s']:.1f} s",
        f"{name}_b128_seeds": lambda: "{reached}/{of}".format(**_t99(path, b128)),
    }


def _images_per_s(path: Path, variant: str) -> float:
    return {r["variant"]: r for r in _json(path)["rows"]}[variant]["images_per_s"]


_H100_T99 = H100 / "steps" / "lenet_time_to_99" / "lenet_time_to_99_cuda.json"
_H100_GELU, _H100_GPT = H100 / "steps" / "gelu_bench" / "gelu_bench.json", H100 / "steps" / "gpt_best" / "bench.json"

# one H200, the code of 9ee1111 (2026-11-28): README.md there gives the commands
H200_RUN = H200 / "2026-11-28"
_H200_GELU = H200_RUN / "issue40" / "gelu_bench.json"
# the same H200 model in a later session, the code of 0c786db: `fast` at batch 128 with Muon's step captured
_H200_T99 = H200_RUN / "issue40-b128" / "lenet_time_to_99_cuda.json"
_TRITON_NOW = "issue40-triton/ops_bench/ops_bench.json"  # the Triton rung at 87a1bdf (TF32 as ATen, no mask in GEMMs)
_H200_GPT, _H200_PEER = H200_RUN / "gpt_best_glue" / "best_glue.json", H200_RUN / "gpt_best_glue" / "peer.json"
_H200_NOGLUE, _H200_NOGLUE_PEER = H200_RUN / "issue35" / "gpt_best.json", H200_RUN / "issue35" / "peer.json"


def _h200_layers(impl: str, run: str = "issue40/ops_bench.json", step: str = "layers") -> float:
    """Total (forward + backward) of the own LeNet layers at batch 4096 over ATen's (`ops bench`'s totals);
    `run`: issue40/ at 9ee1111, issue40-triton/ops_bench/ at 87a1bdf (the Triton rung alone beside ATen)."""
    totals = [t for t in _json(H200_RUN / run)["totals"] if t["step"] == step]
    return next(t["ratio_to_aten"] for t in totals if t["impl"] == impl)


def _profile_ratio(key: str) -> float:
    """gpu_layer_profile at 87a1bdf: the Triton rung's `key` (kernels or host time) over ATen's, summed over the
    eleven layers of a LeNet-5 step, forward and backward, at torch's default TF32 switches."""
    rows = _json(H200_RUN / "issue40-triton" / "layer_profile" / "layer_profile.json")["rows"]
    layers = {"conv1", "relu1", "pool1", "conv2", "relu2", "pool2", "fc1", "relu3", "fc2", "relu4", "fc3"}
    total = {i: sum(r[key] for r in rows if r["impl"] == i and r["layer"] in layers) for i in ("aten", "triton")}
    return total["triton"] / total["aten"]


def _gelu_vs_copy(key: str) -> float:
    """gpu_layer_profile --launch at 0c786db: a 256M-element float32 copy's `key` time over Triton GELU's (wall:
    a synchronize around each call; queued: back to back; kernels: the GPU's own time)."""
    d = _json(H200_RUN / "issue40-b128" / "layer_profile" / "layer_profile.json")
    return d["gelu256M copy"][key] / d["gelu256M triton gelu"][key]


def _gelu_host_us(row: str) -> float:
    return _json(H200_RUN / "issue40-b128" / "layer_profile" / "layer_profile.json")[row]["host"] * 1e6


def _ratio(a: Path, b: Path) -> str:
    return f"{_json(a)['tokens_per_s'] / _json(b)['tokens_per_s']:.2f}×"


# name -> the figure as the docs print it, computed from committed results
FIGURES = {
    "cpu.default_acc": lambda: f"{_json(_DEFAULT)['rows']['mean']:.2f} ± {_json(_DEFAULT)['rows']['sd']:.2f} %",
    "cpu.best_acc": lambda: f"{_json(_BEST)['mean']:.2f} ± {_json(_BEST)['sd']:.2f} %",
    "cpu.best_min": lambda: f"{_json(_BEST)['min']:.2f}",
    "cpu.best_tta": lambda: f"{_json(_BEST)['tta_mean']:.2f} %",
    "cpu.t99_s": lambda: f"{_t99(_T99)['median_s']:.1f} s",
    "cpu.t99_ratio": lambda: f"{_t99(_T99)['speedup_vs_seed_style']['median']:.1f}×",
    "cpu.t99_worst": lambda: f"{_t99(_T99)['speedup_vs_seed_style']['min']:.1f}×",
    "cpu.t99_seeds": lambda: f"{_t99(_T99)['reached']}/{_t99(_T99)['of']}",
    "cpu.t99_avx2_s": lambda: f"{_t99(_T99_AVX2)['median_s']:.1f} s",
    "cpu.t99_avx2_seeds": lambda: f"{_t99(_T99_AVX2)['reached']}/{_t99(_T99_AVX2)['of']}",
    "cpu.t99_avx2_ratio": lambda: f"{_t99(_T99_AVX2)['speedup_vs_seed_style']['median']:.1f}×",
    "cpu.t99_rerun_s": lambda: f"{_t99(_T99_RERUN)['median_s']:.1f} s",
    "cpu.t99_rerun_ratio": lambda: f"{_t99(_T99_RERUN)['speedup_vs_seed_style']['median']:.1f}×",
    "cpu.t99_rerun_worst": lambda: f"{_t99(_T99_RERUN)['speedup_vs_seed_style']['min']:.1f}×",
    "cpu.step_ms": lambda: f"{_step_ms(_FAST):.1f} ms",
    "cpu.step_ratio": lambda: f"{_step_ms(_BASE) / _step_ms(_FAST):.2f}×",
    "cpu.avx2_bf16_step_ratio": lambda: (
        f"{_fp32_step_ms('bn234+bf16+cl+fused1+muon@1') / _fp32_step_ms('bn234+cl+fused1+muon@1'):.1f}×"
    ),
    "cpu.bf16_peak_ratio": lambda: "{:.1f}×".format(
        (lambda r: r["bf16_peak_gflops"] / r["fp32_peak_gflops"])(
            _json(RESULTS / "lenet_cpu_step_fast.json")["roofline"][0]
        )
    ),
    "cpu.fast_fp32_val": lambda: _val(RESULTS / "lenet_fast_validation_r7_parts" / "lenet_fast_validation_r7.json"),
    "cpu.b128_val_fp32": lambda: _val(_R8, "fp32"),
    "cpu.r10_misses": lambda: _misses(_R10),
    "cpu.b192avg_val": lambda: _val(_R11, "fp32", "fast-muon-b192-avg"),
    "cpu.r11_misses": lambda: _misses(_R11),
    "cpu.b192avg_val_fused": lambda: _val(_R12, "fp32"),
    "cpu.r13_b192": lambda: _r13(None),
    "cpu.r13_b128": lambda: _r13("fast-b128-max"),
    "cpu.r14_w03": lambda: (
        _r13("fast-w0.3", _R14) + f", min {min(r['test_accuracy'] for r in _json(_R14)['rows']):.2f}"
    ),
    "cpu.w03_test": lambda: f"{_json(_TEST_W03)['mean']:.2f} ± {_json(_TEST_W03)['sd']:.2f} %",
    "cpu.w03_test_min": lambda: f"{_json(_TEST_W03)['min']:.2f}",
    **_t99_beside_b128("cpu.t99_r8", _T99_R8),
    "cpu.b192avg_imgs_ratio": lambda: "{:.2f}×".format(
        _images_per_s(_STEP_B192, "bn234+cl+fused1+muon+avg+bs192@2")
        / _images_per_s(_STEP_B192, "bn234+cl+fused1+muon+bs128@2")
    ),
    "cpu.b192avg_test": lambda: f"{_json(_TEST_B192)['mean']:.2f} ± {_json(_TEST_B192)['sd']:.2f} %",
    "cpu.b192avg_test_min": lambda: f"{_json(_TEST_B192)['min']:.2f}",
    **_t99_beside_b128("cpu.t99_r7", _T99_R7),
    "cpu.b128_val_bf16": lambda: _val(_R8, "bf16"),
    "cpu.b128_imgs_ratio": lambda: "{:.2f}×".format(
        _images_per_s(_STEP_B128, "bn234+cl+fused1+muon+bs128@1") / _images_per_s(_STEP_B128, "bn234+cl+fused1+muon@1")
    ),
    "cpu.b128_test": lambda: f"{_json(_TEST_B128)['mean']:.2f} ± {_json(_TEST_B128)['sd']:.2f} %",
    "cpu.b128_test_min": lambda: f"{_json(_TEST_B128)['min']:.2f}",
    "cpu.t99_r5_s": lambda: f"{_t99(_T99_R5)['median_s']:.1f} s",
    "cpu.t99_r5_seeds": lambda: f"{_t99(_T99_R5)['reached']}/{_t99(_T99_R5)['of']}",
    "cpu.t99_r5_ratio": lambda: f"{_t99(_T99_R5)['speedup_vs_seed_style']['median']:.1f}×",
    "cpu.t99_r5_b96_s": lambda: f"{_t99(_T99_R5, 'fast=fast-muon')['median_s']:.1f} s",
    "cpu.t99_r5_b96_seeds": lambda: "{reached}/{of}".format(**_t99(_T99_R5, "fast=fast-muon")),
    "cpu.gelu_fwd": lambda: f"{_gelu(RESULTS / 'gelu_bench_16M.json', 'cpp', 'fwd', 'ratio_to_torch'):.2f}×",
    "cpu.gelu_fwdbwd": lambda: f"{_gelu(RESULTS / 'gelu_bench_16M.json', 'cpp', 'fwd+bwd', 'ratio_to_torch'):.2f}×",
    "cpu.ddp_comm_ms": lambda: f"{_dp('ddp')[0]['comm_ms']:.2f} ms",
    "cpu.loader_ms": lambda: f"{_dp('none')[0]['data_ms']:.1f} ms",
    "cpu.dataloader_ms": lambda: "{:.1f}–{:.1f} ms".format(*_span(r["data_ms"] for r in _dp("none", "dataloader"))),
    "cpu.plan_fp32": lambda: _plan_gib("none"),
    "cpu.plan_amp_ckpt": lambda: _plan_gib("amp+ckpt"),
    "h200.t99_s": lambda: f"{_t99(_H200_T99)['median_s']:.2f} s",
    "h200.t99_seeds": lambda: f"{_t99(_H200_T99)['reached']} of {_t99(_H200_T99)['of']}",
    "h200.t99_ratio": lambda: f"{_t99(_H200_T99)['speedup_vs_seed_style']['median']:.0f}×",
    "h200.t99_ms_step": lambda: f"{_t99(_H200_T99)['ms_per_step_median']:.2f} ms",
    "h200.t99_b96_s": lambda: f"{_t99(_H200_T99, 'fast=fast-muon')['median_s']:.2f} s",
    "h200.t99_b96_ms_step": lambda: f"{_t99(_H200_T99, 'fast=fast-muon')['ms_per_step_median']:.2f} ms",
    "h200.t99_adamw_s": lambda: f"{_t99(_H200_T99, 'fast=fast-adamw')['median_s']:.3f} s",
    "h200.t99_adamw_seeds": lambda: (
        f"{_t99(_H200_T99, 'fast=fast-adamw')['reached']} of {_t99(_H200_T99, 'fast=fast-adamw')['of']}"
    ),
    "h200.t99_adamw_ratio": lambda: f"{_t99(_H200_T99, 'fast=fast-adamw')['speedup_vs_seed_style']['median']:.0f}×",
    "h200.t99_adamw_ms_step": lambda: f"{_t99(_H200_T99, 'fast=fast-adamw')['ms_per_step_median']:.2f} ms",
    "h200.gelu_size": lambda: f"{max(r['size'] for r in _json(_H200_GELU)['rows']) // 2**20}M",
    "h200.gelu_cuda_copy": lambda: f"{_gelu(_H200_GELU, 'cuda', 'fwd', 'pct_of_copy_bw') * 100:.0f} %",
    "h200.gelu_triton_copy": lambda: f"{_gelu(_H200_GELU, 'triton', 'fwd', 'pct_of_copy_bw') * 100:.0f} %",
    "h200.gelu_aten_copy": lambda: f"{_gelu(_H200_GELU, 'aten', 'fwd', 'pct_of_copy_bw') * 100:.0f} %",
    "h200.layers_cuda": lambda: f"{_h200_layers('cuda'):.2f}×",
    "h200.layers_triton": lambda: f"{_h200_layers('triton'):.2f}×",
    "h200.layers_triton_now": lambda: f"{_h200_layers('triton', _TRITON_NOW):.2f}×",
    "h200.triton_kernels_ratio": lambda: f"{_profile_ratio('kernels'):.2f}×",
    "h200.triton_host_ratio": lambda: f"{_profile_ratio('host'):.1f}×",
    "h200.gelu_triton_kernel_pct": lambda: f"{_gelu_vs_copy('kernels') * 100:.0f} %",
    "h200.gelu_triton_queued_pct": lambda: f"{_gelu_vs_copy('queued') * 100:.1f} %",
    "h200.gelu_triton_wall_pct": lambda: f"{_gelu_vs_copy('wall') * 100:.1f} %",
    "h200.gelu_triton_host_us": lambda: f"{_gelu_host_us('gelu256M triton gelu'):.0f} µs",
    "h200.gelu_copy_host_us": lambda: f"{_gelu_host_us('gelu256M copy'):.0f} µs",
    "h200.relu_epilogue_triton_now": lambda: f"{_h200_layers('triton', _TRITON_NOW, 'relu-epilogue'):.2f}×",
    "h200.gpt_strategy": lambda: _json(_H200_GPT)["strategy"],
    "h200.gpt_micro": lambda: (
        f"{_json(_H200_GPT)['micro_batch']} × {_json(_H200_GPT)['global_batch'] // _json(_H200_GPT)['micro_batch']}"
    ),
    "h200.gpt_tokens": lambda: f"{_json(_H200_GPT)['tokens_per_s']:,.0f}",
    "h200.gpt_mfu": lambda: f"{_json(_H200_GPT)['mfu'] * 100:.1f} %",
    "h200.peer_mfu": lambda: f"{_json(_H200_PEER)['mfu'] * 100:.1f} %",
    "h200.peer_tokens": lambda: f"{_json(_H200_PEER)['tokens_per_s']:,.0f}",
    "h200.gpt_vs_peer": lambda: _ratio(_H200_GPT, _H200_PEER),
    "h200.noglue_mfu": lambda: f"{_json(_H200_NOGLUE)['mfu'] * 100:.1f} %",
    "h200.noglue_vs_peer": lambda: _ratio(_H200_NOGLUE, _H200_NOGLUE_PEER),
    "h100.steps_ok": lambda: _lab_ok(H100 / "results.json"),
    # the 2-core CPU box, quiet: one call of the README's lab command (benchmarks/lab_cpu.md)
    "cpu_lab.steps_ok": lambda: _lab_ok(CPU_LAB / "results.json"),
    "cpu_lab.minutes": lambda: _lab_minutes(CPU_LAB / "results.json"),
    "h100.minutes": lambda: _lab_minutes(H100 / "results.json"),
    "h100.t99_s": lambda: f"{_t99(_H100_T99)['median_s']:.1f} s",
    "h100.t99_ratio": lambda: f"{_t99(_H100_T99)['speedup_vs_seed_style']['median']:.1f}×",
    "h100.t99_seeds": lambda: f"{_t99(_H100_T99)['reached']}/{_t99(_H100_T99)['of']}",
    "h100.gpt_mfu": lambda: f"{_json(_H100_GPT)['mfu'] * 100:.1f} %",
    "h100.gpt_tokens": lambda: f"{_json(_H100_GPT)['tokens_per_s']:,.0f}",
    "h100.gpt_tflops": lambda: f"{_json(_H100_GPT)['tflops_per_device']:.0f}",
    "h100.gpt_strategy": lambda: _json(_H100_GPT)["strategy"],
    "h100.gpt_baseline_mfu": lambda: f"{_json(H100 / 'steps/gpt_baseline/bench.json')['mfu'] * 100:.1f} %",
    "h100.gpt_vs_baseline": lambda: "{:.2f}×".format(
        _json(_H100_GPT)["tokens_per_s"] / _json(H100 / "steps/gpt_baseline/bench.json")["tokens_per_s"]
    ),
    "h100.gelu_cuda_copy": lambda: f"{_gelu(_H100_GELU, 'cuda', 'fwd', 'pct_of_copy_bw') * 100:.0f} %",
    "h100.gelu_triton_copy": lambda: f"{_gelu(_H100_GELU, 'triton', 'fwd', 'pct_of_copy_bw') * 100:.0f} %",
    "h100.gelu_aten_copy": lambda: f"{_gelu(_H100_GELU, 'aten', 'fwd', 'pct_of_copy_bw') * 100:.0f} %",
    "h100.gelu_size": lambda: f"{max(r['size'] for r in _json(_H100_GELU)['rows']) // 2**20}M",
    "h100.lenet_acc": lambda: f"{_json(H100 / 'steps/lenet_train/lenet-default/summary.json')['test_accuracy']:.2f} %",
    "h100.lenet_s": lambda: f"{_json(H100 / 'results.json')['steps']['lenet_train']['seconds']:.0f} s",
}


def figures(text: str) -> list[tuple[str, str, tuple[int, int]]]:
    """(name, value as written, span of the value) of every `fig:` marker in a text."""
    return [(m.group(1), m.group(2), m.span(2)) for m in _FIG.finditer(text)]


def figure_problems(doc: Path, text: str | None = None) -> list[str]:
    text = doc.read_text() if text is None else text
    out = []
    for name, written, _ in figures(text):
        if name not in FIGURES:
            out.append(f"{doc.name}: no figure named {name!r} in docs/excerpts.py FIGURES")
        elif (fresh := FIGURES[name]()) != written:
            out.append(f"{doc.name}: figure {name} says {written!r}, the committed results give {fresh!r}")
    return out


def regenerate(doc: Path) -> bool:
    """Rewrite every `output:` block and `fig:` value of `doc` from its source; True if it changed."""
    text = doc.read_text()
    for name, _, span in reversed(figures(text)):
        if name in FIGURES:
            text = text[: span[0]] + FIGURES[name]() + text[span[1] :]
    for ex in reversed(excerpts(doc, text)):
        if ex.kind == "output":
            fresh = run(ex.source).strip("\n").replace(str(ROOT) + "/", "") + "\n"
            text = text[: ex.span[0]] + fresh + text[ex.span[1] :]
    changed = text != doc.read_text()
    if changed:
        doc.write_text(text)
    return changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare only; exit 1 if an excerpt drifted")
    args = ap.parse_args(argv)
    if args.check:
        problems = [p for doc in doc_paths() for ex in excerpts(doc) if (p := problem(ex))]
        problems += [p for doc in doc_paths() for p in figure_problems(doc)]
        for p in problems:
            print(p, file=sys.stderr)
        return 1 if problems else 0
    for doc in doc_paths():
        if regenerate(doc):
            print(f"rewrote {doc.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    raise SystemExit(main())
