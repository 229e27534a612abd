// GELU forward, backward and double backward for CPU: one fused pass over memory each, vectorized
// and parallel.
//
// Registered as real operators `trainlab::gelu_fwd`, `trainlab::gelu_bwd` and `trainlab::gelu_bwd2`
// (schemas below), so autograd, FakeTensor and torch.compile treat them like any ATen op. The
// autograd formulas of gelu_fwd and gelu_bwd are registered here in C++ (see "autograd" below);
// gelu_bwd2's and the fake (meta) implementations from Python (trainlab/ops/gelu.py); the
// derivatives are derived in trainlab/ops/gelu_math.py.
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
#include <torch/autograd.h>
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

enum class Approx { None, Tanh, Sigmoid };

constexpr double kSig = 1.702;   // the sigmoid form: x sigmoid(1.702 x)

inline Approx parse_approximate(std::string_view a) {
  if (a == "none") return Approx::None;
  if (a == "tanh") return Approx::Tanh;
  if (a == "sigmoid") return Approx::Sigmoid;
  TORCH_CHECK(false, "trainlab::gelu: approximate must be 'none', 'tanh' or 'sigmoid', got '", a, "'");
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

// The sigmoid form (report 000): y = x s, s = sigmoid(k x), k = 1.702. With z = k x and
// A = s (1 - s) evaluated as e / (1 + e)^2, e = exp(-|z|) (no cancellation once s rounds to 1):
//   d  = s + z A
//   d' = k A (2 + z (1 - 2 s))
template <typename T> inline T sig_var(T z) {
  const T e = std::exp(-std::abs(z));
  return e / ((T(1) + e) * (T(1) + e));
}
template <typename T> inline T fwd_sigmoid(T x) { return x / (T(1) + std::exp(T(-kSig) * x)); }
template <typename T> inline T bwd_sigmoid(T g, T x) {
  const T z = T(kSig) * x;
  return g * (T(1) / (T(1) + std::exp(-z)) + z * sig_var(z));
}
template <typename T> inline T bwd2_sigmoid(T gg, T g, T x) {
  const T z = T(kSig) * x;
  const T s = T(1) / (T(1) + std::exp(-z));
  return gg * g * T(kSig) * sig_var(z) * (T(2) + z * (T(1) - T(2) * s));
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

template <typename T> inline Vectorized<T> vsig_var(Vectorized<T> z) {
  const Vectorized<T> one{T(1)};
  const Vectorized<T> e = z.abs().neg().exp();
  return e / ((one + e) * (one + e));
}
template <typename T> inline Vectorized<T> vfwd_sigmoid(Vectorized<T> x) {
  const Vectorized<T> one{T(1)}, mk{T(-kSig)};
  return x / (one + (mk * x).exp());
}
template <typename T> inline Vectorized<T> vbwd_sigmoid(Vectorized<T> g, Vectorized<T> x) {
  const Vectorized<T> one{T(1)}, k{T(kSig)};
  const Vectorized<T> z = k * x;
  return g * (one / (one + z.neg().exp()) + z * vsig_var(z));
}
template <typename T> inline Vectorized<T> vbwd2_sigmoid(Vectorized<T> gg, Vectorized<T> g, Vectorized<T> x) {
  const Vectorized<T> one{T(1)}, two{T(2)}, k{T(kSig)};
  const Vectorized<T> z = k * x;
  const Vectorized<T> sg = one / (one + z.neg().exp());
  return gg * g * k * vsig_var(z) * (two + z * (one - two * sg));
}

// One name per operation over the three forms, scalar and vector.
template <Approx A, typename T> inline T fwd(T x) {
  if constexpr (A == Approx::Tanh) return fwd_tanh(x);
  else if constexpr (A == Approx::Sigmoid) return fwd_sigmoid(x);
  else return fwd_exact(x);
}
template <Approx A, typename T> inline T bwd(T g, T x) {
  if constexpr (A == Approx::Tanh) return bwd_tanh(g, x);
  else if constexpr (A == Approx::Sigmoid) return bwd_sigmoid(g, x);
  else return bwd_exact(g, x);
}
template <Approx A, typename T> inline T bwd2(T gg, T g, T x) {
  if constexpr (A == Approx::Tanh) return bwd2_tanh(gg, g, x);
  else if constexpr (A == Approx::Sigmoid) return bwd2_sigmoid(gg, g, x);
  else return bwd2_exact(gg, g, x);
}
template <Approx A, typename T> inline Vectorized<T> vfwd(Vectorized<T> x) {
  if constexpr (A == Approx::Tanh) return vfwd_tanh(x);
  else if constexpr (A == Approx::Sigmoid) return vfwd_sigmoid(x);
  else return vfwd_exact(x);
}
template <Approx A, typename T> inline Vectorized<T> vbwd(Vectorized<T> g, Vectorized<T> x) {
  if constexpr (A == Approx::Tanh) return vbwd_tanh(g, x);
  else if constexpr (A == Approx::Sigmoid) return vbwd_sigmoid(g, x);
  else return vbwd_exact(g, x);
}
template <Approx A, typename T> inline Vectorized<T> vbwd2(Vectorized<T> gg, Vectorized<T> g, Vectorized<T> x) {
  if constexpr (A == Approx::Tanh) return vbwd2_tanh(gg, g, x);
  else if constexpr (A == Approx::Sigmoid) return vbwd2_sigmoid(gg, g, x);
  else return vbwd2_exact(gg, g, x);
}

// ---- kernels --------------------------------------------------------------------------------------

template <typename scalar_t, Approx A>
void forward_kernel(at::TensorIteratorBase& iter) {
  if constexpr (c10::is_reduced_floating_point_v<scalar_t>) {
    // bf16/half: widen to two float vectors, compute, narrow once.
    at::native::cpu_kernel_vec(
        iter, [](scalar_t x) -> scalar_t { return static_cast<scalar_t>(fwd<A>(static_cast<float>(x))); },
        [](Vectorized<scalar_t> x) -> Vectorized<scalar_t> {
          auto [x0, x1] = at::vec::convert_to_float<scalar_t>(x);
          return at::vec::convert_from_float<scalar_t>(vfwd<A>(x0), vfwd<A>(x1));
        });
  } else {
    at::native::cpu_kernel_vec(
        iter, [](scalar_t x) -> scalar_t { return fwd<A>(x); },
        [](Vectorized<scalar_t> x) -> Vectorized<scalar_t> { return vfwd<A>(x); });
  }
}

template <typename scalar_t, Approx A>
void backward_kernel(at::TensorIteratorBase& iter) {
  if constexpr (c10::is_reduced_floating_point_v<scalar_t>) {
    at::native::cpu_kernel_vec(
        iter,
        [](scalar_t g, scalar_t x) -> scalar_t {
          return static_cast<scalar_t>(bwd<A>(static_cast<float>(g), static_cast<float>(x)));
        },
        [](Vectorized<scalar_t> g, Vectorized<scalar_t> x) -> Vectorized<scalar_t> {
          auto [g0, g1] = at::vec::convert_to_float<scalar_t>(g);
          auto [x0, x1] = at::vec::convert_to_float<scalar_t>(x);
          return at::vec::convert_from_float<scalar_t>(vbwd<A>(g0, x0), vbwd<A>(g1, x1));
        });
  } else {
    at::native::cpu_kernel_vec(
        iter, [](scalar_t g, scalar_t x) -> scalar_t { return bwd<A>(g, x); },
        [](Vectorized<scalar_t> g, Vectorized<scalar_t> x) -> Vectorized<scalar_t> { return vbwd<A>(g, x); });
  }
}

template <typename scalar_t, Approx A>
void double_backward_kernel(at::TensorIteratorBase& iter) {
  if constexpr (c10::is_reduced_floating_point_v<scalar_t>) {
    at::native::cpu_kernel_vec(
        iter,
        [](scalar_t gg, scalar_t g, scalar_t x) -> scalar_t {
          return static_cast<scalar_t>(bwd2<A>(static_cast<float>(gg), static_cast<float>(g), static_cast<float>(x)));
        },
        [](Vectorized<scalar_t> gg, Vectorized<scalar_t> g, Vectorized<scalar_t> x) -> Vectorized<scalar_t> {
          auto [a0, a1] = at::vec::convert_to_float<scalar_t>(gg);
          auto [b0, b1] = at::vec::convert_to_float<scalar_t>(g);
          auto [c0, c1] = at::vec::convert_to_float<scalar_t>(x);
          return at::vec::convert_from_float<scalar_t>(vbwd2<A>(a0, b0, c0), vbwd2<A>(a1, b1, c1));
        });
  } else {
    at::native::cpu_kernel_vec(
        iter, [](scalar_t gg, scalar_t g, scalar_t x) -> scalar_t { return bwd2<A>(gg, g, x); },
        [](Vectorized<scalar_t> gg, Vectorized<scalar_t> g, Vectorized<scalar_t> x) -> Vectorized<scalar_t> {
          return vbwd2<A>(gg, g, x);
        });
  }
}

// Runs kernel<scalar_t, A> for the runtime form.
#define TRAINLAB_GELU_BY_APPROX(approx, kernel, iter)                                   \
  switch (approx) {                                                                     \
    case Approx::Tanh: kernel<scalar_t, Approx::Tanh>(iter); break;                     \
    case Approx::Sigmoid: kernel<scalar_t, Approx::Sigmoid>(iter); break;               \
    case Approx::None: kernel<scalar_t, Approx::None>(iter); break;                     \
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
    TRAINLAB_GELU_BY_APPROX(approx, forward_kernel, iter)
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
    TRAINLAB_GELU_BY_APPROX(approx, backward_kernel, iter)
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
    TRAINLAB_GELU_BY_APPROX(approx, double_backward_kernel, iter)
  });
  return out;
}

