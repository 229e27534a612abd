"""`trainlab gpt profile` on the CPU (tiny model): every category the step runs is found and named, the SDPA
backend is the one the operators show, and the numbers add up (issue 35)."""

import json

import pytest
from gpt_plans import make_plan

from trainlab.cli import main
from trainlab.gpt.profile import category, profile_plan, sdpa_backend


@pytest.mark.parametrize(
    "name,cat",
    [
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "GEMM"),
        ("nvjet_tst_192x192_64x4_1x2_h_bz_coopB_TNN", "GEMM"),
        ("aten::addmm", "GEMM"),
        ("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<…>", "attention bwd"),
        ("pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128>>", "attention fwd"),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3", "attention fwd"),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_7", "attention bwd"),
        ("aten::_scaled_dot_product_flash_attention_for_cpu_backward", "attention bwd"),
        ("void at::native::elementwise_kernel<128, 4, direct_copy_kernel_cuda>", "copies/casts"),
        ("triton_poi_fused__to_copy_0", "copies/casts"),
        ("triton_per_fused_add_native_layer_norm_1", "LayerNorm"),
        ("triton_poi_fused_gelu_tanh_2", "GELU/elementwise"),
        ("aten::expand", "other"),
        ("void at::native::(anonymous namespace)::fused_adamw_kernel", "optimizer"),
        ("aten::_log_softmax", "loss"),
    ],
)
def test_kernel_names_fall_in_their_category(name, cat):
    assert category(name) == cat


def test_sdpa_backend_from_the_operators():
    assert sdpa_backend(["aten::linear", "aten::_scaled_dot_product_flash_attention_for_cpu"]) == "flash-cpu"
    assert sdpa_backend(["aten::_cudnn_attention_forward"]) == "cudnn"
    assert sdpa_backend(["aten::_scaled_dot_product_efficient_attention"]) == "efficient"
    assert sdpa_backend(["aten::mm"]) == "none"


def test_profile_of_the_tiny_step_on_the_cpu():
    plan = make_plan("tiny", "accum", global_batch=4, micro_batch=2, seq_len=32, warmup=1, attention="pad24")
    p = profile_plan(plan, steps=1)
    cats = {r["category"]: r for r in p["categories"]}
    for c in ("GEMM", "attention fwd", "attention bwd", "LayerNorm", "GELU/elementwise", "loss", "optimizer"):
        assert cats.get(c, {}).get("ms_per_step", 0) > 0, (c, sorted(cats))
    assert sum(r["share"] for r in p["categories"]) == pytest.approx(1.0)
    assert p["sdpa_backend"] == p["sdpa_backend_planned"] == "flash-cpu"
    assert p["attention_layout"] == "pad24" and p["micro_steps"] == 2
    assert 0 < p["busy_fraction"] <= 1 and p["busy_ms_per_step"] <= p["wall_ms_per_step"] * 1.001
    assert p["gemm_tflops"] > 0 and p["attention_tflops"] > 0


def test_gpt_profile_command_writes_json(tmp_path, capsys):
    out = tmp_path / "p.json"
    argv = ["gpt", "profile", "--model", "tiny", "--device", "cpu", "--global-batch", "2", "--micro-batch", "2"]
    assert main([*argv, "--seq", "16", "--warmup", "0", "--profile-steps", "1", "--json", str(out)]) == 0
    assert "SDPA ran flash-cpu" in capsys.readouterr().out
    assert json.loads(out.read_text())["kind"] == "gpt_profile"


# ---------------------------------------------------------------------------------------------- the FP8 row


def test_float8_block_linears_swaps_the_block_linears_and_keeps_the_loss():
    """torchao's Float8Linear in every block (6 Linears each), the head left alone; one bf16-autocast step on
    the CPU (torchao emulates the scaled GEMM there) gives the plain loss within FP8's rounding."""
    pytest.importorskip("torchao", reason="the fp8 extra (pip install 'trainlab[fp8]') is not installed")
    import torch

    from trainlab.gpt.model import build_gpt, float8_block_linears, lm_loss
    from trainlab.gpt.shape import get_preset

    cfg = get_preset("tiny")
    plain, fp8 = build_gpt(cfg, 0), build_gpt(cfg, 0)
    assert float8_block_linears(fp8) == 6 * cfg.n_layer
    assert type(fp8.h["0"].mlp.fc).__name__ == "Float8Linear" and type(fp8.lm_head).__name__ == "Linear"
    tokens = torch.randint(512, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        l0, l1 = lm_loss(plain(tokens), tokens), lm_loss(fp8(tokens), tokens)
    l1.backward()
    assert float(l1) == pytest.approx(float(l0), rel=0.02)
    assert fp8.h["0"].mlp.fc.weight.grad.abs().max() > 0


def test_fp8_is_refused_with_one_line_where_it_cannot_run():
    from trainlab.errors import ConfigError, HardwareError
    from trainlab.gpt.plan import Machine, fp8_problem

    with pytest.raises(HardwareError, match="--fp8: "):
        make_plan("tiny", "amp+compile", fp8=True, global_batch=2, micro_batch=2)
    h100 = Machine(gpus=1, sm=90, memory_bytes=80 * 2**30)
    if fp8_problem(h100) is None:  # torchao installed: the strategy's limits
        with pytest.raises(ConfigError, match="--fp8: for --impl ours with bf16 and compile"):
            make_plan("tiny", "amp", device="cuda", machine=h100, fp8=True, global_batch=2, micro_batch=2)
        plan = make_plan("tiny", "amp+compile", device="cuda", machine=h100, fp8=True, global_batch=2, micro_batch=2)
        assert plan.fp8 and plan.describe()["fp8"]
    assert "sm89+" in fp8_problem(Machine(gpus=1, sm=80))  # the hardware is named first, installed or not


def test_the_ablations_fp8_row_runs_gpt_best_with_fp8_or_says_why():
    from trainlab.gpt.ablation import CHANGES, rows_for
    from trainlab.gpt.config import GPTBenchConfig
    from trainlab.gpt.plan import Machine, fp8_problem

    bench = GPTBenchConfig(model="tiny", device="cuda")
    names = [c.name for c in CHANGES]
    cpu_row = rows_for(bench, names, ["separate"])[0]
    assert cpu_row["config"] is None and cpu_row["status"].startswith("not measured: ")
    h100 = Machine(gpus=1, sm=90, memory_bytes=80 * 2**30)
    gpu_rows = rows_for(bench, names, ["cumulative", "separate"], h100)
    if fp8_problem(h100) is None:
        best, fp8 = gpu_rows[-2]["config"], gpu_rows[-1]["config"]
        assert fp8.fp8 and "compile" in fp8.strategy and fp8.micro_batch_auto == best.micro_batch_auto
