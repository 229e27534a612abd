// Shapes and argument checks of the trainlab layer ops, shared by the CPU kernels (layers_cpu.cpp)
// and the CUDA glue (layers_cuda_glue.cpp), so both devices reject the same inputs with the same
// message. The Python entry points (trainlab/ops/layer_args.py) check first with friendlier
// messages; these guard direct torch.ops.trainlab.* calls.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <optional>

namespace trainlab_layers {

inline void check_float(const char* op, const char* what, const at::Tensor& t) {
  const auto s = t.scalar_type();
  TORCH_CHECK(s == at::kFloat || s == at::kDouble || s == at::kBFloat16 || s == at::kHalf, "trainlab::", op, ": ",
              what, " must be float32, float64, bfloat16 or float16, got ", s);
}

inline void check_like(const char* op, const char* what, const at::Tensor& t, const at::Tensor& ref) {
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), "trainlab::", op, ": ", what, " dtype ", t.scalar_type(),
              " differs from the input's ", ref.scalar_type());
  TORCH_CHECK(t.device() == ref.device(), "trainlab::", op, ": ", what, " is on ", t.device(), ", the input on ",
              ref.device());
}

inline void check_pair(const char* op, const char* what, at::IntArrayRef v, int64_t min) {
  TORCH_CHECK(v.size() == 2 && v[0] >= min && v[1] >= min, "trainlab::", op, ": ", what, " must be two integers >= ",
              min, ", got ", v);
}

// float32 for bfloat16/float16 (products and sums are never accumulated in 8 or 11 bits).
inline at::ScalarType opmath_type(at::ScalarType t) {
  return (t == at::kBFloat16 || t == at::kHalf) ? at::kFloat : t;
}

// The tensor in its compute type, contiguous (no copy when it already is both).
inline at::Tensor opmath_contiguous(const at::Tensor& t) {
  return t.to(opmath_type(t.scalar_type())).contiguous();
}

// Samples per chunk so that one chunk's im2col matrix holds at most `budget` elements.
inline int64_t chunk_samples(int64_t per_sample, int64_t n, int64_t budget) {
  return std::max<int64_t>(1, std::min<int64_t>(n, budget / std::max<int64_t>(1, per_sample)));
}

// ---- conv2d (stride 1, zero padding) --------------------------------------------------------------

struct ConvShape {
  int64_t N, C, H, W, OC, KH, KW, PH, PW, OH, OW;
  int64_t ckk() const { return C * KH * KW; }
  int64_t l() const { return OH * OW; }
};

inline ConvShape conv_shape(const char* op, const at::Tensor& x, const at::Tensor& weight, at::IntArrayRef padding) {
  check_float(op, "x", x);
  check_like(op, "weight", weight, x);
  check_pair(op, "padding", padding, 0);
  TORCH_CHECK(x.dim() == 4, "trainlab::", op, ": x must be 4-D [N, C, H, W], got ", x.dim(), "-D");
  TORCH_CHECK(weight.dim() == 4, "trainlab::", op, ": weight must be 4-D [OC, C, KH, KW], got ", weight.dim(), "-D");
  ConvShape s{x.size(0), x.size(1), x.size(2), x.size(3), weight.size(0), weight.size(2), weight.size(3),
              padding[0], padding[1], 0, 0};
  TORCH_CHECK(weight.size(1) == s.C, "trainlab::", op, ": x has ", s.C, " channels, weight expects ", weight.size(1));
  s.OH = s.H + 2 * s.PH - s.KH + 1;
  s.OW = s.W + 2 * s.PW - s.KW + 1;
  TORCH_CHECK(s.OH >= 1 && s.OW >= 1, "trainlab::", op, ": kernel ", s.KH, "x", s.KW, " is larger than the padded input ",
              s.H + 2 * s.PH, "x", s.W + 2 * s.PW);
  return s;
}

inline void check_conv_bias(const char* op, const std::optional<at::Tensor>& bias, const at::Tensor& x,
                            const ConvShape& s) {
  if (!bias.has_value() || !bias->defined()) return;
  check_like(op, "bias", *bias, x);
  TORCH_CHECK(bias->dim() == 1 && bias->size(0) == s.OC, "trainlab::", op, ": bias must be [", s.OC, "], got ",
              bias->sizes());
}

// The backward-input shape: stride 1 implies the input size, H = OH - 2·PH + KH - 1.
inline ConvShape conv_shape_from_grad(const char* op, const at::Tensor& grad, const at::Tensor& weight,
                                      at::IntArrayRef padding) {
  check_float(op, "grad", grad);
  check_like(op, "weight", weight, grad);
  check_pair(op, "padding", padding, 0);
  TORCH_CHECK(grad.dim() == 4 && weight.dim() == 4 && grad.size(1) == weight.size(0), "trainlab::", op,
              ": grad [N, OC, OH, OW] and weight [OC, C, KH, KW] do not match: ", grad.sizes(), " vs ", weight.sizes());
  ConvShape s{grad.size(0), weight.size(1), 0, 0, weight.size(0), weight.size(2), weight.size(3), padding[0], padding[1],
              grad.size(2), grad.size(3)};
  s.H = s.OH - 2 * s.PH + s.KH - 1;
  s.W = s.OW - 2 * s.PW + s.KW - 1;
  TORCH_CHECK(s.H >= 1 && s.W >= 1, "trainlab::", op, ": no input size gives output ", s.OH, "x", s.OW,
              " with this kernel and padding");
  return s;
}

