// LeNet-5's layers on the CPU, forward and backward: conv2d, max_pool2d, linear and relu.
//
// Registered as real operators in the `trainlab` namespace (schemas at the bottom), so autograd,
// FakeTensor and torch.compile treat them like ATen ops. The autograd formulas of conv2d_fwd,
// linear_fwd and relu_fwd are C++ (bottom of this file); max_pool2d_fwd's and the fake (meta)
// implementations are registered from Python in trainlab/ops/layer_args.py.
//
// What is ours and what is ATen's: every byte of data movement is written here — im2col and col2im
// for the convolution, the window argmax and the gradient scatter for max-pooling, the bias
// reductions, ReLU's mask. The matrix products go through ATen's BLAS (at::mm / at::addmm, which
// call MKL on this build): writing a competitive GEMM is a different lesson. The convolution's and
// the linear layer's algorithms (chunking, the bias-as-a-GEMM-row trick) are in layers_algo.h,
// shared with the CUDA build; this file supplies their CPU data movement (CpuBackend).
//
// Precision: float32 and float64 are computed in their own type. bfloat16 and float16 inputs are
// widened to float32 once at the op's entry and the result is rounded once on exit (what ATen's CPU
// kernels do internally), so a reduction of thousands of products never accumulates in 8 bits.
// Max-pooling and ReLU only select or mask values: they run in the input type and are exact.
//
// Parallelism: at::parallel_for over independent units (a (sample, channel) plane for im2col,
// col2im and pooling; an element range for relu), so no two threads ever write the same element
// and every result is independent of the thread count. GEMMs are multi-threaded inside MKL.

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include "layers_algo.h"
#include "layers_shapes.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace trainlab_layers {

using at::vec::Vectorized;

constexpr int64_t kGrain = 32768;            // elements per task, ATen's GRAIN_SIZE
constexpr int64_t kColsBudget = 1 << 18;     // im2col elements per chunk: 1 MiB in float32, half an L2

// ================================================================================================
// conv2d's CPU data movement (the algorithm: layers_algo.h)
// ================================================================================================

// Short rows (LeNet's are 10 to 28 elements) with whole vectors and one masked vector at the end
// (at::vec's loadu/store with a count): a scalar loop or a memcpy/fill call costs more than the data.
template <typename T> inline void copy_row(T* dst, const T* src, int64_t n) {
  using Vec = Vectorized<T>;
  int64_t i = 0;
  for (; i + Vec::size() <= n; i += Vec::size()) Vec::loadu(src + i).store(dst + i);
  if (i < n) Vec::loadu(src + i, n - i).store(dst + i, n - i);
}
template <typename T> inline void zero_row(T* dst, int64_t n) {
  using Vec = Vectorized<T>;
  const Vec zero(T(0));
  int64_t i = 0;
  for (; i + Vec::size() <= n; i += Vec::size()) zero.store(dst + i);
  if (i < n) zero.store(dst + i, n - i);
}
template <typename T> inline void add_row(T* dst, const T* src, int64_t n) {
  using Vec = Vectorized<T>;
  int64_t i = 0;
  for (; i + Vec::size() <= n; i += Vec::size()) (Vec::loadu(dst + i) + Vec::loadu(src + i)).store(dst + i);
  if (i < n) (Vec::loadu(dst + i, n - i) + Vec::loadu(src + i, n - i)).store(dst + i, n - i);
}

// Columns [lo, hi) of an output row read the image (ow + kw - PW inside [0, W)); the rest is padding.
inline std::pair<int64_t, int64_t> valid_cols(const ConvShape& s, int64_t kw) {
  const int64_t lo = std::clamp<int64_t>(s.PW - kw, 0, s.OW);
  return {lo, std::clamp<int64_t>(s.W + s.PW - kw, lo, s.OW)};
}

