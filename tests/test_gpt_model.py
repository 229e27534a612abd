"""Our GPT-2 against HF GPT2LMHeadModel, parameter counts, checkpointing and pipeline deletion."""

import pytest
import torch
import torch.nn.functional as F

from trainlab.errors import ConfigError
from trainlab.gpt.model import (
    GPT,
    build_gpt,
    build_hf_model,
    gpt_state_dict_from_hf,
    gpt_state_dict_to_hf,
    hf_logits,
    init_gpt_weights,
    lm_loss,
    set_activation_checkpointing,
)
from trainlab.gpt.shape import PRESETS, count_params, get_preset

pytest.importorskip("transformers")


def _tokens(cfg, B=2, T=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(cfg.vocab_size, (B, T or cfg.n_positions), generator=g)


def test_param_count_1_6b_on_meta_distinct_parameters():
    cfg = get_preset("gpt2-1.6b")
    model = build_gpt(cfg, device="meta")
    assert all(p.is_meta for p in model.parameters())
    assert sum(p.numel() for p in model.parameters()) == 1_557_611_200  # each parameter once
    assert count_params(cfg) == 1_557_611_200


def test_handouts_get_model_size_counts_the_tied_embedding_twice():
    """The handout's get_model_size, applied literally to HF's GPT2LMHeadModel (the handout's model)
    and to ours: 1,638,022,400 = 1,557,611,200 + the 50257×1600 embedding again as lm_head.weight."""
    from transformers import GPT2LMHeadModel

    from trainlab.gpt.flops import handout_model_size, handout_param_count
    from trainlab.gpt.model import hf_config

    def get_model_size(model):  # the handout's code, verbatim
        total_numel = 0
        for module in model.modules():
            for p in module.parameters(recurse=False):
                total_numel += p.numel()
        return total_numel

    cfg = get_preset("gpt2-1.6b")
    with torch.device("meta"):
        hf = GPT2LMHeadModel(hf_config(cfg))
    assert get_model_size(hf) == 1_638_022_400
    assert get_model_size(build_gpt(cfg, device="meta")) == 1_638_022_400
    assert handout_model_size(hf) == handout_param_count(cfg) == 1_638_022_400
    assert 1_638_022_400 - 1_557_611_200 == cfg.vocab_size * cfg.n_embd


@pytest.mark.parametrize("name", ["gpt2", "gpt2-medium", "tiny", "tiny-8l"])
def test_count_params_matches_hf(name):
    from transformers import GPT2LMHeadModel

    cfg = get_preset(name)
    with torch.device("meta"):
        hf = GPT2LMHeadModel(__import__("trainlab.gpt.model", fromlist=["hf_config"]).hf_config(cfg))
    assert count_params(cfg) == sum(p.numel() for p in hf.parameters())
    # published sizes: GPT-2 small 124,439,808 and medium 354,823,168 parameters
    expected = {"gpt2": 124_439_808, "gpt2-medium": 354_823_168}
    if name in expected:
        assert count_params(cfg) == expected[name]


def test_logits_equal_hf_our_weights_to_hf():
    cfg = get_preset("tiny")
    ours = build_gpt(cfg, seed=3).eval()
    hf = build_hf_model(cfg).eval()
    hf.load_state_dict(gpt_state_dict_to_hf(ours.state_dict()), strict=True)
    x = _tokens(cfg)
    with torch.no_grad():
        assert torch.allclose(ours(x), hf_logits(hf, x), atol=1e-5, rtol=0)


def test_logits_equal_hf_hf_weights_to_ours():
    cfg = get_preset("tiny")
    torch.manual_seed(7)
    hf = build_hf_model(cfg).eval()  # HF's own random init
    ours = GPT(cfg).eval()
    ours.load_state_dict(gpt_state_dict_from_hf(hf.state_dict()), strict=True)
    x = _tokens(cfg, seed=1)
    with torch.no_grad():
        diff = (ours(x) - hf_logits(hf, x)).abs().max().item()
    assert diff < 1e-5
    # and the loss equals the handout's GPTLMLoss (slice logits, shift labels)
    logits = hf_logits(hf, x)
    ref = F.cross_entropy(logits[:, :-1].reshape(-1, cfg.vocab_size), x[:, 1:].reshape(-1))
    assert torch.allclose(lm_loss(logits, x), ref, atol=1e-6)


def test_state_dict_round_trip_is_exact():
    cfg = get_preset("tiny")
    sd = build_gpt(cfg, seed=5).state_dict()
    back = gpt_state_dict_from_hf(gpt_state_dict_to_hf(sd))
    assert set(back) == set(sd)
    for k in sd:
        assert torch.equal(back[k], sd[k]), k


def test_hf_seeded_init_equals_ours():
    cfg = get_preset("tiny")
    ours = build_gpt(cfg, seed=11).eval()
    hf = build_hf_model(cfg, seed=11).eval()
    x = _tokens(cfg)
    with torch.no_grad():
        assert torch.allclose(ours(x), hf_logits(hf, x), atol=1e-5, rtol=0)
    assert hf.lm_head.weight.data_ptr() == hf.transformer.wte.weight.data_ptr()


def test_init_is_deterministic_and_gpt2_like():
    cfg = get_preset("tiny")
    a, b, c = build_gpt(cfg, seed=1), build_gpt(cfg, seed=1), build_gpt(cfg, seed=2)
    for (n, p), q, r in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(p, q), n
        if n.endswith("weight") and p.dim() == 2:
            assert not torch.equal(p, r), n
    assert a.lm_head.weight is a.wte.weight
    L = cfg.n_layer
    proj = torch.cat([a.h[str(i)].mlp.proj.weight.flatten() for i in range(L)])
    assert abs(proj.std().item() - 0.02 / (2 * L) ** 0.5) < 0.1 * 0.02 / (2 * L) ** 0.5
    assert abs(a.wte.weight.std().item() - 0.02) < 0.002
    assert torch.equal(a.h["0"].ln_1.weight, torch.ones(cfg.n_embd))
    assert torch.equal(a.h["0"].attn.q_proj.bias, torch.zeros(cfg.n_embd))


def _loss_and_grads(model, x):
    model.zero_grad(set_to_none=True)
    loss = lm_loss(model(x), x)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_checkpointing_gives_same_loss_and_grads(mode):
    cfg = get_preset("tiny")
    model = build_gpt(cfg, seed=0)
    x = _tokens(cfg, T=32)
    ref_loss, ref_grads = _loss_and_grads(model, x)
    set_activation_checkpointing(model, mode)
    assert model.activation_checkpointing == mode
    loss, grads = _loss_and_grads(model, x)
    assert torch.allclose(loss, ref_loss, atol=1e-6)
    for n in ref_grads:
        assert torch.allclose(grads[n], ref_grads[n], atol=1e-6, rtol=1e-5), n


def test_checkpointing_saves_fewer_activations():
    """Full recompute keeps only block inputs: far fewer saved bytes than none."""
    cfg = get_preset("tiny")
    model = build_gpt(cfg, seed=0)
    x = _tokens(cfg)

    def saved_bytes(mode):
        set_activation_checkpointing(model, mode)
        total = [0]

        def pack(t):
            total[0] += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(x)
        return total[0]

    none, sel, full = saved_bytes("none"), saved_bytes("selective"), saved_bytes("full")
    assert full < sel < none


def test_bad_checkpoint_mode_and_preset():
    with pytest.raises(ConfigError, match="unknown preset"):
        get_preset("gpt5")
    with pytest.raises(ConfigError, match="activation checkpointing"):
        set_activation_checkpointing(build_gpt(get_preset("tiny")), "some")


def test_pipeline_style_deletion_composes_to_full_model():
    """Two stages made by deleting blocks/embeddings reproduce the full model's logits and FQNs."""
    cfg = get_preset("tiny-8l")
    full = build_gpt(cfg, seed=4).eval()
    stage0, stage1 = build_gpt(cfg, seed=4).eval(), build_gpt(cfg, seed=4).eval()
    for i in range(4, 8):
        del stage0.h[str(i)]
    stage0.ln_f = None
    stage0.lm_head = None
    for i in range(4):
        del stage1.h[str(i)]
    stage1.wte = None
    stage1.wpe = None
    x = _tokens(cfg)
    with torch.no_grad():
        hidden = stage0(x)
        assert hidden.shape == (2, cfg.n_positions, cfg.n_embd)
        assert torch.allclose(stage1(hidden), full(x), atol=1e-6)
    names0, names1 = set(stage0.state_dict()), set(stage1.state_dict())
    assert "h.3.mlp.fc.weight" in names0 and "h.4.mlp.fc.weight" in names1
    assert "lm_head.weight" in names1 and "wte.weight" not in names1
    # a stage initialized on its own gets the same numbers as the full model (tied lm_head too)
    fresh = GPT(cfg)
    for i in range(4):
        del fresh.h[str(i)]
    fresh.wte = None
    fresh.wpe = None
    init_gpt_weights(fresh, seed=4)
    assert torch.equal(fresh.h["5"].attn.k_proj.weight, full.h["5"].attn.k_proj.weight)
    assert torch.equal(fresh.lm_head.weight, full.wte.weight)


def test_presets_have_valid_head_split():
    for name, cfg in PRESETS.items():
        assert cfg.n_embd % cfg.n_head == 0, name
