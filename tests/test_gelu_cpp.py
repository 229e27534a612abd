"""The C++ extension (CPU kernels, and the CUDA kernel on a GPU) against F.gelu and float64.

The first test in a fresh cache JIT-compiles the extension (~30-60 s on 2 cores); later runs reuse
the cached library (see trainlab.ops.build.cache_dir).
"""

import math

import pytest
import torch
import torch.nn.functional as F

from trainlab.errors import HardwareError
from trainlab.ops.build import LIBRARY
from trainlab.ops.gelu import gelu, gelu_math

APPROX = ["none", "tanh"]
# (atol, rtol) against float64 F.gelu on the same rounded input; justified in trainlab/ops/check.py.
TOL = {torch.float64: (1e-13, 1e-12), torch.float32: (2e-6, 2e-6), torch.bfloat16: (1e-5, 2.0**-7)}


@pytest.fixture
def ext(gelu_ext):
    return gelu_ext


def _x(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * 3).to(dtype)


def _assert_fwd_bwd(x, approximate, device="cpu", impl="cpp"):
    atol, rtol = TOL[x.dtype]
    x = x.to(device).requires_grad_()
    g = torch.randn_like(x)
    y = gelu(x, impl=impl, approximate=approximate)
    y.backward(g)
    xr = x.detach().double().requires_grad_()
    yr = F.gelu(xr, approximate=approximate)
    yr.backward(g.double())
    assert y.dtype == x.dtype and y.shape == x.shape and y.stride() == torch.empty_like(x).stride()
    torch.testing.assert_close(y.double(), yr, atol=atol, rtol=rtol)
    torch.testing.assert_close(x.grad.double(), xr.grad, atol=atol * float(g.abs().max()), rtol=rtol)


@pytest.mark.parametrize("approximate", APPROX)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_contiguous_matches_float64_reference(ext, dtype, approximate):
    # 100003: not a multiple of any vector width, and above ATen's grain size, so the parallel
    # split, the vector body and the scalar tail all run.
    _assert_fwd_bwd(_x(100003, dtype), approximate)


@pytest.mark.parametrize("approximate", APPROX)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_non_contiguous_layouts(ext, dtype, approximate):
    base = _x((64, 48), dtype)
    _assert_fwd_bwd(base.t(), approximate)  # dense, transposed
    _assert_fwd_bwd(base[:, ::3], approximate)  # strided gaps
    _assert_fwd_bwd(_x((4, 6, 9, 9), dtype).to(memory_format=torch.channels_last), approximate)


def test_channels_last_output_keeps_layout(ext):
    x = _x((2, 3, 5, 5), torch.float32).to(memory_format=torch.channels_last)
    assert gelu(x, impl="cpp").is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("approximate", APPROX)
def test_bf16_agrees_with_aten_rounding(ext, approximate):
    x = _x(50000, torch.bfloat16)
    y = gelu(x, impl="cpp", approximate=approximate)
    ref = F.gelu(x, approximate=approximate)
    big = ref.abs() > 1e-3
    assert (y[big] != ref[big]).float().mean() < 0.02  # differs only at rounding boundaries


@pytest.mark.parametrize("approximate", APPROX)
def test_edge_values(ext, approximate):
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        tiny = torch.finfo(dtype).smallest_normal
        x = torch.tensor(
            [0.0, -0.0, 10.0, -10.0, 1e4, -1e4, math.inf, -math.inf, math.nan, tiny / 4, -tiny / 4], dtype=torch.float64
        ).to(dtype)
        y = gelu(x, impl="cpp", approximate=approximate)
        ref = F.gelu(x.double(), approximate=approximate)
        assert torch.equal(torch.isnan(y), torch.isnan(ref)), (dtype, y)
        assert y[6] == math.inf
        finite = torch.isfinite(ref)
        atol, rtol = TOL[dtype]
        torch.testing.assert_close(y.double()[finite], ref[finite], atol=atol, rtol=rtol)
        assert math.copysign(1, y[1].item()) == -1  # -0 stays -0
        dx = torch.ops.trainlab.gelu_bwd(torch.ones_like(x), x, approximate)
        assert torch.equal(
            torch.isnan(dx),
            torch.isnan(torch.ops.aten.gelu_backward(torch.ones_like(x.double()), x.double(), approximate=approximate)),
        )


