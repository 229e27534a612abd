// CUDA kernels of LeNet-5's layers: im2col/col2im for the convolution (the GEMMs are cuBLAS, called
// from layers_cuda_glue.cpp), max-pooling forward and two backward versions, the linear layer's
// bias gradient, and relu. CUDA-only — no ATen/c10 headers — so `nvcc -ptx` compiles this file on a
// machine without a GPU or a CUDA build of torch (tests/test_ops_layers_cuda.py, sm_80 and sm_90).
//
// The lesson this file is here for is the max-pool backward (the course report that inspired it
// found a serial pool backward dominating the whole training step):
//   version 1, scatter: one thread per *output* adds its gradient to the input element its window
//     chose. Overlapping windows (stride < kernel) can choose the same element, so the add must be
//     atomic, dx must be zeroed first (an extra pass over dx), and the float sum's order — hence its
//     rounding — changes from run to run.
//   version 2, gather: one thread per *input* element visits the ceil(K/S)^2 windows that can contain
//     it and adds the gradients of those whose saved winner it is. Every thread writes its own
//     element exactly once: no atomics, no zeroing pass, deterministic, coalesced stores.
// Both read the one-byte window-local argmax the forward saved (p·KW + q), not a 64-bit offset.
//
// Index math is 64-bit where a tensor can exceed 2^31 elements (pooling switches to 32-bit when it fits);
// the element-wise kernels use grid-stride loops of 256-thread blocks.
// bfloat16/half are compared and summed in float; a maximum is stored as the input element itself.

#include "layers_cuda.h"

#include <cfloat>
#include <cmath>
#include <algorithm>
#include <cstdint>

namespace trainlab_layers_cuda {

namespace {

constexpr int kThreads = 256;

inline unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65535 * 8 ? (b > 0 ? b : 1) : 65535 * 8);   // grid-stride covers the rest
}

template <typename T> struct Acc { using type = float; };
template <> struct Acc<double> { using type = double; };

__device__ __forceinline__ float to_acc(float v) { return v; }
__device__ __forceinline__ double to_acc(double v) { return v; }
__device__ __forceinline__ float to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_acc(__half v) { return __half2float(v); }