// ---- autograd, in C++ -------------------------------------------------------------------------------
//
// The autograd formulas of gelu_fwd and gelu_bwd are registered here, at the Autograd key (every
// device), rather than with torch.library.register_autograd in Python: a Python formula makes every
// backward re-enter the interpreter, and on a GPU that happens on autograd's device thread, which
// must first take the GIL. The H100 bench measured ~0.15 ms of fixed cost per forward+backward
// that way (1.82x F.gelu at 1K elements, where both are pure overhead), enough on its own to miss
// "forward+backward <= 1.05x F.gelu" at 256M elements. In C++ the backward stays off Python, as
// F.gelu's does. The formulas (gelu_math.py):
//   gelu_fwd(x)        -> dx = gelu_bwd(g, x)
//   gelu_bwd(g, x)     -> dg = gelu_bwd(gg, x),  dx = gelu_bwd2(gg, g, x)
// and gelu_bwd2's own (third-order) formula stays in Python (torch ops, gelu_math.bwd2_backward).
// Each formula calls the next op through the dispatcher with autograd, so create_graph=True
// records it and every order stays exact; under torch.compile, AOTAutograd traces these functions
// like ATen's own derivative formulas.

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor call_fwd(const at::Tensor& x, c10::string_view a) {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("trainlab::gelu_fwd", "")
                       .typed<at::Tensor(const at::Tensor&, c10::string_view)>();
  return op.call(x, a);
}
at::Tensor call_bwd(const at::Tensor& g, const at::Tensor& x, c10::string_view a) {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("trainlab::gelu_bwd", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view)>();
  return op.call(g, x, a);
}
at::Tensor call_bwd2(const at::Tensor& gg, const at::Tensor& g, const at::Tensor& x, c10::string_view a) {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("trainlab::gelu_bwd2", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, c10::string_view)>();
  return op.call(gg, g, x, a);
}

