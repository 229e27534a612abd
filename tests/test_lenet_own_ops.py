"""LeNet-5 built from our operators (`train --ops own[=…]`), `trainlab profile`, `trainlab ops check|bench`.

Accuracy: same seed, same batches, same initial weights → our operators differ from ATen's only in
float rounding (~1e-7 relative per op), so after an epoch on a subset the test accuracy must agree
to within 0.15 percentage points (the issue's bound; in practice it is equal) and the per-step
losses to 1e-4 relative. A wrong backward moves them far more (the negative control below).
"""

import json

import pytest
import torch

from trainlab.cli import main
from trainlab.errors import ConfigError
from trainlab.lenet.config import TrainConfig
from trainlab.lenet.loop import train
from trainlab.lenet.model import LeNet5, NCHWConv2d, parse_ops

SUBSET = dict(
    epochs=1, train_subset=2048, test_subset=500, batch_size=64, device="cpu", progress=False, tensorboard=False, seed=1
)


def quiet(*_a, **_k):
    pass


def run(tmp_path, ops, **kw):
    summary = train(TrainConfig(**{**SUBSET, **kw, "ops": ops, "out": str(tmp_path / ops)}), log=quiet)
    losses = [
        loss
        for rec in map(json.loads, (tmp_path / ops / "metrics.jsonl").read_text().splitlines())
        for loss in rec["step_losses"]
    ]
    return summary, losses


@pytest.fixture(scope="module")
def aten_run(tmp_path_factory):
    return run(tmp_path_factory.mktemp("aten"), "aten")


@pytest.mark.parametrize("ops", ["own", "own=python", "fused"])
def test_own_operators_train_to_the_same_accuracy(tmp_path, aten_run, ops):
    ref, ref_losses = aten_run
    summary, losses = run(tmp_path, ops)
    assert ref["test_accuracy"] > 60  # it learned (~80 % after 32 steps; chance is 10 %)
    assert abs(summary["test_accuracy"] - ref["test_accuracy"]) <= 0.15
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-4, atol=1e-5)
    saved = torch.load(tmp_path / ops / "checkpoint.pt", weights_only=False)
    assert saved["config"]["ops"] == ops and "features.0.weight" in saved["model"]


def test_own_operators_with_batchnorm_train_like_aten_with_batchnorm(tmp_path):
    """--ops own --batchnorm: our conv/pool/linear/relu around PyTorch's BatchNorm, the same curve."""
    (ref, ref_losses), (summary, losses) = (run(tmp_path, ops, batchnorm=True) for ops in ("aten", "own"))
    assert ref["test_accuracy"] > 60
    assert abs(summary["test_accuracy"] - ref["test_accuracy"]) <= 0.15
    # BatchNorm divides by each batch's spread, which amplifies the ops' last-bit differences step
    # by step (measured: 1.8e-4 relative after 32 steps); a wrong backward is > 1e-3 after 1 step
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-3, atol=1e-4)


def test_fused_stage_with_average_pooling_trains_like_aten(tmp_path):
    """--ops fused --pool avg (the `fast` preset's first stage on a CPU since issue 40, round 7): conv → ReLU →
    average pool in our one C++ kernel follows the curve of PyTorch's three layers."""
    (ref, ref_losses), (summary, losses) = (run(tmp_path, ops, pool="avg") for ops in ("aten", "fused"))
    assert ref["test_accuracy"] > 60
    assert abs(summary["test_accuracy"] - ref["test_accuracy"]) <= 0.15
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-4, atol=1e-5)


def test_fused_stage_keeps_the_aten_model_weights_and_keys():
    """--ops fused draws the same initial weights and has the same state_dict keys (checkpoints move)."""
    torch.manual_seed(3)
    aten = LeNet5(batchnorm=True, batchnorm_conv1=False).state_dict()
    torch.manual_seed(3)
    fused = LeNet5(batchnorm=True, batchnorm_conv1=False, ops="fused").state_dict()
    assert list(fused) == list(aten) and all(torch.equal(fused[k], aten[k]) for k in aten)


