// The CUDA implementations of the trainlab layer ops: tensors in, raw pointers and shapes out to
// the CUDA-only kernels of layers_cuda.cu. The convolution runs its direct kernels (implicit GEMM:
// no im2col matrix; a deterministic two-stage weight-gradient reduction); the linear layer runs the
// CPU's algorithm (layers_algo.h) with cuBLAS GEMMs and CudaBackend's column sums; pooling and relu
// call their kernels directly. Also defines `max_pool2d_bwd_atomic`, the naive
// scatter backward, which exists only on CUDA (it is the benchmark's "before").
//
// Built only when torch has CUDA and a GPU is present (trainlab/ops/layers_cpp.py). It includes no
// cuBLAS/cuSPARSE headers (ATen calls cuBLAS for it), so the tests can syntax-check it against the
// CPU wheel's headers and the CUDA runtime headers alone.

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "layers_algo.h"
#include "layers_cuda.h"
#include "layers_shapes.h"

namespace trainlab_layers {
namespace {

namespace k = trainlab_layers_cuda;

k::ConvGeom geom(const ConvShape& s) { return {s.N, s.C, s.H, s.W, s.OC, s.KH, s.KW, s.PH, s.PW, s.OH, s.OW}; }
k::PoolGeom geom(const PoolShape& s) { return {s.N, s.C, s.H, s.W, s.KH, s.KW, s.SH, s.SW, s.PH, s.PW, s.OH, s.OW}; }

// at:: scalar types -> the CUDA types the kernels are instantiated for (same bits).
template <typename T> struct Cuda { using type = T; };
template <> struct Cuda<at::BFloat16> { using type = __nv_bfloat16; };
template <> struct Cuda<at::Half> { using type = __half; };
template <typename T> auto* ptr(const at::Tensor& t) { return reinterpret_cast<const typename Cuda<T>::type*>(t.const_data_ptr<T>()); }
template <typename T> auto* mut(at::Tensor& t) { return reinterpret_cast<typename Cuda<T>::type*>(t.data_ptr<T>()); }

// The linear layer's bias gradient for the shared algorithm (layers_algo.h), on the current stream.
struct CudaBackend {
  template <typename T> static void column_sums(const T* g, T* out, int64_t rows, int64_t cols) {
    C10_CUDA_CHECK(k::column_sums(g, out, rows, cols, c10::cuda::getCurrentCUDAStream()));
  }
};

// conv2d runs the direct kernels of layers_cuda.cu (no im2col matrix, no GEMM library call);
// bfloat16/float16 are computed in float32 and rounded once, as on the CPU.
at::Tensor conv2d_fwd_cuda(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                           at::IntArrayRef padding) {
  const ConvShape s = conv_shape("conv2d_fwd", x, weight, padding);
  check_conv_bias("conv2d_fwd", bias, x, s);
  const c10::cuda::CUDAGuard guard(x.device());
  const bool has_bias = bias.has_value() && bias->defined();
  const at::Tensor xc = opmath_contiguous(x), wc = opmath_contiguous(weight);
  const at::Tensor bc = has_bias ? opmath_contiguous(*bias) : at::Tensor();
  at::Tensor out = at::empty({s.N, s.OC, s.OH, s.OW}, xc.options());
  if (out.numel() == 0) return out.to(x.scalar_type());
  const k::ConvGeom g = geom(s);
  at::Tensor packed = at::empty({k::conv_packed_elems(g)}, xc.options());
  AT_DISPATCH_FLOATING_TYPES(xc.scalar_type(), "trainlab_conv2d_fwd_cuda", [&] {
    C10_CUDA_CHECK(k::conv_forward(xc.const_data_ptr<scalar_t>(), wc.const_data_ptr<scalar_t>(),
                                   has_bias ? bc.const_data_ptr<scalar_t>() : nullptr, out.data_ptr<scalar_t>(),
                                   packed.data_ptr<scalar_t>(), g, c10::cuda::getCurrentCUDAStream()));
  });
  return out.to(x.scalar_type());
}

at::Tensor conv2d_bwd_input_cuda(const at::Tensor& grad, const at::Tensor& weight, at::IntArrayRef padding) {
  const ConvShape s = conv_shape_from_grad("conv2d_bwd_input", grad, weight, padding);
  const c10::cuda::CUDAGuard guard(grad.device());
  const at::Tensor gc = opmath_contiguous(grad), wc = opmath_contiguous(weight);
  at::Tensor dx = at::empty({s.N, s.C, s.H, s.W}, gc.options());
  if (dx.numel() == 0) return dx.to(grad.scalar_type());
  const k::ConvGeom g = geom(s);
  at::Tensor packed = at::empty({k::conv_packed_elems(g)}, gc.options());
  AT_DISPATCH_FLOATING_TYPES(gc.scalar_type(), "trainlab_conv2d_bwd_input_cuda", [&] {
    C10_CUDA_CHECK(k::conv_backward_input(gc.const_data_ptr<scalar_t>(), wc.const_data_ptr<scalar_t>(),
                                          dx.data_ptr<scalar_t>(), packed.data_ptr<scalar_t>(), g,
                                          c10::cuda::getCurrentCUDAStream()));
  });
  return dx.to(grad.scalar_type());
}

// (dW, db): per-slice partial sums then their column sums in slice order, so the result is the
// same bit for bit from run to run (no atomics).
std::tuple<at::Tensor, at::Tensor> conv2d_bwd_weight_cuda(const at::Tensor& grad, const at::Tensor& x,
                                                          const at::Tensor& weight, at::IntArrayRef padding, bool bias) {
  const ConvShape s = conv_shape("conv2d_bwd_weight", x, weight, padding);
  check_conv_grad("conv2d_bwd_weight", grad, x, s);
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor xc = opmath_contiguous(x), gc = opmath_contiguous(grad);
  const int64_t ckk = s.ckk(), kcols = ckk + (bias ? 1 : 0);
  at::Tensor acc = at::empty({s.OC, kcols}, xc.options());
  const k::ConvGeom g = geom(s);
  if (acc.numel() == 0 || s.N * s.OH * s.OW == 0) {
    acc.zero_();
  } else {
    const int64_t slices = k::conv_wgrad_slices(g);
    at::Tensor partial = at::empty({slices, s.OC * kcols}, xc.options());
    AT_DISPATCH_FLOATING_TYPES(xc.scalar_type(), "trainlab_conv2d_bwd_weight_cuda", [&] {
      C10_CUDA_CHECK(k::conv_backward_weight(gc.const_data_ptr<scalar_t>(), xc.const_data_ptr<scalar_t>(),
                                             partial.data_ptr<scalar_t>(), acc.data_ptr<scalar_t>(), g, bias, slices,
                                             c10::cuda::getCurrentCUDAStream()));
    });
  }
  at::Tensor dw = acc.narrow(1, 0, ckk).reshape(weight.sizes()).to(weight.scalar_type());
  at::Tensor db = bias ? acc.select(1, ckk).to(weight.scalar_type()).contiguous() : at::empty({0}, weight.options());
  return {dw, db};
}

std::tuple<at::Tensor, at::Tensor> max_pool2d_fwd_cuda(const at::Tensor& x, at::IntArrayRef kernel,
                                                       at::IntArrayRef stride, at::IntArrayRef padding) {
  const PoolShape s = pool_fwd_shape("max_pool2d_fwd", x, kernel, stride, padding);
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor xc = x.contiguous();
  at::Tensor out = at::empty({s.N, s.C, s.OH, s.OW}, xc.options());
  at::Tensor idx = at::empty({s.N, s.C, s.OH, s.OW}, xc.options().dtype(pool_index_type(s)));
  if (out.numel() == 0) return {out, idx};
  const auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, xc.scalar_type(), "trainlab_max_pool2d_fwd_cuda", [&] {
    if (idx.scalar_type() == at::kByte) {
      C10_CUDA_CHECK(k::max_pool_fwd(ptr<scalar_t>(xc), mut<scalar_t>(out), idx.data_ptr<uint8_t>(), geom(s), stream));
    } else {
      C10_CUDA_CHECK(k::max_pool_fwd(ptr<scalar_t>(xc), mut<scalar_t>(out), idx.data_ptr<int32_t>(), geom(s), stream));
    }
  });
  return {out, idx};
}

at::Tensor max_pool2d_bwd_cuda(const at::Tensor& grad, const at::Tensor& indices, at::IntArrayRef input_hw,
                               at::IntArrayRef kernel, at::IntArrayRef stride, at::IntArrayRef padding) {
  const PoolShape s = pool_bwd_shape("max_pool2d_bwd", grad, indices, input_hw, kernel, stride, padding);
  const c10::cuda::CUDAGuard guard(grad.device());
  const at::Tensor gc = grad.contiguous(), ic = indices.contiguous();
  at::Tensor dx = at::empty({s.N, s.C, s.H, s.W}, gc.options());
  if (dx.numel() == 0) return dx;
  const auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, gc.scalar_type(), "trainlab_max_pool2d_bwd_cuda", [&] {
    if (ic.scalar_type() == at::kByte) {
      C10_CUDA_CHECK(k::max_pool_bwd_gather(ptr<scalar_t>(gc), ic.const_data_ptr<uint8_t>(), mut<scalar_t>(dx), geom(s), stream));
    } else {
      C10_CUDA_CHECK(k::max_pool_bwd_gather(ptr<scalar_t>(gc), ic.const_data_ptr<int32_t>(), mut<scalar_t>(dx), geom(s), stream));
    }
  });
  return dx;
}

