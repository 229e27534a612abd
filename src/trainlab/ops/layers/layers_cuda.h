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

// conv2d, stride 1, zero padding, direct (no im2col matrix): g is [N, C, H, W] x [OC, C, KH, KW] ->
// [N, OC, OH, OW], all tensors contiguous. `packed` is scratch of conv_packed_elems(g) elements
// (the weights re-laid out per output-channel tile, written by the call itself).
int64_t conv_packed_elems(const ConvGeom& g);
template <typename T>   // y = conv(x, w) + bias (bias may be null)
cudaError_t conv_forward(const T* x, const T* w, const T* bias, T* y, T* packed, const ConvGeom& g, cudaStream_t stream);
template <typename T>   // dx from dy: the forward kernel on dy with w flipped and transposed
cudaError_t conv_backward_input(const T* dy, const T* w, T* dx, T* packed, const ConvGeom& g, cudaStream_t stream);
// acc = [OC, C·KH·KW (+1 with bias)]: dW and db, summed deterministically over positions: per-slice
// partials ([slices, OC, C·KH·KW (+1)] scratch) then their column sums in slice order.
int64_t conv_wgrad_slices(const ConvGeom& g);
template <typename T>
cudaError_t conv_backward_weight(const T* dy, const T* x, T* partial, T* acc, const ConvGeom& g, bool bias,
                                 int64_t slices, cudaStream_t stream);

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