template <typename T> __device__ __forceinline__ T from_acc(typename Acc<T>::type v);
template <> __device__ __forceinline__ float from_acc<float>(float v) { return v; }
template <> __device__ __forceinline__ double from_acc<double>(double v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half from_acc<__half>(float v) { return __float2half_rn(v); }

// T(0) does not compile for bf16/half under torch's -D__CUDA_NO_BFLOAT16_CONVERSIONS__ flags.
template <typename T> __device__ __forceinline__ T zero() { return from_acc<T>(typename Acc<T>::type(0)); }

#define GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

// ---- conv2d: direct (implicit-GEMM) kernels -------------------------------------------------------
//
// The first CUDA version ran the CPU algorithm on the GPU: im2col into a [C·KH·KW (+1), N·OH·OW]
// matrix (for conv1 at batch 4096: 26 x 3.2M floats, 334 MB written and read back), a cuBLAS GEMM
// with M = 6 or 16 and K = 26 or 151 (too skinny for tensor-core tiles: memory-bound on the
// columns), and transposing copies between [OC, N·L] and NCHW; every element index was decomposed
// with six 64-bit divisions. At batch 4096 it was 3.1-3.5x ATen's forward.
// These kernels never materialise the columns:
//   forward and input gradient, conv_fwd_kernel: one thread per output position m = (n, i, j) (128
//     consecutive positions per block: coalesced loads of x and stores of y), all OCT output channels
//     of a tile in registers (register blocking: each x value loaded once feeds OCT FMAs). The block's
//     weights sit in shared memory as [tap][OCT], so the OCT weights of one tap are OCT/4 broadcast
//     128-bit loads (every lane of a warp reads the same address). The input gradient is the same
//     kernel: for stride 1, dx = conv(dy, W flipped in (p, q) and transposed in (o, c), padding
//     K - 1 - P), and the flip/transpose is done while filling shared memory (kFlip), not in a pass.
//   weight gradient, conv_wgrad_kernel: dW[o, k] = sum over positions m of dy[o, m] cols[k, m], a
//     reduction over N·OH·OW (3.2M for conv1). Each block owns a fixed contiguous slice of positions;
//     a thread owns one tap k (its (c, p, q) decoded once) and OCT accumulators, and walks the slice in
//     chunks whose dy values and position offsets are staged in shared memory. The bias gradient is
//     tap k = C·KH·KW, whose "input" is 1. The block's lanes are summed in shared memory in a fixed
//     order and each block writes its partial [OC, C·KH·KW + 1] matrix; column_sums then adds the
//     partials in slice order. No atomics: the result is deterministic, bit for bit, run to run.

constexpr int kConvThreads = 128;   // output positions per block of conv_fwd_kernel
constexpr int kSmemBytes = 16384;   // weight tile budget per block (48 KB is the static limit)
constexpr int kWgradChunk = 64;     // positions staged at a time by conv_wgrad_kernel
constexpr int kWgradThreads = 256;

// OCT values of type T in shared memory as 128-bit loads where they fit (float x4, double x2).
template <typename T, int OCT>
__device__ __forceinline__ void fma_tile(T (&acc)[OCT], T v, const T* __restrict__ w) {
  if constexpr (sizeof(T) == 4 && OCT % 4 == 0) {
#pragma unroll
    for (int o = 0; o < OCT; o += 4) {
      const float4 q = *reinterpret_cast<const float4*>(w + o);
      acc[o] += v * q.x; acc[o + 1] += v * q.y; acc[o + 2] += v * q.z; acc[o + 3] += v * q.w;
    }
  } else if constexpr (sizeof(T) == 8 && OCT % 2 == 0) {
#pragma unroll
    for (int o = 0; o < OCT; o += 2) {
      const double2 q = *reinterpret_cast<const double2*>(w + o);
      acc[o] += v * q.x; acc[o + 1] += v * q.y;
    }
  } else {
#pragma unroll
    for (int o = 0; o < OCT; ++o) acc[o] += v * w[o];
  }
}

// The weights of the logical convolution packed per output-channel tile as [tile][k][OCT], k =
// (c·KH + p)·KW + q, zero beyond OC: one launch per call, so that every block of conv_fwd_kernel
// fills its shared memory with a straight coalesced copy. kFlip: w is the forward weight [C, OC,
// KH, KW] of the convolution whose input gradient this is, read flipped in (p, q) and transposed.
template <typename T, int OCT, bool kFlip>
__global__ void pack_weights_kernel(const T* __restrict__ w, T* __restrict__ packed, ConvGeom g) {
  const int64_t ckk = g.C * g.KH * g.KW, total = (g.OC + OCT - 1) / OCT * ckk * OCT;
  GRID_STRIDE(e, total) {
    const int64_t o = (e / (ckk * OCT)) * OCT + e % OCT, k = (e / OCT) % ckk;
    const int64_t c = k / (g.KH * g.KW), p = (k / g.KW) % g.KH, q = k % g.KW;
    T v = T(0);
    if (o < g.OC) v = kFlip ? w[((c * g.OC + o) * g.KH + (g.KH - 1 - p)) * g.KW + (g.KW - 1 - q)]
                            : w[((o * g.C + c) * g.KH + p) * g.KW + q];
    packed[e] = v;
  }
}

// g is the *logical* convolution: in [N, C, H, W] -> out [N, OC, OH, OW], padding PH/PW (any
// integer: the input-gradient call passes K - 1 - P); wp its packed weights (pack_weights_kernel).
template <typename T, int OCT>
__global__ void __launch_bounds__(kConvThreads) conv_fwd_kernel(const T* __restrict__ in, const T* __restrict__ wp,
                                                                const T* __restrict__ bias, T* __restrict__ out,
                                                                ConvGeom g, int chunk_c) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* ws = reinterpret_cast<T*>(smem_raw);   // [chunk_c * KH * KW][OCT]
  const int C = static_cast<int>(g.C), H = static_cast<int>(g.H), W = static_cast<int>(g.W);
  const int OC = static_cast<int>(g.OC), KH = static_cast<int>(g.KH), KW = static_cast<int>(g.KW);
  const int PH = static_cast<int>(g.PH), PW = static_cast<int>(g.PW), OW = static_cast<int>(g.OW);
  const int L = static_cast<int>(g.OH * g.OW), taps = KH * KW;
  const int o0 = blockIdx.y * OCT;
  const int64_t m = static_cast<int64_t>(blockIdx.x) * kConvThreads + threadIdx.x;
  const bool active = m < g.N * L;
  const int64_t n = active ? m / L : 0;
  const int l = active ? static_cast<int>(m - n * L) : 0;
  const int i = l / OW, j = l - (l / OW) * OW;
  const T* x = in + n * C * H * W;
  const T* wtile = wp + static_cast<int64_t>(blockIdx.y) * C * taps * OCT;
  T acc[OCT];
#pragma unroll
  for (int o = 0; o < OCT; ++o) acc[o] = (bias != nullptr && o0 + o < OC) ? bias[o0 + o] : T(0);
  for (int c0 = 0; c0 < C; c0 += chunk_c) {
    const int cc = min(chunk_c, C - c0);
    __syncthreads();   // the previous chunk's weights are no longer read
    const T* src = wtile + static_cast<int64_t>(c0) * taps * OCT;
    for (int e = threadIdx.x; e < cc * taps * OCT; e += kConvThreads) ws[e] = src[e];
    __syncthreads();
    if (!active) continue;
    for (int c = 0; c < cc; ++c) {
      const T* xc = x + static_cast<int64_t>(c0 + c) * H * W;
      const T* wc = ws + c * taps * OCT;
      for (int p = 0; p < KH; ++p) {
        const int ih = i + p - PH;
        if (ih < 0 || ih >= H) continue;
        const T* xrow = xc + ih * W;
        for (int q = 0; q < KW; ++q) {
          const int iw = j + q - PW;
          if (iw < 0 || iw >= W) continue;
          fma_tile<T, OCT>(acc, __ldg(xrow + iw), wc + (p * KW + q) * OCT);
        }
      }
    }
  }
  if (!active) return;
  T* y = out + (n * OC + o0) * L + l;
#pragma unroll
  for (int o = 0; o < OCT; ++o)
    if (o0 + o < OC) y[static_cast<int64_t>(o) * L] = acc[o];
}

