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
// Index math is 64-bit throughout (grid-stride loops over int64 counts); blocks are 256 threads.
// bfloat16/half are compared and summed in float; a maximum is stored as the input element itself.

#include "layers_cuda.h"

#include <cfloat>
#include <cmath>
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

// ---- conv2d data movement ----------------------------------------------------------------------

// One thread per cols element (r, b, l): consecutive threads write consecutive l (coalesced) and
// read along a row of x.
template <typename T>
__global__ void im2col_kernel(const T* __restrict__ x, T* __restrict__ cols, ConvGeom g, int64_t n0, int64_t B) {
  const int64_t L = g.OH * g.OW, total = g.C * g.KH * g.KW * B * L;
  GRID_STRIDE(i, total) {
    const int64_t l = i % L, b = (i / L) % B, r = i / (L * B);
    const int64_t q = r % g.KW, p = (r / g.KW) % g.KH, c = r / (g.KW * g.KH);
    const int64_t ih = l / g.OW + p - g.PH, iw = l % g.OW + q - g.PW;
    const bool inside = ih >= 0 && ih < g.H && iw >= 0 && iw < g.W;
    cols[i] = inside ? x[(((n0 + b) * g.C + c) * g.H + ih) * g.W + iw] : T(0);
  }
}

// One thread per dx element (b, c, h, w): dx = sum over (p, q) of dcols[(c, p, q), (b, h+PH-p, w+PW-q)].
template <typename T>
__global__ void col2im_kernel(const T* __restrict__ dcols, T* __restrict__ dx, ConvGeom g, int64_t n0, int64_t B) {
  const int64_t L = g.OH * g.OW, total = B * g.C * g.H * g.W;
  GRID_STRIDE(i, total) {
    const int64_t w = i % g.W, h = (i / g.W) % g.H, c = (i / (g.W * g.H)) % g.C, b = i / (g.W * g.H * g.C);
    typename Acc<T>::type acc = 0;
    for (int64_t p = 0; p < g.KH; ++p) {
      const int64_t oh = h + g.PH - p;
      if (oh < 0 || oh >= g.OH) continue;
      for (int64_t q = 0; q < g.KW; ++q) {
        const int64_t ow = w + g.PW - q;
        if (ow < 0 || ow >= g.OW) continue;
        acc += to_acc(dcols[((c * g.KH + p) * g.KW + q) * B * L + b * L + oh * g.OW + ow]);
      }
    }
    dx[(n0 * g.C) * g.H * g.W + i] = from_acc<T>(acc);
  }
}

template <typename T>
__global__ void to_channels_first_kernel(const T* __restrict__ nchw, T* __restrict__ t, int64_t n0, int64_t B,
                                         int64_t OC, int64_t L) {
  GRID_STRIDE(i, B * OC * L) {   // i indexes t = [OC, B, L]
    const int64_t l = i % L, b = (i / L) % B, oc = i / (L * B);
    t[i] = nchw[((n0 + b) * OC + oc) * L + l];
  }
}

template <typename T>
__global__ void from_channels_first_kernel(const T* __restrict__ t, T* __restrict__ nchw, int64_t n0, int64_t B,
                                           int64_t OC, int64_t L) {
  GRID_STRIDE(i, B * OC * L) {   // i indexes nchw rows of the chunk = [B, OC, L]
    const int64_t l = i % L, oc = (i / L) % OC, b = i / (L * OC);
    nchw[(n0 * OC) * L + i] = t[(oc * B + b) * L + l];
  }
}

// ---- max_pool2d ----------------------------------------------------------------------------------

// One thread per output. ATen's rules: scan p then q, take v when v > best or v is NaN; a window
// nothing beats (all -inf) reports its first element inside the image.
template <typename T, typename I>
__global__ void max_pool_fwd_kernel(const T* __restrict__ x, T* __restrict__ y, I* __restrict__ idx, PoolGeom g) {
  using acc_t = typename Acc<T>::type;
  const int64_t total = g.N * g.C * g.OH * g.OW;
  GRID_STRIDE(i, total) {
    const int64_t j = i % g.OW, r = (i / g.OW) % g.OH, plane = i / (g.OW * g.OH);
    const int64_t h0 = r * g.SH - g.PH, w0 = j * g.SW - g.PW;
    const int64_t h_lo = h0 > 0 ? h0 : 0, w_lo = w0 > 0 ? w0 : 0;
    const int64_t h_hi = h0 + g.KH < g.H ? h0 + g.KH : g.H, w_hi = w0 + g.KW < g.W ? w0 + g.KW : g.W;
    const T* xp = x + plane * g.H * g.W;
    acc_t best = -INFINITY;
    int64_t k = (h_lo - h0) * g.KW + (w_lo - w0);
    T best_v = xp[h_lo * g.W + w_lo];
    for (int64_t ih = h_lo; ih < h_hi; ++ih) {
      for (int64_t iw = w_lo; iw < w_hi; ++iw) {
        const T raw = xp[ih * g.W + iw];
        const acc_t v = to_acc(raw);
        if (v > best || isnan(v)) {
          best = v;
          best_v = raw;
          k = (ih - h0) * g.KW + (iw - w0);
        }
      }
    }
    y[i] = best_v;
    idx[i] = static_cast<I>(k);
  }
}

