// GELU forward, backward and double backward as CUDA kernels. Depends on CUDA alone (no ATen, no
// c10), like llm.c's kernel files: `nvcc -arch=sm_90 -ptx gelu_cuda_kernels.cu` works on any machine
// with nvcc, GPU or not, which is how the test suite compiles it for sm_80 and sm_90 and checks the
// generated loads and stores (tests/test_gelu_cuda_compile.py). The ATen glue that turns tensors
// into the pointers below lives in gelu_cuda.cpp.
//
// Memory-bound element-wise kernels: the only goal is to keep the DRAM pipe full. The launch
// geometry is PyTorch's own element-wise loop (aten/src/ATen/native/cuda/CUDALoops.cuh):
//   * 128 threads per block, 8 elements per thread, so a block owns 1024 consecutive elements and
//     the grid is ONE SHOT: ceil(n / 1024) blocks, no grid-stride loop. Many small blocks in flight
//     per SM (16 at 128 threads) is what hides DRAM latency; the earlier grid-stride version (8
//     blocks of 256 per SM, one 16-byte vector per thread per iteration) kept a thread's loads
//     dependent on its previous store and reached 84 % of copy bandwidth on an H100.
//   * every thread issues ALL its loads before any math (2 x 128-bit per input for float, 1 for
//     bf16/half, 4 for double), then computes, then stores: 8 elements' worth of independent
//     memory requests per input per thread.
//   * access pattern: in a block, pack j of thread t is pack j*128 + t, so a warp's 32 lanes read
//     32 consecutive 16-byte packs (512 contiguous bytes) per instruction: fully coalesced.
//   * 16-byte vector loads/stores (LDG.E.128 / STG.E.128) when every pointer is 16-byte aligned;
//     misaligned views (a storage offset) and the last partial block take the scalar kernel, with
//     the same geometry and bounds checks, so correctness never depends on alignment and the vector
//     kernel has no bounds checks at all (its SASS has only 128-bit accesses; the tests check).
//   * the backward is one fused pass: reads dy and x, recomputes GELU'(x) in registers, writes dx
//     (3 N element-bytes, the minimum); the double backward likewise (4 N).
//   * 64-bit element offsets (tensors of 2^31 elements and more exist on 141 GB GPUs).
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
constexpr double kSig = 1.702;                      // x sigmoid(1.702 x)

constexpr int kThreads = 128;                       // PyTorch's num_threads()
constexpr int kItems = 8;                           // elements per thread (PyTorch's thread_work_size for 4-byte types)
constexpr int kBlockWork = kThreads * kItems;       // 1024 elements per block
// Blocks per SM the register allocation must allow: 16 x 128 threads = 2048, a full SM (<= 32
// registers per thread), for the forward and backward in float/bf16/half. Double math and the
// (rare) double backward need more registers and would spill; they keep 8 blocks (<= 64).
template <typename scalar_t, typename Op>
constexpr int kMinBlocks = (sizeof(scalar_t) < 8 && Op::kInputs <= 2) ? 16 : 8;

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

// e / (1 + e)^2 with e = exp(-|z|): sigma(z) (1 - sigma(z)) without the cancellation of 1 - sigma
// once sigma rounds to 1 (z > ~17 in float32). The same identity as sech^2 in the tanh form.
template <typename T> __device__ __forceinline__ T sig_var(T z) {
  const T e = d_exp(-fabs(z));
  return e / ((T(1) + e) * (T(1) + e));
}

// y = x Phi(x)  |  x/2 (1 + tanh u),  u = beta (x + kappa x^3)  |  x sigma(k x)
template <typename T, Approx A> __device__ __forceinline__ T gelu(T x) {
  if (A == Approx::Tanh) return T(0.5) * x * (T(1) + d_tanh(T(kBeta) * (x + T(kKappa) * x * x * x)));
  if (A == Approx::Sigmoid) return x / (T(1) + d_exp(T(-kSig) * x));
  return T(0.5) * x * (T(1) + d_erf(x * T(kAlpha)));
}

