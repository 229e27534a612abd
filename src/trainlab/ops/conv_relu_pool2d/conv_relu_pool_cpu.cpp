// LeNet-5's first stage as ONE operator on the CPU: conv2d (stride 1, zero padding) + bias → ReLU →
// 2×2/2 max-pooling or average pooling (`avg`), forward and backward.
//
// Why fuse: in the unfused step (bf16, channels-last, batch 256) the first stage costs more than
// the rest of the network — ATen's max-pool forward alone is ~8 ms of a 25 ms step, because a
// 6-channel channels-last plane vectorizes badly — and each of the three ops writes and re-reads
// a [N, 6, 28, 28] activation. Here the 28×28 conv output of one sample and one channel never
// leaves L1: two conv rows are computed, pooled and rectified, and only the 14×14 result and a
// one-byte code per output are written (8× less memory traffic than the conv output alone).
//
// Forward, per sample (parallel over samples):
//   xpad[c]          the sample's input planes, zero-padded, in float (double for float64),
//                    with spare columns so every row read is a whole number of vectors
//   acc[r][w]        = b[o] + Σ_{c,p,q} W[o,c,p,q] · xpad[c][2i+r+p][w+q]     (r = 0, 1: the two
//                    conv rows under pooled row i; the loop over w is the vectorized one)
//   out[i][j]        = relu(max of acc[0..1][2j..2j+1]), scanning (0,0),(0,1),(1,0),(1,1): the
//                    first maximum wins and a NaN wins over numbers, as in ATen's max_pool2d
//   code[i][j]       = the winner's window position k = 2r+s, plus kCut when the maximum is <= 0
//                    (ReLU passes no gradient there; a NaN's passes, as in ATen's threshold_backward)
// ReLU before or after the max is the same function with the same gradient (max is monotone),
// which is why the operator is defined as conv → ReLU → pool and computed as conv → pool → ReLU.
// Average pooling (`avg`, the `fast` preset since issue 40, round 7) rectifies each of the four first:
//   out[i][j]        = (relu(a00) + relu(a01) + relu(a10) + relu(a11)) / 4, summed in that order (ATen's)
//   code[i][j]       = bit k set when element k's ReLU passed (4 bits; no bit: no gradient)
// and its backward routes dy/4 to every element whose bit is set, by the same code as max's one winner.
//
// Backward: only the winners carry gradient. For each pooled output whose ReLU passed, dW[o] gets
// g times the winner's KH x KW input patch and db[o] gets g (at most a quarter of a dense dW's
// work: one conv output in four wins, and only the winners whose ReLU passed count):
//   dW[o,c,p,q] = Σ_{n, passing (i,j)} dy[n,o,i,j] · xpad[c][h+p][w+q]    (h, w: the winner)
//   db[o]       = Σ_{n, passing (i,j)} dy[n,o,i,j]
//   dx          = the same taps transposed, scattered into a padded plane from the dense gradient
//                 of the conv output (only when asked: LeNet's input needs none)
// dW and db are summed per fixed chunk of kChunk samples and the chunks are added in order at the
// end: the result does not depend on the thread count (bit-identical with 1 and 2 threads, tested),
// which keeps "same seed, same curve" true on a CPU. A sample with an inf or NaN input takes a
// dense sum instead, to give ATen's NaNs (0 · inf).
//
// Precision: float32/bfloat16/float16 accumulate in float32 (bf16/fp16 inputs are widened on entry,
// the outputs rounded once), float64 in float64 — as the other `trainlab::` CPU ops do.

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace trainlab_fused {

constexpr uint8_t kCut = 0x80;     // code bit: the pooled maximum was <= 0, ReLU passes no gradient
constexpr int64_t kLanes = 16;     // row length is rounded up to this (one AVX-512 float vector)
constexpr int64_t kChunk = 8;      // samples per weight-gradient partial sum (fixed: thread-count independent)

// The conv outputs one pooled output's gradient reaches, as window positions k = 2r+s (fills `pos`,
// returns how many): max-pooling's winner (none if its ReLU cut), or, under average pooling, every
// element whose ReLU passed (each gets a quarter of dy: the callers scale).
inline int routed(uint8_t code, bool avg, int pos[4]) {
  int n = 0;
  if (!avg) {
    if (!(code & kCut)) pos[n++] = code & 3;
    return n;
  }
  for (int k = 0; k < 4; ++k)
    if (code & (1 << k)) pos[n++] = k;
  return n;
}

struct Geometry {
  int64_t N, C, H, W, O, KH, KW, PH, PW;
  int64_t CH, CW;      // conv output size
  int64_t OH, OW;      // pooled output size (floor, like max_pool2d)
  int64_t RW;          // conv row length computed: CW rounded up to kLanes
  int64_t KWP;         // KW rounded up to 8: the weight gradient's row of taps, one 256-bit vector for 5x5
  int64_t XH, XW;      // padded input plane: rows, row length (RW + KWP - 1 so every read is in bounds)
};

Geometry geometry(const char* op, const at::Tensor& x, const at::Tensor& weight, at::IntArrayRef padding) {
  TORCH_CHECK(x.dim() == 4 && weight.dim() == 4, op, ": x and weight must be 4-D");
  TORCH_CHECK(padding.size() == 2 && padding[0] >= 0 && padding[1] >= 0, op, ": padding must be two integers >= 0");
  TORCH_CHECK(x.size(1) == weight.size(1), op, ": x has ", x.size(1), " channels but weight expects ", weight.size(1));
  Geometry g{};
  g.N = x.size(0); g.C = x.size(1); g.H = x.size(2); g.W = x.size(3);
  g.O = weight.size(0); g.KH = weight.size(2); g.KW = weight.size(3);
  g.PH = padding[0]; g.PW = padding[1];
  g.CH = g.H + 2 * g.PH - g.KH + 1;
  g.CW = g.W + 2 * g.PW - g.KW + 1;
  TORCH_CHECK(g.CH >= 2 && g.CW >= 2, op, ": the convolution output is ", g.CH, "x", g.CW, ", smaller than the 2x2 pooling window");
  g.OH = g.CH / 2; g.OW = g.CW / 2;
  g.RW = (g.CW + kLanes - 1) / kLanes * kLanes;
  g.KWP = (g.KW + 7) / 8 * 8;
  g.XH = g.H + 2 * g.PH;
  g.XW = g.RW + g.KWP - 1;
  return g;
}

// The sample's C input planes into `xpad` (zeroed borders and spare columns), widened to acc_t.
// Returns whether every value is finite.
template <typename scalar_t, typename acc_t>
bool pad_sample(const scalar_t* x, const int64_t* xs, acc_t* xpad, const Geometry& g) {
  std::fill(xpad, xpad + g.C * g.XH * g.XW, acc_t(0));
  bool finite = true;
  for (int64_t c = 0; c < g.C; ++c)
    for (int64_t h = 0; h < g.H; ++h) {
      const scalar_t* src = x + c * xs[1] + h * xs[2];
      acc_t* dst = xpad + (c * g.XH + h + g.PH) * g.XW + g.PW;
      for (int64_t w = 0; w < g.W; ++w) {
        dst[w] = static_cast<acc_t>(src[w * xs[3]]);
        finite &= std::isfinite(dst[w]);
      }
    }
  return finite;
}

// acc[w] += wv * row[w] over one row: the generic path (and the input gradient's), vectorized by
// the compiler.
template <typename acc_t>
inline void axpy_row(acc_t* __restrict acc, const acc_t* __restrict row, acc_t wv, int64_t n) {
  for (int64_t w = 0; w < n; ++w) acc[w] += wv * row[w];
}

// The fast path. A conv row is V vectors long (LeNet's 28 columns: 2 AVX-512 vectors); OB output
// channels × V vectors of accumulators stay in registers across all C·KH·KW taps, each input
// vector is loaded once per tap and used by the OB channels. (A loop over a 32-element row per
// tap and channel, as in axpy_row, spends more on loop and alias checks than on the 2 FMAs.)
template <int OB, int V, typename acc_t>
inline void conv_row_block(const acc_t* xpad, const acc_t* wf, const acc_t* bias, acc_t* out, int64_t o0,
                           int64_t row, const Geometry& g) {
  using Vec = at::vec::Vectorized<acc_t>;
  constexpr int S = Vec::size();
  const int64_t taps = g.C * g.KH * g.KW;
  Vec acc[OB][V];
  for (int b = 0; b < OB; ++b)
    for (int v = 0; v < V; ++v) acc[b][v] = Vec(bias[o0 + b]);
  for (int64_t c = 0; c < g.C; ++c)
    for (int64_t p = 0; p < g.KH; ++p) {
      const acc_t* xr = xpad + (c * g.XH + row + p) * g.XW;
      const acc_t* wr = wf + o0 * taps + (c * g.KH + p) * g.KW;
      for (int64_t q = 0; q < g.KW; ++q) {
        Vec xv[V];
        for (int v = 0; v < V; ++v) xv[v] = Vec::loadu(xr + q + v * S);
        for (int b = 0; b < OB; ++b) {
          const Vec wv(wr[b * taps + q]);
          for (int v = 0; v < V; ++v) acc[b][v] = at::vec::fmadd(wv, xv[v], acc[b][v]);
        }
      }
    }
  for (int b = 0; b < OB; ++b)
    for (int v = 0; v < V; ++v) acc[b][v].store(out + (o0 + b) * g.RW + v * S);
}

// dW and db of one sample, from the winners only: a pooled output whose ReLU passed adds g times
// its winner's KH x KW input patch to dW[o] (one KWP-wide vector per patch row; the lanes past KW
// read real padded-row values and are dropped at the end). A quarter of the conv outputs win and
// the winners' ReLU mostly passes, so this does about a quarter of a dense dW's work and needs no
// dense gradient.
// db goes into 8 partial sums (j mod 8), so consecutive adds do not wait on each other.
template <int KWP, typename scalar_t, typename acc_t>
void sparse_weight_grad(const scalar_t* grad, const int64_t* gs, const uint8_t* code, const acc_t* xpad,
                        acc_t* dw, acc_t* db8, const Geometry& g, bool avg) {
  const acc_t share = avg ? acc_t(0.25) : acc_t(1);
  int pos[4];
  for (int64_t o = 0; o < g.O; ++o)
    for (int64_t i = 0; i < g.OH; ++i)
      for (int64_t j = 0; j < g.OW; ++j) {
        const int n = routed(code[(o * g.OH + i) * g.OW + j], avg, pos);
        if (n == 0) continue;
        const acc_t gv = static_cast<acc_t>(grad[o * gs[1] + i * gs[2] + j * gs[3]]) * share;
        for (int e = 0; e < n; ++e) {
          db8[o * 8 + (j & 7)] += gv;
          const int64_t h = 2 * i + (pos[e] >> 1), w = 2 * j + (pos[e] & 1);
          for (int64_t c = 0; c < g.C; ++c)
            for (int64_t p = 0; p < g.KH; ++p) {
              const acc_t* __restrict row = xpad + (c * g.XH + h + p) * g.XW + w;
              acc_t* __restrict d = dw + ((o * g.C + c) * g.KH + p) * KWP;
              for (int q = 0; q < KWP; ++q) d[q] += gv * row[q];
            }
        }
      }
}

// LeNet's case, float32 and at most 8 rows of at most 8 taps: the same sum with each (o, c) pair's
// KH rows of dW in registers (GCC/Clang vector types, 8 floats: one 256-bit FMA per patch row)
// while all of the sample's outputs of channel o stream past, instead of a load-add-store of dW
// per patch row and output. The even and odd columns j use separate registers, so consecutive
// outputs do not wait on each other's multiply-adds.
typedef float f32x8 __attribute__((vector_size(32)));

// Average pooling (AVG) takes every element of every window, its dy/4 multiplied by its ReLU bit (0 or 1)
// rather than branching on the bit: about half the elements pass, at random, so such a branch would be
// mispredicted about half the time.
template <int KH, bool AVG, typename scalar_t>
void weight_grad_f32(const scalar_t* grad, const int64_t* gs, const uint8_t* code, const float* xpad,
                     float* dw, float* db8, const Geometry& g) {
  for (int64_t o = 0; o < g.O; ++o)
    for (int64_t c = 0; c < g.C; ++c) {
      f32x8 even[KH] = {}, odd[KH] = {};
      for (int64_t i = 0; i < g.OH; ++i)
        for (int64_t j = 0; j < g.OW; ++j) {
          const unsigned k = code[(o * g.OH + i) * g.OW + j];
          if (!AVG && (k & kCut)) continue;
          const float gv = static_cast<float>(grad[o * gs[1] + i * gs[2] + j * gs[3]]) * (AVG ? 0.25f : 1.0f);
          if (c == 0) db8[o * 8 + (j & 7)] += AVG ? gv * static_cast<float>(__builtin_popcount(k)) : gv;
          f32x8* acc = (j & 1) ? odd : even;
          for (int e = 0; e < (AVG ? 4 : 1); ++e) {
            const unsigned pos = AVG ? unsigned(e) : (k & 3u);   // the window element: 2r + s
            const float ge = AVG ? gv * static_cast<float>((k >> e) & 1u) : gv;
            const f32x8 gvec = {ge, ge, ge, ge, ge, ge, ge, ge};
            const float* row = xpad + (c * g.XH + 2 * i + (pos >> 1)) * g.XW + 2 * j + (pos & 1);
            for (int p = 0; p < KH; ++p) {
              f32x8 xv;
              std::memcpy(&xv, row + p * g.XW, sizeof(xv));   // an unaligned 8-float load
              acc[p] += gvec * xv;
            }
          }
        }
      for (int p = 0; p < KH; ++p) {
        const f32x8 sum = even[p] + odd[p];
        float* d = dw + ((o * g.C + c) * g.KH + p) * 8;
        for (int q = 0; q < 8; ++q) d[q] += sum[q];
      }
    }
}

// dW of a sample with an inf or NaN input, summed over every conv position as ATen's weight
// gradient does: there a zero gradient times an infinite input is NaN, and the sparse sum (which
// never visits the zeros) would report a finite number where ATen reports NaN. Rare; scalar.
template <typename acc_t>
void dense_weight_grad(const acc_t* G, const acc_t* xpad, acc_t* dw, const Geometry& g) {
  for (int64_t o = 0; o < g.O; ++o)
    for (int64_t c = 0; c < g.C; ++c)
      for (int64_t p = 0; p < g.KH; ++p)
        for (int64_t q = 0; q < g.KW; ++q) {
          acc_t s = 0;
          for (int64_t h = 0; h < g.CH; ++h)
            for (int64_t w = 0; w < g.CW; ++w)
              s += G[(o * g.CH + h) * g.RW + w] * xpad[(c * g.XH + h + p) * g.XW + w + q];
          dw[((o * g.C + c) * g.KH + p) * g.KWP + q] += s;
        }
}

// Calls body(OB, V, o0) for output channels in blocks of OB = 4, then 2, then 1, with OB and the
// row's vector count V (1..kMaxV) as compile-time constants, so the accumulators are registers.
constexpr int64_t kMaxV = 4;
template <typename Body>
inline void for_channel_blocks(int64_t O, int64_t V, Body&& body) {
  auto with_v = [&](auto ob, int64_t o) {
    switch (V) {
      case 1: body(ob, std::integral_constant<int, 1>{}, o); break;
      case 2: body(ob, std::integral_constant<int, 2>{}, o); break;
      case 3: body(ob, std::integral_constant<int, 3>{}, o); break;
      default: body(ob, std::integral_constant<int, 4>{}, o); break;
    }
  };
  int64_t o = 0;
  for (; o + 4 <= O; o += 4) with_v(std::integral_constant<int, 4>{}, o);
  for (; o + 2 <= O; o += 2) with_v(std::integral_constant<int, 2>{}, o);
  for (; o < O; ++o) with_v(std::integral_constant<int, 1>{}, o);
}

// Pool two conv rows 2x2 and rectify: pooled[j] and code[j] for j < n. ATen's max_pool2d scans a
// window (0,0), (0,1), (1,0), (1,1) and takes an element when it is > the running max or NaN (so
// the first maximum wins, and NaN wins over numbers). Written without branches, with the window
// position as an integer as wide as acc_t (a byte would make the vector 64 lanes wide, longer
// than the row, and leave everything to the scalar epilogue), so the compiler vectorizes it with
// stride-2 loads: the branchy scalar version cost more than the convolution.
template <typename acc_t, typename index_t = std::conditional_t<sizeof(acc_t) == 8, int64_t, int32_t>>
inline void pool_relu_rows(const acc_t* __restrict a0, const acc_t* __restrict a1, int64_t n,
                           acc_t* __restrict pooled, index_t* __restrict code) {
  for (int64_t j = 0; j < n; ++j) {
    acc_t best = a0[2 * j];
    index_t k = 0;
    const acc_t v1 = a0[2 * j + 1], v2 = a1[2 * j], v3 = a1[2 * j + 1];
    const bool t1 = v1 > best || v1 != v1;
    best = t1 ? v1 : best; k = t1 ? 1 : k;
    const bool t2 = v2 > best || v2 != v2;
    best = t2 ? v2 : best; k = t2 ? 2 : k;
    const bool t3 = v3 > best || v3 != v3;
    best = t3 ? v3 : best; k = t3 ? 3 : k;
    const bool pass = !(best <= acc_t(0));   // ATen's threshold_backward passes a NaN's gradient
    pooled[j] = pass ? best : acc_t(0);
    code[j] = pass ? k : (k | kCut);
  }
}

// Average pooling: rectify the four, sum them in ATen's order (0,0), (0,1), (1,0), (1,1), divide by 4;
// code[j] has bit k set when element k's ReLU passed (NaN passes, as in threshold_backward).
template <typename acc_t, typename index_t = std::conditional_t<sizeof(acc_t) == 8, int64_t, int32_t>>
inline void relu_avg_rows(const acc_t* __restrict a0, const acc_t* __restrict a1, int64_t n,
                          acc_t* __restrict pooled, index_t* __restrict code) {
  // written out and without branches like pool_relu_rows, so that it vectorizes (a loop over the four
  // elements did not, and made the forward 2.9x as long as max-pooling's)
  for (int64_t j = 0; j < n; ++j) {
    const acc_t v0 = a0[2 * j], v1 = a0[2 * j + 1], v2 = a1[2 * j], v3 = a1[2 * j + 1];
    const bool p0 = !(v0 <= acc_t(0)), p1 = !(v1 <= acc_t(0)), p2 = !(v2 <= acc_t(0)), p3 = !(v3 <= acc_t(0));
    const acc_t r0 = p0 ? v0 : acc_t(0), r1 = p1 ? v1 : acc_t(0), r2 = p2 ? v2 : acc_t(0), r3 = p3 ? v3 : acc_t(0);
    pooled[j] = (((r0 + r1) + r2) + r3) * acc_t(0.25);   // exact: the same as / 4
    code[j] = (p0 ? index_t(1) : index_t(0)) | (p1 ? index_t(2) : index_t(0)) | (p2 ? index_t(4) : index_t(0)) |
              (p3 ? index_t(8) : index_t(0));
  }
}

template <typename scalar_t>
void forward_kernel(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                    at::Tensor& out, at::Tensor& code, const Geometry& g, bool avg) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t taps = g.C * g.KH * g.KW;
  std::vector<acc_t> wf(g.O * taps), bf(g.O, acc_t(0));
  const at::Tensor wc = weight.contiguous();
  const scalar_t* wp = wc.data_ptr<scalar_t>();
  for (int64_t i = 0; i < g.O * taps; ++i) wf[i] = static_cast<acc_t>(wp[i]);
  if (bias.has_value() && bias->defined()) {
    const at::Tensor bc = bias->contiguous();
    for (int64_t o = 0; o < g.O; ++o) bf[o] = static_cast<acc_t>(bc.data_ptr<scalar_t>()[o]);
  }
  const scalar_t* xp = x.data_ptr<scalar_t>();
  scalar_t* op = out.data_ptr<scalar_t>();
  uint8_t* cp = code.data_ptr<uint8_t>();
  const int64_t xs[4] = {x.stride(0), x.stride(1), x.stride(2), x.stride(3)};
  const int64_t os[4] = {out.stride(0), out.stride(1), out.stride(2), out.stride(3)};
  const int64_t grain = 4;   // a sample is ~10^5 multiply-adds for LeNet's conv1: a few per task
  const int64_t V = g.RW / at::vec::Vectorized<acc_t>::size();

  at::parallel_for(0, g.N, grain, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> xpad(g.C * g.XH * g.XW), acc(2 * g.O * g.RW), pooled(g.RW / 2);
    std::vector<std::conditional_t<sizeof(acc_t) == 8, int64_t, int32_t>> codes(g.RW / 2);   // as wide as acc_t: one vector width for the loop
    for (int64_t n = begin; n < end; ++n) {
      pad_sample(xp + n * xs[0], xs, xpad.data(), g);
      for (int64_t i = 0; i < g.OH; ++i) {
        // the two conv rows under pooled row i, for every output channel
        for (int64_t r = 0; r < 2; ++r) {
          if (V <= kMaxV) {
            for_channel_blocks(g.O, V, [&](auto ob, auto v, int64_t o0) {
              conv_row_block<decltype(ob)::value, decltype(v)::value>(xpad.data(), wf.data(), bf.data(),
                                                                        acc.data() + r * g.O * g.RW, o0, 2 * i + r, g);
            });
            continue;
          }
          for (int64_t o = 0; o < g.O; ++o) std::fill_n(acc.data() + (r * g.O + o) * g.RW, g.RW, bf[o]);
          for (int64_t c = 0; c < g.C; ++c)
            for (int64_t p = 0; p < g.KH; ++p) {
              const acc_t* row = xpad.data() + (c * g.XH + 2 * i + r + p) * g.XW;
              for (int64_t o = 0; o < g.O; ++o)
                for (int64_t q = 0; q < g.KW; ++q)
                  axpy_row(acc.data() + (r * g.O + o) * g.RW, row + q, wf[((o * g.C + c) * g.KH + p) * g.KW + q], g.RW);
            }
        }
        for (int64_t o = 0; o < g.O; ++o) {
          const acc_t* a0 = acc.data() + o * g.RW;
          const acc_t* a1 = a0 + g.O * g.RW;
          scalar_t* orow = op + n * os[0] + o * os[1] + i * os[2];
          uint8_t* crow = cp + ((n * g.O + o) * g.OH + i) * g.OW;
          // all RW/2 windows of the computed rows (whole vectors; the ones past OW read the spare
          // columns and are dropped): a 14-iteration loop would run entirely in the scalar epilogue
          if (avg)
            relu_avg_rows(a0, a1, g.RW / 2, pooled.data(), codes.data());
          else
            pool_relu_rows(a0, a1, g.RW / 2, pooled.data(), codes.data());
          for (int64_t j = 0; j < g.OW; ++j) orow[j * os[3]] = static_cast<scalar_t>(pooled[j]);
          for (int64_t j = 0; j < g.OW; ++j) crow[j] = static_cast<uint8_t>(codes[j]);
        }
      }
    }
  });
}