inline void check_conv_grad(const char* op, const at::Tensor& grad, const at::Tensor& x, const ConvShape& s) {
  check_like(op, "grad", grad, x);
  TORCH_CHECK(grad.dim() == 4 && grad.size(0) == s.N && grad.size(1) == s.OC && grad.size(2) == s.OH &&
                  grad.size(3) == s.OW,
              "trainlab::", op, ": grad must be [", s.N, ", ", s.OC, ", ", s.OH, ", ", s.OW, "], got ", grad.sizes());
}

// ---- max_pool2d ------------------------------------------------------------------------------------

struct PoolShape {
  int64_t N, C, H, W, KH, KW, SH, SW, PH, PW, OH, OW;
  bool overlapping() const { return SH < KH || SW < KW; }
};

inline PoolShape pool_shape(const char* op, int64_t N, int64_t C, int64_t H, int64_t W, at::IntArrayRef kernel,
                            at::IntArrayRef stride, at::IntArrayRef padding) {
  check_pair(op, "kernel", kernel, 1);
  check_pair(op, "stride", stride, 1);
  check_pair(op, "padding", padding, 0);
  PoolShape s{N, C, H, W, kernel[0], kernel[1], stride[0], stride[1], padding[0], padding[1], 0, 0};
  TORCH_CHECK(2 * s.PH <= s.KH && 2 * s.PW <= s.KW, "trainlab::", op, ": padding ", padding,
              " must be at most half the kernel ", kernel);
  TORCH_CHECK(s.H + 2 * s.PH >= s.KH && s.W + 2 * s.PW >= s.KW, "trainlab::", op, ": kernel ", kernel,
              " is larger than the padded input ", s.H + 2 * s.PH, "x", s.W + 2 * s.PW);
  s.OH = (s.H + 2 * s.PH - s.KH) / s.SH + 1;
  s.OW = (s.W + 2 * s.PW - s.KW) / s.SW + 1;
  return s;
}

// Window-local argmax p·KW + q: one byte while the window has <= 256 elements.
inline at::ScalarType pool_index_type(const PoolShape& s) {
  return s.KH * s.KW <= 256 ? at::kByte : at::kInt;
}

inline PoolShape pool_fwd_shape(const char* op, const at::Tensor& x, at::IntArrayRef kernel, at::IntArrayRef stride,
                                at::IntArrayRef padding) {
  check_float(op, "x", x);
  TORCH_CHECK(x.dim() == 4, "trainlab::", op, ": x must be 4-D [N, C, H, W], got ", x.dim(), "-D");
  return pool_shape(op, x.size(0), x.size(1), x.size(2), x.size(3), kernel, stride, padding);
}

inline PoolShape pool_bwd_shape(const char* op, const at::Tensor& grad, const at::Tensor& indices,
                                at::IntArrayRef input_hw, at::IntArrayRef kernel, at::IntArrayRef stride,
                                at::IntArrayRef padding) {
  check_float(op, "grad", grad);
  TORCH_CHECK(grad.dim() == 4 && indices.sizes() == grad.sizes(), "trainlab::", op, ": grad ", grad.sizes(),
              " and indices ", indices.sizes(), " must be the same 4-D shape");
  TORCH_CHECK(indices.device() == grad.device(), "trainlab::", op, ": indices are on ", indices.device(),
              ", grad on ", grad.device());
  TORCH_CHECK(input_hw.size() == 2, "trainlab::", op, ": input_hw must be [H, W]");
  const PoolShape s = pool_shape(op, grad.size(0), grad.size(1), input_hw[0], input_hw[1], kernel, stride, padding);
  TORCH_CHECK(grad.size(2) == s.OH && grad.size(3) == s.OW, "trainlab::", op, ": grad is ", grad.size(2), "x",
              grad.size(3), " but this input size and window give ", s.OH, "x", s.OW);
  TORCH_CHECK(indices.scalar_type() == pool_index_type(s), "trainlab::", op, ": indices must be ", pool_index_type(s),
              " (from max_pool2d_fwd), got ", indices.scalar_type());
  return s;
}

// ---- linear and relu --------------------------------------------------------------------------------

inline void check_linear(const char* op, const at::Tensor& x, const at::Tensor& weight,
                         const std::optional<at::Tensor>& bias = std::nullopt) {
  check_float(op, "x", x);
  check_like(op, "weight", weight, x);
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), "trainlab::", op,
              ": x [N, in] and weight [out, in] do not match: ", x.sizes(), " vs ", weight.sizes());
  if (bias.has_value() && bias->defined()) {
    check_like(op, "bias", *bias, x);
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == weight.size(0), "trainlab::", op, ": bias must be [",
                weight.size(0), "], got ", bias->sizes());
  }
}

inline void check_linear_grad(const char* op, const at::Tensor& grad, const at::Tensor& x, const at::Tensor& weight) {
  check_linear(op, x, weight);
  check_like(op, "grad", grad, x);
  TORCH_CHECK(grad.dim() == 2 && grad.size(0) == x.size(0) && grad.size(1) == weight.size(0), "trainlab::", op,
              ": grad must be [", x.size(0), ", ", weight.size(0), "], got ", grad.sizes());
}

inline void check_relu_bwd(const at::Tensor& grad, const at::Tensor& out) {
  check_float("relu_bwd", "grad", grad);
  check_like("relu_bwd", "out", out, grad);
  TORCH_CHECK(grad.sizes() == out.sizes(), "trainlab::relu_bwd: grad ", grad.sizes(), " and out ", out.sizes(),
              " differ in shape");
}

}  // namespace trainlab_layers
