r"""conv2d → ReLU → 2x2 max-pool (or average pool) as one operator: LeNet-5's first stage, fused on the CPU.

    conv_relu_pool2d(x, weight, bias=None, padding=0, impl="aten" | "python" | "cpp" | "triton" | "cuda",
                     pool="max" | "avg")
    ConvReluPool2d(in_channels, out_channels, kernel_size, padding=0, bias=True, impl="cpp", pool="max")

    y = max_pool2d(relu(conv2d(x, W, b, padding)), 2)        (stride-1 conv, 2x2 windows, stride 2, floor)
    y = avg_pool2d(relu(conv2d(x, W, b, padding)), 2)        (pool="avg": the `fast` preset since issue 40, round 7)

Why this operator exists: in the `fast` CPU step (bf16 autocast, channels-last, batch 256) the first
stage — conv1, its ReLU and its pooling — was two thirds of the step, and ATen's max-pool forward
on the 6-channel channels-last activation alone a third (benchmarks/results/lenet_cpu_profile.md).
Each of the three ops writes and re-reads the [N, 6, 28, 28] conv output. The `cpp` rung
(conv_relu_pool_cpu.cpp, in this folder) computes two conv rows of one sample at a time in L1, pools and
rectifies them there, and writes only the [N, 6, 14, 14] result plus one code byte per output
(which window element won, and whether ReLU let the gradient through). Its backward rebuilds the
conv output's gradient per sample from those bytes and never materializes it for the whole batch.

Math (the gradient the rungs must agree on). With c the conv output and k(i, j) the window element
that wins output (i, j) — the first maximum, NaN winning, as ATen's max_pool2d —

    dc[n, o, 2i + r, 2j + s] = dy[n, o, i, j]  if (r, s) = k(i, j) and c at the winner > 0, else 0
    dW, db, dx = conv2d's backward applied to dc  (ops/conv2d derives it)

ReLU before the max or after it is the same function with the same gradient (max is monotone), so
the kernel pools first and rectifies a quarter of the values. Average pooling rectifies all four and
routes dy/4 to each element whose ReLU passed (one bit each in the code byte):

    dc[n, o, 2i + r, 2j + s] = dy[n, o, i, j] / 4  if c[n, o, 2i + r, 2j + s] > 0, else 0

Average pooling runs on the `aten` and `cpp` rungs only (our other rungs have no average pooling: they
refuse it in one line).

The ladder: `aten` is F.conv2d → F.relu → F.max_pool2d. `python` and `cuda` run that rung's own
conv2d, relu and max_pool2d in sequence; `triton` runs its conv2d with the ReLU in the GEMM's
epilogue, then its max_pool2d — the full fusion is what the C++ rung adds (on a GPU the fast path is
cuDNN: see `trainlab train --ops`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from trainlab.ops.build import LIBRARY
from trainlab.ops.conv2d import Conv2d, conv2d_relu, gradcheck_inputs, random_conv_inputs
from trainlab.ops.conv2d import bench_layer as bench_conv_layer
from trainlab.ops.ladder import Case, Layer, check_impl, every_other_column
from trainlab.ops.layers.layer_args import OpInputError, check_conv2d, check_device, conv2d_output_hw
from trainlab.ops.layers.layers_cpp import compiled_rung
from trainlab.ops.max_pool2d import max_pool2d

REGISTERED = ("cpp",)  # the rungs with a registered trainlab:: operator of their own (opcheck)


def check_conv_relu_pool2d(x, weight, bias, padding) -> tuple[int, int]:
    """conv2d's checks, plus a conv output of at least one 2x2 window."""
    pad = check_conv2d(x, weight, bias, padding)
    ch, cw = conv2d_output_hw(x.shape[2], x.shape[3], weight.shape[2], weight.shape[3], pad)
    if ch < 2 or cw < 2:
        raise OpInputError(
            f"conv_relu_pool2d: the convolution output is {ch}x{cw}, smaller than the 2x2 pooling window"
        )
    if weight.shape[3] > 16:  # the C++ weight gradient keeps a row of taps in one or two vectors
        raise OpInputError(
            f"conv_relu_pool2d: kernel width {weight.shape[3]} is above 16, the widest the fused kernel takes"
        )
    return pad


AVG_IMPLS = ("aten", "cpp")  # the rungs with average pooling