// Partial weight (and bias) gradients of one slice of positions: partial[slice][o][k], k < C·KH·KW
// the taps, k = C·KH·KW the bias. Block: KT taps x LANES lanes; blockIdx.y picks the tap group,
// blockIdx.z the output-channel tile.
template <typename T, int OCT>
__global__ void __launch_bounds__(kWgradThreads) conv_wgrad_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                                                   T* __restrict__ partial, ConvGeom g, int kt,
                                                                   int64_t slice_len, bool bias) {
  __shared__ __align__(16) T dys[kWgradChunk][OCT];
  __shared__ int64_t xoff[kWgradChunk];   // n·C·H·W + (i - PH)·W + (j - PW)
  __shared__ int pos_i[kWgradChunk], pos_j[kWgradChunk];
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* red = reinterpret_cast<T*>(smem_raw);   // [LANES][KT][OCT] for the lane reduction
  const int C = static_cast<int>(g.C), H = static_cast<int>(g.H), W = static_cast<int>(g.W);
  const int OC = static_cast<int>(g.OC), KH = static_cast<int>(g.KH), KW = static_cast<int>(g.KW);
  const int PH = static_cast<int>(g.PH), PW = static_cast<int>(g.PW), OW = static_cast<int>(g.OW);
  const int L = static_cast<int>(g.OH * g.OW), taps = KH * KW, ckk = C * taps;
  const int lanes = blockDim.x / kt;
  const int kk = threadIdx.x % kt, lane = threadIdx.x / kt;
  const int k = blockIdx.y * kt + kk;
  const int o0 = blockIdx.z * OCT;
  const bool tap_ok = lane < lanes && k <= (bias ? ckk : ckk - 1);
  const bool is_bias = k == ckk;
  const int c = is_bias ? 0 : k / taps, p = is_bias ? 0 : (k % taps) / KW, q = is_bias ? 0 : k % KW;
  const int64_t koff = static_cast<int64_t>(c) * H * W + p * W + q;
  const int64_t total = g.N * L;
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * slice_len;
  const int64_t end = min(begin + slice_len, total);
  T acc[OCT];
#pragma unroll
  for (int o = 0; o < OCT; ++o) acc[o] = T(0);
  for (int64_t m0 = begin; m0 < end; m0 += kWgradChunk) {
    __syncthreads();   // the previous chunk is no longer read
    // Positions m0 .. m0 + 63 are contiguous: decompose m0 once (64-bit), the rest in 32-bit steps.
    const int64_t n0 = m0 / L;
    const int l0 = static_cast<int>(m0 - n0 * L);
    for (int e = threadIdx.x; e < kWgradChunk * OCT; e += blockDim.x) {
      const int o = e / kWgradChunk, r = e % kWgradChunk;   // consecutive threads: consecutive positions
      const int64_t m = m0 + r;
      T v = T(0);
      if (m < end && o0 + o < OC) {
        const int64_t n = n0 + (l0 + r) / L;
        v = dy[(n * OC + o0 + o) * L + (l0 + r) % L];
      }
      dys[r][o] = v;
    }
    for (int r = threadIdx.x; r < kWgradChunk; r += blockDim.x) {
      if (m0 + r < end) {
        const int64_t n = n0 + (l0 + r) / L;
        const int l = (l0 + r) % L, i = l / OW, j = l % OW;
        xoff[r] = n * C * H * W + static_cast<int64_t>(i - PH) * W + (j - PW);
        pos_i[r] = i;
        pos_j[r] = j;
      }
    }
    __syncthreads();
    if (!tap_ok) continue;
    const int rows = static_cast<int>(end - m0 < kWgradChunk ? end - m0 : kWgradChunk);
    for (int r = lane; r < rows; r += lanes) {
      T v;
      if (is_bias) {
        v = T(1);
      } else {
        const int ih = pos_i[r] + p - PH, iw = pos_j[r] + q - PW;
        v = (ih >= 0 && ih < H && iw >= 0 && iw < W) ? __ldg(x + xoff[r] + koff) : T(0);
      }
      fma_tile<T, OCT>(acc, v, &dys[r][0]);
    }
  }
  // Sum the lanes in a fixed order (lane 0 + lane 1 + ...), then one partial row per (o, k).
  __syncthreads();
  if (lane < lanes) {
#pragma unroll
    for (int o = 0; o < OCT; ++o) red[(lane * kt + kk) * OCT + o] = acc[o];
  }
  __syncthreads();
  if (lane != 0 || !tap_ok) return;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * OC;
  const int kcols = ckk + (bias ? 1 : 0);
#pragma unroll
  for (int o = 0; o < OCT; ++o) {
    T sum = red[kk * OCT + o];
    for (int ln = 1; ln < lanes; ++ln) sum += red[(ln * kt + kk) * OCT + o];
    if (o0 + o < OC) partial[(row + o0 + o) * kcols + k] = sum;
  }
}

