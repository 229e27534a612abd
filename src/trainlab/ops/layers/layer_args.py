"""The contract of our layer operators (conv2d, max_pool2d, linear, relu): their arguments, checked in
one place; their output sizes; and the fakes and autograd formulas of the compiled ops (`register`).

Every rung of every operator (python, cpp, triton, cuda) calls these checks before it runs, so a
wrong dtype, a wrong rank, a channel mismatch or a kernel larger than its input is the same one-line
`OpInputError` whichever implementation was asked for — not a C++ assertion from one rung and a
NumPy broadcasting error from another. `OpInputError` is a `UserError` (the CLI prints it as
`trainlab: error: …`) and a `ValueError` (what Python code expects to catch for a bad argument).

The output-size formulas live here too, for the same reason: the Python rung, the Triton launcher
and the fake (meta) kernels of the C++ ops must agree on them to the element.
"""

from __future__ import annotations

import torch

from trainlab.errors import HardwareError, UserError
from trainlab.ops.ladder import FLOAT_DTYPES, dtype_kind


class OpInputError(UserError, ValueError):
    """A tensor or argument given to one of our operators has the wrong dtype, rank or shape."""


def check_device(op: str, impl: str, x: torch.Tensor) -> None:
    """impl='cuda' runs CUDA kernels only: say so before anything is launched."""
    if impl == "cuda" and x.device.type != "cuda":
        where = "no CUDA GPU is available" if not torch.cuda.is_available() else f"the input is on {x.device}"
        raise HardwareError(f"{op} impl='cuda': {where}; move the tensors with .cuda(), or use impl='cpp' on the CPU")


def pair(op: str, name: str, value, minimum: int) -> tuple[int, int]:
    """An int or a pair of ints (like nn.Conv2d's arguments), each >= minimum."""
    vals = (
        (value, value)
        if isinstance(value, int) and not isinstance(value, bool)
        else tuple(value)
        if isinstance(value, (tuple, list))
        else None
    )
    if (
        vals is None
        or len(vals) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= minimum for v in vals)
    ):
        raise OpInputError(f"{op}: {name} must be an integer or a pair of integers >= {minimum}, got {value!r}")
    return vals


def _dtype_name(t: torch.Tensor) -> str:
    return f"a {dtype_kind(t.dtype)} tensor ({t.dtype})"


def check_tensor(op: str, name: str, t, rank: int | None, layout: str = "") -> None:
    if not isinstance(t, torch.Tensor):
        raise OpInputError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FLOAT_DTYPES:
        raise OpInputError(
            f"{op}: {name} is {_dtype_name(t)}; expected float32, float64, bfloat16 or float16 (cast with .float())"
        )
    if rank is not None and t.dim() != rank:
        raise OpInputError(f"{op}: {name} must be {rank}-D{' ' + layout if layout else ''}, got shape {list(t.shape)}")