@pytest.mark.parametrize("channels_last", [True, False])
def test_nchw_conv2_computes_nn_conv2d_and_hands_back_the_input_layout(channels_last):
    """The fused model's conv2 computes in NCHW (faster input gradient) but is the same function with
    the same gradients as nn.Conv2d, and returns channels-last when it was given channels-last."""
    assert isinstance(LeNet5(ops="fused").features[4], NCHWConv2d)
    torch.manual_seed(0)
    ref = torch.nn.Conv2d(6, 16, 5)
    ours = NCHWConv2d(6, 16, 5)
    ours.load_state_dict(ref.state_dict())
    layout = (lambda t: t.to(memory_format=torch.channels_last)) if channels_last else (lambda t: t)
    ref, ours = layout(ref), layout(ours)
    x = layout(torch.randn(4, 6, 14, 14, dtype=torch.float64))
    ref, ours = ref.double(), ours.double()
    xr, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
    yr, yo = ref(xr), ours(xo)
    assert yo.is_contiguous(memory_format=torch.channels_last) == channels_last != yo.is_contiguous()
    dy = torch.randn_like(yr)
    yr.backward(dy)
    yo.backward(dy)
    torch.testing.assert_close(yo, yr, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(xo.grad, xr.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours.weight.grad, ref.weight.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours.bias.grad, ref.bias.grad, rtol=1e-12, atol=1e-12)


def test_ops_auto_resolves_to_fused_on_a_cpu_where_it_applies():
    from trainlab.lenet.model import resolve_ops

    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert resolve_ops("auto", cpu, "relu", "max", batchnorm=True, batchnorm_conv1=False) == "fused"
    assert resolve_ops("auto", cpu, "relu", "avg", batchnorm=True, batchnorm_conv1=False) == "fused"  # `fast`
    assert resolve_ops("auto", gpu, "relu", "max", batchnorm=False) == "aten"  # cuDNN on a GPU
    assert resolve_ops("auto", cpu, "gelu", "max", batchnorm=False) == "aten"  # not conv → ReLU → pool
    assert resolve_ops("auto", cpu, "relu", "max", batchnorm=True) == "aten"  # BatchNorm between conv1 and ReLU
    assert resolve_ops("own", cpu, "relu", "max", batchnorm=False) == "own"
    with pytest.raises(ConfigError, match="--ops auto is resolved for a device first"):
        LeNet5(ops="auto")


def _curve(ops: str, steps: int = 3, batch: int = 4) -> list[float]:
    """Per-step losses of LeNet-5 (seed 0, plain SGD: a scaled gradient shows, Adam would normalize it away)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(0)
    x = torch.randn(steps, batch, 1, 28, 28, generator=g).to(device)
    y = torch.randint(0, 10, (steps, batch), generator=g).to(device)
    torch.manual_seed(0)
    model = LeNet5(ops=ops).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    curve = []
    for xb, yb in zip(x, y):
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        curve.append(loss.item())
    return curve


def test_wrong_backward_is_detected(monkeypatch):
    from trainlab.ops import max_pool2d as pool

    real = pool.MaxPool2dFunction.backward
    monkeypatch.setattr(
        pool.MaxPool2dFunction, "backward", staticmethod(lambda ctx, g: (real(ctx, g)[0] * 0.25, None, None, None))
    )
    ref, broken = _curve("aten", 4, 16), _curve("own=python", 4, 16)
    assert max(abs(a - b) for a, b in zip(ref[1:], broken[1:])) > 1e-3


def test_triton_rung_trains_like_aten_for_a_few_steps(monkeypatch):
    """own=triton runs conv1, conv2, fc1 and fc2 with the ReLU in their forward kernels (the backward
    masks dy once): the curve of plain SGD follows ATen's, so every gradient does."""
    pytest.importorskip("triton")
    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")  # slow: 3 steps of batch 4
    assert LeNet5(ops="own=triton").relu_epilogue
    torch.testing.assert_close(torch.tensor(_curve("own=triton")), torch.tensor(_curve("aten")), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "flags,fused",
    [
        ({}, ["features.0", "features.4", "classifier.1", "classifier.4"]),
        ({"batchnorm": True, "batchnorm_conv1": False}, ["features.0"]),  # BatchNorm after conv2, fc1, fc2
        ({"batchnorm": True}, []),
        ({"act": "gelu"}, []),
    ],
)
def test_own_triton_model_puts_relu_in_its_layers_with_the_aten_keys_and_draws(flags, fused):
    """A ReLU that directly follows a conv/linear layer moves into that layer (Conv2dReLU, LinearReLU;
    its slot an Identity), never across a BatchNorm; the state_dict keys and initial weights stay the
    aten model's, so checkpoints move between them."""
    pytest.importorskip("triton")
    from trainlab.ops.conv2d import Conv2dReLU
    from trainlab.ops.linear import LinearReLU

    torch.manual_seed(5)
    aten = LeNet5(**flags)
    torch.manual_seed(5)
    ours = LeNet5(ops="own=triton", **flags)
    ref, got = aten.state_dict(), ours.state_dict()
    assert list(got) == list(ref) and all(torch.equal(got[k], ref[k]) for k in ref)
    names = [n for n, m in ours.named_modules() if isinstance(m, (Conv2dReLU, LinearReLU))]
    assert names == fused and ours.relu_epilogue == bool(fused)
    relus = sum(type(m).__name__ in ("ReLU", "GELU") for m in ours.modules())
    assert relus == sum(type(m).__name__ in ("ReLU", "GELU") for m in aten.modules()) - len(fused)


@pytest.mark.parametrize(
    "spec,impl",
    [
        ("aten", None),
        ("fused", None),
        ("auto", None),
        ("own", "cpp"),
        ("own=python", "python"),
        ("own=triton", "triton"),
    ],
)
def test_parse_ops(spec, impl):
    assert parse_ops(spec) == impl


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--ops", "mine"], "--ops 'mine': expected aten, auto, fused, own or own=python"),
        (["--ops", "own=fortran"], "expected aten, auto, fused, own or own=python"),
        (["--ops", "fused", "--batchnorm"], "no BatchNorm on conv1 (add --no-batchnorm-conv1)"),
        (["--ops", "fused", "--act", "gelu"], "needs --act relu (got --act gelu)"),
        (["--ops", "own", "--pool", "avg"], "use --pool max"),
        (["--ops", "own", "--act", "tanh"], "--act must be one of relu, gelu, gelu-tanh"),
        (["--ops", "fused", "--preset", "best"], "no BatchNorm on conv1"),
    ],
)
def test_bad_ops_flags_fail_before_data_loads(tmp_path, capsys, flags, message, monkeypatch):
    import trainlab.lenet.loop as loop

    monkeypatch.setattr(loop, "load_dataset", lambda *a, **k: pytest.fail("data loaded before the flags were checked"))
    assert main(["train", *flags, "--device", "cpu", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trainlab: error: ") and message in err and err.count("\n") == 1


# ---- trainlab profile ------------------------------------------------------------------------------


def test_profile_attributes_every_layer_forward_and_backward(tmp_path, capsys):
    out = tmp_path / "prof"
    assert (
        main(
            [
                "profile",
                "--ops",
                "aten",
                "--ops",
                "own",
                "--steps",
                "3",
                "--warmup",
                "1",
                "--batch-size",
                "64",
                "--device",
                "cpu",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    result = json.loads((out / "profile.json").read_text())
    assert result["variants"] == ["aten", "own"] and result["steps"] == 3
    rows = {(r["variant"], r["layer"]): r for r in result["rows"]}
    for variant in ("aten", "own"):
        for layer in (
            "conv1",
            "relu1",
            "pool1",
            "conv2",
            "relu2",
            "pool2",
            "fc1",
            "relu3",
            "fc2",
            "relu4",
            "fc3",
            "loss",
        ):
            r = rows[(variant, layer)]
            assert r["fwd_ms_median"] > 0 and r["bwd_ms_median"] > 0, (variant, layer)
    # Nothing is lost or counted twice: in every profiled step the parts (layers, loss, optimizer and
    # "other") add up to the step's own time. Checked per step, so a busy machine cannot break it.
    assert sorted(result["per_step"]) == ["aten", "own"]
    for variant, steps in result["per_step"].items():
        assert len(steps) == 3, variant
        for step in steps:
            parts = sum(cpu for name, (cpu, _dev) in step.items() if name != "step")
            assert parts == pytest.approx(step["step"][0], rel=1e-6), (variant, step)
    assert (out / "trace.json.gz").stat().st_size > 1000 and result["interleaved"]
    table = capsys.readouterr().out
    assert "conv1" in table and "x aten (own)" in table


def test_profile_rejects_bad_variants_before_loading_data(tmp_path, capsys):
    assert main(["profile", "--ops", "own=fortran", "--out", str(tmp_path / "p")]) == 2
    assert "--ops 'own=fortran'" in capsys.readouterr().err
    assert not (tmp_path / "p").exists()


def test_report_renders_a_profile(tmp_path):
    from trainlab.report.build import build_report

    out = tmp_path / "prof"
    assert (
        main(
            [
                "profile",
                "--ops",
                "aten",
                "--steps",
                "2",
                "--warmup",
                "0",
                "--batch-size",
                "32",
                "--device",
                "cpu",
                "--no-trace",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    build_report([str(out / "profile.json")], tmp_path / "report")
    md = (tmp_path / "report" / "report.md").read_text()
    assert "LeNet-5 per-layer profile" in md and "| aten | conv1 |" in md


# ---- trainlab ops check | bench ---------------------------------------------------------------------


def test_ops_check_cli_subset_passes_and_writes_results(tmp_path, capsys):
    code = main(
        [
            "ops",
            "check",
            "--op",
            "max_pool2d",
            "--impl",
            "aten",
            "--impl",
            "cpp",
            "--case",
            "lenet-pool2",
            "--case",
            "nan-inf-ties",
            "--no-gelu",
            "--out",
            str(tmp_path),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0 and "all ok" in out and "nan-inf-ties" in out
    data = json.loads((tmp_path / "ops_check.json").read_text())
    assert (
        len(data["rows"]) == 8
        and all(r["ok"] for r in data["rows"])
        and data["command"].startswith("trainlab ops check")
    )


def test_ops_check_exit_code_is_nonzero_when_a_row_fails(monkeypatch, capsys):
    from trainlab.ops import check

    real = check.check_row
    monkeypatch.setattr(check, "check_row", lambda *a, **k: {**real(*a, **k), "ok": False, "reason": "forced"})
    assert (
        main(
            [
                "ops",
                "check",
                "--op",
                "relu",
                "--impl",
                "cpp",
                "--case",
                "nan-inf-zero",
                "--dtype",
                "float32",
                "--no-gelu",
            ]
        )
        == 1
    )
    assert "FAILED relu/nan-inf-zero/cpp/float32: forced" in capsys.readouterr().out


def test_ops_bench_quick_one_layer(tmp_path, capsys):
    assert (
        main(
            ["ops", "bench", "--quick", "--layer", "pool2", "--batch", "32", "--device", "cpu", "--out", str(tmp_path)]
        )
        == 0
    )
    data = json.loads((tmp_path / "ops_bench.json").read_text())
    impls = {r["impl"] for r in data["rows"]}
    assert impls == {"aten", "python", "cpp"}
    assert all(r["fwd_median_s"] > 0 and r["bwd_median_s"] > 0 for r in data["rows"])
    assert "pool2" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv,message",
    [
        (["ops", "bench", "--batch", "0"], "--batch '0'"),
        (["ops", "bench", "--layer", "conv9"], "--layer 'conv9'"),
        (["ops", "bench", "--threads", "0"], "--threads 0"),
        (["ops", "check", "--batch", "0", "--no-gelu"], "--batch 0"),
    ],
)
def test_ops_bad_flags_are_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("trainlab: error: ") and message in err


def test_config_rejects_a_non_string_ops_in_json():
    with pytest.raises(ConfigError, match="'ops' must be a string"):
        TrainConfig.from_dict({"ops": 3})


def test_ops_auto_falls_back_to_pytorch_layers_without_a_compiler(monkeypatch):
    """`auto` (the fast preset) is a speed choice: no C++ toolchain means PyTorch's layers, not a failure;
    an explicit --ops fused still says what is missing."""
    from trainlab.errors import HardwareError
    from trainlab.lenet import plan

    def no_compiler(with_cuda):
        raise HardwareError("impl='cpp': no C++ compiler found")

    monkeypatch.setattr(plan, "check_toolchain", no_compiler)
    cfg = TrainConfig(device="cpu", batchnorm=True, batchnorm_conv1=False, ops="auto")
    assert plan.resolve(cfg, torch.device("cpu")).ops == "aten"
    cfg.ops = "fused"
    assert plan.resolve(cfg, torch.device("cpu")).ops == "fused"
    monkeypatch.undo()
    assert (
        plan.resolve(
            TrainConfig(device="cpu", batchnorm=True, batchnorm_conv1=False, ops="auto"), torch.device("cpu")
        ).ops
        == "fused"
    )


def test_profile_names_the_fused_stage_and_keeps_the_later_names():
    from trainlab.lenet.profile import layer_names

    names = list(layer_names(LeNet5(ops="fused", batchnorm=True, batchnorm_conv1=False)))
    assert names[:5] == ["conv1+relu1+pool1", "conv2", "bn2", "pool2", "relu2"]
    assert names[-1] == "fc3" and len(names) == len(set(names))