// The output-channel tile: the smallest of 4, 8, 16 that holds OC (16 and a grid of tiles beyond).
inline int oc_tile(int64_t oc) { return oc <= 4 ? 4 : oc <= 8 ? 8 : 16; }

// ---- max_pool2d ----------------------------------------------------------------------------------

// Index math in Ix: int32_t whenever every index of the call fits (LeNet's always do), int64_t
// otherwise. The kernels are memory-bound only if their index math is cheap: a 64-bit division is a
// ~70-instruction subroutine on the GPU and each element needed three, which made the gather
// backward compute-bound (1.37x ATen at batch 4096 on the H100).
//
// One thread per output. ATen's rules: scan p then q, take v when v > best or v is NaN; a window
// nothing beats (all -inf) reports its first element inside the image.
template <typename T, typename I, typename Ix>
__global__ void max_pool_fwd_kernel(const T* __restrict__ x, T* __restrict__ y, I* __restrict__ idx, PoolGeom g64) {
  using acc_t = typename Acc<T>::type;
  const Ix H = Ix(g64.H), W = Ix(g64.W), OH = Ix(g64.OH), OW = Ix(g64.OW), KH = Ix(g64.KH), KW = Ix(g64.KW);
  const Ix SH = Ix(g64.SH), SW = Ix(g64.SW), PH = Ix(g64.PH), PW = Ix(g64.PW);
  const Ix total = Ix(g64.N * g64.C) * OH * OW;
  for (Ix i = Ix(blockIdx.x) * Ix(blockDim.x) + Ix(threadIdx.x); i < total; i += Ix(gridDim.x) * Ix(blockDim.x)) {
    const Ix q = i / OW, j = i - q * OW, plane = q / OH, r = q - plane * OH;
    const Ix h0 = r * SH - PH, w0 = j * SW - PW;
    const Ix h_lo = h0 > 0 ? h0 : 0, w_lo = w0 > 0 ? w0 : 0;
    const Ix h_hi = h0 + KH < H ? h0 + KH : H, w_hi = w0 + KW < W ? w0 + KW : W;
    const T* xp = x + plane * H * W;
    acc_t best = -INFINITY;
    Ix k = (h_lo - h0) * KW + (w_lo - w0);
    T best_v = xp[h_lo * W + w_lo];
    for (Ix ih = h_lo; ih < h_hi; ++ih) {
      for (Ix iw = w_lo; iw < w_hi; ++iw) {
        const T raw = xp[ih * W + iw];
        const acc_t v = to_acc(raw);
        if (v > best || isnan(v)) {
          best = v;
          best_v = raw;
          k = (ih - h0) * KW + (iw - w0);
        }
      }
    }
    y[i] = best_v;
    idx[i] = static_cast<I>(k);
  }
}