// The KH·KW rows that channel c of one sample contributes, each an OH·OW segment starting at
// `cols + r·row_stride`: row r = (c·KH + kh)·KW + kw, entry oh·OW + ow = x[c, oh+kh-PH, ow+kw-PW]
// (0 in the padding).
template <typename T>
void im2col_channel(const T* x_c, T* cols, int64_t row_stride, const ConvShape& s, int64_t c) {
  for (int64_t kh = 0; kh < s.KH; ++kh) {
    for (int64_t kw = 0; kw < s.KW; ++kw) {
      T* row = cols + ((c * s.KH + kh) * s.KW + kw) * row_stride;
      const auto [lo, hi] = valid_cols(s, kw);
      for (int64_t oh = 0; oh < s.OH; ++oh) {
        T* dst = row + oh * s.OW;
        const int64_t ih = oh + kh - s.PH;
        if (ih < 0 || ih >= s.H) {
          zero_row(dst, s.OW);
          continue;
        }
        zero_row(dst, lo);
        copy_row(dst + lo, x_c + ih * s.W + lo + kw - s.PW, hi - lo);
        zero_row(dst + hi, s.OW - hi);
      }
    }
  }
}

// cols [rows, B·L] for samples [n0, n0 + B): sample b's columns start at b·L. Rows past C·KH·KW
// (the bias row) are left alone. One task per (sample, channel).
template <typename T>
void im2col_chunk(const T* x, T* cols, const ConvShape& s, int64_t n0, int64_t B) {
  const int64_t L = s.l(), work = s.KH * s.KW * L;
  at::parallel_for(0, B * s.C, std::max<int64_t>(1, kGrain / std::max<int64_t>(1, work)), [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) {
      const int64_t b = u / s.C, c = u % s.C;
      im2col_channel(x + ((n0 + b) * s.C + c) * s.H * s.W, cols + b * L, B * L, s, c);
    }
  });
}

// dx[n0 + b, c] = the KH·KW rows of dcols [C·KH·KW, B·L] that channel c produced, each added back
// where its patch came from. One task per (sample, channel) plane: no atomics, a fixed order.
template <typename T>
void col2im_chunk(const T* dcols, T* dx, const ConvShape& s, int64_t n0, int64_t B) {
  const int64_t L = s.l(), work = s.KH * s.KW * L;
  at::parallel_for(0, B * s.C, std::max<int64_t>(1, kGrain / std::max<int64_t>(1, work)), [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) {
      const int64_t b = u / s.C, c = u % s.C;
      T* plane = dx + ((n0 + b) * s.C + c) * s.H * s.W;
      std::fill(plane, plane + s.H * s.W, T(0));
      for (int64_t kh = 0; kh < s.KH; ++kh) {
        const int64_t oh_lo = std::clamp<int64_t>(s.PH - kh, 0, s.OH);
        const int64_t oh_hi = std::clamp<int64_t>(s.H + s.PH - kh, oh_lo, s.OH);
        for (int64_t kw = 0; kw < s.KW; ++kw) {
          const T* row = dcols + ((c * s.KH + kh) * s.KW + kw) * B * L + b * L;
          const auto [lo, hi] = valid_cols(s, kw);
          for (int64_t oh = oh_lo; oh < oh_hi; ++oh) {
            add_row(plane + (oh + kh - s.PH) * s.W + lo + kw - s.PW, row + oh * s.OW + lo, hi - lo);
          }
        }
      }
    }
  });
}

// [B, OC, L] (samples n0.. of an NCHW tensor) <-> [OC, B·L] (the GEMM's layout).
template <typename T>
void to_channels_first(const T* nchw, T* t, int64_t n0, int64_t B, int64_t OC, int64_t L) {
  at::parallel_for(0, B * OC, std::max<int64_t>(1, kGrain / L), [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) {
      const int64_t b = u / OC, oc = u % OC;
      std::memcpy(t + (oc * B + b) * L, nchw + ((n0 + b) * OC + oc) * L, L * sizeof(T));
    }
  });
}

template <typename T>
void from_channels_first(const T* t, T* nchw, int64_t n0, int64_t B, int64_t OC, int64_t L) {
  at::parallel_for(0, B * OC, std::max<int64_t>(1, kGrain / L), [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) {
      const int64_t b = u / OC, oc = u % OC;
      std::memcpy(nchw + ((n0 + b) * OC + oc) * L, t + (oc * B + b) * L, L * sizeof(T));
    }
  });
}

