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
