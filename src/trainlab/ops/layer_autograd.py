"""Fake kernels and autograd formulas for a family of layer ops: the C++ ones and the Triton ones.

Both compiled rungs define the same nine operators under a name prefix — `trainlab::conv2d_fwd`
(C++, schemas in csrc/layers_cpu.cpp) and `trainlab::triton_conv2d_fwd` (Triton, torch.library
custom ops in layers_triton.py) — with the same arguments and results. `register(prefix)` gives
each family what makes it a real PyTorch operator:

  * fake (meta) kernels — output shapes and dtypes from input shapes, so FakeTensor, opcheck and
    torch.compile(fullgraph=True) can trace the ops without running them;
  * autograd formulas — which backward op computes which gradient, saving only what it reads
    (x and W for conv/linear, the one-byte window index for pooling, y for relu), and computing
    only the gradients that are needed (LeNet's first convolution never computes dx).

Every real kernel returns contiguous tensors, which is what `new_empty` gives the fakes.
"""

from __future__ import annotations

import torch

from trainlab.ops.layer_args import conv2d_output_hw, pool_index_dtype, pool_output_hw


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
        h = grad.shape[2] - 2 * padding[0] + weight.shape[2] - 1   # stride 1: the input size is implied
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

    fakes = {"conv2d_fwd": conv_fwd_fake, "conv2d_bwd_input": conv_bwd_input_fake,
             "conv2d_bwd_weight": conv_bwd_weight_fake, "max_pool2d_fwd": pool_fwd_fake,
             "max_pool2d_bwd": pool_bwd_fake, "linear_fwd": linear_fwd_fake, "linear_bwd": linear_bwd_fake,
             "relu_fwd": same_shape_fake, "relu_bwd": same_shape_fake}
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
        ctx.save_for_backward(output[1])   # the window indices, one byte per output
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

    for op_name, backward, setup in (("conv2d_fwd", conv_backward, conv_setup),
                                     ("max_pool2d_fwd", pool_backward, pool_setup),
                                     ("linear_fwd", linear_backward, linear_setup),
                                     ("relu_fwd", relu_backward, relu_setup)):
        torch.library.register_autograd(name(op_name), backward, setup_context=setup)
