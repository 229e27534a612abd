"""The lab's report as a hand-in: the handout's §6 in order, the figures' units, nvidia-smi taken during
training, the TensorBoard command, the GPT ablation, failed steps' reasons, and `trainlab report LABDIR`
rebuilding it all from the folder alone (nothing rerun, nothing written into the lab folder).

The lab folder is made here in the shape `trainlab lab` leaves on a GPU (the H100 run of
../shared/gpu/h100-2026-11-25): one real tiny LeNet-5 run trained on the CPU, given the GPU record
(gpu.rank0.csv, nvidia-smi taken during training) a GPU run has, and the result files of the other
steps with the keys their producers write."""

from __future__ import annotations

import csv
import html
import json
import re
import shutil
from pathlib import Path

import pytest

from trainlab.cli import main
from trainlab.io import atomic_write_json
from trainlab.lenet.config import TrainConfig
from trainlab.lenet.loop import train
from trainlab.results.kinds import plan_record, stamp

IDLE_SMI = "| N/A   40C    P0   119W /  700W |  995MiB /  81559MiB |      2%      Default |  (at start-up)"
BUSY_SMI = "| N/A   41C    P0   160W /  700W | 1596MiB /  81559MiB |     17%      Default |  (during training)"
COPY_BW = 0.9691710145034872  # gelu bench: a fraction of the copy bandwidth (97 %)
OPS_ERROR = "FAILED conv_relu_pool2d/ties-nan-inf/cuda/float32: RuntimeError: invalid gradient at index 0"


def _bench(strategy, tps, step_s, timed_steps, peak_bytes, impl="ours"):
    return {
        "strategy": strategy,
        "impl": impl,
        "model": "gpt2-1.6b",
        "world_size": 1,
        "params": 1557611200,
        "global_batch": 16,
        "micro_batch": 8,
        "seq_len": 1024,
        "tokens_per_step": 16384,
        "timed_steps": timed_steps,
        "step_seconds_median": step_s,
        "tokens_per_s": tps,
        "tflops_per_device": tps * 1.029e10 / 1e12,
        "tflops_per_device_handout": tps * 8 * 1638022400 / 1e12,
        "peak_tflops": 989.0,
        "peak_tflops_source": "data sheet (NVIDIA H100 80GB HBM3, dense bf16)",
        "mfu": tps * 1.029e10 / 1e12 / 989.0,
        "peak_memory_bytes": peak_bytes,
        "losses": [11.1, 11.2],
    }