// d = Phi + x phi  |  (1 + t)/2 + x/2 (1 - t^2) u'  |  s + k x s (1 - s)
template <typename T, Approx A> __device__ __forceinline__ T gelu_d1(T x) {
  if (A == Approx::Tanh) {
    const T x2 = x * x;
    const T t = d_tanh(T(kBeta) * (x + T(kKappa) * x2 * x));
    return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * T(kBeta) * (T(1) + T(3 * kKappa) * x2);
  }
  if (A == Approx::Sigmoid) {
    const T z = T(kSig) * x;
    const T s = T(1) / (T(1) + d_exp(-z));
    return s + z * sig_var(z);
  }
  const T cdf = T(0.5) * (T(1) + d_erf(x * T(kAlpha)));
  const T pdf = T(kInvSqrt2Pi) * d_exp(T(-0.5) * x * x);
  return cdf + x * pdf;
}

// d' = phi (2 - x^2)  |  (1 - t^2) (u' + x/2 (u'' - 2 t u'^2)),  u'' = 6 beta kappa x,
// 1 - t^2 as 4e / (1 + e)^2 with e = exp(-2|u|): no cancellation once t rounds to 1
// |  k s (1 - s) (2 + k x (1 - 2 s))
template <typename T, Approx A> __device__ __forceinline__ T gelu_d2(T x) {
  const T x2 = x * x;
  if (A == Approx::Tanh) {
    const T u = T(kBeta) * (x + T(kKappa) * x2 * x);
    const T t = d_tanh(u);
    const T e = d_exp(T(-2) * fabs(u));
    const T sech2 = T(4) * e / ((T(1) + e) * (T(1) + e));
    const T du = T(kBeta) * (T(1) + T(3 * kKappa) * x2);
    const T d2u = T(6 * kBeta * kKappa) * x;
    return sech2 * (du + T(0.5) * x * (d2u - T(2) * t * du * du));
  }
  if (A == Approx::Sigmoid) {
    const T z = T(kSig) * x;
    const T s = T(1) / (T(1) + d_exp(-z));
    return T(kSig) * sig_var(z) * (T(2) + z * (T(1) - T(2) * s));
  }
  return T(kInvSqrt2Pi) * d_exp(T(-0.5) * x2) * (T(2) - x2);
}

// The three operations, each a function of kInputs values in the math type.
template <Approx A> struct Forward {
  static constexpr int kInputs = 1;
  template <typename T> __device__ static T apply(const T* v) { return gelu<T, A>(v[0]); }
};
template <Approx A> struct Backward {  // inputs: grad, x
  static constexpr int kInputs = 2;
  template <typename T> __device__ static T apply(const T* v) { return v[0] * gelu_d1<T, A>(v[1]); }
};
template <Approx A> struct DoubleBackward {  // inputs: grad_grad, grad, x
  static constexpr int kInputs = 3;
  template <typename T> __device__ static T apply(const T* v) { return v[0] * v[1] * gelu_d2<T, A>(v[2]); }
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

// Full blocks only (the launcher sends the last partial block to scalar_kernel), all pointers 16-byte
// aligned: no bounds checks, every global access 128 bits wide.
template <typename scalar_t, typename Op>
__global__ void __launch_bounds__(kThreads, kMinBlocks<scalar_t, Op>) vec_kernel(Inputs<scalar_t, Op::kInputs> in, scalar_t* __restrict__ out) {
  using P = Pack<scalar_t>;
  using E = Elem<scalar_t>;
  using opmath = typename E::opmath;
  constexpr int kPacks = kItems / P::N;   // 2 (float), 1 (bf16/half), 4 (double)
  static_assert(kPacks * P::N == kItems, "8 elements per thread must be whole 16-byte packs");
  const int64_t first = static_cast<int64_t>(blockIdx.x) * (kBlockWork / P::N) + threadIdx.x;   // in packs
  P a[Op::kInputs][kPacks];
#pragma unroll
  for (int j = 0; j < Op::kInputs; ++j)
#pragma unroll
    for (int k = 0; k < kPacks; ++k)   // every load issued before any math: kInputs * kPacks in flight
      *reinterpret_cast<uint4*>(&a[j][k]) = __ldg(reinterpret_cast<const uint4*>(in.p[j]) + first + k * kThreads);
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    P o;
#pragma unroll
    for (int e = 0; e < P::N; ++e) {
      opmath v[Op::kInputs];
#pragma unroll
      for (int j = 0; j < Op::kInputs; ++j) v[j] = E::load(a[j][k].v[e]);
      o.v[e] = E::store(Op::template apply<opmath>(v));
    }
    reinterpret_cast<uint4*>(out)[first + k * kThreads] = *reinterpret_cast<const uint4*>(&o);   // STG.E.128
  }
}

