// GELU forward, backward and double backward for CPU: one fused pass over memory each, vectorized
// and parallel.
//
// Registered as real operators `trainlab::gelu_fwd`, `trainlab::gelu_bwd` and `trainlab::gelu_bwd2`
// (schemas below), so autograd, FakeTensor and torch.compile treat them like any ATen op. The
// autograd formulas and the fake (meta) implementations are registered from Python in
// trainlab/ops/gelu_cpp.py; the derivatives are derived in trainlab/ops/gelu_math.py.
//
// Why TensorIterator + cpu_kernel_vec rather than a hand-written loop over data_ptr():
//   * it handles every layout without a `.contiguous()` copy: contiguous and channels-last tensors
//     take the Vectorized path, strided views (x[:, ::2], x.t()) take a strided scalar loop;
//   * it splits the work with at::parallel_for using ATen's GRAIN_SIZE (32768 elements), the same
//     threshold F.gelu uses, so small tensors are not slowed down by thread start-up.
// The element-wise math is written here (not a chain of torch:: ops), so each element is read once
// and written once: forward moves 2 × N × sizeof(T) bytes, backward 3 × N × sizeof(T).
//
// Vector width: this file is compiled with the flags of the best CPU capability torch detected
// (AVX512 / AVX2 / DEFAULT, see gelu_cpp.py), so Vectorized<float> is 16, 8 or 8 (emulated) lanes.
// bfloat16 and float16 are widened to float32 for the math (as ATen does) and rounded once on store.

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/TensorIterator.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/native/cpu/Loops.h>
#include <torch/library.h>

#include <cmath>
#include <string_view>