def _write(path: Path, data, kind: str | None = None) -> None:
    """A file as its step leaves it; `kind`: a result, stamped as its producer stamps it (on the H100)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind is not None:
        data = stamp(kind, data, plan_record("cuda", device_name="NVIDIA H100 80GB HBM3"))
    path.write_text(data if isinstance(data, str) else json.dumps(data))


def make_lab(root: Path, run_template: Path) -> Path:
    steps = root / "steps"
    plan, recs = [], {}

    def step(name, part, title, status="ok", **rec):
        plan.append({"name": name, "part": part, "title": title, "estimate_s": 60.0, "limit_s": 180.0, "sizes": {}})
        recs[name] = {
            "part": part,
            "title": title,
            "status": status,
            "rc": 0 if status == "ok" else 1,
            "seconds": 20.0,
            "estimate_s": 60.0,
            "limit_s": 180.0,
            "command": f"python -m trainlab {name}",
            "log": f"steps/{name}/log.txt",
            **rec,
        }
        _write(steps / name / "log.txt", f"{name}: done\n")

    for name, part, title, act in (
        ("lenet_train", "lenet", "LeNet-5, default recipe", "relu"),
        ("gelu_train", "gelu", "LeNet-5 trained with our GELU", "gelu-python"),
    ):
        step(name, part, title)
        run = steps / name / f"lenet-{act}"
        shutil.copytree(run_template, run)
        env = json.loads((run / "env.json").read_text())
        env["nvidia_smi"] = IDLE_SMI
        env["nvidia_smi_busy"] = {"text": BUSY_SMI, "taken_utc": env["time_utc"]}
        (run / "env.json").write_text(json.dumps(env))
        summary = json.loads((run / "summary.json").read_text())
        summary.update(
            act=act,
            gpu={
                "samples": 40,
                "utilization_mean_pct": 15.25,
                "utilization_max_pct": 20,
                "memory_used_max_mib": 1596.8,
            },
        )
        (run / "summary.json").write_text(json.dumps(summary))
        with (run / "gpu.rank0.csv").open("w", newline="") as f:
            w = csv.DictWriter(
                f,
                fieldnames=[
                    "time_s",
                    "gpu",
                    "utilization_pct",
                    "memory_used_mib",
                    "memory_total_mib",
                    "power_w",
                    "temperature_c",
                ],
            )
            w.writeheader()
            w.writerows(
                {
                    "time_s": i / 10,
                    "gpu": 0,
                    "utilization_pct": 10 + i % 10,
                    "memory_used_mib": 1500 + i,
                    "memory_total_mib": 81559,
                    "power_w": 150.0,
                    "temperature_c": 40,
                }
                for i in range(40)
            )
    step("gelu_check", "gelu", "GELU: Python / C++ / GPU implementations against a float64 reference")
    _write(
        steps / "gelu_check" / "gelu_check.json",
        {
            "rows": [
                {
                    "op": "gelu",
                    "impl": impl,
                    "approximate": "none",
                    "dtype": dtype,
                    "fwd_max_abs_err": 4e-7,
                    "grad_max_abs_err": 3e-7,
                    "recipe_loss_diff": 0.0,
                    "recipe_grad_mse": 7e-18,
                    "gradcheck": dtype == "float64" or None,
                    "gradgradcheck": dtype == "float64" or None,
                    "ok": True,
                }
                for impl in ("aten", "python", "cpp", "triton", "cuda")
                for dtype in ("float32", "float64", "bfloat16")
            ]
        },
        "gelu_check",
    )
    step("gelu_bench", "gelu", "GELU speed: forward and backward against F.gelu")
    _write(
        steps / "gelu_bench" / "gelu_bench.json",
        {
            "rows": [
                {
                    "size": n,
                    "impl": impl,
                    "pass": p,
                    "dtype": "float32",
                    "approximate": "none",
                    "median_s": 2e-4,
                    "p10_s": 1.9e-4,
                    "p90_s": 2.1e-4,
                    "gbps": 2641.2,
                    "ratio_to_torch": 1.0 if impl == "aten" else 1.43,
                    "pct_of_copy_bw": COPY_BW,
                }
                for n in (1024, 67108864)
                for impl in ("aten", "python", "cuda", "triton")
                for p in ("fwd", "fwd+bwd")
            ]
        },
        "gelu_bench",
    )
    step("ops_check", "ops", "Own conv2d / max-pool / linear / ReLU against ATen", status="failed")
    _write(steps / "ops_check" / "log.txt", f"ops check: 159 rows\n{OPS_ERROR}\n12 of 159 row(s) failed\n")
    step("dp_compile", "dp", "Eager vs torch.compile vs CUDA graphs")
    _write(
        steps / "dp_compile" / "dp_compile.json",
        {
            "rows": [
                {
                    "variant": v,
                    "device": "cuda",
                    "batch_size": 128,
                    "steps": 200,
                    "step_ms": {"n": 200, "median": med, "p10": med * 0.9, "p90": med * 1.1},
                    "setup_seconds": 0.5,
                    "images_per_s": 128 / (med / 1e3),
                    "unsynced_ms_per_step": queued,
                    "synced_ms_per_step": synced,
                }
                for v, med, queued, synced in (("eager", 2.203, 2.4076, 2.408), ("cudagraph", 0.4374, 0.245, 0.404))
            ]
        },
        "dp_compile",
    )
    step("gpt_baseline", "gpt", "GPT-2: the handout's baseline")
    _write(
        steps / "gpt_baseline" / "bench.json", _bench("ckpt", 2678.0, 6.12, 4, 32_530_000_000, impl="hf"), "gpt_bench"
    )
    step("gpt_best", "gpt", "GPT-2: our fastest single-device configuration")
    _write(
        steps / "gpt_best" / "bench.json", _bench("amp+accum+compile", 31964.0, 0.513, 8, 55_606_583_296), "gpt_bench"
    )
    step("gpt_strategies", "gpt", "GPT-2: parallel and memory strategies side by side")
    _write(steps / "gpt_strategies" / "amp.json", _bench("amp", 26647.0, 0.615, 3, 56_900_000_000), "gpt_bench")
    _write(
        steps / "gpt_strategies" / "compare.json",
        {
            "rows": [
                {
                    "strategy": "amp",
                    "nproc": 1,
                    "status": "ok",
                    "step_ms_median": 615.0,
                    "tokens_per_s": 26647.0,
                    "peak_memory_bytes": 56_900_000_000,
                    "predicted_bytes": 58_300_000_000,
                },
                {
                    "strategy": "ckpt",
                    "nproc": 1,
                    "status": "ok",
                    "step_ms_median": 5843.0,
                    "tokens_per_s": 2804.0,
                    "peak_memory_bytes": 32_530_000_000,
                    "predicted_bytes": 32_500_000_000,
                },
            ]
        },
        "gpt_compare",
    )
    step("gpt_ablation", "gpt", "GPT-2: the ablation", status="not run", reason="budget (needs ≈400 s, 12 s left)")
    state = {
        "version": 1,
        "size": "full",
        "plan": plan,
        "steps": recs,
        "hardware": {"kind": "cuda", "gpus": 1, "name": "NVIDIA H100 80GB HBM3", "cpus": 16},
        "calls": [
            {
                "command": "trainlab lab --out /tmp/lab --budget 9m",
                "started_utc": "2026-11-25T17:07:54Z",
                "budget_s": 540,
                "used_s": 206.0,
            }
        ],
    }
    atomic_write_json(root / "results.json", state)  # as the lab writes it: a file trainlab owns
    return root


@pytest.fixture(scope="module")
def run_template(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "lenet"
    train(
        TrainConfig(epochs=2, train_subset=512, test_subset=300, device="cpu", progress=False, seed=0, out=str(out)),
        log=lambda *_: None,
    )
    return out


def _files(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}


def _build(lab: Path, out: Path) -> tuple[str, str]:
    assert main(["report", str(lab), "-o", str(out)]) == 0
    return html.unescape((out / "index.html").read_text()), (out / "report.md").read_text()


def _outside_folds(md: str) -> str:
    """The Markdown a reader sees without opening any <details>."""
    depth, kept = 0, []
    for line in md.splitlines():
        depth += line.startswith("<details>")
        if depth == 0:
            kept.append(line)
        depth -= line.startswith("</details>")
    return "\n".join(kept)


@pytest.fixture(scope="module")
def built(tmp_path_factory, run_template):
    """The lab folder and its report rebuilt elsewhere (built once: drawing the figures takes seconds):
    (lab, out, page text, report.md, the bar charts drawn {file: (values, title, ylabel)}, the lab's files before)."""
    from trainlab.report import plots

    tmp = tmp_path_factory.mktemp("lab")
    lab = make_lab(tmp / "lab", run_template)
    (lab / "steps" / "lenet_train" / "lenet-relu" / "events.out.tfevents.1.host.1.0").write_bytes(b"")
    before = _files(lab)
    bars, real = {}, plots.bars

    def spy(labels, values, path, title, ylabel, **kw):
        bars[path.name] = (values, title, ylabel)
        return real(labels, values, path, title, ylabel, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plots, "bars", spy)
        page, md = _build(lab, tmp / "out")
    return {"lab": lab, "out": tmp / "out", "page": page, "md": md, "bars": bars, "before": before}


def test_the_lab_report_is_rebuilt_from_its_folder_in_the_handouts_order(built):
    from trainlab.report.lab_text import TOC

    lab, md = built["lab"], built["md"]
    assert _files(lab) == built["before"]  # rebuilt elsewhere: nothing in the lab folder written or touched
    headings = re.findall(r"^#+ (.*)$", md, re.MULTILINE)
    order = [next(i for i, h in enumerate(headings) if h == text) for _, text in TOC]
    assert order == sorted(order), headings  # one section per deliverable of §6, in its order
    shown = _outside_folds(md)
    # 1: the architecture, read off the model the run built: LeNet-5's layer parameters and total
    for layer, params in (
        ("convolution 1→6, 5×5, padding 2", "156"),
        ("convolution 6→16, 5×5", "2,416"),
        ("fully connected 400→120", "48,120"),
        ("fully connected 84→10", "850"),
        ("total", "61,706"),
    ):
        assert re.search(rf"\| {re.escape(layer)} \| [^|]+ \| {params} \|", shown), layer
    # 2: the formula and its derivative; the handout's recipe described as what it is (randn(100)), not a LeNet batch
    assert "GELU(x)  = x·Φ(x) = ½·x·(1 + erf(x/√2))" in shown and "GELU'(x) = Φ(x) + x·φ(x)" in shown
    assert "torch.randn(100)" in shown and "LeNet-5 batch" not in md
    # 5: where F.gelu lives in PyTorch's source
    for path in (
        "aten/src/ATen/native/cuda/ActivationGeluKernel.cu",
        "aten/src/ATen/native/cpu/Activation.cpp",
        "tools/autograd/derivatives.yaml",
    ):
        assert path in shown
    # no invented requirement lines
    assert "The handout: " not in md


def test_gpu_snapshot_during_training_beside_nvml_and_tensorboard_command(built):
    shown = _outside_folds(built["md"])
    gpu = shown.split("#### 3.2.2")[1].split("#### 3.2.3")[0]
    assert BUSY_SMI in gpu and IDLE_SMI not in gpu
    assert "utilization mean 15 %, peak 20 %" in gpu and "nvidia-smi taken during training" in gpu
    assert "`tensorboard --logdir steps` in the lab folder" in shown  # relative: no machine's absolute path
    assert str(built["lab"]) not in built["md"]


def test_figures_in_their_units(built):
    md = built["md"]
    # % of copy bandwidth: the file's fraction 0.969 is 96.9 %, never "0.97 %"
    assert "96.9 %" in md and "0.97 %" not in md
    # the memory chart in GiB, title and axis, like the tables
    ((values, title, ylabel),) = [v for k, v in built["bars"].items() if k.endswith("_gpt_mem.png")]
    assert ylabel == "GiB" and "GiB" in title and "bytes" not in title
    assert values == pytest.approx([56_900_000_000 / 2**30, 32_530_000_000 / 2**30])
    # CUDA graphs: the throughput is the batch over the finished-ms column beside it (128 / 0.404 ms)
    row = next(line for line in md.splitlines() if line.startswith("| cudagraph |"))
    assert "| 0.404 ms | 316,832 img/s |" in row
    assert f"{128 / 0.4374e-3:,.0f}" not in row  # the old figure, matching neither column


def test_a_failed_step_says_why_in_one_line(built, tmp_path):
    line = next(ln for ln in built["page"].splitlines() if "ops_check: failed" in ln)
    assert "12 of 159 row(s) failed" in line and "exit 1" in line
    from trainlab.report.lab_folder import last_error_line

    log = tmp_path / "log.txt"
    log.write_text(f"{OPS_ERROR}\nfinished\n\n")
    assert last_error_line(log) == OPS_ERROR  # the last line naming an error, not the last line
    log.write_text("x" * 1000)
    assert len(last_error_line(log)) == 240


def test_gpt_rows_and_references_used(built):
    md = built["md"]
    gpt = _outside_folds(md).split("#### 3.2.5")[1].split("## 4.")[0]
    for label, speedup in (
        ("handout's baseline", "1.00×"),
        ("amp", f"{26647 / 2678:.2f}×"),
        ("trainlab's fastest", f"{31964 / 2678:.2f}×"),
    ):
        assert re.search(rf"\| {re.escape(label)} \|.*\| {re.escape(speedup)} \|", gpt), label
    assert "time different numbers of tokens" in gpt and "989 TFLOP/s" in gpt and "dense bf16" in gpt
    refs = md.split("## References")[1]
    assert "Hendrycks" in refs and "LeCun" in refs and "Micikevicius" in refs and "Chen" in refs
    assert "ZeRO" not in refs and "GPipe" not in refs and "Megatron" not in refs  # no row used them
    assert "trainlab" in refs.split("| [")[-1] or "trainlab 0." in refs  # trainlab is credited
    # the model's shape is what the files record (an old bench.json: name and sequence), never a typed-in one
    assert "hidden 1600" not in md and "gpt2-1.6b, sequence 1,024" in gpt


def test_the_ablation_file_is_rendered_when_present(run_template, tmp_path):
    def row(label, group, tps, tokens=262144):
        return {
            "label": label,
            "group": group,
            "status": "ok",
            "tokens": tokens,
            "tokens_per_s": tps,
            "step_seconds_median": 16384 / tps,
            "total_seconds": tokens / tps,
            "peak_memory_bytes": 30 * 2**30,
            "tflops_per_device": tps * 1.029e10 / 1e12,
            "tflops_per_device_handout": tps * 1.31e10 / 1e12,
            "mfu": tps * 1.029e10 / 1e12 / 989,
        }

    ablation = {
        "total_tokens": 262144,
        "model": "gpt2-1.6b",
        "peak_tflops": 989.0,
        "peak_tflops_source": "data sheet",
        "rows": [
            row("handout's baseline", "baseline", 2662.0),
            row("+ TF32", "cumulative", 6308.0),
            row("bf16 alone", "alone", 9000.0, tokens=131072),
            {"label": "FP8", "group": "separate", "status": "Transformer Engine not installed"},
        ],
    }
    lab = make_lab(tmp_path / "lab", run_template)
    path = lab / "steps" / "gpt_ablation" / "ablation.json"
    _write(path, ablation, "gpt_ablation")
    state = json.loads((lab / "results.json").read_text())
    state["steps"]["gpt_ablation"].update(status="ok", reason=None)
    (lab / "results.json").write_text(json.dumps(state))
    _, md = _build(lab, tmp_path / "out")
    gpt = _outside_folds(md).split("#### 3.2.5")[1].split("## 4.")[0]
    assert "Every row trains 262,144 tokens" in gpt
    assert re.search(r"\| \+ TF32 \| cumulative \| 262,144 \| 6,308 \|.*\| 2\.37× \|", gpt)
    assert "Not on the same total tokens (262,144), the handout's rule: bf16 alone." in gpt
    assert "| FP8 | separate | not measured: Transformer Engine not installed |" in gpt
    assert "time different numbers of tokens" not in gpt  # the benchmarks' table gives way to the ablation
    # one quantity, one number: the first screen quotes the ablation's own speed-up, not the benchmarks' ratio
    glance = md.split("## 1.")[0]
    assert "2.37× the handout's baseline" in glance and f"{31964 / 2678:.2f}×" not in md


def test_report_pdf_without_chromium_is_one_line(built, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    capsys.readouterr()
    assert main(["report", str(built["lab"]), "-o", str(tmp_path / "out"), "--pdf"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Chromium" in err and "apt-get install chromium" in err
    # the HTML and Markdown are written all the same: the PDF is the only thing missing
    assert (tmp_path / "out" / "index.html").is_file() and (tmp_path / "out" / "report.md").is_file()
    assert not (tmp_path / "out" / "report.pdf").exists()


def test_the_lab_prints_its_report_to_pdf_at_the_end_of_a_call(run_template, tmp_path, monkeypatch):
    """lab/run.py's last write: the PDF beside the page, or one line saying why there is none."""
    from browser import chromium_or_skip

    from trainlab.lab.run import write_outputs

    lab = make_lab(tmp_path / "lab", run_template)
    state = json.loads((lab / "results.json").read_text())
    lines: list[str] = []
    with monkeypatch.context() as mp:
        mp.setenv("PATH", str(tmp_path / "empty"))
        write_outputs(lab, state, pdf_log=lines.append)
    assert lines == [
        f"lab: no report PDF: --pdf: no headless Chromium on PATH (Debian/Ubuntu: apt-get install chromium); "
        f"the HTML report is written: {(lab / 'report' / 'index.html').resolve()}"
    ]
    assert (lab / "report" / "index.html").exists() and (lab / "lab.tar.gz").exists()
    chromium_or_skip()
    lines.clear()
    write_outputs(lab, state, pdf_log=lines.append)
    pdf = lab / "report" / "report.pdf"
    assert lines == [f"lab: report PDF {pdf.resolve()}"] and pdf.read_bytes()[:5] == b"%PDF-"


def test_the_architecture_comes_from_the_run_and_the_standard_text_equals_the_model():
    """The report reads the table a run recorded; the fixed-text fallback (runs from before the field)
    is the handout's LeNet-5 exactly as lenet.architecture computes it, and only for that config."""
    from trainlab.lenet.architecture import architecture_rows
    from trainlab.report.lab import lenet_architecture
    from trainlab.report.lab_text import STANDARD_LENET5

    assert [list(r) for r in STANDARD_LENET5] == architecture_rows({"act": "relu", "pool": "max"})
    recorded = architecture_rows({"act": "gelu-cuda", "batchnorm": True})
    assert any(r[0] == "batch normalization" for r in recorded) and any(r[0] == "gelu-cuda" for r in recorded)
    rows, source = lenet_architecture({"architecture": recorded}, {"act": "gelu-cuda", "batchnorm": True})
    assert rows == recorded and source == "recorded by the run"
    assert lenet_architecture({}, {"act": "relu"})[0][-1] == ["total", "10 class scores", "61,706"]
    assert lenet_architecture({}, {"act": "gelu-cuda"}) is None  # no guessing for a run that differs
    assert lenet_architecture({}, {"batchnorm": True}) is None


def test_every_source_path_the_report_cites_exists():
    """The report's fixed text names our files (`code("ops/gelu/…")`): each must exist, so a move of
    the code cannot leave the hand-in pointing at nothing."""
    import re

    import trainlab.report.lab as lab_module

    src = Path(lab_module.__file__).resolve().parents[1]  # src/trainlab
    cited = re.findall(r'code\("([\w./-]+/[\w./-]*)"\)', Path(lab_module.__file__).read_text())
    assert len(cited) >= 8, cited
    root = src.parent.parent  # the checkout: "src/…" and "docs/…" are cited from there, the rest from the package
    for rel in cited:
        assert (root / rel if rel.startswith(("src/", "docs/")) else src / rel).exists(), rel


def test_the_lenet_section_describes_the_pooling_the_run_used(built, tmp_path):
    """Max-pooling (the handout's form): ReLU after the pool is explained; average pooling (the `fast` preset
    since issue 40, round 7): the report says so and does not print the max-pool paragraph."""
    import json
    import shutil

    from trainlab.lenet.architecture import architecture_rows

    assert "in its common modern form (ReLU, max-pooling)" in built["page"]
    assert "with ReLU and average pooling" not in built["page"]
    lab = tmp_path / "lab"
    shutil.copytree(built["lab"], lab)
    run = lab / "steps" / "lenet_train" / "lenet-relu"
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "pool": "avg"}))
    summary = json.loads((run / "summary.json").read_text())
    rows = architecture_rows({**config, "pool": "avg"})
    (run / "summary.json").write_text(json.dumps({**summary, "architecture": rows}))
    page, _ = _build(lab, tmp_path / "out")
    assert "with ReLU and average pooling" in page and "common modern form" not in page
    assert "average pooling 2×2" in page  # the architecture table the run recorded