template <typename T, typename I, typename Ix>
__global__ void max_pool_bwd_gather_kernel(const T* __restrict__ grad, const I* __restrict__ idx, T* __restrict__ dx,
                                           PoolGeom g64) {
  const Ix H = Ix(g64.H), W = Ix(g64.W), OH = Ix(g64.OH), OW = Ix(g64.OW), KH = Ix(g64.KH), KW = Ix(g64.KW);
  const Ix SH = Ix(g64.SH), SW = Ix(g64.SW), PH = Ix(g64.PH), PW = Ix(g64.PW);
  const Ix total = Ix(g64.N * g64.C) * H * W;
  for (Ix i = Ix(blockIdx.x) * Ix(blockDim.x) + Ix(threadIdx.x); i < total; i += Ix(gridDim.x) * Ix(blockDim.x)) {
    const Ix q = i / W, w = i - q * W, plane = q / H, h = q - plane * H;
    const Ix r_hi = (h + PH) / SH, j_hi = (w + PW) / SW;   // last windows that can contain (h, w)
    typename Acc<T>::type acc = 0;
    for (Ix r = r_hi; r >= 0 && r * SH - PH + KH > h; --r) {
      if (r >= OH) continue;
      const Ix p = h + PH - r * SH;
      for (Ix j = j_hi; j >= 0 && j * SW - PW + KW > w; --j) {
        if (j >= OW) continue;
        const Ix o = (plane * OH + r) * OW + j;
        if (static_cast<Ix>(idx[o]) == p * KW + (w + PW - j * SW)) acc += to_acc(grad[o]);
      }
    }
    dx[i] = from_acc<T>(acc);
  }
}

// Whether every index of a pooling call fits in int32 (with room for the grid-stride step).
inline bool pool_fits_int32(const PoolGeom& g) {
  const int64_t in = g.N * g.C * g.H * g.W, out = g.N * g.C * g.OH * g.OW;
  return std::max(in, out) < (int64_t(1) << 30);
}

template <typename T, typename I>
__global__ void max_pool_bwd_atomic_kernel(const T* __restrict__ grad, const I* __restrict__ idx, T* __restrict__ dx,
                                           PoolGeom g) {
  const int64_t total = g.N * g.C * g.OH * g.OW;
  GRID_STRIDE(i, total) {
    const int64_t j = i % g.OW, r = (i / g.OW) % g.OH, plane = i / (g.OW * g.OH);
    const int64_t k = static_cast<int64_t>(idx[i]);
    const int64_t h = r * g.SH - g.PH + k / g.KW, w = j * g.SW - g.PW + k % g.KW;
    atomicAdd(dx + (plane * g.H + h) * g.W + w, grad[i]);
  }
}