namespace trainlab_gelu {

using at::vec::Vectorized;

// sqrt(2/pi), 1/sqrt(2), 1/sqrt(2*pi), tanh-approximation cubic coefficient.
constexpr double kBeta = 0.7978845608028654;
constexpr double kAlpha = 0.7071067811865476;
constexpr double kInvSqrt2Pi = 0.3989422804014327;
constexpr double kKappa = 0.044715;

enum class Approx { None, Tanh };

inline Approx parse_approximate(std::string_view a) {
  if (a == "none") return Approx::None;
  if (a == "tanh") return Approx::Tanh;
  TORCH_CHECK(false, "trainlab::gelu: approximate must be 'none' or 'tanh', got '", a, "'");
}

inline void check_dtype(const at::Tensor& t, const char* what) {
  TORCH_CHECK(at::isFloatingType(t.scalar_type()),
              "trainlab::gelu: ", what, " must be a floating-point tensor (float32, float64, bfloat16 or float16), got ",
              t.scalar_type());
}

// ---- erf for float32: a rational approximation, no exp, no division by a polynomial in t -------
//
// at::vec::Vectorized<float>::erf() (Abramowitz–Stegun 7.1.26) costs a division *and* a Sleef exp
// per element, which made the exact-GELU forward ~1.6x slower than F.gelu (oneDNN's JIT kernel on
// x86). This is the odd/even rational minimax fit used by Eigen and XLA for float32:
//   erf(x) ~= x P(x^2) / Q(x^2) on [-4, 4], deg P = 6, deg Q = 4, and erf(x) = +-1 (to float32) beyond.
// Measured against float64 erf on a 2e5-point grid over [-6, 6]: 6.5e-8 max abs error evaluated in
// double. Through this kernel (float32, FMA) on a 2e6-point grid over [-8, 8], the erf error implied
// by the GELU error is 5.2e-7, vs 7.3e-7 for F.gelu's float32 path (oneDNN) on the same grid; the
// GELU itself is within 1.5e-6 of float64 (F.gelu: 1.2e-6), mostly output rounding.
// NaN stays NaN (the clamp keeps NaN on x86 max/min, and GELU multiplies by x again anyway).
constexpr float kErfA[7] = {-1.60960333262415e-02f, -2.95459980854025e-03f, -7.34990630326855e-04f,
                            -5.69250639462346e-05f, -2.10102402082508e-06f, 2.77068142495902e-08f,
                            -2.72614225801306e-10f};
constexpr float kErfB[5] = {-1.42647390514189e-02f, -7.37332916720468e-03f, -1.68282697438203e-03f,
                            -2.13374055278905e-04f, -1.45660718464996e-05f};

inline float madd(float a, float b, float c) { return std::fma(a, b, c); }
inline Vectorized<float> madd(const Vectorized<float>& a, const Vectorized<float>& b, const Vectorized<float>& c) {
  return at::vec::fmadd(a, b, c);
}
inline float clamp4(float x) { return x > 4.f ? 4.f : (x < -4.f ? -4.f : x); }  // NaN falls through
inline Vectorized<float> clamp4(const Vectorized<float>& x) {
  return at::vec::clamp(x, Vectorized<float>(-4.f), Vectorized<float>(4.f));
}

template <typename V> inline V erf_f32(V x_in) {
  const V x = clamp4(x_in);
  const V x2 = x * x;
  V p = madd(x2, V(kErfA[6]), V(kErfA[5]));
  p = madd(x2, p, V(kErfA[4]));
  p = madd(x2, p, V(kErfA[3]));
  p = madd(x2, p, V(kErfA[2]));
  p = madd(x2, p, V(kErfA[1]));
  p = madd(x2, p, V(kErfA[0]));
  V q = madd(x2, V(kErfB[4]), V(kErfB[3]));
  q = madd(x2, q, V(kErfB[2]));
  q = madd(x2, q, V(kErfB[1]));
  q = madd(x2, q, V(kErfB[0]));
  return (x * p) / q;
}

// erf in the kernel's compute type: the fast float32 fit, or the accurate (1-ulp) double versions.
inline float erf_t(float x) { return erf_f32(x); }
inline double erf_t(double x) { return std::erf(x); }
inline Vectorized<float> erf_t(const Vectorized<float>& x) { return erf_f32(x); }
inline Vectorized<double> erf_t(const Vectorized<double>& x) { return x.erf(); }

// ---- scalar math in opmath (float for float/bf16/half, double for double) ----------------------
// The scalar versions serve strided (non-vectorizable) layouts and loop tails; they use the same
// erf as the vector versions so a tensor's result does not depend on its layout.

template <typename T> inline T fwd_exact(T x) {
  return T(0.5) * x * (T(1) + erf_t(x * T(kAlpha)));
}
template <typename T> inline T fwd_tanh(T x) {
  const T inner = T(kBeta) * (x + T(kKappa) * x * x * x);
  return T(0.5) * x * (T(1) + std::tanh(inner));
}
// d/dx [x Phi(x)] = Phi(x) + x phi(x)
template <typename T> inline T bwd_exact(T g, T x) {
  const T cdf = T(0.5) * (T(1) + erf_t(x * T(kAlpha)));
  const T pdf = T(kInvSqrt2Pi) * std::exp(T(-0.5) * x * x);
  return g * (cdf + x * pdf);
}
// d/dx [0.5 x (1 + tanh u)], u = beta (x + kappa x^3):
//   0.5 (1 + t) + 0.5 x (1 - t^2) beta (1 + 3 kappa x^2)
template <typename T> inline T bwd_tanh(T g, T x) {
  const T x2 = x * x;
  const T t = std::tanh(T(kBeta) * (x + T(kKappa) * x2 * x));
  const T left = T(0.5) * (T(1) + t);
  const T right = T(0.5) * x * (T(1) - t * t) * T(kBeta) * (T(1) + T(3 * kKappa) * x2);
  return g * (left + right);
}

// Double backward: the x-gradient of g * d(x) for an incoming gg is gg * g * d'(x).
//   exact: d' = phi(x) (2 - x^2)
//   tanh:  d' = (1 - t^2) (u' + x/2 (u'' - 2 t u'^2)),  u' = beta (1 + 3 kappa x^2),  u'' = 6 beta kappa x
// with 1 - t^2 = sech^2 u = 4e / (1 + e)^2, e = exp(-2|u|): `1 - t*t` cancels to nothing in float32
// once t rounds to 1, and this derivative multiplies the loss by x u'^2 (see gelu_math.py).
template <typename T> inline T bwd2_exact(T gg, T g, T x) {
  const T x2 = x * x;
  return gg * g * T(kInvSqrt2Pi) * std::exp(T(-0.5) * x2) * (T(2) - x2);
}
template <typename T> inline T bwd2_tanh(T gg, T g, T x) {
  const T x2 = x * x;
  const T u = T(kBeta) * (x + T(kKappa) * x2 * x);
  const T t = std::tanh(u);
  const T e = std::exp(T(-2) * std::abs(u));
  const T sech2 = T(4) * e / ((T(1) + e) * (T(1) + e));
  const T du = T(kBeta) * (T(1) + T(3 * kKappa) * x2);
  const T d2u = T(6 * kBeta * kKappa) * x;
  return gg * g * sech2 * (du + T(0.5) * x * (d2u - T(2) * t * du * du));
}

// ---- the same math on Vectorized<T> (T = float or double) ----------------------------------------

template <typename T> inline Vectorized<T> vfwd_exact(Vectorized<T> x) {
  const Vectorized<T> half{T(0.5)}, one{T(1)}, alpha{T(kAlpha)};
  return half * x * (one + erf_t(x * alpha));
}
template <typename T> inline Vectorized<T> vfwd_tanh(Vectorized<T> x) {
  const Vectorized<T> half{T(0.5)}, one{T(1)}, beta{T(kBeta)}, kappa{T(kKappa)};
  const Vectorized<T> inner = beta * (x + kappa * x * x * x);
  return half * x * (one + inner.tanh());
}
template <typename T> inline Vectorized<T> vbwd_exact(Vectorized<T> g, Vectorized<T> x) {
  const Vectorized<T> half{T(0.5)}, one{T(1)}, alpha{T(kAlpha)}, inv{T(kInvSqrt2Pi)}, mhalf{T(-0.5)};
  const Vectorized<T> cdf = half * (one + erf_t(x * alpha));
  const Vectorized<T> pdf = inv * (mhalf * x * x).exp();
  return g * (cdf + x * pdf);
}
template <typename T> inline Vectorized<T> vbwd_tanh(Vectorized<T> g, Vectorized<T> x) {
  const Vectorized<T> half{T(0.5)}, one{T(1)}, beta{T(kBeta)}, kappa{T(kKappa)}, kappa3{T(3 * kKappa)};
  const Vectorized<T> x2 = x * x;
  const Vectorized<T> t = (beta * (x + kappa * x2 * x)).tanh();
  const Vectorized<T> left = half * (one + t);
  const Vectorized<T> right = half * x * (one - t * t) * beta * (one + kappa3 * x2);
  return g * (left + right);
}

template <typename T> inline Vectorized<T> vbwd2_exact(Vectorized<T> gg, Vectorized<T> g, Vectorized<T> x) {
  const Vectorized<T> inv{T(kInvSqrt2Pi)}, mhalf{T(-0.5)}, two{T(2)};
  const Vectorized<T> x2 = x * x;
  return gg * g * inv * (mhalf * x2).exp() * (two - x2);
}
template <typename T> inline Vectorized<T> vbwd2_tanh(Vectorized<T> gg, Vectorized<T> g, Vectorized<T> x) {
  const Vectorized<T> half{T(0.5)}, one{T(1)}, two{T(2)}, four{T(4)}, mtwo{T(-2)}, beta{T(kBeta)},
      kappa{T(kKappa)}, kappa3{T(3 * kKappa)}, c2{T(6 * kBeta * kKappa)};
  const Vectorized<T> x2 = x * x;
  const Vectorized<T> u = beta * (x + kappa * x2 * x);
  const Vectorized<T> t = u.tanh();
  const Vectorized<T> e = (mtwo * u.abs()).exp();
  const Vectorized<T> sech2 = four * e / ((one + e) * (one + e));
  const Vectorized<T> du = beta * (one + kappa3 * x2);
  const Vectorized<T> d2u = c2 * x;
  return gg * g * sech2 * (du + half * x * (d2u - two * t * du * du));
}

// ---- kernels --------------------------------------------------------------------------------------

template <typename scalar_t, bool kTanh>
void forward_kernel(at::TensorIteratorBase& iter) {
  if constexpr (c10::is_reduced_floating_point_v<scalar_t>) {
    // bf16/half: widen to two float vectors, compute, narrow once.
    at::native::cpu_kernel_vec(
        iter,
        [](scalar_t x) -> scalar_t {
          const float xf = static_cast<float>(x);
          return static_cast<scalar_t>(kTanh ? fwd_tanh(xf) : fwd_exact(xf));
        },
        [](Vectorized<scalar_t> x) -> Vectorized<scalar_t> {
          auto [x0, x1] = at::vec::convert_to_float<scalar_t>(x);
          if constexpr (kTanh) {
            return at::vec::convert_from_float<scalar_t>(vfwd_tanh(x0), vfwd_tanh(x1));
          } else {
            return at::vec::convert_from_float<scalar_t>(vfwd_exact(x0), vfwd_exact(x1));
          }
        });
  } else {
    at::native::cpu_kernel_vec(
        iter,
        [](scalar_t x) -> scalar_t { return kTanh ? fwd_tanh(x) : fwd_exact(x); },
        [](Vectorized<scalar_t> x) -> Vectorized<scalar_t> {
          if constexpr (kTanh) return vfwd_tanh(x); else return vfwd_exact(x);
        });
  }
}

template <typename scalar_t, bool kTanh>
void backward_kernel(at::TensorIteratorBase& iter) {
  if constexpr (c10::is_reduced_floating_point_v<scalar_t>) {
    at::native::cpu_kernel_vec(
        iter,
        [](scalar_t g, scalar_t x) -> scalar_t {
          const float gf = static_cast<float>(g), xf = static_cast<float>(x);
          return static_cast<scalar_t>(kTanh ? bwd_tanh(gf, xf) : bwd_exact(gf, xf));
        },
        [](Vectorized<scalar_t> g, Vectorized<scalar_t> x) -> Vectorized<scalar_t> {
          auto [g0, g1] = at::vec::convert_to_float<scalar_t>(g);
          auto [x0, x1] = at::vec::convert_to_float<scalar_t>(x);
          if constexpr (kTanh) {
            return at::vec::convert_from_float<scalar_t>(vbwd_tanh(g0, x0), vbwd_tanh(g1, x1));
          } else {
            return at::vec::convert_from_float<scalar_t>(vbwd_exact(g0, x0), vbwd_exact(g1, x1));
          }
        });
  } else {
    at::native::cpu_kernel_vec(
        iter,
        [](scalar_t g, scalar_t x) -> scalar_t { return kTanh ? bwd_tanh(g, x) : bwd_exact(g, x); },
        [](Vectorized<scalar_t> g, Vectorized<scalar_t> x) -> Vectorized<scalar_t> {
          if constexpr (kTanh) return vbwd_tanh(g, x); else return vbwd_exact(g, x);
        });
  }
}

template <typename scalar_t, bool kTanh>
void double_backward_kernel(at::TensorIteratorBase& iter) {
  if constexpr (c10::is_reduced_floating_point_v<scalar_t>) {
    at::native::cpu_kernel_vec(
        iter,
        [](scalar_t gg, scalar_t g, scalar_t x) -> scalar_t {
          const float a = static_cast<float>(gg), b = static_cast<float>(g), c = static_cast<float>(x);
          return static_cast<scalar_t>(kTanh ? bwd2_tanh(a, b, c) : bwd2_exact(a, b, c));
        },
        [](Vectorized<scalar_t> gg, Vectorized<scalar_t> g, Vectorized<scalar_t> x) -> Vectorized<scalar_t> {
          auto [a0, a1] = at::vec::convert_to_float<scalar_t>(gg);
          auto [b0, b1] = at::vec::convert_to_float<scalar_t>(g);
          auto [c0, c1] = at::vec::convert_to_float<scalar_t>(x);
          if constexpr (kTanh) {
            return at::vec::convert_from_float<scalar_t>(vbwd2_tanh(a0, b0, c0), vbwd2_tanh(a1, b1, c1));
          } else {
            return at::vec::convert_from_float<scalar_t>(vbwd2_exact(a0, b0, c0), vbwd2_exact(a1, b1, c1));
          }
        });
  } else {
    at::native::cpu_kernel_vec(
        iter,
        [](scalar_t gg, scalar_t g, scalar_t x) -> scalar_t { return kTanh ? bwd2_tanh(gg, g, x) : bwd2_exact(gg, g, x); },
        [](Vectorized<scalar_t> gg, Vectorized<scalar_t> g, Vectorized<scalar_t> x) -> Vectorized<scalar_t> {
          if constexpr (kTanh) return vbwd2_tanh(gg, g, x); else return vbwd2_exact(gg, g, x);
        });
  }
}

inline void check_like_x(const at::Tensor& t, const at::Tensor& x, const char* op, const char* what) {
  TORCH_CHECK(t.scalar_type() == x.scalar_type(), "trainlab::", op, ": ", what, " dtype ", t.scalar_type(),
              " differs from x dtype ", x.scalar_type());
  TORCH_CHECK(t.sizes() == x.sizes(), "trainlab::", op, ": ", what, " shape ", t.sizes(), " differs from x shape ",
              x.sizes());
}

at::Tensor gelu_fwd_cpu(const at::Tensor& x, c10::string_view approximate) {
  check_dtype(x, "x");
  const Approx approx = parse_approximate(std::string_view(approximate.data(), approximate.size()));
  // empty_like keeps x's strides when x is dense (contiguous, channels-last, transposed), else it
  // returns a contiguous tensor; the fake implementation in Python does the same.
  at::Tensor out = at::empty_like(x);
  auto iter = at::TensorIteratorConfig()
                  .add_output(out)
                  .add_const_input(x)
                  .check_all_same_dtype(true)
                  .build();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "trainlab_gelu_fwd", [&] {
    if (approx == Approx::Tanh) forward_kernel<scalar_t, true>(iter);
    else forward_kernel<scalar_t, false>(iter);
  });
  return out;
}

