// Host entry points of the CUDA GELU kernels (gelu_cuda_kernels.cu). CUDA runtime types only: no
// ATen, no c10, so the kernel file compiles with plain `nvcc` anywhere (the test suite does so for
// sm_80 and sm_90) and the ATen glue (gelu_cuda.cpp) is the only file that knows about tensors.
//
// Every launcher walks `n` elements of dense storage, takes 16-byte vector steps when all its
// pointers are 16-byte aligned and a scalar grid-stride loop for the rest, launches on `stream`
// with a grid of at most 8 blocks per SM, and returns cudaGetLastError().
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace trainlab_gelu_cuda {

enum class Dtype : int { Float32, Float64, BFloat16, Float16 };

// y = GELU(x)
cudaError_t launch_forward(Dtype dtype, bool tanh_approx, const void* x, void* y, int64_t n, int sm_count,
                           cudaStream_t stream);
// dx = g * GELU'(x)
cudaError_t launch_backward(Dtype dtype, bool tanh_approx, const void* g, const void* x, void* dx, int64_t n,
                            int sm_count, cudaStream_t stream);
// out = gg * g * GELU''(x): the x-gradient of the backward (double backward)
cudaError_t launch_double_backward(Dtype dtype, bool tanh_approx, const void* gg, const void* g, const void* x,
                                   void* out, int64_t n, int sm_count, cudaStream_t stream);

}  // namespace trainlab_gelu_cuda