// ---- linear bias gradient and relu ---------------------------------------------------------------

// One block per column: a strided partial sum per thread, then a shared-memory tree. The order is
// fixed by the launch shape, so the result is deterministic.
template <typename T>
__global__ void column_sums_kernel(const T* __restrict__ g, T* __restrict__ out, int64_t rows, int64_t cols) {
  using acc_t = typename Acc<T>::type;
  __shared__ acc_t partial[kThreads];
  const int64_t col = blockIdx.x;
  acc_t acc = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) acc += to_acc(g[r * cols + col]);
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[col] = from_acc<T>(partial[0]);
}

template <typename T>
__global__ void relu_fwd_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n) {
  GRID_STRIDE(i, n) {
    const auto v = to_acc(x[i]);
    y[i] = (v > 0 || isnan(v)) ? x[i] : zero<T>();   // NaN kept, as ATen's relu
  }
}

template <typename T>
__global__ void relu_bwd_kernel(const T* __restrict__ grad, const T* __restrict__ y, T* __restrict__ dx, int64_t n) {
  GRID_STRIDE(i, n) { dx[i] = to_acc(y[i]) <= 0 ? zero<T>() : grad[i]; }   // NaN <= 0 is false: grad passes
}

}  // namespace

// ---- launchers -----------------------------------------------------------------------------------

template <typename T, int OCT, bool kFlip>
cudaError_t conv_fwd_tile(const T* in, const T* w, const T* bias, T* out, T* packed, const ConvGeom& g,
                          cudaStream_t stream) {
  const int64_t taps = g.KH * g.KW;
  const int64_t per_c = taps * OCT * static_cast<int64_t>(sizeof(T));
  if (per_c > kSmemBytes) return cudaErrorInvalidValue;   // kernels over ~16x16 (float, OCT 16): not LeNet's
  const int chunk_c = static_cast<int>(std::min<int64_t>(g.C, kSmemBytes / per_c));
  const int64_t tiles = (g.OC + OCT - 1) / OCT;
  pack_weights_kernel<T, OCT, kFlip><<<blocks_for(tiles * g.C * taps * OCT), kThreads, 0, stream>>>(w, packed, g);
  const int64_t positions = g.N * g.OH * g.OW;
  const dim3 grid(static_cast<unsigned>((positions + kConvThreads - 1) / kConvThreads), static_cast<unsigned>(tiles));
  conv_fwd_kernel<T, OCT><<<grid, kConvThreads, chunk_c * per_c, stream>>>(in, packed, bias, out, g, chunk_c);
  return cudaGetLastError();
}

