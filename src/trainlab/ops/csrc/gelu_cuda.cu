// GELU forward and backward for CUDA: the CUDA-key implementations of trainlab::gelu_fwd/gelu_bwd
// (the schemas are defined in gelu_cpu.cpp, compiled into the same library).
//
// Memory-bound element-wise kernels, so the design goal is to keep the DRAM pipe full:
//   * 16-byte vector loads/stores (float4, double2, 8 x bf16/half in a uint4) — one LDG.128 per
//     thread per step instead of four LDG.32;
//   * a grid-stride loop with the grid sized to a few waves of the SMs, so one launch covers any
//     size and each thread streams through several vectors;
//   * the tail (numel % VEC) and misaligned tensors (views with a storage offset) take a scalar
//     grid-stride kernel, so correctness never depends on alignment.
// Math is done in float for float/bf16/half (libdevice erff/expf/tanhf), in double for double, and
// mirrors the CPU kernel formula for formula.
//
// Layout: dense tensors (contiguous, channels-last, any permutation without gaps) are processed as
// their flat storage, and the output from empty_like(x) has the same strides, so element i of the
// storage maps to element i of the output. Non-dense views (x[:, ::2]) are first made contiguous —
// one extra read+write of x (and of grad in backward); the result is then contiguous, which is
// also what empty_like returns for such inputs, so the fake (meta) implementation stays correct.

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <string_view>

namespace trainlab_gelu_cuda {

constexpr double kBeta = 0.7978845608028654;
constexpr double kAlpha = 0.7071067811865476;
constexpr double kInvSqrt2Pi = 0.3989422804014327;
constexpr double kKappa = 0.044715;

template <typename T> struct OpMath { using type = float; };
template <> struct OpMath<double> { using type = double; };

__device__ __forceinline__ float d_erf(float x) { return erff(x); }
__device__ __forceinline__ double d_erf(double x) { return erf(x); }
__device__ __forceinline__ float d_exp(float x) { return expf(x); }
__device__ __forceinline__ double d_exp(double x) { return exp(x); }
__device__ __forceinline__ float d_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double d_tanh(double x) { return tanh(x); }

template <typename T, bool kTanh> __device__ __forceinline__ T fwd(T x) {
  if (kTanh) {
    const T inner = T(kBeta) * (x + T(kKappa) * x * x * x);
    return T(0.5) * x * (T(1) + d_tanh(inner));
  }
  return T(0.5) * x * (T(1) + d_erf(x * T(kAlpha)));
}

template <typename T, bool kTanh> __device__ __forceinline__ T bwd(T g, T x) {
  if (kTanh) {
    const T x2 = x * x;
    const T t = d_tanh(T(kBeta) * (x + T(kKappa) * x2 * x));
    const T left = T(0.5) * (T(1) + t);
    const T right = T(0.5) * x * (T(1) - t * t) * T(kBeta) * (T(1) + T(3 * kKappa) * x2);
    return g * (left + right);
  }
  const T cdf = T(0.5) * (T(1) + d_erf(x * T(kAlpha)));
  const T pdf = T(kInvSqrt2Pi) * d_exp(T(-0.5) * x * x);
  return g * (cdf + x * pdf);
}

// 16 bytes worth of scalar_t, loaded and stored as one unit.
template <typename scalar_t> struct alignas(16) Pack {
  static constexpr int N = 16 / sizeof(scalar_t);
  scalar_t v[N];
};

template <typename scalar_t, bool kTanh>
__global__ void fwd_vec_kernel(const scalar_t* __restrict__ x, scalar_t* __restrict__ y, int64_t n_packs) {
  using P = Pack<scalar_t>;
  using opmath_t = typename OpMath<scalar_t>::type;
  const P* xp = reinterpret_cast<const P*>(x);
  P* yp = reinterpret_cast<P*>(y);
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n_packs; i += (int64_t)gridDim.x * blockDim.x) {
    P in = xp[i];
    P out;
#pragma unroll
    for (int k = 0; k < P::N; ++k) out.v[k] = static_cast<scalar_t>(fwd<opmath_t, kTanh>(static_cast<opmath_t>(in.v[k])));
    yp[i] = out;
  }
}

