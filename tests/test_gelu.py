"""GELU dispatch, the Python autograd.Function, bad input, and the `trainlab gelu check` contract."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

from trainlab.cli import main
from trainlab.errors import ConfigError, HardwareError
from trainlab.ops import GELU, IMPLS
from trainlab.ops.gelu import GeluFunction, gelu, gelu_math

APPROX = ["none", "tanh"]


def _x(n=2000, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=g, dtype=torch.float64) * 3).to(dtype)


@pytest.mark.parametrize("approximate", APPROX)
def test_python_matches_torch_float64(approximate):
    x = _x().requires_grad_()
    xr = x.detach().clone().requires_grad_()
    g = torch.randn_like(x)
    y = gelu(x, impl="python", approximate=approximate)
    yr = F.gelu(xr, approximate=approximate)
    y.backward(g)
    yr.backward(g)
    torch.testing.assert_close(y, yr, atol=1e-14, rtol=1e-12)
    torch.testing.assert_close(x.grad, xr.grad, atol=1e-13, rtol=1e-12)


@pytest.mark.parametrize("approximate", APPROX)
def test_python_hand_backward_passes_gradcheck(approximate):
    x = _x(32).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: GeluFunction.apply(t, approximate), (x,), eps=1e-6, atol=1e-6)


def test_python_backward_formula_against_autograd_of_the_formula():
    # d/dx of x*Phi(x) computed by autograd on the composite must equal the hand-derived one.
    x = _x(500).requires_grad_()
    assert (
        torch.autograd.grad((0.5 * x * (1 + torch.erf(x / math.sqrt(2)))).sum(), x)[0]
        - gelu_math.derivative(x.detach(), "none")
    ).abs().max() < 1e-14


def test_python_saves_only_the_input():
    x = _x(10).requires_grad_()
    y = gelu(x, impl="python")
    saved = y.grad_fn.saved_tensors
    assert len(saved) == 1 and saved[0].data_ptr() == x.data_ptr()


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 2e-6), (torch.bfloat16, 0.0)])
def test_python_low_precision_close_to_torch(dtype, atol):
    x = _x(4000, dtype=dtype)
    y = gelu(x, impl="python")
    ref = F.gelu(x.double()).to(dtype)  # correctly rounded reference
    if dtype == torch.bfloat16:
        # one rounding of a float32 result: within one bf16 ulp (2^-7 relative) of the correctly
        # rounded value, and identical for nearly all elements; tiny outputs (x << 0) may flush to 0.
        torch.testing.assert_close(y.double(), ref.double(), rtol=2.0**-7, atol=1e-5)
        big = ref.abs() > 1e-3
        assert (y[big] != ref[big]).float().mean() < 0.05
    else:
        torch.testing.assert_close(y, ref, atol=atol, rtol=2e-6)


def test_edge_values_follow_float64_reference():
    x = torch.tensor([0.0, -0.0, 10.0, -10.0, 1e4, -1e4, math.inf, -math.inf, math.nan, 1e-310], dtype=torch.float64)
    y = gelu(x, impl="python")
    ref = F.gelu(x)
    assert torch.equal(torch.isnan(y), torch.isnan(ref))
    assert y[6] == math.inf and math.isnan(y[7]) and math.isnan(y[8])
    finite = torch.isfinite(ref)
    torch.testing.assert_close(y[finite], ref[finite], atol=0, rtol=1e-15)
    assert str(y[1].item()) == "-0.0"


def test_empty_and_scalar():
    assert gelu(torch.empty(0, 4), impl="python").shape == (0, 4)
    s = gelu(torch.tensor(1.5, dtype=torch.float64), impl="python")
    assert s.dim() == 0 and abs(s.item() - F.gelu(torch.tensor(1.5, dtype=torch.float64)).item()) < 1e-15


def test_module_wraps_impl_and_reprs():
    m = GELU(impl="python", approximate="tanh")
    x = _x(100)
    torch.testing.assert_close(m(x), F.gelu(x, approximate="tanh"))
    assert "python" in repr(m) and "tanh" in repr(m)
    assert set(IMPLS) == {"aten", "python", "cpp", "triton", "cuda"}


# ---- bad input ---------------------------------------------------------------------------------


def test_unknown_impl_lists_valid_names():
    with pytest.raises(ConfigError, match="aten, python, cpp, triton, cuda"):
        gelu(torch.zeros(3), impl="fortran")
    with pytest.raises(ConfigError, match="choose one of"):
        GELU(impl="nope")


def test_unknown_approximation_lists_valid_names():
    with pytest.raises(ConfigError, match="none, tanh, sigmoid"):
        gelu(torch.zeros(3), approximate="quick")
    with pytest.raises(ConfigError, match="none, tanh, sigmoid"):
        GELU(approximate="erf")


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.complex64, torch.bool])
def test_non_floating_dtypes_raise_type_error_naming_dtype(impl, dtype):
    x = torch.zeros(4, dtype=dtype)
    with pytest.raises(TypeError, match=str(dtype).replace(".", r"\.")):
        gelu(x, impl=impl)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_cuda_without_gpu_is_a_hardware_error():
    with pytest.raises(HardwareError, match="no CUDA GPU"):
        gelu(torch.zeros(3), impl="cuda")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_triton_without_gpu_or_interpreter_is_a_hardware_error(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(HardwareError, match="TRITON_INTERPRET=1"):
        gelu(torch.zeros(3), impl="triton")


def test_cli_reports_bad_impl_as_one_line_error(capsys):
    assert main(["gelu", "check", "--impl", "fortran"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trainlab: error: --impl 'fortran'") and err.count("\n") == 1


def test_cli_bench_rejects_bad_size(capsys):
    assert main(["gelu", "bench", "--sizes", "12Q"]) == 2
    assert "--sizes '12Q'" in capsys.readouterr().err


# ---- `trainlab gelu check --json` contract ------------------------------------------------------


def test_check_json_contract_and_skipped_rows(capsys):
    from trainlab.ops.check import ROW_FIELDS

    rc = main(["gelu", "check", "--json", "--impl", "torch", "--impl", "python", "--impl", "cuda", "--n", "256"])
    doc = json.loads(capsys.readouterr().out)  # exactly one JSON document on stdout
    assert rc == 0 and doc["ok"] is True
    assert len(doc["rows"]) == 3 * 12 * 3  # rungs x (4 cases x 3 approximations) x dtypes
    for row in doc["rows"] + doc["autograd_rows"]:
        assert set(row) == set(ROW_FIELDS)
    assert {r["case"] for r in doc["rows"]} == {
        f"{a}{s}" for a in ("none", "tanh", "sigmoid") for s in ("", "-strided", "-0d", "-empty")
    }
    py64 = [
        r for r in doc["rows"] if r["impl"] == "python" and r["dtype"] == "float64" and r["case"] in ("none", "tanh")
    ]
    assert len(py64) == 2 and all(r["ok"] and 0 < r["fwd_max_abs_err"] < 1e-13 and r["nonfinite_ok"] for r in py64)
    assert all(r["checks"]["recipe_grad_mse"] < 1e-20 for r in py64)  # the handout's recipe, in the row
    py32 = [r for r in doc["rows"] if r["impl"] == "python" and r["dtype"] == "float32" and r["case"] == "none"]
    assert 0 < py32[0]["fwd_max_abs_err"] < 2e-6
    py_grad = next(r for r in doc["autograd_rows"] if r["impl"] == "python")
    assert py_grad["gradcheck"] is True and py_grad["gradgradcheck"] is True
    cuda = [r for r in doc["rows"] + doc["autograd_rows"] if r["impl"] == "cuda"]
    if not torch.cuda.is_available():
        # could not run: "skipped" with the reason, never reported as ok
        assert all(r["skipped"] and r["reason"] and r["ok"] is None and r["status"] == "skipped" for r in cuda)
        assert doc["skipped"] == len(cuda)
        # a check in which nothing could run checked nothing: it fails, with the reason (issue 20)
        assert main(["gelu", "check", "--impl", "cuda", "--dtype", "float32", "--approximate", "none"]) == 2
        captured = capsys.readouterr()
        table = captured.out
        assert "skipped: no CUDA GPU" in table and "0 rows that ran" in table and "5 skipped" in table
        assert captured.err.strip().splitlines()[-1].startswith("trainlab: error: nothing was checked")


def test_check_fails_with_nonzero_exit_when_a_row_is_out_of_tolerance(monkeypatch, capsys):
    from trainlab.ops import check

    # A tolerance no float32 kernel can meet: the row must fail and the exit code must say so.
    monkeypatch.setitem(check.TOLERANCES["elementwise"], torch.float32, check.Tolerance(0.0, 0.0))
    rc = main(
        ["gelu", "check", "--json", "--impl", "python", "--dtype", "float32", "--approximate", "none", "--n", "256"]
    )
    doc = json.loads(capsys.readouterr().out)
    assert rc == 1 and doc["ok"] is False and doc["rows"][0]["ok"] is False


def test_check_flags_a_wrong_backward(monkeypatch):
    import importlib

    from trainlab.ops import check

    math_mod = importlib.import_module("trainlab.ops.gelu.gelu_math")

    # A classic published bug: dropping the x*phi(x) term of the exact backward.
    def bad_derivative(x, approximate):
        return 0.5 * (1.0 + torch.erf(x * math_mod.SQRT1_2))

    monkeypatch.setattr(math_mod, "derivative", bad_derivative)
    row = check.check_row(check.CASES["gelu"][0], "python", torch.float64, n=128)
    assert row["ok"] is False and row["grad_max_abs_err"] > 0.1
    assert check.autograd_row("gelu", "python")["gradcheck"] is False


# ---- `trainlab gelu bench` ---------------------------------------------------------------------


def test_parse_size():
    from trainlab.ops.choices import format_size, parse_size

    assert parse_size("1K") == 1024 and parse_size("16M") == 16 * 2**20 and parse_size("1000") == 1000
    assert format_size(64 * 2**20) == "64M"
    with pytest.raises(ConfigError):
        parse_size("0")


def test_bench_json_rows_and_baseline(capsys):
    rc = main(
        ["gelu", "bench", "--json", "--sizes", "1K,4K", "--impl", "python", "--budget", "0.01", "--device", "cpu"]
    )
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["sizes"] == [1024, 4096]
    rows = doc["rows"]
    assert {(r["impl"], r["pass"], r["size"]) for r in rows} == {
        (i, p, s) for i in ("aten", "python") for p in ("fwd", "fwd+bwd") for s in (1024, 4096)
    }
    for r in rows:
        assert r["runs"] >= 5 and r["p10_s"] <= r["median_s"] <= r["p90_s"]
        elem_bytes = (2 if r["pass"] == "fwd" else 5) * r["size"] * 4
        assert r["gbps"] == pytest.approx(elem_bytes / r["median_s"] / 1e9)
        if r["impl"] == "aten":
            assert r["ratio_to_torch"] == 1.0
    if not torch.cuda.is_available():
        assert "triton" in doc["skipped"] and "cuda" in doc["skipped"]


def test_bench_on_cuda_does_not_time_cpp_as_a_second_copy_of_cuda():
    from trainlab.ops.bench import available_impls

    impls, skipped = available_impls(torch.device("cuda"))
    assert "cpp" not in impls and "cuda" in impls
    assert "same CUDA kernel" in skipped["cpp"]
    impls, skipped = available_impls(torch.device("cpu"))
    assert "cpp" in impls and "cuda" not in impls


def test_bench_survives_an_impl_that_fails(monkeypatch, capsys):
    """Any error of one impl (not only a UserError) is listed under `skipped`; the others are timed."""
    from trainlab.ops import bench

    def flaky_gelu(x, impl="aten", approximate="none"):
        if impl == "python":
            raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore lines")
        return gelu(x, impl=impl, approximate=approximate)

    monkeypatch.setattr(bench, "gelu", flaky_gelu)
    rc = main(["gelu", "bench", "--json", "--sizes", "1K", "--impl", "python", "--budget", "0.01", "--device", "cpu"])
    out = capsys.readouterr()
    doc = json.loads(out.out)
    # the baseline was timed, the one rung asked for was not: the bench measured nothing asked for (issue 32)
    assert rc == 2 and {r["impl"] for r in doc["rows"]} == {"aten"}
    assert out.err.strip().splitlines()[-1].startswith("trainlab: error: nothing was timed")
    assert (
        doc["skipped"]["python"]
        == "RuntimeError: CUDA error: an illegal memory access was encountered (at 1K elements)"
    )