at::Tensor max_pool2d_bwd_atomic_cuda(const at::Tensor& grad, const at::Tensor& indices, at::IntArrayRef input_hw,
                                      at::IntArrayRef kernel, at::IntArrayRef stride, at::IntArrayRef padding) {
  const PoolShape s = pool_bwd_shape("max_pool2d_bwd_atomic", grad, indices, input_hw, kernel, stride, padding);
  TORCH_CHECK(grad.scalar_type() == at::kFloat || grad.scalar_type() == at::kDouble,
              "trainlab::max_pool2d_bwd_atomic: float32 or float64 only (the lesson kernel), got ", grad.scalar_type());
  const c10::cuda::CUDAGuard guard(grad.device());
  const at::Tensor gc = grad.contiguous(), ic = indices.contiguous();
  at::Tensor dx = at::zeros({s.N, s.C, s.H, s.W}, gc.options());   // the extra pass the gather avoids
  if (grad.numel() == 0) return dx;
  const auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES(gc.scalar_type(), "trainlab_max_pool2d_bwd_atomic_cuda", [&] {
    if (ic.scalar_type() == at::kByte) {
      C10_CUDA_CHECK(k::max_pool_bwd_atomic(gc.const_data_ptr<scalar_t>(), ic.const_data_ptr<uint8_t>(), dx.data_ptr<scalar_t>(), geom(s), stream));
    } else {
      C10_CUDA_CHECK(k::max_pool_bwd_atomic(gc.const_data_ptr<scalar_t>(), ic.const_data_ptr<int32_t>(), dx.data_ptr<scalar_t>(), geom(s), stream));
    }
  });
  return dx;
}

