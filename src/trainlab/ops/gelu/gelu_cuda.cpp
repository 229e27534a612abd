// ATen glue of the CUDA GELU kernels: the CUDA-key implementations of trainlab::gelu_fwd, gelu_bwd
// and gelu_bwd2 (schemas in gelu_cpu.cpp, compiled into the same library). Tensors in, pointers to
// the kernels in gelu_cuda_kernels.cu out; this file holds no device code.
//
// Layout: dense tensors (contiguous, channels-last, any permutation without gaps) are processed as
// their flat storage, and the output from empty_like(x) has the same strides, so element i of the
// storage maps to element i of the output. Inputs with different dense strides, or non-dense views
// (x[:, ::2]), are first made contiguous: one extra read+write of each; the result is then
// contiguous, which is also what empty_like returns for non-dense inputs, so the fake (meta)
// implementation stays correct. When x itself was dense but another input was not, the result is
// copied back into x's layout to keep the promise of empty_like(x).

// Only c10's CUDA stream/guard headers and the CUDA runtime API, not ATen/cuda/CUDAContext.h (which
// pulls in cuBLAS/cuSPARSE headers): the glue then also compiles, syntax-checked, on a machine with
// a CPU-only torch and nvcc's headers (tests/test_gelu_cuda_compile.py).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/library.h>

#include <string_view>
#include <vector>

#include "gelu_cuda_kernels.h"

namespace trainlab_gelu_cuda {
namespace {

Dtype to_kernel_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return Dtype::Float32;
    case at::kDouble: return Dtype::Float64;
    case at::kBFloat16: return Dtype::BFloat16;
    case at::kHalf: return Dtype::Float16;
    default:
      TORCH_CHECK(false, "trainlab::gelu: x must be a floating-point tensor (float32, float64, bfloat16 or float16), got ", t);
  }
}

Approx parse_approx(c10::string_view a) {
  const std::string_view s(a.data(), a.size());
  if (s == "none") return Approx::None;
  if (s == "tanh") return Approx::Tanh;
  if (s == "sigmoid") return Approx::Sigmoid;
  TORCH_CHECK(false, "trainlab::gelu: approximate must be 'none', 'tanh' or 'sigmoid', got '", s, "'");
}

void check_like_x(const at::Tensor& t, const at::Tensor& x, const char* op, const char* what) {
  TORCH_CHECK(t.scalar_type() == x.scalar_type(), "trainlab::", op, ": ", what, " dtype ", t.scalar_type(),
              " differs from x dtype ", x.scalar_type());
  TORCH_CHECK(t.sizes() == x.sizes(), "trainlab::", op, ": ", what, " shape ", t.sizes(), " differs from x shape ",
              x.sizes());
  TORCH_CHECK(t.device() == x.device(), "trainlab::", op, ": ", what, " is on ", t.device(), ", x on ", x.device());
}

// Runs `launch(inputs, out, n, stream)` over dense storage; `tensors` = the op's inputs, x last.
template <typename Launch>
at::Tensor elementwise(const std::vector<at::Tensor>& tensors, Launch launch) {
  const at::Tensor& x_in = tensors.back();
  const c10::cuda::CUDAGuard guard(x_in.device());
  bool same_dense = x_in.is_non_overlapping_and_dense();
  for (const auto& t : tensors) same_dense = same_dense && t.strides() == x_in.strides();
  std::vector<at::Tensor> dense;
  std::vector<const void*> ptrs;
  for (const auto& t : tensors) {
    dense.push_back(same_dense ? t : t.contiguous());
    ptrs.push_back(dense.back().const_data_ptr());
  }
  at::Tensor out = at::empty_like(dense.back());
  const cudaError_t err = launch(ptrs.data(), out.mutable_data_ptr(), out.numel(),
                                 c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == cudaSuccess, "trainlab::gelu CUDA kernel launch failed: ", cudaGetErrorString(err));
  if (!same_dense && x_in.is_non_overlapping_and_dense() && !x_in.is_contiguous()) {
    at::Tensor restored = at::empty_like(x_in);
    restored.copy_(out);
    return restored;
  }
  return out;
}

at::Tensor gelu_fwd_cuda(const at::Tensor& x, c10::string_view approximate) {
  const Dtype dtype = to_kernel_dtype(x.scalar_type());
  const Approx approx = parse_approx(approximate);
  return elementwise({x}, [&](const void* const* in, void* out, int64_t n, cudaStream_t s) {
    return launch_forward(dtype, approx, in[0], out, n, s);
  });
}

at::Tensor gelu_bwd_cuda(const at::Tensor& grad, const at::Tensor& x, c10::string_view approximate) {
  const Dtype dtype = to_kernel_dtype(x.scalar_type());
  check_like_x(grad, x, "gelu_bwd", "grad");
  const Approx approx = parse_approx(approximate);
  return elementwise({grad, x}, [&](const void* const* in, void* out, int64_t n, cudaStream_t s) {
    return launch_backward(dtype, approx, in[0], in[1], out, n, s);
  });
}

at::Tensor gelu_bwd2_cuda(const at::Tensor& grad_grad, const at::Tensor& grad, const at::Tensor& x,
                          c10::string_view approximate) {
  const Dtype dtype = to_kernel_dtype(x.scalar_type());
  check_like_x(grad, x, "gelu_bwd2", "grad");
  check_like_x(grad_grad, x, "gelu_bwd2", "grad_grad");
  const Approx approx = parse_approx(approximate);
  return elementwise({grad_grad, grad, x}, [&](const void* const* in, void* out, int64_t n, cudaStream_t s) {
    return launch_double_backward(dtype, approx, in[0], in[1], in[2], out, n, s);
  });
}

}  // namespace
}  // namespace trainlab_gelu_cuda

TORCH_LIBRARY_IMPL(trainlab, CUDA, m) {
  m.impl("gelu_fwd", &trainlab_gelu_cuda::gelu_fwd_cuda);
  m.impl("gelu_bwd", &trainlab_gelu_cuda::gelu_bwd_cuda);
  m.impl("gelu_bwd2", &trainlab_gelu_cuda::gelu_bwd2_cuda);
}
