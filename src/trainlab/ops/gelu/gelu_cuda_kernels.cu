// GELU forward, backward and double backward as CUDA kernels. Depends on CUDA alone (no ATen, no
// c10), like llm.c's kernel files: `nvcc -arch=sm_90 -ptx gelu_cuda_kernels.cu` works on any machine
// with nvcc, GPU or not, which is how the test suite compiles it for sm_80 and sm_90 and checks the
// generated loads and stores (tests/test_gelu_cuda_compile.py). The ATen glue that turns tensors
// into the pointers below lives in gelu_cuda.cpp.
//
// Memory-bound element-wise kernels, so the design goal is to keep the DRAM pipe full:
//   * 16-byte vector loads/stores (4 x float, 2 x double, 8 x bf16/half): one LDG.E.128 per input
//     per thread per step instead of four to eight narrow ones; loads go through the read-only
//     path (__ldg);
//   * a grid-stride loop with 64-bit indices (tensors of 2^31 elements and more exist on 141 GB
//     GPUs) and a grid of at most 8 blocks per SM, so one launch covers any size and each thread
//     streams through several vectors;
//   * the tail (n % vector width) and misaligned pointers (views with a storage offset) take a
//     scalar grid-stride kernel, so correctness never depends on alignment.
// Math is done in float for float/bf16/half (libdevice erff/expf/tanhf, no fast-math), in double
// for double, formula for formula as the CPU kernel; the derivation is in trainlab/ops/gelu_math.py.
// bf16/half are converted with the explicit intrinsics (round-to-nearest-even on the way back):
// PyTorch's extension build defines __CUDA_NO_HALF_CONVERSIONS__ / __CUDA_NO_BFLOAT16_CONVERSIONS__.