def conv_relu_pool2d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    padding=0,
    impl: str = "aten",
    pool: str = "max",
) -> torch.Tensor:
    """{max,avg}_pool2d(relu(conv2d(x, weight, bias, padding)), 2) with the chosen implementation;
    differentiable. OpInputError (one line) for what conv2d refuses, a conv output smaller than 2x2, or
    average pooling on a rung without it."""
    check_impl("conv_relu_pool2d", impl)
    if pool not in ("max", "avg"):
        raise OpInputError(f"conv_relu_pool2d pool={pool!r}: expected 'max' or 'avg'")
    if pool == "avg" and impl not in AVG_IMPLS:
        raise OpInputError(f"conv_relu_pool2d impl={impl!r}: average pooling runs on {' and '.join(AVG_IMPLS)} only")
    pad = check_conv_relu_pool2d(x, weight, bias, padding)
    check_device("conv_relu_pool2d", impl, x)
    if impl == "aten":
        return (F.avg_pool2d if pool == "avg" else F.max_pool2d)(F.relu(F.conv2d(x, weight, bias, padding=pad)), 2)
    if impl == "cpp":
        if x.device.type != "cpu":
            raise OpInputError(
                f"conv_relu_pool2d impl='cpp': the fused kernel runs on the CPU, the input is on "
                f"{x.device}; use impl='cuda' (our unfused GPU kernels) or 'aten'"
            )
        return compiled_rung(impl).conv_relu_pool2d(x, weight, bias, pad, pool == "avg")
    return max_pool2d(conv2d_relu(x, weight, bias, pad, impl=impl), 2, impl=impl)  # triton: the ReLU in the epilogue


class ConvReluPool2d(Conv2d):
    """A conv layer followed by ReLU and 2x2 max- or average pooling, as one module. It *is* an nn.Conv2d
    (our Conv2d's constructor: same parameters, same initial draws from the same seed, same state_dict
    keys), so a model can swap it in for its first conv and keep its checkpoints."""

    def __init__(self, *args, pool: str = "max", **kwargs):
        super().__init__(*args, **kwargs)
        self.pool = pool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return conv_relu_pool2d(x, self.weight, self.bias, self.padding, impl=self.impl, pool=self.pool)

    def conv_relu(self, x: torch.Tensor) -> torch.Tensor:
        """The rectified conv output before pooling (for looking at the first layer's maps)."""
        return F.relu(F.conv2d(x, self.weight, self.bias, padding=self.padding))

    def extra_repr(self) -> str:
        return super().extra_repr() + f", relu, {self.pool}_pool 2x2, impl={self.impl!r}"


# ---- registration of the fused C++ ops (compiled into trainlab's one library, ops/build.py) ---------------


