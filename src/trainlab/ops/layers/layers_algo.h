// The convolution's and the linear layer's algorithms. The linear layer's serves both devices; the
// convolution's is the CPU's (on CUDA, conv2d runs the direct kernels of layers_cuda.cu instead: an
// im2col matrix and a skinny GEMM were memory-bound there). A Backend (CpuBackend in layers_cpu.cpp;
// CudaBackend in layers_cuda_glue.cpp, column sums only) supplies the data movement —
// im2col, col2im, the [B, OC, L] <-> [OC, B·L] transposes, column sums — and its chunk budget; the
// GEMMs are ATen's (MKL on the CPU, cuBLAS on the GPU). So the CUDA path runs exactly the algorithm
// the CPU tests check, with different kernels underneath.
//
// conv2d, stride 1, zero padding:
//   forward   out[n] = W · cols(x[n]) + b          cols(x[n]): [C·KH·KW, OH·OW] patches (im2col)
//   backward  dx[n]  = col2im(Wᵀ · dy[n])          col2im: the adjoint of im2col, patches summed back
//             dW     = Σ_n dy[n] · cols(x[n])ᵀ,    db = Σ_n,l dy[n, :, l]
// Samples are processed in chunks whose columns fit in Backend::kColsBudget elements (on the CPU
// about half of one core's L2) and a chunk's columns are laid side by side, [C·KH·KW, B·OH·OW], so
// each chunk is ONE large GEMM whose operand im2col has just left in cache (B small per-sample GEMMs
// were 2-3x slower: LeNet's per-sample matrices are 6x25x784 and 16x150x100). The price is a
// transposing copy of out / dy between [B, OC, L] and [OC, B·L], which stays in cache too.
// The bias rides in the GEMM: cols gets an extra row of ones and W an extra column holding b, so
// the forward GEMM adds b and the weight-gradient GEMM's extra column is exactly db.
//
// bfloat16/float16 are widened to float32 at entry and rounded once at exit (layers_shapes.h).
#pragma once

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>

#include <tuple>

#include "layers_shapes.h"

namespace trainlab_layers {

template <typename Backend>
at::Tensor conv2d_forward(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                          at::IntArrayRef padding) {
  const ConvShape s = conv_shape("conv2d_fwd", x, weight, padding);
  check_conv_bias("conv2d_fwd", bias, x, s);
  const bool has_bias = bias.has_value() && bias->defined();
  const at::Tensor xc = opmath_contiguous(x);
  const int64_t ckk = s.ckk(), L = s.l(), rows = ckk + (has_bias ? 1 : 0);
  at::Tensor wm = opmath_contiguous(weight).view({s.OC, ckk});
  if (has_bias) wm = at::cat({wm, opmath_contiguous(*bias).view({s.OC, 1})}, 1);   // [OC, CKK + 1]
  at::Tensor out = at::empty({s.N, s.OC, s.OH, s.OW}, xc.options());
  const int64_t chunk = chunk_samples(rows * L, s.N, Backend::kColsBudget);
  at::Tensor cols_buf = at::empty({rows * chunk * L}, xc.options());
  at::Tensor out_buf = at::empty({s.OC * chunk * L}, xc.options());
  AT_DISPATCH_FLOATING_TYPES(xc.scalar_type(), "trainlab_conv2d_fwd", [&] {
    for (int64_t n0 = 0; n0 < s.N; n0 += chunk) {
      const int64_t B = std::min(chunk, s.N - n0);
      at::Tensor cols = cols_buf.narrow(0, 0, rows * B * L).view({rows, B * L});
      if (has_bias) cols.select(0, ckk).fill_(1);   // the ones row: the GEMM adds the bias column of wm
      Backend::im2col(xc.const_data_ptr<scalar_t>(), cols.data_ptr<scalar_t>(), s, n0, B);
      at::Tensor t = out_buf.narrow(0, 0, s.OC * B * L).view({s.OC, B * L});
      at::mm_out(t, wm, cols);   // [OC, rows] x [rows, B·L]
      Backend::from_channels_first(t.const_data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), n0, B, s.OC, L);
    }
  });
  return out.to(x.scalar_type());
}

// dx from dy: the input size follows from stride 1 (H = OH - 2·PH + KH - 1).
template <typename Backend>
at::Tensor conv2d_backward_input(const at::Tensor& grad, const at::Tensor& weight, at::IntArrayRef padding) {
  const ConvShape s = conv_shape_from_grad("conv2d_bwd_input", grad, weight, padding);
  const at::Tensor gc = opmath_contiguous(grad);
  const int64_t ckk = s.ckk(), L = s.l();
  const at::Tensor wt = opmath_contiguous(weight).view({s.OC, ckk}).t();   // [CKK, OC], a transposed view
  at::Tensor dx = at::empty({s.N, s.C, s.H, s.W}, gc.options());
  const int64_t chunk = chunk_samples(ckk * L, s.N, Backend::kColsBudget);
  at::Tensor dcols_buf = at::empty({ckk * chunk * L}, gc.options());
  at::Tensor g_buf = at::empty({s.OC * chunk * L}, gc.options());
  AT_DISPATCH_FLOATING_TYPES(gc.scalar_type(), "trainlab_conv2d_bwd_input", [&] {
    for (int64_t n0 = 0; n0 < s.N; n0 += chunk) {
      const int64_t B = std::min(chunk, s.N - n0);
      at::Tensor gt = g_buf.narrow(0, 0, s.OC * B * L).view({s.OC, B * L});
      Backend::to_channels_first(gc.const_data_ptr<scalar_t>(), gt.data_ptr<scalar_t>(), n0, B, s.OC, L);
      at::Tensor dcols = dcols_buf.narrow(0, 0, ckk * B * L).view({ckk, B * L});
      at::mm_out(dcols, wt, gt);   // [CKK, OC] x [OC, B·L]
      Backend::col2im(dcols.const_data_ptr<scalar_t>(), dx.data_ptr<scalar_t>(), s, n0, B);
    }
  });
  return dx.to(grad.scalar_type());
}