// ================================================================================================
// max_pool2d: any kernel, stride and padding (padding <= kernel / 2, as ATen requires).
//
// The forward keeps, per output, which element of its window won: a window-local index
// kh·KW + kw in one byte (uint8 when the window has <= 256 elements, else int32) instead of
// ATen's int64 offset into the plane, so the saved indices cost 1/8 of the memory traffic.
// Ties and NaN follow ATen exactly: scan kh then kw, take v when v > best or v is NaN.
// The backward sends each gradient to its window's winner. Windows that do not overlap (stride >=
// kernel, LeNet's 2x2/2) write each input element at most once; overlapping windows add up, in a
// fixed order per plane, in float32 for reduced types.
// ================================================================================================

template <typename scalar_t, typename index_t>
void max_pool_plane(const scalar_t* in, scalar_t* out, index_t* idx, const PoolShape& s) {
  using acc_t = at::opmath_type<scalar_t>;
  if (s.KH == 2 && s.KW == 2 && s.SH == 2 && s.SW == 2 && s.PH == 0 && s.PW == 0) {
    // LeNet's case, unrolled: four candidates, compared in ATen's order.
    for (int64_t oh = 0; oh < s.OH; ++oh) {
      const scalar_t* r0 = in + 2 * oh * s.W;
      const scalar_t* r1 = r0 + s.W;
      for (int64_t ow = 0; ow < s.OW; ++ow) {
        const acc_t v[4] = {acc_t(r0[2 * ow]), acc_t(r0[2 * ow + 1]), acc_t(r1[2 * ow]), acc_t(r1[2 * ow + 1])};
        acc_t best = v[0];
        int k = 0;
        for (int j = 1; j < 4; ++j) {
          const bool take = v[j] > best || std::isnan(v[j]);
          best = take ? v[j] : best;
          k = take ? j : k;
        }
        out[oh * s.OW + ow] = static_cast<scalar_t>(best);
        idx[oh * s.OW + ow] = static_cast<index_t>(k);
      }
    }
    return;
  }
  for (int64_t oh = 0; oh < s.OH; ++oh) {
    const int64_t h0 = oh * s.SH - s.PH;
    const int64_t ih_lo = std::max<int64_t>(h0, 0), ih_hi = std::min<int64_t>(h0 + s.KH, s.H);
    for (int64_t ow = 0; ow < s.OW; ++ow) {
      const int64_t w0 = ow * s.SW - s.PW;
      const int64_t iw_lo = std::max<int64_t>(w0, 0), iw_hi = std::min<int64_t>(w0 + s.KW, s.W);
      acc_t best = -std::numeric_limits<acc_t>::infinity();
      int64_t k = (ih_lo - h0) * s.KW + (iw_lo - w0);   // ATen's default: the first element inside the image
      for (int64_t ih = ih_lo; ih < ih_hi; ++ih) {
        for (int64_t iw = iw_lo; iw < iw_hi; ++iw) {
          const acc_t v = acc_t(in[ih * s.W + iw]);
          if (v > best || std::isnan(v)) {
            best = v;
            k = (ih - h0) * s.KW + (iw - w0);
          }
        }
      }
      out[oh * s.OW + ow] = static_cast<scalar_t>(best);
      idx[oh * s.OW + ow] = static_cast<index_t>(k);
    }
  }
}