// Elements [begin, n) one at a time, same geometry (128 threads x 8 elements, element j*128 + t of
// the block): the tail after the last full block, or a whole tensor whose pointers are misaligned.
template <typename scalar_t, typename Op>
__global__ void __launch_bounds__(kThreads, kMinBlocks<scalar_t, Op>) scalar_kernel(Inputs<scalar_t, Op::kInputs> in, scalar_t* __restrict__ out,
                                                          int64_t begin, int64_t n) {
  using E = Elem<scalar_t>;
  using opmath = typename E::opmath;
  const int64_t first = begin + static_cast<int64_t>(blockIdx.x) * kBlockWork + threadIdx.x;
  opmath v[kItems][Op::kInputs];
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int64_t i = first + k * kThreads;
#pragma unroll
    for (int j = 0; j < Op::kInputs; ++j) v[k][j] = i < n ? E::load(in.p[j][i]) : opmath(0);
  }
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int64_t i = first + k * kThreads;
    if (i < n) out[i] = E::store(Op::template apply<opmath>(v[k]));
  }
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

inline unsigned blocks(int64_t elements) { return static_cast<unsigned>((elements + kBlockWork - 1) / kBlockWork); }

template <typename scalar_t, typename Op>
cudaError_t launch(const void* const* inputs, void* out_v, int64_t n, cudaStream_t stream) {
  Inputs<scalar_t, Op::kInputs> in;
  scalar_t* out = static_cast<scalar_t*>(out_v);
  bool aligned = aligned16(out);
  for (int j = 0; j < Op::kInputs; ++j) {
    in.p[j] = static_cast<const scalar_t*>(inputs[j]);
    aligned = aligned && aligned16(inputs[j]);
  }
  const int64_t full_blocks = aligned ? n / kBlockWork : 0;
  const int64_t tail_begin = full_blocks * kBlockWork;
  if (full_blocks > 0) {
    vec_kernel<scalar_t, Op><<<static_cast<unsigned>(full_blocks), kThreads, 0, stream>>>(in, out);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  if (tail_begin < n) scalar_kernel<scalar_t, Op><<<blocks(n - tail_begin), kThreads, 0, stream>>>(in, out, tail_begin, n);
  return cudaGetLastError();
}

template <template <Approx> class Op, typename scalar_t>
cudaError_t by_approx(Approx approx, const void* const* inputs, void* out, int64_t n, cudaStream_t stream) {
  switch (approx) {
    case Approx::None: return launch<scalar_t, Op<Approx::None>>(inputs, out, n, stream);
    case Approx::Tanh: return launch<scalar_t, Op<Approx::Tanh>>(inputs, out, n, stream);
    case Approx::Sigmoid: return launch<scalar_t, Op<Approx::Sigmoid>>(inputs, out, n, stream);
  }
  return cudaErrorInvalidValue;
}

template <template <Approx> class Op>
cudaError_t dispatch(Dtype dtype, Approx approx, const void* const* inputs, void* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  // One-shot grid: ceil(n / 1024) blocks must fit gridDim.x (2^31 - 1), i.e. n < 2^41 elements.
  if ((n + kBlockWork - 1) / kBlockWork > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
  switch (dtype) {
    case Dtype::Float32: return by_approx<Op, float>(approx, inputs, out, n, stream);
    case Dtype::Float64: return by_approx<Op, double>(approx, inputs, out, n, stream);
    case Dtype::BFloat16: return by_approx<Op, __nv_bfloat16>(approx, inputs, out, n, stream);
    case Dtype::Float16: return by_approx<Op, __half>(approx, inputs, out, n, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t launch_forward(Dtype dtype, Approx approx, const void* x, void* y, int64_t n, cudaStream_t stream) {
  const void* inputs[1] = {x};
  return dispatch<Forward>(dtype, approx, inputs, y, n, stream);
}

cudaError_t launch_backward(Dtype dtype, Approx approx, const void* g, const void* x, void* dx, int64_t n,
                            cudaStream_t stream) {
  const void* inputs[2] = {g, x};
  return dispatch<Backward>(dtype, approx, inputs, dx, n, stream);
}

cudaError_t launch_double_backward(Dtype dtype, Approx approx, const void* gg, const void* g, const void* x, void* out,
                                   int64_t n, cudaStream_t stream) {
  const void* inputs[3] = {gg, g, x};
  return dispatch<DoubleBackward>(dtype, approx, inputs, out, n, stream);
}

}  // namespace trainlab_gelu_cuda
