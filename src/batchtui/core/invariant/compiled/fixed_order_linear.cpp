// A linear layer's rows, each summed in one fixed order whatever else shares the call (the CPU kernel of batchtui's
// `fixed_order_linear`).
//
// Output (r, n) is bias[n] + the sum over k of x[r, k] * w[n, k]: in spans of kSpan terms, each taken in order from
// +0 and added to the total in order; the same operations for every row, whatever the call's height, the row's place
// in it, the thread that computes it or the thread count. Each thread copies the weight's blocks of kCols outputs it
// takes transposed (zeros past N) once a call, so that a row's outputs are independent sums side by side in the
// vector lanes (every lane the same fused operation: no scalar tail rounds otherwise); the weight is read as it is at
// the call, never kept. float32: one fused multiply-add a term. bfloat16 where the CPU has its dot-product instruction
// (avx512_bf16): a pair of terms an instruction (both products exact in float32, added to the lane one after the
// other, as the instruction defines); elsewhere converted to float32 and summed as float32 is. Made for weights the
// caches hold (a small model's layers), where a GEMM library's call costs more than its arithmetic and keeps a row's
// bits only from a measured height.

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/util/BFloat16.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
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

using BFloat16 = c10::BFloat16;

template <typename T>
struct Call {
  const T* x;
  int64_t x_stride;  // from a row to the next, in elements
  const T* weight;   // [n][k], rows contiguous
  int64_t w_stride;
  const T* bias;     // nullptr where none
  T* out;            // [m][n], contiguous
  int64_t m, n, k;
};

// Output (r, n0 + l) for l < the block's real outputs, from the block's sums (kCols of them) and the bias.
template <typename T>
void write_row(const Call<T>& c, int64_t r, int64_t n0, const float* sums) {
  const int64_t real = std::min(kCols, c.n - n0);
  T* out = c.out + r * c.n + n0;
  for (int64_t l = 0; l < real; ++l) out[l] = T(c.bias ? sums[l] + float(c.bias[n0 + l]) : sums[l]);
}

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