def test_empty_and_zero_dim(ext):
    assert gelu(torch.empty(0, 5), impl="cpp").shape == (0, 5)
    s = torch.tensor(-0.5)
    y = gelu(s, impl="cpp")
    assert y.dim() == 0 and abs(y.item() - F.gelu(s).item()) < 1e-6


@pytest.mark.parametrize("approximate", APPROX)
def test_gradcheck_float64(ext, approximate):
    x = _x(40, torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: gelu(t, impl="cpp", approximate=approximate), (x,), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("approximate", APPROX)
def test_opcheck_registered_ops(ext, approximate):
    x = _x((3, 7), torch.float32).requires_grad_()
    g = torch.randn(3, 7)
    torch.library.opcheck(torch.ops.trainlab.gelu_fwd.default, (x, approximate))
    torch.library.opcheck(torch.ops.trainlab.gelu_bwd.default, (g.requires_grad_(), x, approximate))
    torch.library.opcheck(
        torch.ops.trainlab.gelu_bwd2.default, (torch.randn(3, 7, requires_grad=True), g, x, approximate)
    )


def test_torch_compile_fullgraph_no_graph_break(ext):
    torch._dynamo.reset()

    def f(t):
        return gelu(t, impl="cpp").sum() * 2

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    x = _x(1000, torch.float32).requires_grad_()
    out = compiled(x)
    out.backward()
    xr = x.detach().clone().requires_grad_()
    (F.gelu(xr).sum() * 2).backward()
    torch.testing.assert_close(out, F.gelu(x.detach()).sum() * 2, atol=1e-3, rtol=1e-5)
    torch.testing.assert_close(x.grad, xr.grad, atol=2e-6, rtol=2e-6)


def test_op_rejects_integer_input_with_dtype_in_message(ext):
    with pytest.raises(RuntimeError, match="Long"):
        torch.ops.trainlab.gelu_fwd(torch.zeros(3, dtype=torch.long), "none")
    with pytest.raises(RuntimeError, match="'none', 'tanh' or 'sigmoid'"):
        torch.ops.trainlab.gelu_fwd(torch.zeros(3), "erf")


# ---- build errors ------------------------------------------------------------------------------

# Both C++ extensions (GELU and the LeNet layers) are built by the same kind of loader; each must
# turn a missing compiler or a failed build into one line that names the fallback.
LOADERS = ["gelu", "layers.layers_cpp"]


@pytest.mark.parametrize("module", LOADERS)
def test_missing_compiler_is_one_clear_error(monkeypatch, module):
    import importlib

    loader = importlib.import_module(f"trainlab.ops.{module}")
    monkeypatch.setattr(LIBRARY, "loaded", None)
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    with pytest.raises(HardwareError, match=r"no C\+\+ compiler.*impl='python'"):
        loader.load()


@pytest.mark.parametrize("module", LOADERS)
def test_build_failure_is_one_clear_error(monkeypatch, tmp_path, module):
    import importlib

    from torch.utils import cpp_extension

    loader = importlib.import_module(f"trainlab.ops.{module}")

    def failing_load(**kwargs):
        raise RuntimeError(
            "Error building extension 'x':\nfoo.cpp:1:1: error: expected unqualified-id\nninja: build stopped"
        )

    monkeypatch.setattr(LIBRARY, "loaded", None)
    monkeypatch.setenv("TRAINLAB_CACHE", str(tmp_path))
    monkeypatch.setattr(cpp_extension, "load", failing_load)
    with pytest.raises(
        HardwareError, match=r"failed \(foo.cpp:1:1: error: expected unqualified-id\).*impl='python'"
    ) as e:
        loader.load()
    assert "\n" not in str(e.value)
    assert str(tmp_path) in str(e.value)


def test_failed_build_fails_gpu_tests_instead_of_skipping(monkeypatch):
    import importlib

    from conftest import load_gelu_ext

    gelu_module = importlib.import_module("trainlab.ops.gelu")

    def broken():
        raise HardwareError("impl='cpp': building the C++ GELU extension failed (nvcc: error)")

    monkeypatch.setattr(gelu_module, "load", broken)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(HardwareError, match="building"):
        load_gelu_ext()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(pytest.skip.Exception, match="building"):
        load_gelu_ext()


def test_cache_dir_honours_trainlab_cache(monkeypatch, tmp_path):
    from trainlab.ops.build import cache_dir

    monkeypatch.setenv("TRAINLAB_CACHE", str(tmp_path))
    assert cache_dir().parent == tmp_path / "torch_extensions"


def test_the_cpp_sources_build_as_one_unit_rewritten_only_when_they_change(tmp_path):
    """The library's C++ files (GELU's, the layers', the fused first stage's) compile as one translation unit
    (the torch headers parsed once); an unchanged unit keeps its time stamp, so ninja finds the built
    library up to date."""
    import os

    from trainlab.ops.build import OPS_DIR, unity_source

    assert {"gelu/gelu_cpu.cpp", "layers/layers_cpu.cpp", "conv_relu_pool2d/conv_relu_pool_cpu.cpp"} == set(
        LIBRARY.cpu_sources
    )

    unit = unity_source(tmp_path, LIBRARY.cpu_sources)
    includes = [line.split('"')[1] for line in open(unit).read().splitlines()]
    assert includes == [str(OPS_DIR / s) for s in LIBRARY.cpu_sources] and all(map(os.path.isfile, includes))
    os.utime(unit, (1, 1))
    assert unity_source(tmp_path, LIBRARY.cpu_sources) == unit and os.stat(unit).st_mtime == 1
    unity_source(tmp_path, LIBRARY.cpu_sources[:1])
    assert open(unit).read().count("#include") == 1 and os.stat(unit).st_mtime > 1


# ---- CUDA kernel (needs a GPU) -------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("approximate", APPROX)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_cuda_kernel_matches_reference(ext, dtype, approximate):
    if dtype == torch.float16:
        TOL[torch.float16] = (1e-4, 2.0**-10)
    for n in (1, 7, 4099, 1 << 20):  # tails, a single vector, many waves
        _assert_fwd_bwd(_x(n, dtype), approximate, device="cuda", impl="cuda")


@pytest.mark.gpu
def test_cuda_kernel_layouts_and_misalignment(ext):
    base = _x((256, 130), torch.float32).cuda()
    _assert_fwd_bwd(base.t(), "none", device="cuda", impl="cuda")
    _assert_fwd_bwd(base[:, ::2], "none", device="cuda", impl="cuda")
    _assert_fwd_bwd(base.reshape(-1)[1:], "none", device="cuda", impl="cuda")  # 4-byte offset: scalar path
    torch.library.opcheck(torch.ops.trainlab.gelu_fwd.default, (base.requires_grad_(), "none"))


@pytest.mark.gpu
@pytest.mark.parametrize("approximate", APPROX)
def test_cuda_double_backward(ext, approximate):
    x = _x(64, torch.float64).cuda().requires_grad_()
    assert torch.autograd.gradgradcheck(lambda t: gelu(t, impl="cuda", approximate=approximate), (x,))
    for dtype in (torch.float32, torch.bfloat16):
        xs = _x(1 << 16, dtype).cuda()
        gg, g = torch.randn_like(xs), torch.randn_like(xs)
        out = torch.ops.trainlab.gelu_bwd2(gg, g, xs, approximate)
        ref = gelu_math.bwd2(gg.double(), g.double(), xs.double(), approximate)
        atol, rtol = TOL[dtype]
        torch.testing.assert_close(out.double(), ref, atol=4 * atol * float((gg * g).abs().max()), rtol=4 * rtol)
    torch.library.opcheck(torch.ops.trainlab.gelu_bwd2.default, (gg.requires_grad_(), g, xs, approximate))


@pytest.mark.gpu
def test_cuda_matches_cpp_cpu_kernel(ext):
    x = _x(1 << 16, torch.float32)
    torch.testing.assert_close(gelu(x.cuda(), impl="cuda").cpu(), gelu(x, impl="cpp"), atol=2e-6, rtol=2e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["cuda", "triton"])
def test_gpu_kernels_index_past_2_31(ext, impl):
    """2^31 + 5 bf16 elements: 64-bit offsets (Triton) and grid-stride indices (CUDA) reach the last ones."""
    if impl == "triton":
        pytest.importorskip("triton")
    free, _ = torch.cuda.mem_get_info()
    n = 2**31 + 5
    if free < 3 * 2 * n + 2**30:
        pytest.skip(f"needs ~{3 * 2 * n / 2**30:.0f} GiB of free GPU memory")
    x = torch.full((n,), -1.5, dtype=torch.bfloat16, device="cuda")
    x[-3:] = torch.tensor([0.5, 1.0, 2.0], dtype=torch.bfloat16)
    for approximate in APPROX:
        y = gelu(x, impl=impl, approximate=approximate)
        assert torch.equal(y[-4:], F.gelu(x[-4:].float(), approximate=approximate).to(torch.bfloat16))
        del y
