// Host entry points of the CUDA GELU kernels (gelu_cuda_kernels.cu). CUDA runtime types only: no
// ATen, no c10, so the kernel file compiles with plain `nvcc` anywhere (the test suite does so for
// sm_80 and sm_90) and the ATen glue (gelu_cuda.cpp) is the only file that knows about tensors.
//
// Every launcher walks `n` elements of dense storage with PyTorch's element-wise geometry (128
// threads x 8 elements per block, a one-shot grid of ceil(n / 1024) blocks), takes 16-byte vector
// accesses when all its pointers are 16-byte aligned (the last partial block and misaligned
// pointers go through a bounds-checked scalar kernel), launches on `stream` and returns
// cudaGetLastError().
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace trainlab_gelu_cuda {

enum class Dtype : int { Float32, Float64, BFloat16, Float16 };

// GELU's forms: exact x Phi(x) ("none"), the tanh approximation ("tanh"), x sigmoid(1.702 x) ("sigmoid").
enum class Approx : int { None, Tanh, Sigmoid };

// y = GELU(x)
cudaError_t launch_forward(Dtype dtype, Approx approx, const void* x, void* y, int64_t n, cudaStream_t stream);
// dx = g * GELU'(x): one fused pass (reads g and x, writes dx)
cudaError_t launch_backward(Dtype dtype, Approx approx, const void* g, const void* x, void* dx, int64_t n,
                            cudaStream_t stream);
// out = gg * g * GELU''(x): the x-gradient of the backward (double backward)
cudaError_t launch_double_backward(Dtype dtype, Approx approx, const void* gg, const void* g, const void* x, void* out,
                                   int64_t n, cudaStream_t stream);

}  // namespace trainlab_gelu_cuda