#include "gelu_cuda_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace trainlab_gelu_cuda {
namespace {

constexpr double kBeta = 0.7978845608028654;       // sqrt(2/pi)
constexpr double kAlpha = 0.7071067811865476;      // 1/sqrt(2)
constexpr double kInvSqrt2Pi = 0.3989422804014327;  // 1/sqrt(2 pi)
constexpr double kKappa = 0.044715;
constexpr int kThreads = 256;

// ---- element types: storage type <-> math type ---------------------------------------------------

template <typename T> struct Elem;
template <> struct Elem<float> {
  using opmath = float;
  __device__ static float load(float v) { return v; }
  __device__ static float store(float v) { return v; }
};
template <> struct Elem<double> {
  using opmath = double;
  __device__ static double load(double v) { return v; }
  __device__ static double store(double v) { return v; }
};
template <> struct Elem<__nv_bfloat16> {
  using opmath = float;
  __device__ static float load(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __nv_bfloat16 store(float v) { return __float2bfloat16_rn(v); }
};
template <> struct Elem<__half> {
  using opmath = float;
  __device__ static float load(__half v) { return __half2float(v); }
  __device__ static __half store(float v) { return __float2half_rn(v); }
};

__device__ __forceinline__ float d_erf(float x) { return erff(x); }
__device__ __forceinline__ double d_erf(double x) { return erf(x); }
__device__ __forceinline__ float d_exp(float x) { return expf(x); }
__device__ __forceinline__ double d_exp(double x) { return exp(x); }
__device__ __forceinline__ float d_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double d_tanh(double x) { return tanh(x); }

// ---- the math (T = float or double) ---------------------------------------------------------------

// y = x Phi(x)  |  x/2 (1 + tanh u),  u = beta (x + kappa x^3)
template <typename T, bool kTanh> __device__ __forceinline__ T gelu(T x) {
  if (kTanh) return T(0.5) * x * (T(1) + d_tanh(T(kBeta) * (x + T(kKappa) * x * x * x)));
  return T(0.5) * x * (T(1) + d_erf(x * T(kAlpha)));
}

// d = Phi + x phi  |  (1 + t)/2 + x/2 (1 - t^2) u'
template <typename T, bool kTanh> __device__ __forceinline__ T gelu_d1(T x) {
  if (kTanh) {
    const T x2 = x * x;
    const T t = d_tanh(T(kBeta) * (x + T(kKappa) * x2 * x));
    return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * T(kBeta) * (T(1) + T(3 * kKappa) * x2);
  }
  const T cdf = T(0.5) * (T(1) + d_erf(x * T(kAlpha)));
  const T pdf = T(kInvSqrt2Pi) * d_exp(T(-0.5) * x * x);
  return cdf + x * pdf;
}

// d' = phi (2 - x^2)  |  (1 - t^2) (u' + x/2 (u'' - 2 t u'^2)),  u'' = 6 beta kappa x,
// 1 - t^2 as 4e / (1 + e)^2 with e = exp(-2|u|): no cancellation once t rounds to 1
template <typename T, bool kTanh> __device__ __forceinline__ T gelu_d2(T x) {
  const T x2 = x * x;
  if (kTanh) {
    const T u = T(kBeta) * (x + T(kKappa) * x2 * x);
    const T t = d_tanh(u);
    const T e = d_exp(T(-2) * fabs(u));
    const T sech2 = T(4) * e / ((T(1) + e) * (T(1) + e));
    const T du = T(kBeta) * (T(1) + T(3 * kKappa) * x2);
    const T d2u = T(6 * kBeta * kKappa) * x;
    return sech2 * (du + T(0.5) * x * (d2u - T(2) * t * du * du));
  }
  return T(kInvSqrt2Pi) * d_exp(T(-0.5) * x2) * (T(2) - x2);
}

// The three operations, each a function of kInputs values in the math type.
template <bool kTanh> struct Forward {
  static constexpr int kInputs = 1;
  template <typename T> __device__ static T apply(const T* v) { return gelu<T, kTanh>(v[0]); }
};
template <bool kTanh> struct Backward {  // inputs: grad, x
  static constexpr int kInputs = 2;
  template <typename T> __device__ static T apply(const T* v) { return v[0] * gelu_d1<T, kTanh>(v[1]); }
};
template <bool kTanh> struct DoubleBackward {  // inputs: grad_grad, grad, x
  static constexpr int kInputs = 3;
  template <typename T> __device__ static T apply(const T* v) { return v[0] * v[1] * gelu_d2<T, kTanh>(v[2]); }
};

// ---- kernels --------------------------------------------------------------------------------------

// 16 bytes worth of scalar_t, moved as one uint4.
template <typename scalar_t> struct alignas(16) Pack {
  static constexpr int N = 16 / sizeof(scalar_t);
  scalar_t v[N];
};

template <typename scalar_t, int kInputs> struct Inputs {
  const scalar_t* p[kInputs];
};

template <typename scalar_t> __device__ __forceinline__ Pack<scalar_t> load_pack(const scalar_t* p, int64_t i) {
  Pack<scalar_t> out;
  *reinterpret_cast<uint4*>(&out) = __ldg(reinterpret_cast<const uint4*>(p) + i);  // LDG.E.128 (read-only path)
  return out;
}

template <typename scalar_t, typename Op>
__global__ void vec_kernel(Inputs<scalar_t, Op::kInputs> in, scalar_t* __restrict__ out, int64_t n_packs) {
  using P = Pack<scalar_t>;
  using E = Elem<scalar_t>;
  using opmath = typename E::opmath;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n_packs; i += stride) {
    P a[Op::kInputs];
#pragma unroll
    for (int j = 0; j < Op::kInputs; ++j) a[j] = load_pack(in.p[j], i);
    P o;
#pragma unroll
    for (int k = 0; k < P::N; ++k) {
      opmath v[Op::kInputs];
#pragma unroll
      for (int j = 0; j < Op::kInputs; ++j) v[j] = E::load(a[j].v[k]);
      o.v[k] = E::store(Op::template apply<opmath>(v));
    }
    reinterpret_cast<uint4*>(out)[i] = *reinterpret_cast<const uint4*>(&o);  // STG.E.128
  }
}

template <typename scalar_t, typename Op>
__global__ void scalar_kernel(Inputs<scalar_t, Op::kInputs> in, scalar_t* __restrict__ out, int64_t begin, int64_t n) {
  using E = Elem<scalar_t>;
  using opmath = typename E::opmath;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = begin + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    opmath v[Op::kInputs];
#pragma unroll
    for (int j = 0; j < Op::kInputs; ++j) v[j] = E::load(in.p[j][i]);
    out[i] = E::store(Op::template apply<opmath>(v));
  }
}

