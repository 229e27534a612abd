// Host launchers of the CUDA layer kernels (layers_cuda.cu). CUDA-only: no ATen, no c10 — the .cu
// compiles with nvcc alone (tests compile it for sm_80 and sm_90 on a machine without a GPU), and
// layers_cuda_glue.cpp turns tensors into these raw pointers and shapes.
//
// Every launcher enqueues on `stream` and returns cudaGetLastError() of the launch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace trainlab_layers_cuda {

struct ConvGeom {
  int64_t N, C, H, W, OC, KH, KW, PH, PW, OH, OW;
};

struct PoolGeom {
  int64_t N, C, H, W, KH, KW, SH, SW, PH, PW, OH, OW;
};

// conv2d on chunks of B samples starting at n0, in the CPU kernels' layout: cols [rows, B·OH·OW]
// (row r = (c·KH + p)·KW + q, column b·OH·OW + l), so each chunk is one cuBLAS GEMM.
template <typename T>
cudaError_t im2col(const T* x, T* cols, const ConvGeom& g, int64_t n0, int64_t B, cudaStream_t stream);
template <typename T>   // dx[n0 + b] = col2im(dcols): a gather, one thread per dx element
cudaError_t col2im(const T* dcols, T* dx, const ConvGeom& g, int64_t n0, int64_t B, cudaStream_t stream);
template <typename T>   // [B, OC, L] (samples n0.. of an NCHW tensor) -> [OC, B·L]
cudaError_t to_channels_first(const T* nchw, T* t, int64_t n0, int64_t B, int64_t OC, int64_t L, cudaStream_t stream);
template <typename T>   // [OC, B·L] -> [B, OC, L]
cudaError_t from_channels_first(const T* t, T* nchw, int64_t n0, int64_t B, int64_t OC, int64_t L, cudaStream_t stream);

// max_pool2d with window-local argmax indices (I = uint8_t or int32_t).
template <typename T, typename I>
cudaError_t max_pool_fwd(const T* x, T* y, I* idx, const PoolGeom& g, cudaStream_t stream);
template <typename T, typename I>   // version 2: gather, one thread per input element, no atomics
cudaError_t max_pool_bwd_gather(const T* grad, const I* idx, T* dx, const PoolGeom& g, cudaStream_t stream);
template <typename T, typename I>   // version 1: scatter, one thread per output, atomicAdd (dx zeroed first)
cudaError_t max_pool_bwd_atomic(const T* grad, const I* idx, T* dx, const PoolGeom& g, cudaStream_t stream);

// out[j] = sum_i g[i, j] for a row-major [rows, cols] matrix (the linear layer's bias gradient).
template <typename T>
cudaError_t column_sums(const T* g, T* out, int64_t rows, int64_t cols, cudaStream_t stream);

template <typename T>
cudaError_t relu_fwd(const T* x, T* y, int64_t n, cudaStream_t stream);
template <typename T>
cudaError_t relu_bwd(const T* grad, const T* y, T* dx, int64_t n, cudaStream_t stream);

}  // namespace trainlab_layers_cuda