template <typename T, typename I>
__global__ void max_pool_bwd_gather_kernel(const T* __restrict__ grad, const I* __restrict__ idx, T* __restrict__ dx,
                                           PoolGeom g) {
  const int64_t total = g.N * g.C * g.H * g.W;
  GRID_STRIDE(i, total) {
    const int64_t w = i % g.W, h = (i / g.W) % g.H, plane = i / (g.W * g.H);
    const int64_t r_hi = (h + g.PH) / g.SH, j_hi = (w + g.PW) / g.SW;   // last windows that can contain (h, w)
    typename Acc<T>::type acc = 0;
    for (int64_t r = r_hi; r >= 0 && r * g.SH - g.PH + g.KH > h; --r) {
      if (r >= g.OH) continue;
      const int64_t p = h + g.PH - r * g.SH;
      for (int64_t j = j_hi; j >= 0 && j * g.SW - g.PW + g.KW > w; --j) {
        if (j >= g.OW) continue;
        const int64_t o = (plane * g.OH + r) * g.OW + j;
        if (static_cast<int64_t>(idx[o]) == p * g.KW + (w + g.PW - j * g.SW)) acc += to_acc(grad[o]);
      }
    }
    dx[i] = from_acc<T>(acc);
  }
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

template <typename T>
cudaError_t im2col(const T* x, T* cols, const ConvGeom& g, int64_t n0, int64_t B, cudaStream_t stream) {
  im2col_kernel<<<blocks_for(g.C * g.KH * g.KW * B * g.OH * g.OW), kThreads, 0, stream>>>(x, cols, g, n0, B);
  return cudaGetLastError();
}

template <typename T>
cudaError_t col2im(const T* dcols, T* dx, const ConvGeom& g, int64_t n0, int64_t B, cudaStream_t stream) {
  col2im_kernel<<<blocks_for(B * g.C * g.H * g.W), kThreads, 0, stream>>>(dcols, dx, g, n0, B);
  return cudaGetLastError();
}

template <typename T>
cudaError_t to_channels_first(const T* nchw, T* t, int64_t n0, int64_t B, int64_t OC, int64_t L, cudaStream_t stream) {
  to_channels_first_kernel<<<blocks_for(B * OC * L), kThreads, 0, stream>>>(nchw, t, n0, B, OC, L);
  return cudaGetLastError();
}

template <typename T>
cudaError_t from_channels_first(const T* t, T* nchw, int64_t n0, int64_t B, int64_t OC, int64_t L, cudaStream_t stream) {
  from_channels_first_kernel<<<blocks_for(B * OC * L), kThreads, 0, stream>>>(t, nchw, n0, B, OC, L);
  return cudaGetLastError();
}

template <typename T, typename I>
cudaError_t max_pool_fwd(const T* x, T* y, I* idx, const PoolGeom& g, cudaStream_t stream) {
  max_pool_fwd_kernel<<<blocks_for(g.N * g.C * g.OH * g.OW), kThreads, 0, stream>>>(x, y, idx, g);
  return cudaGetLastError();
}

template <typename T, typename I>
cudaError_t max_pool_bwd_gather(const T* grad, const I* idx, T* dx, const PoolGeom& g, cudaStream_t stream) {
  max_pool_bwd_gather_kernel<<<blocks_for(g.N * g.C * g.H * g.W), kThreads, 0, stream>>>(grad, idx, dx, g);
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
  template cudaError_t im2col<T>(const T*, T*, const ConvGeom&, int64_t, int64_t, cudaStream_t);          \
  template cudaError_t col2im<T>(const T*, T*, const ConvGeom&, int64_t, int64_t, cudaStream_t);          \
  template cudaError_t to_channels_first<T>(const T*, T*, int64_t, int64_t, int64_t, int64_t, cudaStream_t); \
  template cudaError_t from_channels_first<T>(const T*, T*, int64_t, int64_t, int64_t, int64_t, cudaStream_t); \
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