std::tuple<at::Tensor, at::Tensor> max_pool2d_fwd_cpu(const at::Tensor& x, at::IntArrayRef kernel,
                                                      at::IntArrayRef stride, at::IntArrayRef padding) {
  const PoolShape s = pool_fwd_shape("max_pool2d_fwd", x, kernel, stride, padding);
  const at::Tensor xc = x.contiguous();
  at::Tensor out = at::empty({s.N, s.C, s.OH, s.OW}, xc.options());
  at::Tensor idx = at::empty({s.N, s.C, s.OH, s.OW}, xc.options().dtype(pool_index_type(s)));
  const int64_t planes = s.N * s.C, in_plane = s.H * s.W, out_plane = s.OH * s.OW;
  const int64_t grain = std::max<int64_t>(1, kGrain / std::max<int64_t>(1, in_plane));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, xc.scalar_type(), "trainlab_max_pool2d_fwd", [&] {
    const scalar_t* in = xc.const_data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    auto run = [&](auto* ix) {
      at::parallel_for(0, planes, grain, [&](int64_t begin, int64_t end) {
        for (int64_t p = begin; p < end; ++p) max_pool_plane(in + p * in_plane, o + p * out_plane, ix + p * out_plane, s);
      });
    };
    if (idx.scalar_type() == at::kByte) run(idx.data_ptr<uint8_t>());
    else run(idx.data_ptr<int32_t>());
  });
  return {out, idx};
}

template <typename scalar_t, typename index_t>
void max_pool_backward_plane(const scalar_t* g, const index_t* idx, scalar_t* dx, float* scratch, const PoolShape& s) {
  const int64_t in_plane = s.H * s.W;
  auto target = [&](int64_t oh, int64_t ow) {
    const int64_t k = static_cast<int64_t>(idx[oh * s.OW + ow]);
    return (oh * s.SH - s.PH + k / s.KW) * s.W + (ow * s.SW - s.PW + k % s.KW);
  };
  if (!s.overlapping()) {   // each input element receives at most one gradient: no sums, exact in any type
    std::fill(dx, dx + in_plane, scalar_t(0));
    for (int64_t oh = 0; oh < s.OH; ++oh)
      for (int64_t ow = 0; ow < s.OW; ++ow) dx[target(oh, ow)] = g[oh * s.OW + ow];
    return;
  }
  using acc_t = at::opmath_type<scalar_t>;
  if constexpr (std::is_same_v<acc_t, scalar_t>) {
    std::fill(dx, dx + in_plane, scalar_t(0));
    for (int64_t oh = 0; oh < s.OH; ++oh)
      for (int64_t ow = 0; ow < s.OW; ++ow) dx[target(oh, ow)] += g[oh * s.OW + ow];
  } else {   // bf16/half: sum in float32, round once
    std::fill(scratch, scratch + in_plane, 0.f);
    for (int64_t oh = 0; oh < s.OH; ++oh)
      for (int64_t ow = 0; ow < s.OW; ++ow) scratch[target(oh, ow)] += static_cast<float>(g[oh * s.OW + ow]);
    for (int64_t i = 0; i < in_plane; ++i) dx[i] = static_cast<scalar_t>(scratch[i]);
  }
}

at::Tensor max_pool2d_bwd_cpu(const at::Tensor& grad, const at::Tensor& indices, at::IntArrayRef input_hw,
                              at::IntArrayRef kernel, at::IntArrayRef stride, at::IntArrayRef padding) {
  const PoolShape s = pool_bwd_shape("max_pool2d_bwd", grad, indices, input_hw, kernel, stride, padding);
  const at::Tensor gc = grad.contiguous(), ic = indices.contiguous();
  at::Tensor dx = at::empty({s.N, s.C, s.H, s.W}, gc.options());
  const int64_t planes = s.N * s.C, in_plane = s.H * s.W, out_plane = s.OH * s.OW;
  const int64_t grain = std::max<int64_t>(1, kGrain / std::max<int64_t>(1, in_plane));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, gc.scalar_type(), "trainlab_max_pool2d_bwd", [&] {
    const scalar_t* g = gc.const_data_ptr<scalar_t>();
    scalar_t* d = dx.data_ptr<scalar_t>();
    auto run = [&](const auto* ix) {
      at::parallel_for(0, planes, grain, [&](int64_t begin, int64_t end) {
        std::vector<float> scratch(s.overlapping() ? in_plane : 0);
        for (int64_t p = begin; p < end; ++p)
          max_pool_backward_plane(g + p * out_plane, ix + p * out_plane, d + p * in_plane, scratch.data(), s);
      });
    };
    if (ic.scalar_type() == at::kByte) run(ic.const_data_ptr<uint8_t>());
    else run(ic.const_data_ptr<int32_t>());
  });
  return dx;
}