template <typename scalar_t, bool kTanh>
__global__ void fwd_scalar_kernel(const scalar_t* __restrict__ x, scalar_t* __restrict__ y, int64_t begin, int64_t n) {
  using opmath_t = typename OpMath<scalar_t>::type;
  for (int64_t i = begin + blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    y[i] = static_cast<scalar_t>(fwd<opmath_t, kTanh>(static_cast<opmath_t>(x[i])));
  }
}

template <typename scalar_t, bool kTanh>
__global__ void bwd_vec_kernel(const scalar_t* __restrict__ g, const scalar_t* __restrict__ x,
                               scalar_t* __restrict__ dx, int64_t n_packs) {
  using P = Pack<scalar_t>;
  using opmath_t = typename OpMath<scalar_t>::type;
  const P* gp = reinterpret_cast<const P*>(g);
  const P* xp = reinterpret_cast<const P*>(x);
  P* dp = reinterpret_cast<P*>(dx);
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n_packs; i += (int64_t)gridDim.x * blockDim.x) {
    P gi = gp[i];
    P xi = xp[i];
    P out;
#pragma unroll
    for (int k = 0; k < P::N; ++k)
      out.v[k] = static_cast<scalar_t>(
          bwd<opmath_t, kTanh>(static_cast<opmath_t>(gi.v[k]), static_cast<opmath_t>(xi.v[k])));
    dp[i] = out;
  }
}

template <typename scalar_t, bool kTanh>
__global__ void bwd_scalar_kernel(const scalar_t* __restrict__ g, const scalar_t* __restrict__ x,
                                  scalar_t* __restrict__ dx, int64_t begin, int64_t n) {
  using opmath_t = typename OpMath<scalar_t>::type;
  for (int64_t i = begin + blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    dx[i] = static_cast<scalar_t>(bwd<opmath_t, kTanh>(static_cast<opmath_t>(g[i]), static_cast<opmath_t>(x[i])));
  }
}

constexpr int kThreads = 256;