// Outputs n0 .. n0+kCols-1 of the weight transposed into `column` ([k][kCols] float32), zeros past the last output:
// blocks of eight outputs by eight terms through registers where the machine has them, the rest one value at a time.
// A bfloat16 weight's rows are converted into `staging` first ([kCols][k]).
template <typename T>
void transpose_block(const Call<T>& c, int64_t n0, float* column, float* staging) {
  const int64_t real = std::min(kCols, c.n - n0);
  const float* rows[kCols];
  for (int64_t l = 0; l < real; ++l) {
    const T* row = c.weight + (n0 + l) * c.w_stride;
    if constexpr (std::is_same_v<T, float>) {
      rows[l] = row;
    } else {
      for (int64_t k = 0; k < c.k; ++k) staging[l * c.k + k] = float(row[k]);
      rows[l] = staging + l * c.k;
    }
  }
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

// Rows r0 .. r0+R-1 times outputs n0 .. n0+kCols-1 (`column`: theirs, transposed, float32), one fused multiply-add a
// term.
template <typename T, int64_t R>
void block(const Call<T>& c, int64_t r0, int64_t n0, const float* column) {
  Vec total[R][2], acc[R][2];
  for (int64_t r = 0; r < R; ++r) total[r][0] = total[r][1] = zero();
  const T* rows = c.x + r0 * c.x_stride;
  for (int64_t k0 = 0; k0 < c.k; k0 += kSpan) {
    for (int64_t r = 0; r < R; ++r) acc[r][0] = acc[r][1] = zero();
    for (int64_t k = k0; k < std::min(c.k, k0 + kSpan); ++k) {
      const Vec w0 = load(column + k * kCols), w1 = load(column + k * kCols + kWidth);
      for (int64_t r = 0; r < R; ++r) {
        const Vec xv = broadcast(float(rows[r * c.x_stride + k]));
        acc[r][0] = fmadd(xv, w0, acc[r][0]);
        acc[r][1] = fmadd(xv, w1, acc[r][1]);
      }
    }
    for (int64_t r = 0; r < R; ++r) total[r][0] = add(total[r][0], acc[r][0]), total[r][1] = add(total[r][1], acc[r][1]);
  }
  for (int64_t r = 0; r < R; ++r) {
    float sums[kCols];
    store(sums, total[r][0]);
    store(sums + kWidth, total[r][1]);
    write_row(c, r0 + r, n0, sums);
  }
}

#if defined(__AVX512BF16__)
// bfloat16 by pairs of terms: a pair's two values as one 32-bit word (the first in its low half), so that the weight's
// blocks are transposed as float32's are, pairs for terms: `column` [k/2 rounded up][kCols] words, the last pair's
// second half 0 where k is odd.
inline uint32_t pair_at(const BFloat16* row, int64_t p, int64_t k) {
  uint16_t low, high = 0;
  std::memcpy(&low, row + 2 * p, 2);
  if (2 * p + 1 < k) std::memcpy(&high, row + 2 * p + 1, 2);
  return uint32_t(low) | (uint32_t(high) << 16);
}

void transpose_pairs(const Call<BFloat16>& c, int64_t n0, float* column) {
  const int64_t real = std::min(kCols, c.n - n0), pairs = (c.k + 1) / 2, whole = c.k / 2 - c.k / 2 % 8;
  const float* rows[kCols];  // each row's pairs read as 32-bit words (unaligned loads)
  for (int64_t l = 0; l < real; ++l) rows[l] = reinterpret_cast<const float*>(c.weight + (n0 + l) * c.w_stride);
  int64_t done = 0;
  if (real == kCols) {
    done = whole;
    for (int64_t l = 0; l < kCols; l += 8)
      for (int64_t p0 = 0; p0 < done; p0 += 8) transpose8(rows + l, p0, column + p0 * kCols + l);
  }
  for (int64_t p = done; p < pairs; ++p) {
    for (int64_t l = 0; l < real; ++l) {
      const uint32_t word = pair_at(c.weight + (n0 + l) * c.w_stride, p, c.k);
      std::memcpy(column + p * kCols + l, &word, 4);
    }
    std::fill(column + p * kCols + real, column + (p + 1) * kCols, 0.0f);
  }
}

template <int64_t R>
void block_pairs(const Call<BFloat16>& c, int64_t r0, int64_t n0, const float* column) {
  static_assert(kWidth == 16, "16 float32 lanes a register");
  __m512 total[R][2], acc[R][2];
  for (int64_t r = 0; r < R; ++r) total[r][0] = total[r][1] = _mm512_setzero_ps();
  const int64_t pairs = (c.k + 1) / 2;
  for (int64_t p0 = 0; p0 < pairs; p0 += kSpan / 2) {
    for (int64_t r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    const int64_t end = std::min(pairs, p0 + kSpan / 2);
    for (int64_t p = p0; p < end; ++p) {
      const __m512bh w0 = (__m512bh)_mm512_loadu_ps(column + p * kCols);
      const __m512bh w1 = (__m512bh)_mm512_loadu_ps(column + p * kCols + kWidth);
      const bool whole = 2 * p + 1 < c.k;  // (a last pair of one term, where k is odd: its second half 0)
      for (int64_t r = 0; r < R; ++r) {
        const BFloat16* x = c.x + (r0 + r) * c.x_stride + 2 * p;
        int32_t word;
        if (whole)
          std::memcpy(&word, x, 4);
        else
          word = int32_t(pair_at(x, 0, 1));
        const __m512bh xv = (__m512bh)_mm512_set1_epi32(word);
        acc[r][0] = _mm512_dpbf16_ps(acc[r][0], xv, w0);
        acc[r][1] = _mm512_dpbf16_ps(acc[r][1], xv, w1);
      }
    }
    for (int64_t r = 0; r < R; ++r)
      total[r][0] = _mm512_add_ps(total[r][0], acc[r][0]), total[r][1] = _mm512_add_ps(total[r][1], acc[r][1]);
  }
  for (int64_t r = 0; r < R; ++r) {
    float sums[kCols];
    _mm512_storeu_ps(sums, total[r][0]);
    _mm512_storeu_ps(sums + kWidth, total[r][1]);
    write_row(c, r0 + r, n0, sums);
  }
}
#endif

// Whether `T`'s sums go by pairs of terms here (bfloat16 on a CPU with its dot-product instruction).
template <typename T>
constexpr bool kByPairs =
#if defined(__AVX512BF16__)
    std::is_same_v<T, BFloat16>;
#else
    false;
#endif

// The rows from r0 (at most kRows) times outputs n0 .. n0+kCols-1, through the block of their count.
template <typename T, int64_t R>
void block_of(const Call<T>& c, int64_t r0, int64_t n0, const float* column) {
#if defined(__AVX512BF16__)
  if constexpr (kByPairs<T>) return block_pairs<R>(c, r0, n0, column);
#endif
  if constexpr (!kByPairs<T>) block<T, R>(c, r0, n0, column);
}

template <typename T>
void rows_times_block(const Call<T>& c, int64_t r0, int64_t count, int64_t n0, const float* column) {
  static_assert(kRows == 6, "the counts below");
  switch (count) {
    case 1: block_of<T, 1>(c, r0, n0, column); break;
    case 2: block_of<T, 2>(c, r0, n0, column); break;
    case 3: block_of<T, 3>(c, r0, n0, column); break;
    case 4: block_of<T, 4>(c, r0, n0, column); break;
    case 5: block_of<T, 5>(c, r0, n0, column); break;
    default: block_of<T, 6>(c, r0, n0, column); break;
  }
}

// At least `size` floats of `kept`, grown where it holds fewer.
float* room(std::vector<float>& kept, int64_t size) {
  if (static_cast<int64_t>(kept.size()) < size) kept.resize(size);
  return kept.data();
}

template <typename T>
void linear_all(const Call<T>& c, int64_t threads) {
  const int64_t chunks = (c.m + kChunkRows - 1) / kChunkRows, blocks = (c.n + kCols - 1) / kCols;
  // Threads split the outputs first (an even split whatever the rows: a short last chunk of rows is every
  // thread's, and a thread transposes each of its blocks once); which thread takes which rows changes nothing in any
  // row: a row's sums are one thread's, in one order.
#pragma omp parallel num_threads(threads) if ((c.m + 1) * c.n * c.k > (1 << 16))
  {
    // Each pool thread's buffers, kept from call to call and never zero-filled: a block is written whole before it
    // is read (a decoding step's call otherwise allocated and cleared them every time).
    thread_local std::vector<float> kept_column, kept_staging;
    float* column = room(kept_column, c.k * kCols);
    float* staging = std::is_same_v<T, float> || kByPairs<T> ? nullptr : room(kept_staging, c.k * kCols);
    int64_t transposed = -1;
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < blocks; ++b)
      for (int64_t chunk = 0; chunk < chunks; ++chunk) {
        if (b != transposed) {
#if defined(__AVX512BF16__)
          if constexpr (kByPairs<T>) transpose_pairs(c, b * kCols, column);
#endif
          if constexpr (!kByPairs<T>) transpose_block(c, b * kCols, column, staging);
          transposed = b;
        }
        const int64_t end = std::min(c.m, (chunk + 1) * kChunkRows);
        for (int64_t r0 = chunk * kChunkRows; r0 < end; r0 += kRows)
          rows_times_block(c, r0, std::min(kRows, end - r0), b * kCols, column);
      }
  }
}

// x [m, k] and weight [n, k] (each row contiguous, rows of any stride) and bias ([n] or empty), all float32 or all
// bfloat16; writes out ([m, n], contiguous, their dtype) and returns it.
Tensor fixed_order_linear(Tensor x, Tensor weight, Tensor bias, int64_t threads, Tensor out) {
  using torch::headeronly::ScalarType;
  const ScalarType type = x.scalar_type();
  STD_TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && out.dim() == 2 &&
                      (type == ScalarType::Float || type == ScalarType::BFloat16) && weight.scalar_type() == type &&
                      out.scalar_type() == type && (bias.numel() == 0 || bias.scalar_type() == type),
                  "fixed_order_linear: 2-d tensors, all float32 or all bfloat16, expected");
  const int64_t m = x.sizes()[0], k = x.sizes()[1], n = weight.sizes()[0];
  STD_TORCH_CHECK(weight.sizes()[1] == k && (k <= 1 || weight.strides()[1] == 1) &&
                      (bias.numel() == 0 || (bias.numel() == n && bias.is_contiguous())),
                  "fixed_order_linear: weight [n, k] (rows contiguous) and bias [n] expected");
  STD_TORCH_CHECK(out.is_contiguous() && out.sizes()[0] == m && out.sizes()[1] == n &&
                      (m == 0 || k == 0 || x.strides()[1] == 1),
                  "fixed_order_linear: out [m, n] contiguous, x's rows contiguous expected");
  auto run = [&](auto zero) {
    using T = decltype(zero);
    const Call<T> c{static_cast<const T*>(x.data_ptr()),
                    m > 1 ? x.strides()[0] : k,
                    static_cast<const T*>(weight.data_ptr()),
                    weight.strides()[0],
                    bias.numel() > 0 ? static_cast<const T*>(bias.data_ptr()) : nullptr,
                    static_cast<T*>(out.mutable_data_ptr()),
                    m, n, k};
    linear_all(c, threads);
  };
  if (type == ScalarType::Float)
    run(float());
  else
    run(BFloat16());
  return out;
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(batchtui, m) {
  m.def("fixed_order_linear(Tensor x, Tensor weight, Tensor bias, int threads, Tensor(a!) out) -> Tensor(a!)");
}

STABLE_TORCH_LIBRARY_IMPL(batchtui, CPU, m) { m.impl("fixed_order_linear", TORCH_BOX(&fixed_order_linear)); }
