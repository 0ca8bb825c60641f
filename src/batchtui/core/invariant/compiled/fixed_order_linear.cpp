// A linear layer's rows, each summed in one fixed order whatever else shares the call (the CPU kernel of batchtui's
// `fixed_order_linear`).
//
// Output (r, n) is bias[n] + the sum over k of x[r, k] * w[n, k]: in spans of kSpan terms, each taken k after k as
// one fused multiply-add after another from +0 and added to the total in order; the same operations for every row,
// whatever the call's height, the row's place in it, the thread that computes it or the thread count. Each thread
// copies the weight's blocks of kCols outputs it takes transposed ([K][kCols], zeros past N) once a call, so that a
// row's outputs are independent sums side by side in the vector lanes (every lane the same fused operation: no
// scalar tail rounds otherwise); the weight is read as it is at the call, never kept. float32 only,
// for weights the caches hold (a small model's layers), where a GEMM library's call costs more than its arithmetic
// and keeps a row's bits only from a measured height (a bfloat16 GEMM's dot-product instructions outrun it there).

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

using torch::stable::Tensor;

namespace {

// One vector register of float32 lanes, and the four operations the sums take, each one IEEE operation per lane:
// a fused multiply-add is rounded once whatever the machine, so the three ways give every lane the same bits.
#if defined(__AVX512F__)
using Vec = __m512;
constexpr int64_t kWidth = 16;
inline Vec zero() { return _mm512_setzero_ps(); }
inline Vec broadcast(float x) { return _mm512_set1_ps(x); }
inline Vec load(const float* p) { return _mm512_loadu_ps(p); }
inline void store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline Vec fmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
#elif defined(__AVX2__) && defined(__FMA__)
using Vec = __m256;
constexpr int64_t kWidth = 8;
inline Vec zero() { return _mm256_setzero_ps(); }
inline Vec broadcast(float x) { return _mm256_set1_ps(x); }
inline Vec load(const float* p) { return _mm256_loadu_ps(p); }
inline void store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline Vec fmadd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
#else
constexpr int64_t kWidth = 8;
struct Vec {
  float lane[kWidth];
};
inline Vec zero() { return Vec{}; }
inline Vec broadcast(float x) {
  Vec v;
  std::fill(v.lane, v.lane + kWidth, x);
  return v;
}
inline Vec load(const float* p) {
  Vec v;
  std::copy(p, p + kWidth, v.lane);
  return v;
}
inline void store(float* p, Vec v) { std::copy(v.lane, v.lane + kWidth, p); }
inline Vec fmadd(Vec a, Vec b, Vec c) {
  for (int64_t l = 0; l < kWidth; ++l) c.lane[l] = std::fma(a.lane[l], b.lane[l], c.lane[l]);
  return c;
}
inline Vec add(Vec a, Vec b) {
  for (int64_t l = 0; l < kWidth; ++l) a.lane[l] += b.lane[l];
  return a;
}
#endif

// Outputs a block's rows take side by side: two registers, so that a block's sums (kRows x 2 registers) stay in the
// registers (16 of AVX2's, 32 of AVX-512's). The blocking changes no sum: each is one row's, in one order.
constexpr int64_t kCols = 2 * kWidth;
constexpr int64_t kRows = 6;  // rows a block takes at once: each weight block loaded once for them all
constexpr int64_t kChunkRows = 48;  // rows a task takes
// A row's sum is taken in spans of kSpan terms, each summed from +0 and added to the total in order: the rounding
// error of a long sum grows with the terms summed one after another, so a span keeps it to a GEMM library's.
constexpr int64_t kSpan = 64;

struct Call {
  const float* x;
  int64_t x_stride;      // from a row to the next, in elements
  const float* weight;   // [n][k], rows contiguous
  int64_t w_stride;
  const float* bias;     // nullptr where none
  float* out;            // [m][n], contiguous
  int64_t m, n, k;
};

#if defined(__AVX__)
// Eight rows of eight floats (rows[l] + k0, l = 0..7) written transposed: column k0 + i's eight values at out + i *
// kCols, in registers (unpack, shuffle, permute: 24 instructions for 64 values).
inline void transpose8(const float* const* rows, int64_t k0, float* out) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(rows[i] + k0);
  for (int i = 0; i < 8; i += 2) t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]), t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  for (int i = 0; i < 8; i += 4) {
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(out + i * kCols, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
    _mm256_storeu_ps(out + (i + 4) * kCols, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
  }
}
#endif

// Outputs n0 .. n0+kCols-1 of the weight transposed into `column` ([k][kCols]), zeros past the last output: blocks
// of eight outputs by eight terms through registers where the machine has them, the rest one value at a time.
void transpose_block(const Call& c, int64_t n0, float* column) {
  const int64_t real = std::min(kCols, c.n - n0);
  const float* rows[kCols];
  for (int64_t l = 0; l < real; ++l) rows[l] = c.weight + (n0 + l) * c.w_stride;
  int64_t done = 0;  // terms transposed through registers, for every output
#if defined(__AVX__)
  if (real == kCols) {
    done = c.k - c.k % 8;
    for (int64_t l = 0; l < kCols; l += 8)
      for (int64_t k0 = 0; k0 < done; k0 += 8) transpose8(rows + l, k0, column + k0 * kCols + l);
  }
#endif
  for (int64_t k = done; k < c.k; ++k) {
    for (int64_t l = 0; l < real; ++l) column[k * kCols + l] = rows[l][k];
    std::fill(column + k * kCols + real, column + (k + 1) * kCols, 0.0f);
  }
}

// Rows r0 .. r0+R-1 times outputs n0 .. n0+kCols-1 (`column`: theirs, transposed).
template <int64_t R>
void block(const Call& c, int64_t r0, int64_t n0, const float* column) {
  Vec total[R][2], acc[R][2];
  for (int64_t r = 0; r < R; ++r) total[r][0] = total[r][1] = zero();
  const float* rows = c.x + r0 * c.x_stride;
  for (int64_t k0 = 0; k0 < c.k; k0 += kSpan) {
    for (int64_t r = 0; r < R; ++r) acc[r][0] = acc[r][1] = zero();
    for (int64_t k = k0; k < std::min(c.k, k0 + kSpan); ++k) {
      const Vec w0 = load(column + k * kCols), w1 = load(column + k * kCols + kWidth);
      for (int64_t r = 0; r < R; ++r) {
        const Vec xv = broadcast(rows[r * c.x_stride + k]);
        acc[r][0] = fmadd(xv, w0, acc[r][0]);
        acc[r][1] = fmadd(xv, w1, acc[r][1]);
      }
    }
    for (int64_t r = 0; r < R; ++r) total[r][0] = add(total[r][0], acc[r][0]), total[r][1] = add(total[r][1], acc[r][1]);
  }
  const int64_t real = std::min(kCols, c.n - n0);
  for (int64_t r = 0; r < R; ++r) {
    float sums[kCols];
    store(sums, total[r][0]);
    store(sums + kWidth, total[r][1]);
    float* out = c.out + (r0 + r) * c.n + n0;
    for (int64_t l = 0; l < real; ++l) out[l] = c.bias ? sums[l] + c.bias[n0 + l] : sums[l];
  }
}

// The rows from r0 (at most kRows) times outputs n0 .. n0+kCols-1, through the block of their count.
void rows_times_block(const Call& c, int64_t r0, int64_t count, int64_t n0, const float* column) {
  static_assert(kRows == 6, "the counts below");
  switch (count) {
    case 1: block<1>(c, r0, n0, column); break;
    case 2: block<2>(c, r0, n0, column); break;
    case 3: block<3>(c, r0, n0, column); break;
    case 4: block<4>(c, r0, n0, column); break;
    case 5: block<5>(c, r0, n0, column); break;
    default: block<6>(c, r0, n0, column); break;
  }
}

void linear_all(const Call& c, int64_t threads) {
  const int64_t chunks = (c.m + kChunkRows - 1) / kChunkRows, blocks = (c.n + kCols - 1) / kCols;
  // Threads split the outputs first (an even split whatever the rows: a short last chunk of rows is every
  // thread's, and a thread transposes each of its blocks once); which thread takes which rows changes nothing in any
  // row: a row's sums are one thread's, in one order.
#pragma omp parallel num_threads(threads) if ((c.m + 1) * c.n * c.k > (1 << 16))
  {
    std::vector<float> column(c.k * kCols);
    int64_t transposed = -1;
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < blocks; ++b)
      for (int64_t chunk = 0; chunk < chunks; ++chunk) {
        if (b != transposed) transpose_block(c, b * kCols, column.data()), transposed = b;
        const int64_t end = std::min(c.m, (chunk + 1) * kChunkRows);
        for (int64_t r0 = chunk * kChunkRows; r0 < end; r0 += kRows)
          rows_times_block(c, r0, std::min(kRows, end - r0), b * kCols, column.data());
      }
  }
}