// G[o][h][w] for one sample: the pooled gradient at each window's winner (avg: a quarter of it at every
// element whose ReLU passed), zero elsewhere.
template <typename scalar_t, typename acc_t>
void dense_grad(const scalar_t* grad, const int64_t* gs, const uint8_t* code, acc_t* G, const Geometry& g, bool avg) {
  std::fill(G, G + g.O * g.CH * g.RW, acc_t(0));
  const acc_t share = avg ? acc_t(0.25) : acc_t(1);
  int pos[4];
  for (int64_t o = 0; o < g.O; ++o)
    for (int64_t i = 0; i < g.OH; ++i)
      for (int64_t j = 0; j < g.OW; ++j) {
        const int n = routed(code[(o * g.OH + i) * g.OW + j], avg, pos);
        for (int e = 0; e < n; ++e)
          G[(o * g.CH + 2 * i + (pos[e] >> 1)) * g.RW + 2 * j + (pos[e] & 1)] =
              static_cast<acc_t>(grad[o * gs[1] + i * gs[2] + j * gs[3]]) * share;
      }
}

template <typename scalar_t>
std::tuple<at::Tensor, at::Tensor> backward_weight_kernel(const at::Tensor& grad, const at::Tensor& code,
                                                          const at::Tensor& x, const at::Tensor& weight,
                                                          const Geometry& g, bool has_bias, bool avg) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t rows = g.O * g.C * g.KH;                 // dW as rows of KWP taps
  const int64_t chunks = (g.N + kChunk - 1) / kChunk;
  std::vector<acc_t> partial_w(chunks * rows * g.KWP, acc_t(0)), partial_b(chunks * g.O * 8, acc_t(0));
  const scalar_t* xp = x.data_ptr<scalar_t>();
  const scalar_t* gp = grad.data_ptr<scalar_t>();
  const uint8_t* cp = code.data_ptr<uint8_t>();
  const int64_t xs[4] = {x.stride(0), x.stride(1), x.stride(2), x.stride(3)};
  const int64_t gs[4] = {grad.stride(0), grad.stride(1), grad.stride(2), grad.stride(3)};

  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> xpad(g.C * g.XH * g.XW), G;
    for (int64_t ch = begin; ch < end; ++ch) {
      acc_t* dw = partial_w.data() + ch * rows * g.KWP;
      acc_t* db8 = partial_b.data() + ch * g.O * 8;
      for (int64_t n = ch * kChunk; n < std::min(g.N, (ch + 1) * kChunk); ++n) {
        const bool finite = pad_sample(xp + n * xs[0], xs, xpad.data(), g);
        const scalar_t* gn = gp + n * gs[0];
        const uint8_t* cn = cp + n * g.O * g.OH * g.OW;
        if (!finite) {
          G.resize(g.O * g.CH * g.RW);
          dense_grad(gn, gs, cn, G.data(), g, avg);
          dense_weight_grad(G.data(), xpad.data(), dw, g);
          for (int64_t o = 0; o < g.O; ++o)
            for (int64_t t = 0; t < g.CH * g.RW; ++t) db8[o * 8] += G[o * g.CH * g.RW + t];
          continue;
        }
        if constexpr (std::is_same_v<acc_t, float>) {
          if (g.KWP == 8 && g.KH == 5) {   // LeNet's 5x5 (the kernels of other heights take the general path)
            if (avg)
              weight_grad_f32<5, true>(gn, gs, cn, xpad.data(), dw, db8, g);
            else
              weight_grad_f32<5, false>(gn, gs, cn, xpad.data(), dw, db8, g);
            continue;
          }
        }
        switch (g.KWP) {
          case 8: sparse_weight_grad<8>(gn, gs, cn, xpad.data(), dw, db8, g, avg); break;
          case 16: sparse_weight_grad<16>(gn, gs, cn, xpad.data(), dw, db8, g, avg); break;
          default: TORCH_CHECK(false, "conv_relu_pool2d_bwd_weight: kernels wider than 16 are not supported");
        }
      }
    }
  });
  // chunks in order: the same sums whatever thread ran which chunk
  at::Tensor dweight = at::zeros({g.O, g.C, g.KH, g.KW}, weight.options().dtype(c10::CppTypeToScalarType<acc_t>::value));
  at::Tensor dbias = at::zeros({has_bias ? g.O : 0}, dweight.options());
  acc_t* dwp = dweight.data_ptr<acc_t>();
  acc_t* dbp = dbias.data_ptr<acc_t>();
  for (int64_t ch = 0; ch < chunks; ++ch) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t q = 0; q < g.KW; ++q) dwp[r * g.KW + q] += partial_w[(ch * rows + r) * g.KWP + q];
    if (has_bias)
      for (int64_t o = 0; o < g.O; ++o)
        for (int t = 0; t < 8; ++t) dbp[o] += partial_b[(ch * g.O + o) * 8 + t];
  }
  return {dweight.to(weight.scalar_type()), dbias.to(weight.scalar_type())};
}