template <typename T, bool kFlip>
cudaError_t conv_fwd_any(const T* in, const T* w, const T* bias, T* out, T* packed, const ConvGeom& g,
                         cudaStream_t stream) {
  if (g.N * g.OH * g.OW == 0 || g.OC == 0) return cudaSuccess;
  if ((g.N * g.OH * g.OW + kConvThreads - 1) / kConvThreads > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
  switch (oc_tile(g.OC)) {
    case 4: return conv_fwd_tile<T, 4, kFlip>(in, w, bias, out, packed, g, stream);
    case 8: return conv_fwd_tile<T, 8, kFlip>(in, w, bias, out, packed, g, stream);
    default: return conv_fwd_tile<T, 16, kFlip>(in, w, bias, out, packed, g, stream);
  }
}

int64_t conv_packed_elems(const ConvGeom& g) {
  // Either logical convolution: forward (OC outputs from C·KH·KW taps) or input gradient (C outputs
  // from OC·KH·KW taps), output channels rounded up to the tile (<= 16).
  const auto up16 = [](int64_t v) { return (v + 15) / 16 * 16; };
  return std::max(up16(g.OC) * g.C, up16(g.C) * g.OC) * g.KH * g.KW;
}

template <typename T>
cudaError_t conv_forward(const T* x, const T* w, const T* bias, T* y, T* packed, const ConvGeom& g,
                         cudaStream_t stream) {
  return conv_fwd_any<T, false>(x, w, bias, y, packed, g, stream);
}

template <typename T>
cudaError_t conv_backward_input(const T* dy, const T* w, T* dx, T* packed, const ConvGeom& g, cudaStream_t stream) {
  // dx = conv(dy, flip(W)^T, padding K - 1 - P): the logical convolution maps dy [N, OC, OH, OW]
  // to dx [N, C, H, W].
  const ConvGeom t{g.N, g.OC, g.OH, g.OW, g.C, g.KH, g.KW, g.KH - 1 - g.PH, g.KW - 1 - g.PW, g.H, g.W};
  return conv_fwd_any<T, true>(dy, w, nullptr, dx, packed, t, stream);
}

int64_t conv_wgrad_slices(const ConvGeom& g) {
  // Positions per slice: ~1024 (enough work per block to amortise staging), at most 1024 slices
  // (the partial buffer stays small), at least 1.
  const int64_t positions = g.N * g.OH * g.OW;
  return std::max<int64_t>(1, std::min<int64_t>(1024, (positions + 1023) / 1024));
}

template <typename T, int OCT>
cudaError_t conv_wgrad_tile(const T* dy, const T* x, T* partial, const ConvGeom& g, bool bias, int64_t slices,
                            cudaStream_t stream) {
  const int64_t kcols = g.C * g.KH * g.KW + (bias ? 1 : 0);
  // Taps per block: all of them up to 256 threads (rounded to whole warps), the rest in lanes that
  // split the positions of the slice.
  const int kt = static_cast<int>(std::min<int64_t>(kWgradThreads, (kcols + 31) / 32 * 32));
  const int lanes = kWgradThreads / kt;
  const int64_t positions = g.N * g.OH * g.OW;
  const int64_t slice_len = (positions + slices - 1) / slices;
  const dim3 grid(static_cast<unsigned>(slices), static_cast<unsigned>((kcols + kt - 1) / kt),
                  static_cast<unsigned>((g.OC + OCT - 1) / OCT));
  const size_t red_bytes = static_cast<size_t>(lanes) * kt * OCT * sizeof(T);
  conv_wgrad_kernel<T, OCT><<<grid, kt * lanes, red_bytes, stream>>>(dy, x, partial, g, kt, slice_len, bias);
  return cudaGetLastError();
}

template <typename T>
cudaError_t conv_backward_weight(const T* dy, const T* x, T* partial, T* acc, const ConvGeom& g, bool bias,
                                 int64_t slices, cudaStream_t stream) {
  const int64_t kcols = g.C * g.KH * g.KW + (bias ? 1 : 0);
  if (g.N * g.OH * g.OW == 0) return cudaErrorInvalidValue;   // the glue zero-fills instead
  cudaError_t err;
  switch (oc_tile(g.OC)) {
    case 4: err = conv_wgrad_tile<T, 4>(dy, x, partial, g, bias, slices, stream); break;
    case 8: err = conv_wgrad_tile<T, 8>(dy, x, partial, g, bias, slices, stream); break;
    default: err = conv_wgrad_tile<T, 16>(dy, x, partial, g, bias, slices, stream); break;
  }
  if (err != cudaSuccess) return err;
  return column_sums(partial, acc, slices, g.OC * kcols, stream);   // slices summed in order
}

template <typename T, typename I>
cudaError_t max_pool_fwd(const T* x, T* y, I* idx, const PoolGeom& g, cudaStream_t stream) {
  if (pool_fits_int32(g)) {
    max_pool_fwd_kernel<T, I, int32_t><<<blocks_for(g.N * g.C * g.OH * g.OW), kThreads, 0, stream>>>(x, y, idx, g);
  } else {
    max_pool_fwd_kernel<T, I, int64_t><<<blocks_for(g.N * g.C * g.OH * g.OW), kThreads, 0, stream>>>(x, y, idx, g);
  }
  return cudaGetLastError();
}

template <typename T, typename I>
cudaError_t max_pool_bwd_gather(const T* grad, const I* idx, T* dx, const PoolGeom& g, cudaStream_t stream) {
  if (pool_fits_int32(g)) {
    max_pool_bwd_gather_kernel<T, I, int32_t><<<blocks_for(g.N * g.C * g.H * g.W), kThreads, 0, stream>>>(grad, idx, dx, g);
  } else {
    max_pool_bwd_gather_kernel<T, I, int64_t><<<blocks_for(g.N * g.C * g.H * g.W), kThreads, 0, stream>>>(grad, idx, dx, g);
  }
  return cudaGetLastError();
}

template <typename T, typename I>
cudaError_t max_pool_bwd_atomic(const T* grad, const I* idx, T* dx, const PoolGeom& g, cudaStream_t stream) {
  max_pool_bwd_atomic_kernel<<<blocks_for(g.N * g.C * g.OH * g.OW), kThreads, 0, stream>>>(grad, idx, dx, g);
  return cudaGetLastError();
}

template <typename T>
cudaError_t column_sums(const T* g, T* out, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (cols > 0) column_sums_kernel<<<static_cast<unsigned>(cols), kThreads, 0, stream>>>(g, out, rows, cols);
  return cudaGetLastError();
}

template <typename T>
cudaError_t relu_fwd(const T* x, T* y, int64_t n, cudaStream_t stream) {
  relu_fwd_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, y, n);
  return cudaGetLastError();
}