// x [m, k] and weight [n, k] (each row contiguous, rows of any stride) and bias ([n] or empty), all
// float32; writes out ([m, n], contiguous, float32) and returns it.
Tensor fixed_order_linear(Tensor x, Tensor weight, Tensor bias, int64_t threads, Tensor out) {
  using torch::headeronly::ScalarType;
  const auto is_float = [](const Tensor& t) { return t.scalar_type() == ScalarType::Float; };
  STD_TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && out.dim() == 2 && is_float(x) && is_float(weight) &&
                      is_float(out) && (bias.numel() == 0 || is_float(bias)),
                  "fixed_order_linear: 2-d float32 tensors expected");
  const int64_t m = x.sizes()[0], k = x.sizes()[1], n = weight.sizes()[0];
  STD_TORCH_CHECK(weight.sizes()[1] == k && (k <= 1 || weight.strides()[1] == 1) &&
                      (bias.numel() == 0 || (bias.numel() == n && bias.is_contiguous())),
                  "fixed_order_linear: weight [n, k] (rows contiguous) and bias [n] expected");
  STD_TORCH_CHECK(out.is_contiguous() && out.sizes()[0] == m && out.sizes()[1] == n &&
                      (m == 0 || k == 0 || x.strides()[1] == 1),
                  "fixed_order_linear: out [m, n] contiguous, x's rows contiguous expected");
  const Call c{static_cast<const float*>(x.data_ptr()),
               m > 1 ? x.strides()[0] : k,
               static_cast<const float*>(weight.data_ptr()),
               weight.strides()[0],
               bias.numel() > 0 ? static_cast<const float*>(bias.data_ptr()) : nullptr,
               static_cast<float*>(out.mutable_data_ptr()),
               m, n, k};
  linear_all(c, threads);
  return out;
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(batchtui, m) {
  m.def("fixed_order_linear(Tensor x, Tensor weight, Tensor bias, int threads, Tensor(a!) out) -> Tensor(a!)");
}

STABLE_TORCH_LIBRARY_IMPL(batchtui, CPU, m) { m.impl("fixed_order_linear", TORCH_BOX(&fixed_order_linear)); }