at::Tensor gelu_bwd_cpu(const at::Tensor& grad, const at::Tensor& x, c10::string_view approximate) {
  check_dtype(x, "x");
  check_like_x(grad, x, "gelu_bwd", "grad");
  const Approx approx = parse_approximate(std::string_view(approximate.data(), approximate.size()));
  at::Tensor out = at::empty_like(x);
  auto iter = at::TensorIteratorConfig()
                  .add_output(out)
                  .add_const_input(grad)
                  .add_const_input(x)
                  .check_all_same_dtype(true)
                  .build();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "trainlab_gelu_bwd", [&] {
    if (approx == Approx::Tanh) backward_kernel<scalar_t, true>(iter);
    else backward_kernel<scalar_t, false>(iter);
  });
  return out;
}

at::Tensor gelu_bwd2_cpu(const at::Tensor& grad_grad, const at::Tensor& grad, const at::Tensor& x,
                         c10::string_view approximate) {
  check_dtype(x, "x");
  check_like_x(grad, x, "gelu_bwd2", "grad");
  check_like_x(grad_grad, x, "gelu_bwd2", "grad_grad");
  const Approx approx = parse_approximate(std::string_view(approximate.data(), approximate.size()));
  at::Tensor out = at::empty_like(x);
  auto iter = at::TensorIteratorConfig()
                  .add_output(out)
                  .add_const_input(grad_grad)
                  .add_const_input(grad)
                  .add_const_input(x)
                  .check_all_same_dtype(true)
                  .build();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "trainlab_gelu_bwd2", [&] {
    if (approx == Approx::Tanh) double_backward_kernel<scalar_t, true>(iter);
    else double_backward_kernel<scalar_t, false>(iter);
  });
  return out;
}

}  // namespace trainlab_gelu

// FRAGMENT rather than TORCH_LIBRARY: the `trainlab` namespace may also hold ops defined elsewhere
// (e.g. from Python with torch.library), and only one owner-style definition is allowed per namespace.
TORCH_LIBRARY_FRAGMENT(trainlab, m) {
  m.def("gelu_fwd(Tensor x, str approximate) -> Tensor");
  m.def("gelu_bwd(Tensor grad, Tensor x, str approximate) -> Tensor");
  m.def("gelu_bwd2(Tensor grad_grad, Tensor grad, Tensor x, str approximate) -> Tensor");
}

TORCH_LIBRARY_IMPL(trainlab, CPU, m) {
  m.impl("gelu_fwd", &trainlab_gelu::gelu_fwd_cpu);
  m.impl("gelu_bwd", &trainlab_gelu::gelu_bwd_cpu);
  m.impl("gelu_bwd2", &trainlab_gelu::gelu_bwd2_cpu);
}