// (dW, db) from dy and x; db is [OC] when `bias`, else empty. The GEMM accumulates every chunk into
// one [OC, rows] matrix in the compute type (beta = 1), chunk after chunk in order.
template <typename Backend>
std::tuple<at::Tensor, at::Tensor> conv2d_backward_weight(const at::Tensor& grad, const at::Tensor& x,
                                                          const at::Tensor& weight, at::IntArrayRef padding, bool bias) {
  const ConvShape s = conv_shape("conv2d_bwd_weight", x, weight, padding);
  check_conv_grad("conv2d_bwd_weight", grad, x, s);
  const at::Tensor xc = opmath_contiguous(x), gc = opmath_contiguous(grad);
  const int64_t ckk = s.ckk(), L = s.l(), rows = ckk + (bias ? 1 : 0);
  at::Tensor acc = at::zeros({s.OC, rows}, xc.options());
  const int64_t chunk = chunk_samples((rows + s.OC) * L, s.N, Backend::kColsBudget);
  at::Tensor cols_buf = at::empty({rows * chunk * L}, xc.options());
  at::Tensor g_buf = at::empty({s.OC * chunk * L}, xc.options());
  AT_DISPATCH_FLOATING_TYPES(xc.scalar_type(), "trainlab_conv2d_bwd_weight", [&] {
    for (int64_t n0 = 0; n0 < s.N; n0 += chunk) {
      const int64_t B = std::min(chunk, s.N - n0);
      at::Tensor cols = cols_buf.narrow(0, 0, rows * B * L).view({rows, B * L});
      if (bias) cols.select(0, ckk).fill_(1);   // its GEMM column is sum_l dy: the bias gradient
      Backend::im2col(xc.const_data_ptr<scalar_t>(), cols.data_ptr<scalar_t>(), s, n0, B);
      at::Tensor gt = g_buf.narrow(0, 0, s.OC * B * L).view({s.OC, B * L});
      Backend::to_channels_first(gc.const_data_ptr<scalar_t>(), gt.data_ptr<scalar_t>(), n0, B, s.OC, L);
      acc.addmm_(gt, cols.t());   // acc += [OC, B·L] x [B·L, rows]
    }
  });
  at::Tensor dw = acc.narrow(1, 0, ckk).reshape(weight.sizes()).to(weight.scalar_type());
  at::Tensor db = bias ? acc.select(1, ckk).to(weight.scalar_type()).contiguous() : at::empty({0}, weight.options());
  return {dw, db};
}

// ---- linear: y = x Wᵀ + b. Forward and both matrix gradients are single GEMMs; the bias gradient,
// a column sum of dy, is the backend's.

template <typename Backend>
at::Tensor linear_forward(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  check_linear("linear_fwd", x, weight, bias);
  const at::Tensor xc = opmath_contiguous(x), wc = opmath_contiguous(weight);
  const at::Tensor out = (bias.has_value() && bias->defined()) ? at::addmm(opmath_contiguous(*bias), xc, wc.t())
                                                               : at::mm(xc, wc.t());
  return out.to(x.scalar_type());
}

template <typename Backend>
std::tuple<at::Tensor, at::Tensor, at::Tensor> linear_backward(const at::Tensor& grad, const at::Tensor& x,
                                                               const at::Tensor& weight, bool bias) {
  check_linear_grad("linear_bwd", grad, x, weight);
  const at::Tensor gc = opmath_contiguous(grad), xc = opmath_contiguous(x), wc = opmath_contiguous(weight);
  at::Tensor dx = at::mm(gc, wc);        // [N, out] x [out, in]
  at::Tensor dw = at::mm(gc.t(), xc);    // [out, N] x [N, in]
  at::Tensor db = at::empty({bias ? gc.size(1) : 0}, gc.options());
  if (bias) {
    AT_DISPATCH_FLOATING_TYPES(gc.scalar_type(), "trainlab_linear_bias_grad", [&] {
      Backend::column_sums(gc.const_data_ptr<scalar_t>(), db.data_ptr<scalar_t>(), gc.size(0), gc.size(1));
    });
  }
  const auto t = x.scalar_type();
  return {dx.to(t), dw.to(t), db.to(t)};
}

}  // namespace trainlab_layers