template <typename scalar_t>
at::Tensor backward_input_kernel(const at::Tensor& grad, const at::Tensor& code, const at::Tensor& weight,
                                 const Geometry& g, const at::TensorOptions& options, bool avg) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t taps = g.C * g.KH * g.KW;
  std::vector<acc_t> wf(g.O * taps);
  const at::Tensor wc = weight.contiguous();
  for (int64_t i = 0; i < g.O * taps; ++i) wf[i] = static_cast<acc_t>(wc.data_ptr<scalar_t>()[i]);
  at::Tensor dx = at::empty({g.N, g.C, g.H, g.W}, options);
  const scalar_t* gp = grad.data_ptr<scalar_t>();
  const uint8_t* cp = code.data_ptr<uint8_t>();
  scalar_t* dp = dx.data_ptr<scalar_t>();
  const int64_t gs[4] = {grad.stride(0), grad.stride(1), grad.stride(2), grad.stride(3)};

  at::parallel_for(0, g.N, 1, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> G(g.O * g.CH * g.RW), dxpad(g.C * g.XH * g.XW);
    for (int64_t n = begin; n < end; ++n) {
      dense_grad(gp + n * gs[0], gs, cp + n * g.O * g.OH * g.OW, G.data(), g, avg);
      std::fill(dxpad.begin(), dxpad.end(), acc_t(0));
      for (int64_t h = 0; h < 2 * g.OH; ++h)
        for (int64_t c = 0; c < g.C; ++c)
          for (int64_t p = 0; p < g.KH; ++p) {
            acc_t* row = dxpad.data() + (c * g.XH + h + p) * g.XW;
            for (int64_t o = 0; o < g.O; ++o) {
              const acc_t* grow = G.data() + (o * g.CH + h) * g.RW;
              for (int64_t q = 0; q < g.KW; ++q)
                axpy_row(row + q, grow, wf[((o * g.C + c) * g.KH + p) * g.KW + q], g.RW);
            }
          }
      for (int64_t c = 0; c < g.C; ++c)
        for (int64_t h = 0; h < g.H; ++h)
          for (int64_t w = 0; w < g.W; ++w)
            dp[((n * g.C + c) * g.H + h) * g.W + w] =
                static_cast<scalar_t>(dxpad[(c * g.XH + h + g.PH) * g.XW + w + g.PW]);
    }
  });
  return dx;
}