// Enough blocks to fill every SM several times over, never more than the work needs.
inline int grid_for(int64_t work_items) {
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const int64_t needed = (work_items + kThreads - 1) / kThreads;
  const int64_t cap = static_cast<int64_t>(sms) * 8;
  return static_cast<int>(std::max<int64_t>(1, std::min(needed, cap)));
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

inline bool parse_tanh(c10::string_view a) {
  const std::string_view s(a.data(), a.size());
  TORCH_CHECK(s == "none" || s == "tanh", "trainlab::gelu: approximate must be 'none' or 'tanh', got '", s, "'");
  return s == "tanh";
}

at::Tensor gelu_fwd_cuda(const at::Tensor& x_in, c10::string_view approximate) {
  TORCH_CHECK(at::isFloatingType(x_in.scalar_type()), "trainlab::gelu: x must be floating point, got ",
              x_in.scalar_type());
  const bool tanh_approx = parse_tanh(approximate);
  const c10::cuda::CUDAGuard guard(x_in.device());
  // Dense layouts are walked as flat storage; anything else is compacted first (see header).
  const at::Tensor x = x_in.is_non_overlapping_and_dense() ? x_in : x_in.contiguous();
  at::Tensor y = at::empty_like(x);
  const int64_t n = x.numel();
  if (n == 0) return y;
  auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "trainlab_gelu_fwd_cuda", [&] {
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    scalar_t* yp = y.mutable_data_ptr<scalar_t>();
    constexpr int N = Pack<scalar_t>::N;
    const int64_t n_packs = (aligned16(xp) && aligned16(yp)) ? n / N : 0;
    const int64_t tail_begin = n_packs * N;
    if (n_packs > 0) {
      if (tanh_approx) fwd_vec_kernel<scalar_t, true><<<grid_for(n_packs), kThreads, 0, stream>>>(xp, yp, n_packs);
      else fwd_vec_kernel<scalar_t, false><<<grid_for(n_packs), kThreads, 0, stream>>>(xp, yp, n_packs);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    if (tail_begin < n) {
      const int64_t rest = n - tail_begin;
      if (tanh_approx) fwd_scalar_kernel<scalar_t, true><<<grid_for(rest), kThreads, 0, stream>>>(xp, yp, tail_begin, n);
      else fwd_scalar_kernel<scalar_t, false><<<grid_for(rest), kThreads, 0, stream>>>(xp, yp, tail_begin, n);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  });
  return y;
}

at::Tensor gelu_bwd_cuda(const at::Tensor& grad_in, const at::Tensor& x_in, c10::string_view approximate) {
  TORCH_CHECK(grad_in.scalar_type() == x_in.scalar_type(), "trainlab::gelu_bwd: grad dtype ", grad_in.scalar_type(),
              " differs from x dtype ", x_in.scalar_type());
  TORCH_CHECK(grad_in.sizes() == x_in.sizes(), "trainlab::gelu_bwd: grad shape ", grad_in.sizes(),
              " differs from x shape ", x_in.sizes());
  const bool tanh_approx = parse_tanh(approximate);
  const c10::cuda::CUDAGuard guard(x_in.device());
  // Flat storage walk is valid only if grad and x are dense with identical strides.
  const bool same_dense = x_in.is_non_overlapping_and_dense() && grad_in.strides() == x_in.strides();
  const at::Tensor x = same_dense ? x_in : x_in.contiguous();
  const at::Tensor g = same_dense ? grad_in : grad_in.contiguous();
  at::Tensor dx = at::empty_like(x);
  const int64_t n = x.numel();
  if (n > 0) {
    auto stream = at::cuda::getCurrentCUDAStream();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "trainlab_gelu_bwd_cuda", [&] {
      const scalar_t* gp = g.const_data_ptr<scalar_t>();
      const scalar_t* xp = x.const_data_ptr<scalar_t>();
      scalar_t* dp = dx.mutable_data_ptr<scalar_t>();
      constexpr int N = Pack<scalar_t>::N;
      const int64_t n_packs = (aligned16(gp) && aligned16(xp) && aligned16(dp)) ? n / N : 0;
      const int64_t tail_begin = n_packs * N;
      if (n_packs > 0) {
        if (tanh_approx) bwd_vec_kernel<scalar_t, true><<<grid_for(n_packs), kThreads, 0, stream>>>(gp, xp, dp, n_packs);
        else bwd_vec_kernel<scalar_t, false><<<grid_for(n_packs), kThreads, 0, stream>>>(gp, xp, dp, n_packs);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      }
      if (tail_begin < n) {
        const int64_t rest = n - tail_begin;
        if (tanh_approx) bwd_scalar_kernel<scalar_t, true><<<grid_for(rest), kThreads, 0, stream>>>(gp, xp, dp, tail_begin, n);
        else bwd_scalar_kernel<scalar_t, false><<<grid_for(rest), kThreads, 0, stream>>>(gp, xp, dp, tail_begin, n);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      }
    });
  }
  // Keep the promise of empty_like(x_in): if x_in was dense but grad had other strides, we computed
  // in contiguous order and must restore x_in's layout.
  if (!same_dense && x_in.is_non_overlapping_and_dense() && !x_in.is_contiguous()) {
    at::Tensor out = at::empty_like(x_in);
    out.copy_(dx);
    return out;
  }
  return dx;
}

}  // namespace trainlab_gelu_cuda

TORCH_LIBRARY_IMPL(trainlab, CUDA, m) {
  m.impl("gelu_fwd", &trainlab_gelu_cuda::gelu_fwd_cuda);
  m.impl("gelu_bwd", &trainlab_gelu_cuda::gelu_bwd_cuda);
}