class GeluFwdFunction : public torch::autograd::Function<GeluFwdFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const std::string& approximate) {
    ctx->save_for_backward({x});   // x only, as F.gelu
    ctx->saved_data["approximate"] = approximate;
    at::AutoDispatchBelowADInplaceOrView below;
    return call_fwd(x, approximate);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    return {call_bwd(grads[0], saved[0], ctx->saved_data["approximate"].toStringRef()), at::Tensor()};
  }
};

class GeluBwdFunction : public torch::autograd::Function<GeluBwdFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& grad, const at::Tensor& x,
                            const std::string& approximate) {
    ctx->save_for_backward({grad, x});
    ctx->saved_data["approximate"] = approximate;
    at::AutoDispatchBelowADInplaceOrView below;
    return call_bwd(grad, x, approximate);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const std::string a = ctx->saved_data["approximate"].toStringRef();
    const at::Tensor& gg = grads[0];
    if (!gg.defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    at::Tensor dgrad = ctx->needs_input_grad(0) ? call_bwd(gg, saved[1], a) : at::Tensor();
    at::Tensor dx = ctx->needs_input_grad(1) ? call_bwd2(gg, saved[0], saved[1], a) : at::Tensor();
    return {dgrad, dx, at::Tensor()};
  }
};

at::Tensor gelu_fwd_autograd(const at::Tensor& x, c10::string_view approximate) {
  return GeluFwdFunction::apply(x, std::string(approximate.data(), approximate.size()));
}

at::Tensor gelu_bwd_autograd(const at::Tensor& grad, const at::Tensor& x, c10::string_view approximate) {
  return GeluBwdFunction::apply(grad, x, std::string(approximate.data(), approximate.size()));
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

TORCH_LIBRARY_IMPL(trainlab, Autograd, m) {
  m.impl("gelu_fwd", &trainlab_gelu::gelu_fwd_autograd);
  m.impl("gelu_bwd", &trainlab_gelu::gelu_bwd_autograd);
}