// ================================================================================================
// linear's bias gradient (the GEMMs: layers_algo.h)
// ================================================================================================

// db[j] = sum_i g[i, j]: rows added one at a time into a vector accumulator (fixed order).
template <typename T>
void column_sums(const T* g, T* out, int64_t rows, int64_t cols) {
  using Vec = Vectorized<T>;
  int64_t j = 0;
  for (; j + Vec::size() <= cols; j += Vec::size()) {
    Vec acc(T(0));
    for (int64_t i = 0; i < rows; ++i) acc = acc + Vec::loadu(g + i * cols + j);
    acc.store(out + j);
  }
  for (; j < cols; ++j) {
    T acc = 0;
    for (int64_t i = 0; i < rows; ++i) acc += g[i * cols + j];
    out[j] = acc;
  }
}

// The CPU data movement of the shared algorithms (layers_algo.h).
struct CpuBackend {
  static constexpr int64_t kColsBudget = trainlab_layers::kColsBudget;
  template <typename T> static void im2col(const T* x, T* cols, const ConvShape& s, int64_t n0, int64_t B) {
    im2col_chunk(x, cols, s, n0, B);
  }
  template <typename T> static void col2im(const T* dcols, T* dx, const ConvShape& s, int64_t n0, int64_t B) {
    col2im_chunk(dcols, dx, s, n0, B);
  }
  template <typename T>
  static void to_channels_first(const T* nchw, T* t, int64_t n0, int64_t B, int64_t OC, int64_t L) {
    trainlab_layers::to_channels_first(nchw, t, n0, B, OC, L);
  }
  template <typename T>
  static void from_channels_first(const T* t, T* nchw, int64_t n0, int64_t B, int64_t OC, int64_t L) {
    trainlab_layers::from_channels_first(t, nchw, n0, B, OC, L);
  }
  template <typename T> static void column_sums(const T* g, T* out, int64_t rows, int64_t cols) {
    trainlab_layers::column_sums(g, out, rows, cols);
  }
};

// ================================================================================================
// relu: y = max(x, 0) with NaN kept; dx = dy where y > 0 (and where y is NaN), else 0 — exactly
// ATen's relu / threshold_backward(dy, y, 0). The backward reads y, not x, as ATen's does.
// ================================================================================================

// Compared in the opmath type (float for bf16/half, the type itself otherwise): a double like 1e-300
// must not be rounded to a float 0 before the test.
template <typename T> inline T relu_scalar(T v) {
  const at::opmath_type<T> a = v;
  return (std::isnan(a) || a > 0) ? v : T(0);
}
template <typename T> inline T relu_grad_scalar(T g, T y) {
  return static_cast<at::opmath_type<T>>(y) <= 0 ? T(0) : g;
}

at::Tensor relu_fwd_cpu(const at::Tensor& x) {
  check_float("relu_fwd", "x", x);
  const at::Tensor xc = x.contiguous();
  at::Tensor out = at::empty_like(xc);
  const int64_t n = xc.numel();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, xc.scalar_type(), "trainlab_relu_fwd", [&] {
    const scalar_t* in = xc.const_data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
      int64_t i = begin;
      if constexpr (std::is_same_v<scalar_t, float> || std::is_same_v<scalar_t, double>) {
        using Vec = Vectorized<scalar_t>;
        const Vec zero(scalar_t(0));
        for (; i + Vec::size() <= end; i += Vec::size())
          at::vec::maximum(Vec::loadu(in + i), zero).store(o + i);   // maximum() propagates NaN
      }
      for (; i < end; ++i) o[i] = relu_scalar(in[i]);
    });
  });
  return out;
}