template <typename T>
cudaError_t relu_bwd(const T* grad, const T* y, T* dx, int64_t n, cudaStream_t stream) {
  relu_bwd_kernel<<<blocks_for(n), kThreads, 0, stream>>>(grad, y, dx, n);
  return cudaGetLastError();
}

// ---- explicit instantiations: GEMM-side data movement in float/double (the glue widens bf16/half
// to float, as the CPU kernels do); pooling and relu in every dtype; atomics in float/double -------

#define CONV_TYPES(T)                                                                                      \
  template cudaError_t conv_forward<T>(const T*, const T*, const T*, T*, T*, const ConvGeom&, cudaStream_t); \
  template cudaError_t conv_backward_input<T>(const T*, const T*, T*, T*, const ConvGeom&, cudaStream_t);    \
  template cudaError_t conv_backward_weight<T>(const T*, const T*, T*, T*, const ConvGeom&, bool, int64_t,   \
                                               cudaStream_t);                                             \
  template cudaError_t column_sums<T>(const T*, T*, int64_t, int64_t, cudaStream_t);
CONV_TYPES(float)
CONV_TYPES(double)

#define POOL_TYPES(T, I)                                                                                \
  template cudaError_t max_pool_fwd<T, I>(const T*, T*, I*, const PoolGeom&, cudaStream_t);            \
  template cudaError_t max_pool_bwd_gather<T, I>(const T*, const I*, T*, const PoolGeom&, cudaStream_t);
#define POOL_ALL(T) POOL_TYPES(T, uint8_t) POOL_TYPES(T, int32_t)
POOL_ALL(float)
POOL_ALL(double)
POOL_ALL(__nv_bfloat16)
POOL_ALL(__half)
template cudaError_t max_pool_bwd_atomic<float, uint8_t>(const float*, const uint8_t*, float*, const PoolGeom&, cudaStream_t);
template cudaError_t max_pool_bwd_atomic<float, int32_t>(const float*, const int32_t*, float*, const PoolGeom&, cudaStream_t);
template cudaError_t max_pool_bwd_atomic<double, uint8_t>(const double*, const uint8_t*, double*, const PoolGeom&, cudaStream_t);
template cudaError_t max_pool_bwd_atomic<double, int32_t>(const double*, const int32_t*, double*, const PoolGeom&, cudaStream_t);

#define RELU_TYPES(T)                                                        \
  template cudaError_t relu_fwd<T>(const T*, T*, int64_t, cudaStream_t);    \
  template cudaError_t relu_bwd<T>(const T*, const T*, T*, int64_t, cudaStream_t);
RELU_TYPES(float)
RELU_TYPES(double)
RELU_TYPES(__nv_bfloat16)
RELU_TYPES(__half)

}  // namespace trainlab_layers_cuda