// Enough blocks to fill every SM several times over, never more than the work needs.
inline int grid_for(int64_t work_items, int sm_count) {
  const int64_t needed = (work_items + kThreads - 1) / kThreads;
  const int64_t cap = static_cast<int64_t>(sm_count > 0 ? sm_count : 1) * 8;
  return static_cast<int>(needed < 1 ? 1 : (needed < cap ? needed : cap));
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <typename scalar_t, typename Op>
cudaError_t launch(const void* const* inputs, void* out_v, int64_t n, int sm_count, cudaStream_t stream) {
  constexpr int N = Pack<scalar_t>::N;
  Inputs<scalar_t, Op::kInputs> in;
  scalar_t* out = static_cast<scalar_t*>(out_v);
  bool aligned = aligned16(out);
  for (int j = 0; j < Op::kInputs; ++j) {
    in.p[j] = static_cast<const scalar_t*>(inputs[j]);
    aligned = aligned && aligned16(inputs[j]);
  }
  const int64_t n_packs = aligned ? n / N : 0;
  const int64_t tail_begin = n_packs * N;
  if (n_packs > 0) {
    vec_kernel<scalar_t, Op><<<grid_for(n_packs, sm_count), kThreads, 0, stream>>>(in, out, n_packs);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  if (tail_begin < n) {
    scalar_kernel<scalar_t, Op><<<grid_for(n - tail_begin, sm_count), kThreads, 0, stream>>>(in, out, tail_begin, n);
  }
  return cudaGetLastError();
}

template <template <bool> class Op>
cudaError_t dispatch(Dtype dtype, bool tanh_approx, const void* const* inputs, void* out, int64_t n, int sm_count,
                     cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  switch (dtype) {
    case Dtype::Float32:
      return tanh_approx ? launch<float, Op<true>>(inputs, out, n, sm_count, stream)
                         : launch<float, Op<false>>(inputs, out, n, sm_count, stream);
    case Dtype::Float64:
      return tanh_approx ? launch<double, Op<true>>(inputs, out, n, sm_count, stream)
                         : launch<double, Op<false>>(inputs, out, n, sm_count, stream);
    case Dtype::BFloat16:
      return tanh_approx ? launch<__nv_bfloat16, Op<true>>(inputs, out, n, sm_count, stream)
                         : launch<__nv_bfloat16, Op<false>>(inputs, out, n, sm_count, stream);
    case Dtype::Float16:
      return tanh_approx ? launch<__half, Op<true>>(inputs, out, n, sm_count, stream)
                         : launch<__half, Op<false>>(inputs, out, n, sm_count, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t launch_forward(Dtype dtype, bool tanh_approx, const void* x, void* y, int64_t n, int sm_count,
                           cudaStream_t stream) {
  const void* inputs[1] = {x};
  return dispatch<Forward>(dtype, tanh_approx, inputs, y, n, sm_count, stream);
}

cudaError_t launch_backward(Dtype dtype, bool tanh_approx, const void* g, const void* x, void* dx, int64_t n,
                            int sm_count, cudaStream_t stream) {
  const void* inputs[2] = {g, x};
  return dispatch<Backward>(dtype, tanh_approx, inputs, dx, n, sm_count, stream);
}

cudaError_t launch_double_backward(Dtype dtype, bool tanh_approx, const void* gg, const void* g, const void* x,
                                   void* out, int64_t n, int sm_count, cudaStream_t stream) {
  const void* inputs[3] = {gg, g, x};
  return dispatch<DoubleBackward>(dtype, tanh_approx, inputs, out, n, sm_count, stream);
}

}  // namespace trainlab_gelu_cuda