at::Tensor relu_bwd_cpu(const at::Tensor& grad, const at::Tensor& out) {
  check_relu_bwd(grad, out);
  const at::Tensor gc = grad.contiguous(), oc = out.contiguous();
  at::Tensor dx = at::empty_like(gc);
  const int64_t n = gc.numel();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, gc.scalar_type(), "trainlab_relu_bwd", [&] {
    const scalar_t* g = gc.const_data_ptr<scalar_t>();
    const scalar_t* y = oc.const_data_ptr<scalar_t>();
    scalar_t* d = dx.data_ptr<scalar_t>();
    at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
      int64_t i = begin;
      if constexpr (std::is_same_v<scalar_t, float> || std::is_same_v<scalar_t, double>) {
        using Vec = Vectorized<scalar_t>;
        const Vec zero(scalar_t(0));
        for (; i + Vec::size() <= end; i += Vec::size()) {
          const Vec yv = Vec::loadu(y + i);
          Vec::blendv(Vec::loadu(g + i), zero, yv <= zero).store(d + i);   // NaN <= 0 is false: grad passes
        }
      }
      for (; i < end; ++i) d[i] = relu_grad_scalar(g[i], y[i]);
    });
  });
  return dx;
}

}  // namespace trainlab_layers

// FRAGMENT: the `trainlab` namespace is shared with the GELU extension (a separate library).
TORCH_LIBRARY_FRAGMENT(trainlab, m) {
  m.def("conv2d_fwd(Tensor x, Tensor weight, Tensor? bias, int[2] padding) -> Tensor");
  m.def("conv2d_bwd_input(Tensor grad, Tensor weight, int[2] padding) -> Tensor");
  m.def("conv2d_bwd_weight(Tensor grad, Tensor x, Tensor weight, int[2] padding, bool bias) -> (Tensor, Tensor)");
  m.def("max_pool2d_fwd(Tensor x, int[2] kernel, int[2] stride, int[2] padding) -> (Tensor, Tensor)");
  m.def("max_pool2d_bwd(Tensor grad, Tensor indices, SymInt[2] input_hw, int[2] kernel, int[2] stride, "
        "int[2] padding) -> Tensor");
  m.def("linear_fwd(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
  m.def("linear_bwd(Tensor grad, Tensor x, Tensor weight, bool bias) -> (Tensor, Tensor, Tensor)");
  m.def("relu_fwd(Tensor x) -> Tensor");
  m.def("relu_bwd(Tensor grad, Tensor out) -> Tensor");
}

TORCH_LIBRARY_IMPL(trainlab, CPU, m) {
  using trainlab_layers::CpuBackend;
  m.impl("conv2d_fwd", &trainlab_layers::conv2d_forward<CpuBackend>);
  m.impl("conv2d_bwd_input", &trainlab_layers::conv2d_backward_input<CpuBackend>);
  m.impl("conv2d_bwd_weight", &trainlab_layers::conv2d_backward_weight<CpuBackend>);
  m.impl("max_pool2d_fwd", &trainlab_layers::max_pool2d_fwd_cpu);
  m.impl("max_pool2d_bwd", &trainlab_layers::max_pool2d_bwd_cpu);
  m.impl("linear_fwd", &trainlab_layers::linear_forward<CpuBackend>);
  m.impl("linear_bwd", &trainlab_layers::linear_backward<CpuBackend>);
  m.impl("relu_fwd", &trainlab_layers::relu_fwd_cpu);
  m.impl("relu_bwd", &trainlab_layers::relu_bwd_cpu);
}

// ---- autograd of conv2d_fwd, linear_fwd and relu_fwd, in C++ ------------------------------------
//
// Registered at the Autograd key (every device: these formulas serve the cpp and cuda rungs) rather
// than with torch.library.register_autograd in Python. The Python formula cost every layer call a
// trip through the interpreter forward and backward — on the H100 host, ~0.09 ms per ReLU forward
// at LeNet's sizes, where ATen's whole call takes 0.07 ms — and, on a GPU, a GIL handoff to
// autograd's device thread in the backward. The formulas are the ones trainlab/ops/layer_args.py
// states (and keeps for max_pool2d_fwd, whose backward takes the SymInt input size, and for the
// Triton family); each backward calls the backward ops through the dispatcher.
namespace trainlab_layers {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

template <typename Sig> c10::TypedOperatorHandle<Sig> op_handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

class Conv2dFunction : public torch::autograd::Function<Conv2dFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias, std::vector<int64_t> padding) {
    ctx->save_for_backward({x, weight});
    ctx->saved_data["padding"] = padding;
    ctx->saved_data["has_bias"] = bias.has_value() && bias->defined();
    at::AutoDispatchBelowADInplaceOrView below;
    static auto op = op_handle<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                          at::IntArrayRef)>("trainlab::conv2d_fwd");
    return op.call(x, weight, bias, padding);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const std::vector<int64_t> padding = ctx->saved_data["padding"].toIntVector();
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    at::Tensor dx, dw, db;
    if (!grads[0].defined()) return {dx, dw, db, at::Tensor()};
    if (ctx->needs_input_grad(0)) {
      static auto op = op_handle<at::Tensor(const at::Tensor&, const at::Tensor&, at::IntArrayRef)>(
          "trainlab::conv2d_bwd_input");
      dx = op.call(grads[0], saved[1], padding);
    }
    const bool need_b = has_bias && ctx->needs_input_grad(2);
    if (ctx->needs_input_grad(1) || need_b) {
      static auto op = op_handle<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                                    const at::Tensor&, at::IntArrayRef, bool)>(
          "trainlab::conv2d_bwd_weight");
      auto [w_grad, b_grad] = op.call(grads[0], saved[0], saved[1], padding, has_bias);
      if (ctx->needs_input_grad(1)) dw = w_grad;
      if (need_b) db = b_grad;
    }
    return {dx, dw, db, at::Tensor()};
  }
};