def fused_output_channels_last(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """The kernel's layout rule, mirrored by the fake: channels-last output when x or the weight has
    unit channel stride (the mark a channels-last [N, 1, H, W] tensor carries), as ATen's conv does."""
    return any(t.stride(1) == 1 and t.shape[2] * t.shape[3] > 1 for t in (x, weight))


def register_fused() -> None:
    """Fakes + autograd for `trainlab::conv_relu_pool2d_fwd` and its two backward ops (schemas in
    conv_relu_pool_cpu.cpp); called once the library is loaded."""
    ns = torch.ops.trainlab

    def fwd_fake(x, weight, bias, padding, avg=False):
        ch, cw = conv2d_output_hw(x.shape[2], x.shape[3], weight.shape[2], weight.shape[3], padding)
        shape = (x.shape[0], weight.shape[0], ch // 2, cw // 2)
        out = x.new_empty(shape)
        if fused_output_channels_last(x, weight):
            out = out.contiguous(memory_format=torch.channels_last)
        return out, x.new_empty(shape, dtype=torch.uint8)

    def bwd_weight_fake(grad, code, x, weight, padding, bias, avg=False):
        return weight.new_empty(weight.shape), weight.new_empty((weight.shape[0] if bias else 0,))

    def bwd_input_fake(grad, code, weight, input_hw, padding, avg=False):
        return weight.new_empty((grad.shape[0], weight.shape[1], input_hw[0], input_hw[1]))

    def setup(ctx, inputs, output):
        x, weight, bias, padding, avg = inputs
        ctx.save_for_backward(x, weight, output[1])  # the input and one code byte per output
        ctx.padding, ctx.has_bias, ctx.avg = padding, bias is not None, avg

    def backward(ctx, grad, _grad_code):
        x, weight, code = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        dx = dw = db = None
        if need_x:
            dx = ns.conv_relu_pool2d_bwd_input(grad, code, weight, list(x.shape[2:]), ctx.padding, ctx.avg)
        if need_w or (need_b and ctx.has_bias):
            dw, db = ns.conv_relu_pool2d_bwd_weight(grad, code, x, weight, ctx.padding, ctx.has_bias, ctx.avg)
        return dx, dw if need_w else None, db if (need_b and ctx.has_bias) else None, None, None

    torch.library.register_fake("trainlab::conv_relu_pool2d_fwd", fwd_fake)
    torch.library.register_fake("trainlab::conv_relu_pool2d_bwd_weight", bwd_weight_fake)
    torch.library.register_fake("trainlab::conv_relu_pool2d_bwd_input", bwd_input_fake)
    torch.library.register_autograd("trainlab::conv_relu_pool2d_fwd", backward, setup_context=setup)


LIBRARY.on_load(lambda with_cuda: register_fused())


# ---- check cases (run by ops/check.py) -------------------------------------------------------------


def _bound(padding, pool="max"):
    """S for a sum of products whose terms are chosen by a selection: the convolution of |x| and |W|
    (+|b|), pooled, for the output; for the gradients, |dy| routed the way the float64 reference
    routes dy (its winners, its ReLU cuts) and pushed through the convolution of the absolute
    values. (Routing |dy| through the op on |inputs| would pick other winners: S could be 0 where
    the gradient is not.) `grad` is the check's autograd.grad, which insists that every tensor is
    on the rung's device: dy64 is there, like the inputs (it once was left on the CPU)."""

    def bound(t, dy64, grad):
        x, w, b = t["x"], t["weight"], t["bias"]
        conv_out = F.conv2d(x, w, b, padding=padding).requires_grad_()
        # the reference's own backward through relu and pool routes |dy| (winners, cuts, NaN passing)
        pool2d = F.avg_pool2d if pool == "avg" else F.max_pool2d
        (routed,) = grad(pool2d(F.relu(conv_out), 2), [conv_out], dy64.abs())
        leaves = {k: v.abs().requires_grad_() for k, v in (("x", x), ("weight", w), ("bias", b)) if v is not None}
        s_conv = F.conv2d(leaves["x"], leaves["weight"], leaves.get("bias"), padding=padding)
        grads = grad(s_conv, list(leaves.values()), routed)
        return pool2d(s_conv.detach(), 2), dict(zip(leaves, grads))

    return bound


def _case(name, x, w, padding, bias=True, view=None, make=None, edge=False, pool="max"):
    return Case(
        "conv_relu_pool2d",
        name,
        make or random_conv_inputs(x, w, bias),
        lambda t, impl: conv_relu_pool2d(t["x"], t["weight"], t["bias"], padding, impl=impl, pool=pool),
        True,
        view,
        edge,
        bound=_bound(padding, pool),
        reduced_impls=("aten", "cpp"),  # only the fused rung computes in float32 throughout
        impls=AVG_IMPLS if pool == "avg" else None,
    )


def _channels_last(t: dict) -> dict:
    return {**t, "x": t["x"].to(memory_format=torch.channels_last)}  # .to restrides a one-channel tensor


def _ties_and_nonfinite(batch, gen):
    """Small integers (exact ties between window elements, in every dtype) plus NaN and ±inf inputs."""
    x = torch.randint(-2, 3, (2, 2, 8, 9), generator=gen).double()
    x[0, 0, 1, 1], x[0, 1, 5, 2], x[1, 0, 6, 6] = math.nan, math.inf, -math.inf
    return {
        "x": x,
        "weight": torch.randint(-1, 2, (3, 2, 3, 3), generator=gen).double(),
        "bias": torch.tensor([0.0, 1.0, -1.0], dtype=torch.float64),
    }


CASES = [
    _case("lenet-stage1", (None, 1, 28, 28), (6, 1, 5, 5), (2, 2)),
    _case("lenet-stage1-channels-last", (None, 1, 28, 28), (6, 1, 5, 5), (2, 2), view=_channels_last),
    _case("multi-channel-odd", (2, 3, 9, 8), (4, 3, 3, 2), (1, 0), bias=False),
    _case("strided-input", (2, 2, 10, 22), (3, 2, 3, 3), (1, 1), view=every_other_column),
    _case("wide-kernel", (2, 2, 9, 20), (3, 2, 3, 9), (1, 4)),  # 9 taps: the 16-wide weight-gradient rows
    _case("ties-nan-inf", None, (3, 2, 3, 3), (1, 1), make=_ties_and_nonfinite, edge=True),
    _case("lenet-stage1-avg", (None, 1, 28, 28), (6, 1, 5, 5), (2, 2), pool="avg"),
    _case("lenet-stage1-avg-channels-last", (None, 1, 28, 28), (6, 1, 5, 5), (2, 2), view=_channels_last, pool="avg"),
    _case("multi-channel-odd-avg", (2, 3, 9, 8), (4, 3, 3, 2), (1, 0), bias=False, pool="avg"),
    _case("ties-nan-inf-avg", None, (3, 2, 3, 3), (1, 1), make=_ties_and_nonfinite, edge=True, pool="avg"),
]


def gradcheck_case(g: torch.Generator):
    """float64 inputs small enough for gradcheck's numerical Jacobian, and fn(*inputs, impl)."""
    return gradcheck_inputs(g, (2, 2, 6, 5)), lambda x, w, b, impl: conv_relu_pool2d(x, w, b, (1, 0), impl=impl)


OPCHECK_EXTRA = ([1, 0],)  # the non-tensor argument of trainlab::conv_relu_pool2d_fwd for gradcheck_case's shapes


def _stage1():
    """conv1 → ReLU → max-pool as one operator (the cpp rung is fused; the others run the three layers)."""
    conv1 = bench_conv_layer("conv1", 1, 28, 6, 2, 0)
    return Layer(
        "stage1",
        "conv_relu_pool2d",
        conv1.inputs,
        lambda t, impl: conv_relu_pool2d(t["x"], t["weight"], t["bias"], 2, impl=impl),
        3,
        input_needs_grad=False,
        steps=(),
    )


BENCH = [_stage1()]  # what `ops bench` times