// The output layout follows ATen's convolution: channels-last when the input or the weight is. A
// 4-D tensor is taken as channels-last when its channel stride is 1 (for one channel, as LeNet's
// input has, that is the only mark a channels-last layout leaves). The Python fake kernel applies
// the same rule (ops/layer_args.py).
bool unit_channel_stride(const at::Tensor& t) { return t.stride(1) == 1 && t.size(2) * t.size(3) > 1; }
bool wants_channels_last(const at::Tensor& x, const at::Tensor& w) { return unit_channel_stride(x) || unit_channel_stride(w); }

std::tuple<at::Tensor, at::Tensor> conv_relu_pool2d_fwd(const at::Tensor& x, const at::Tensor& weight,
                                                         const c10::optional<at::Tensor>& bias, at::IntArrayRef padding,
                                                         bool avg) {
  const Geometry g = geometry("conv_relu_pool2d_fwd", x, weight, padding);
  auto format = wants_channels_last(x, weight) ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  at::Tensor out = at::empty({g.N, g.O, g.OH, g.OW}, x.options().memory_format(format));
  at::Tensor code = at::empty({g.N, g.O, g.OH, g.OW}, x.options().dtype(at::kByte));
  if (g.N == 0) return {out, code};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "trainlab_conv_relu_pool2d_fwd", [&] {
    forward_kernel<scalar_t>(x, weight, bias, out, code, g, avg);
  });
  return {out, code};
}