def check_same(op: str, name: str, t: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    if t.dtype != ref.dtype:
        raise OpInputError(f"{op}: {name} is {t.dtype} but {ref_name} is {ref.dtype}; use one dtype for both")
    if t.device != ref.device:
        raise OpInputError(f"{op}: {name} is on {t.device} but {ref_name} is on {ref.device}")


def check_x_weight_bias(op: str, x, weight, bias, rank: int, x_layout: str, w_layout: str, unit: str) -> None:
    """x and weight of one rank, dtype and device; x's dim 1 (channels/features) = weight's dim 1."""
    check_tensor(op, "x", x, rank, x_layout)
    check_tensor(op, "weight", weight, rank, w_layout)
    check_same(op, "weight", weight, "x", x)
    if x.shape[1] != weight.shape[1]:
        raise OpInputError(
            f"{op}: x has {x.shape[1]} {unit} but weight expects {weight.shape[1]} "
            f"(x {list(x.shape)}, weight {list(weight.shape)})"
        )
    check_bias(op, bias, x, weight.shape[0], f"output {unit}")


def check_bias(op: str, bias, x: torch.Tensor, n_out: int, what: str) -> None:
    """An optional 1-D bias with one entry per output channel/feature, like x in dtype and device."""
    if bias is None:
        return
    check_tensor(op, "bias", bias, 1, f"[{what.replace(' ', '_')}]")
    check_same(op, "bias", bias, "x", x)
    if bias.shape[0] != n_out:
        raise OpInputError(f"{op}: bias has {bias.shape[0]} entries but weight has {n_out} {what}")


# ---- conv2d (stride 1, zero padding) -------------------------------------------------------------


def conv2d_output_hw(h, w, kh, kw, padding: tuple[int, int]):
    return h + 2 * padding[0] - kh + 1, w + 2 * padding[1] - kw + 1


def check_conv2d(x, weight, bias, padding) -> tuple[int, int]:
    """The validated padding pair; OpInputError for anything LeNet-style conv2d cannot take."""
    op = "conv2d"
    check_x_weight_bias(op, x, weight, bias, 4, "[N, C, H, W]", "[out_channels, in_channels, KH, KW]", "channels")
    pad = pair(op, "padding", padding, 0)
    oh, ow = conv2d_output_hw(x.shape[2], x.shape[3], weight.shape[2], weight.shape[3], pad)
    if oh < 1 or ow < 1:
        raise OpInputError(
            f"{op}: kernel {weight.shape[2]}x{weight.shape[3]} is larger than the input "
            f"{x.shape[2]}x{x.shape[3]} padded by {pad[0]}x{pad[1]}"
        )
    return pad


# ---- max_pool2d ------------------------------------------------------------------------------------


def pool_output_hw(h, w, kernel, stride, padding):
    return (h + 2 * padding[0] - kernel[0]) // stride[0] + 1, (w + 2 * padding[1] - kernel[1]) // stride[1] + 1


def pool_index_dtype(kernel) -> torch.dtype:
    """Our pools save which element of its window won: one byte while the window has <= 256 elements."""
    return torch.uint8 if kernel[0] * kernel[1] <= 256 else torch.int32


def check_max_pool2d(x, kernel_size, stride, padding):
    """(kernel, stride, padding) as validated pairs; stride=None means stride = kernel (as in PyTorch)."""
    op = "max_pool2d"
    check_tensor(op, "x", x, 4, "[N, C, H, W]")
    kernel = pair(op, "kernel_size", kernel_size, 1)
    stride = kernel if stride is None else pair(op, "stride", stride, 1)
    pad = pair(op, "padding", padding, 0)
    if 2 * pad[0] > kernel[0] or 2 * pad[1] > kernel[1]:
        raise OpInputError(f"{op}: padding {pad} must be at most half the kernel {kernel}")
    if x.shape[2] + 2 * pad[0] < kernel[0] or x.shape[3] + 2 * pad[1] < kernel[1]:
        raise OpInputError(
            f"{op}: kernel {kernel[0]}x{kernel[1]} is larger than the input "
            f"{x.shape[2]}x{x.shape[3]} padded by {pad[0]}x{pad[1]}"
        )
    return kernel, stride, pad


# ---- linear / relu ---------------------------------------------------------------------------------


def check_linear(x, weight, bias) -> None:
    check_x_weight_bias(
        "linear", x, weight, bias, 2, "[N, in_features] (flatten it first)", "[out_features, in_features]", "features"
    )


def check_relu(x) -> None:
    check_tensor("relu", "x", x, None)


# ---- fake kernels and autograd formulas of both compiled families (layers_cpp, layers_triton) ------
#
# Both compiled rungs define the same nine operators under a name prefix — `trainlab::conv2d_fwd`
# (C++, schemas in layers_cpu.cpp) and `trainlab::triton_conv2d_fwd` (Triton, torch.library
# custom ops in layers_triton.py) — with the same arguments and results. `register(prefix)` gives
# each family what makes it a real PyTorch operator:
#
#   * fake (meta) kernels — output shapes and dtypes from input shapes, so FakeTensor, opcheck and
#     torch.compile(fullgraph=True) can trace the ops without running them;
#   * autograd formulas — which backward op computes which gradient, saving only what it reads
#     (x and W for conv/linear, the one-byte window index for pooling, y for relu), and computing
#     only the gradients that are needed (LeNet's first convolution never computes dx).
#
# Every real kernel returns contiguous tensors, which is what `new_empty` gives the fakes.


def register(prefix: str, with_atomic_pool: bool = False) -> None:
    """Fakes + autograd for the ops `trainlab::<prefix>conv2d_fwd`, … (prefix '' or 'triton_')."""
    ns = torch.ops.trainlab

    def name(op: str) -> str:
        return f"trainlab::{prefix}{op}"

    def op(op_name: str):
        return getattr(ns, prefix + op_name)

    # ---- fake kernels ------------------------------------------------------------------------------
    def conv_fwd_fake(x, weight, bias, padding):
        oh, ow = conv2d_output_hw(x.shape[2], x.shape[3], weight.shape[2], weight.shape[3], padding)
        return x.new_empty((x.shape[0], weight.shape[0], oh, ow))

    def conv_bwd_input_fake(grad, weight, padding):
        h = grad.shape[2] - 2 * padding[0] + weight.shape[2] - 1  # stride 1: the input size is implied
        w = grad.shape[3] - 2 * padding[1] + weight.shape[3] - 1
        return grad.new_empty((grad.shape[0], weight.shape[1], h, w))

    def conv_bwd_weight_fake(grad, x, weight, padding, bias):
        return weight.new_empty(weight.shape), weight.new_empty((weight.shape[0] if bias else 0,))

    def pool_fwd_fake(x, kernel, stride, padding):
        shape = (x.shape[0], x.shape[1], *pool_output_hw(x.shape[2], x.shape[3], kernel, stride, padding))
        return x.new_empty(shape), x.new_empty(shape, dtype=pool_index_dtype(kernel))

    def pool_bwd_fake(grad, indices, input_hw, kernel, stride, padding):
        return grad.new_empty((grad.shape[0], grad.shape[1], input_hw[0], input_hw[1]))

    def linear_fwd_fake(x, weight, bias):
        return x.new_empty((x.shape[0], weight.shape[0]))

    def linear_bwd_fake(grad, x, weight, bias):
        return x.new_empty(x.shape), weight.new_empty(weight.shape), weight.new_empty((weight.shape[0] if bias else 0,))

    def same_shape_fake(t, *_):
        return t.new_empty(t.shape)

    fakes = {
        "conv2d_fwd": conv_fwd_fake,
        "conv2d_bwd_input": conv_bwd_input_fake,
        "conv2d_bwd_weight": conv_bwd_weight_fake,
        "max_pool2d_fwd": pool_fwd_fake,
        "max_pool2d_bwd": pool_bwd_fake,
        "linear_fwd": linear_fwd_fake,
        "linear_bwd": linear_bwd_fake,
        "relu_fwd": same_shape_fake,
        "relu_bwd": same_shape_fake,
    }
    if with_atomic_pool:
        fakes["max_pool2d_bwd_atomic"] = pool_bwd_fake
    for op_name, fake in fakes.items():
        torch.library.register_fake(name(op_name), fake)

    # ---- autograd ---------------------------------------------------------------------------------
    def conv_setup(ctx, inputs, output):
        x, weight, bias, padding = inputs
        ctx.save_for_backward(x, weight)
        ctx.padding, ctx.has_bias = padding, bias is not None

    def conv_backward(ctx, grad):
        x, weight = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        dx = op("conv2d_bwd_input")(grad, weight, ctx.padding) if need_x else None
        dw = db = None
        if need_w or need_b:
            dw, db = op("conv2d_bwd_weight")(grad, x, weight, ctx.padding, ctx.has_bias)
        return dx, dw if need_w else None, db if (need_b and ctx.has_bias) else None, None

    def pool_setup(ctx, inputs, output):
        x, kernel, stride, padding = inputs
        ctx.save_for_backward(output[1])  # the window indices, one byte per output
        ctx.input_hw, ctx.window = list(x.shape[2:]), (kernel, stride, padding)

    def pool_backward(ctx, grad, _grad_indices):
        (indices,) = ctx.saved_tensors
        return op("max_pool2d_bwd")(grad, indices, ctx.input_hw, *ctx.window), None, None, None

    def linear_setup(ctx, inputs, output):
        x, weight, bias = inputs
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None

    def linear_backward(ctx, grad):
        x, weight = ctx.saved_tensors
        dx, dw, db = op("linear_bwd")(grad, x, weight, ctx.has_bias)
        return dx, dw, db if ctx.has_bias else None

    def relu_setup(ctx, inputs, output):
        ctx.save_for_backward(output)

    def relu_backward(ctx, grad):
        (out,) = ctx.saved_tensors
        return op("relu_bwd")(grad, out)

    # The C++ family's conv2d, linear and relu carry the same formulas in C++ (layers_cpu.cpp: no
    # interpreter in the step's hot path); the Triton family and max_pool2d keep these.
    in_cpp = {"conv2d_fwd", "linear_fwd", "relu_fwd"} if prefix == "" else set()
    for op_name, backward, setup in (
        ("conv2d_fwd", conv_backward, conv_setup),
        ("max_pool2d_fwd", pool_backward, pool_setup),
        ("linear_fwd", linear_backward, linear_setup),
        ("relu_fwd", relu_backward, relu_setup),
    ):
        if op_name not in in_cpp:
            torch.library.register_autograd(name(op_name), backward, setup_context=setup)
