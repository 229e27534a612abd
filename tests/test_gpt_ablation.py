"""`trainlab gpt ablation`: rows from the handout's baseline to ours on the same tokens, in the report's schema."""

import json

from trainlab.cli import main
from trainlab.gpt.ablation import CHANGES, GLUE, baseline, peer, rows_for
from trainlab.gpt.config import GPTBenchConfig


def test_rows_alone_cumulative_peer_gpt_best_then_the_glue_levers():
    bench = GPTBenchConfig(model="tiny", device="cpu", global_batch=4, micro_batch=2, seq=16)
    rows = rows_for(bench, [c.name for c in CHANGES], ["baseline", "alone", "cumulative", "peer", "separate"])
    base = baseline(bench)
    assert (base.impl, base.strategy, base.tf32, base.fused_optimizer) == ("hf", "ckpt", "off", False)
    alone = {r["changes"][-1]: r for r in rows if r["group"] == "alone"}
    assert all(r["changes"][0] == "tf32" for r in alone.values())  # TF32 first, then each change alone
    assert alone["vocab-pad"]["changes"] == ["tf32", "ours", "vocab-pad"]  # a lever of our model takes our model
    assert alone["bf16"]["config"].impl == "hf" and alone["bf16"]["config"].strategy == "amp+ckpt"
    # a 16-bit glue lever alone also takes our model and bf16; each glue lever then follows gpt_best
    assert alone["cast-once"]["changes"] == ["tf32", "ours", "bf16", "cast-once"]
    assert alone["fused-boundary"]["changes"] == ["tf32", "ours", "fused-boundary"]
    cumulative = [r for r in rows if r["group"] == "cumulative"]
    assert len(cumulative) == len(CHANGES) and cumulative[0]["changes"] == ["tf32"]
    assert [r["changes"][-1] for r in cumulative[-len(GLUE) :]] == list(GLUE)
    last = cumulative[-1]["config"]
    assert (last.residual_16bit, last.fused_boundary, last.cast_once, last.loss) == (True, True, True, "auto")
    best = cumulative[-1 - len(GLUE)]["config"]
    assert (
        best.impl,
        best.strategy,
        best.tf32,
        best.fused_optimizer,
        best.vocab_multiple,
        best.fused_qkv,
        best.loss,
        best.micro_batch_auto,
    ) == ("ours", "amp+compile", "on", True, 64, True, "chunked", True)
    p = peer(bench)
    assert (p.impl, p.strategy, p.fused_optimizer, p.micro_batch_auto) == ("hf", "amp+compile", True, True)
    assert rows[-1]["group"] == "separate" and rows[-1]["config"] is None and rows[-1]["status"]


def test_ablation_runs_on_cpu_same_tokens_report_schema(tmp_path, capsys):
    out = tmp_path / "abl"
    argv = [
        "gpt",
        "ablation",
        "--model",
        "tiny",
        "--device",
        "cpu",
        "--global-batch",
        "2",
        "--micro-batch",
        "2",
        "--seq",
        "16",
        "--steps",
        "2",
        "--warmup",
        "0",
        "--changes",
        "tf32,ours",
        "--groups",
        "baseline,cumulative",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    data = json.loads((out / "ablation.json").read_text())
    assert data["total_tokens"] == 2 * 16 * 2
    assert [r["group"] for r in data["rows"]] == ["baseline", "cumulative", "cumulative"]
    for r in data["rows"]:  # the keys trainlab.report.ablation renders
        assert r["status"] == "ok", r
        assert r["tokens"] == data["total_tokens"]
        for key in (
            "label",
            "tokens_per_s",
            "step_seconds_median",
            "total_seconds",
            "peak_memory_bytes",
            "tflops_per_device",
            "tflops_per_device_handout",
            "mfu",
        ):
            assert r[key] is not None and r[key] == r[key], key
        assert r["total_seconds"] > 0 and r["tokens_per_s"] > 0
    assert data["peak_tflops"] and data["peak_tflops_source"]
    # the same seed and tokens: HF's model and ours start from the same loss
    losses = [r["first_loss"] for r in data["rows"]]
    assert max(losses) - min(losses) < 1e-4, losses
    assert "| handout's baseline" in (out / "ablation.md").read_text()
    # a second call into the same folder (the lab reruns a killed step there) keeps what was measured
    capsys.readouterr()
    assert main(argv) == 0
    assert capsys.readouterr().out.count("kept (ok in an earlier run of this folder)") == 3
    again = json.loads((out / "ablation.json").read_text())
    assert [r["tokens_per_s"] for r in again["rows"]] == [r["tokens_per_s"] for r in data["rows"]]


def test_bad_change_is_one_line(capsys):
    assert main(["gpt", "ablation", "--model", "tiny", "--device", "cpu", "--changes", "tf32,warp-drive"]) == 2
    assert "--changes 'warp-drive'" in capsys.readouterr().err


def test_the_peer_rows_hf_model_runs_sdpa():
    """The peer row claims HF's model with SDPA attention: transformers' default for GPT-2, checked here."""
    from trainlab.gpt.model import build_hf_model
    from trainlab.gpt.shape import get_preset

    assert build_hf_model(get_preset("tiny"), seed=0).config._attn_implementation == "sdpa"