at::Tensor linear_fwd_cuda(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  const c10::cuda::CUDAGuard guard(x.device());
  return linear_forward<CudaBackend>(x, weight, bias);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> linear_bwd_cuda(const at::Tensor& grad, const at::Tensor& x,
                                                               const at::Tensor& weight, bool bias) {
  const c10::cuda::CUDAGuard guard(x.device());
  return linear_backward<CudaBackend>(grad, x, weight, bias);
}

at::Tensor relu_fwd_cuda(const at::Tensor& x) {
  check_float("relu_fwd", "x", x);
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor xc = x.contiguous();
  at::Tensor out = at::empty_like(xc);
  if (xc.numel() == 0) return out;
  const auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, xc.scalar_type(), "trainlab_relu_fwd_cuda", [&] {
    C10_CUDA_CHECK(k::relu_fwd(ptr<scalar_t>(xc), mut<scalar_t>(out), xc.numel(), stream));
  });
  return out;
}

at::Tensor relu_bwd_cuda(const at::Tensor& grad, const at::Tensor& out) {
  check_relu_bwd(grad, out);
  const c10::cuda::CUDAGuard guard(grad.device());
  const at::Tensor gc = grad.contiguous(), oc = out.contiguous();
  at::Tensor dx = at::empty_like(gc);
  if (gc.numel() == 0) return dx;
  const auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, gc.scalar_type(), "trainlab_relu_bwd_cuda", [&] {
    C10_CUDA_CHECK(k::relu_bwd(ptr<scalar_t>(gc), ptr<scalar_t>(oc), mut<scalar_t>(dx), gc.numel(), stream));
  });
  return dx;
}

}  // namespace
}  // namespace trainlab_layers

TORCH_LIBRARY_FRAGMENT(trainlab, m) {
  m.def("max_pool2d_bwd_atomic(Tensor grad, Tensor indices, SymInt[2] input_hw, int[2] kernel, int[2] stride, "
        "int[2] padding) -> Tensor");
}

TORCH_LIBRARY_IMPL(trainlab, CUDA, m) {
  m.impl("conv2d_fwd", &trainlab_layers::conv2d_fwd_cuda);
  m.impl("conv2d_bwd_input", &trainlab_layers::conv2d_bwd_input_cuda);
  m.impl("conv2d_bwd_weight", &trainlab_layers::conv2d_bwd_weight_cuda);
  m.impl("max_pool2d_fwd", &trainlab_layers::max_pool2d_fwd_cuda);
  m.impl("max_pool2d_bwd", &trainlab_layers::max_pool2d_bwd_cuda);
  m.impl("max_pool2d_bwd_atomic", &trainlab_layers::max_pool2d_bwd_atomic_cuda);
  m.impl("linear_fwd", &trainlab_layers::linear_fwd_cuda);
  m.impl("linear_bwd", &trainlab_layers::linear_bwd_cuda);
  m.impl("relu_fwd", &trainlab_layers::relu_fwd_cuda);
  m.impl("relu_bwd", &trainlab_layers::relu_bwd_cuda);
}
