// A CPU stand-in for the parts of CUDA our kernel files use, so that the kernels themselves — their
// index math, shared-memory staging, barriers and launch geometry — run on a machine without a GPU
// (tests/cuda_emu.py compiles a kernel file against it with g++ and calls it through ctypes).
//
// Execution model: a launch runs its blocks one after another, on one OS thread; a block's threads
// are fibers (ucontext, each with its own stack) run in turn, and __syncthreads() parks a fiber until
// every live fiber of the block has reached it — CUDA's barrier, without a spinning OS thread per
// CUDA thread. __shared__ variables become function-local statics, shared by the fibers of the
// running block (blocks never overlap); dynamic shared memory is one buffer, filled with garbage at
// each block start. Math is the host libm (erff, expf, …), not libdevice: results agree to within a
// few ulps, not bit for bit.
#pragma once

#include <math.h>

#include <algorithm>
#include <ucontext.h>

#include <functional>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static

struct dim3 {
  unsigned x, y, z;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
inline dim3 threadIdx{0, 0, 0}, blockIdx{0, 0, 0}, blockDim, gridDim;

// ---- fibers: the threads of one block ----------------------------------------------------------------
enum EmuState { kRunnable, kAtBarrier, kDone };
inline ucontext_t emu_scheduler;
inline std::vector<ucontext_t> emu_fibers;
inline std::vector<EmuState> emu_states;
inline std::vector<char> emu_stacks;
inline std::function<void()> emu_body;
inline unsigned emu_current = 0;
constexpr size_t kEmuStack = 64 * 1024;

inline void __syncthreads() {
  emu_states[emu_current] = kAtBarrier;
  swapcontext(&emu_fibers[emu_current], &emu_scheduler);
}
inline void emu_fiber_entry() {
  emu_body();
  emu_states[emu_current] = kDone;   // uc_link returns to the scheduler
}

alignas(16) inline unsigned char emu_dynamic_smem[1 << 16];
inline unsigned char* emu_smem() { return emu_dynamic_smem; }

using cudaStream_t = void*;
enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorInvalidConfiguration = 9 };
inline cudaError_t emu_last_error = cudaSuccess;
inline cudaError_t cudaGetLastError() {
  const cudaError_t e = emu_last_error;
  emu_last_error = cudaSuccess;
  return e;
}

struct alignas(16) float4 { float x, y, z, w; };
struct alignas(16) double2 { double x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
template <typename T> inline T __ldg(const T* p) { return *p; }

template <typename T> inline T min(T a, T b) { return b < a ? b : a; }
template <typename T> inline T max(T a, T b) { return a < b ? b : a; }

template <typename T> inline T atomicAdd(T* p, T v) {   // fibers never interleave inside it
  const T old = *p;
  *p = old + v;
  return old;
}

// bfloat16 / half as their bits; conversions round to nearest even like the CUDA intrinsics.
struct __nv_bfloat16 { uint16_t bits; };
struct __half { uint16_t bits; };
inline float __bfloat162float(__nv_bfloat16 v) {
  const uint32_t u = uint32_t(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return {uint16_t((u >> 16) | 0x40)};
  u += 0x7FFF + ((u >> 16) & 1);
  return {uint16_t(u >> 16)};
}
inline float __half2float(__half v) {
  _Float16 h;
  std::memcpy(&h, &v.bits, 2);
  return float(h);
}
inline __half __float2half_rn(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  __half out;
  std::memcpy(&out.bits, &h, 2);
  return out;
}

struct EmuConfig {
  dim3 grid, block;
  size_t smem;
};
inline EmuConfig emu_cfg(dim3 grid, dim3 block, size_t smem = 0, cudaStream_t = nullptr) { return {grid, block, smem}; }

template <typename Kernel, typename... Args>
void emu_launch(EmuConfig cfg, Kernel kernel, Args... args) {
  const unsigned threads = cfg.block.x * cfg.block.y * cfg.block.z;
  if (threads == 0 || threads > 1024 || cfg.smem > sizeof(emu_dynamic_smem) || cfg.grid.x == 0) {
    emu_last_error = cudaErrorInvalidConfiguration;
    return;
  }
  blockDim = cfg.block;
  gridDim = cfg.grid;
  emu_body = [&] { kernel(args...); };
  emu_fibers.resize(threads);
  emu_states.resize(threads);
  emu_stacks.resize(threads * kEmuStack);
  for (unsigned bz = 0; bz < cfg.grid.z; ++bz)
    for (unsigned by = 0; by < cfg.grid.y; ++by)
      for (unsigned bx = 0; bx < cfg.grid.x; ++bx) {
        blockIdx = dim3(bx, by, bz);
        std::memset(emu_dynamic_smem, 0xA5, cfg.smem);   // garbage, as on a GPU
        for (unsigned t = 0; t < threads; ++t) {
          getcontext(&emu_fibers[t]);
          emu_fibers[t].uc_stack.ss_sp = emu_stacks.data() + t * kEmuStack;
          emu_fibers[t].uc_stack.ss_size = kEmuStack;
          emu_fibers[t].uc_link = &emu_scheduler;
          makecontext(&emu_fibers[t], emu_fiber_entry, 0);
          emu_states[t] = kRunnable;
        }
        for (;;) {   // run every runnable fiber to its next barrier (or its end), then release the barrier
          for (unsigned t = 0; t < threads; ++t) {
            if (emu_states[t] != kRunnable) continue;
            emu_current = t;
            threadIdx = dim3(t % cfg.block.x, (t / cfg.block.x) % cfg.block.y, t / (cfg.block.x * cfg.block.y));
            swapcontext(&emu_scheduler, &emu_fibers[t]);
          }
          bool waiting = false;
          for (unsigned t = 0; t < threads; ++t) {
            if (emu_states[t] == kAtBarrier) {
              emu_states[t] = kRunnable;
              waiting = true;
            }
          }
          if (!waiting) break;
        }
      }
}