class LinearFunction : public torch::autograd::Function<LinearFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias) {
    ctx->save_for_backward({x, weight});
    ctx->saved_data["has_bias"] = bias.has_value() && bias->defined();
    at::AutoDispatchBelowADInplaceOrView below;
    static auto op = op_handle<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&)>(
        "trainlab::linear_fwd");
    return op.call(x, weight, bias);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    static auto op = op_handle<std::tuple<at::Tensor, at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                                              const at::Tensor&, bool)>(
        "trainlab::linear_bwd");
    auto [dx, dw, db] = op.call(grads[0], saved[0], saved[1], has_bias);
    return {ctx->needs_input_grad(0) ? dx : at::Tensor(), ctx->needs_input_grad(1) ? dw : at::Tensor(),
            has_bias && ctx->needs_input_grad(2) ? db : at::Tensor()};
  }
};

class ReluFunction : public torch::autograd::Function<ReluFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x) {
    at::Tensor out;
    {
      at::AutoDispatchBelowADInplaceOrView below;
      static auto op = op_handle<at::Tensor(const at::Tensor&)>("trainlab::relu_fwd");
      out = op.call(x);
    }
    ctx->save_for_backward({out});   // the output, as ATen's threshold_backward: the mask is y > 0
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return {at::Tensor()};
    static auto op = op_handle<at::Tensor(const at::Tensor&, const at::Tensor&)>("trainlab::relu_bwd");
    return {op.call(grads[0], ctx->get_saved_variables()[0])};
  }
};

at::Tensor conv2d_fwd_autograd(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                               at::IntArrayRef padding) {
  return Conv2dFunction::apply(x, weight, bias, padding.vec());
}
at::Tensor linear_fwd_autograd(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  return LinearFunction::apply(x, weight, bias);
}
at::Tensor relu_fwd_autograd(const at::Tensor& x) { return ReluFunction::apply(x); }

}  // namespace
}  // namespace trainlab_layers

TORCH_LIBRARY_IMPL(trainlab, Autograd, m) {
  m.impl("conv2d_fwd", &trainlab_layers::conv2d_fwd_autograd);
  m.impl("linear_fwd", &trainlab_layers::linear_fwd_autograd);
  m.impl("relu_fwd", &trainlab_layers::relu_fwd_autograd);
}