std::tuple<at::Tensor, at::Tensor> conv_relu_pool2d_bwd_weight(const at::Tensor& grad, const at::Tensor& code,
                                                                const at::Tensor& x, const at::Tensor& weight,
                                                                at::IntArrayRef padding, bool has_bias, bool avg) {
  const Geometry g = geometry("conv_relu_pool2d_bwd_weight", x, weight, padding);
  TORCH_CHECK(grad.sizes() == code.sizes() && grad.size(0) == g.N && grad.size(1) == g.O && grad.size(2) == g.OH &&
              grad.size(3) == g.OW, "conv_relu_pool2d_bwd_weight: grad/code do not match the forward's output shape");
  std::tuple<at::Tensor, at::Tensor> result;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "trainlab_conv_relu_pool2d_bwd_weight", [&] {
    result = backward_weight_kernel<scalar_t>(grad.to(x.scalar_type()), code.contiguous(), x, weight, g, has_bias, avg);
  });
  return result;
}

at::Tensor conv_relu_pool2d_bwd_input(const at::Tensor& grad, const at::Tensor& code, const at::Tensor& weight,
                                      c10::SymIntArrayRef input_hw, at::IntArrayRef padding, bool avg) {
  TORCH_CHECK(input_hw.size() == 2, "conv_relu_pool2d_bwd_input: input_hw must have two entries");
  const at::Tensor shape_of_x = at::empty({grad.size(0), weight.size(1), input_hw[0].expect_int(), input_hw[1].expect_int()},
                                          grad.options().device(at::kMeta));
  const Geometry g = geometry("conv_relu_pool2d_bwd_input", shape_of_x, weight, padding);
  at::Tensor dx;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, weight.scalar_type(), "trainlab_conv_relu_pool2d_bwd_input", [&] {
    dx = backward_input_kernel<scalar_t>(grad.to(weight.scalar_type()), code.contiguous(), weight, g, weight.options(), avg);
  });
  return dx;
}

}  // namespace trainlab_fused

TORCH_LIBRARY_FRAGMENT(trainlab, m) {
  m.def("conv_relu_pool2d_fwd(Tensor x, Tensor weight, Tensor? bias, int[2] padding, bool avg=False) -> (Tensor, Tensor)");
  m.def("conv_relu_pool2d_bwd_weight(Tensor grad, Tensor code, Tensor x, Tensor weight, int[2] padding, "
        "bool bias, bool avg=False) -> (Tensor, Tensor)");
  m.def("conv_relu_pool2d_bwd_input(Tensor grad, Tensor code, Tensor weight, SymInt[2] input_hw, "
        "int[2] padding, bool avg=False) -> Tensor");
}

TORCH_LIBRARY_IMPL(trainlab, CPU, m) {
  m.impl("conv_relu_pool2d_fwd", &trainlab_fused::conv_relu_pool2d_fwd);
  m.impl("conv_relu_pool2d_bwd_weight", &trainlab_fused::conv_relu_pool2d_bwd_weight);
  m.impl("conv_relu_pool2d_bwd_input", &trainlab_fused::conv_relu_pool2d_bwd_input);
}
