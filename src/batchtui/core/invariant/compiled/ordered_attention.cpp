// Attention with every query summed in one fixed order, whatever else shares the call (the CPU kernel of
// batchtui's `ordered_attention`).
//
// One query is computed whole by one thread, over the keys it sees one after another in key order: its scores
// (each a dot product summed in the order of the head's dimensions), their maximum (exact in any order), the weights
// exp(score - maximum), their total and the weighted values, each summed key after key. A key the query does not
// see adds an exact zero to the total and nothing to the values, so a query's bits depend on the keys it sees and
// their order alone: not on their places (a left-padded row, a cache that dropped its oldest keys), the number of
// queries or rows in the call, or the thread count. Built with -ffp-contract=off, so that the loops' vector bodies
// and their scalar tails round alike.

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>

#include <cmath>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

using torch::stable::Tensor;

namespace {

// exp(x) for x <= 0 (every weight is exp(score - maximum)) in plain arithmetic the compiler vectorizes, the same
// bits in a vector body and a scalar tail: 2^n by the exponent's bits times a degree-6 polynomial on [-ln2/2, ln2/2]
// (Cephes' expf, within 2 ulp); 0 below -87 (where float32 leaves its normal range) and for -inf.
inline float exp_fixed(float x) {
  const float clamped = x < -87.0f ? -87.0f : x;
  const float n = std::floor(clamped * 1.44269504088896341f + 0.5f);
  float r = clamped - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  const float z = r * r;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * z + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return x < -87.0f ? 0.0f : y * scale;
}

inline double exp_fixed(double x) { return x < -745.0 ? 0.0 : std::exp(x); }

struct Strides4 {
  int64_t b, h, q, k;
};

Strides4 strides_of(const Tensor& t) {
  auto s = t.strides();
  return {s[0], s[1], s[2], s[3]};
}

// A thread takes kTile queries of one head together and the keys and values in blocks of kLanes: the tile's queries
// are independent chains that the core runs side by side (each query's own sums stay in its own order, key after key
// and dimension after dimension, whatever the other queries of the tile), and each block is loaded once for them all.
constexpr int64_t kTile = 8;
constexpr int64_t kLanes = 16;
constexpr int64_t kMaxDim = 1024;  // the longest head dimension taken (the Python path takes longer ones)

// kLanes values side by side: the compiler's vector type, one element-wise IEEE operation per lane (whatever the
// machine's vector width), kept in registers where a plain array would be stored at every step.
typedef float FloatLanes __attribute__((vector_size(kLanes * sizeof(float))));
typedef double DoubleLanes __attribute__((vector_size(kLanes * sizeof(double))));
template <typename W>
struct LanesOf {
  using type = FloatLanes;
};
template <>
struct LanesOf<double> {
  using type = DoubleLanes;
};
template <typename W>
using Lanes = typename LanesOf<W>::type;
static_assert(sizeof(Lanes<float>) == kLanes * sizeof(float) && sizeof(Lanes<double>) == kLanes * sizeof(double));

template <typename W>
Lanes<W> load(const W* p) {
  Lanes<W> v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <typename W>
struct Inputs {
  const W *q, *k, *v, *bias, *sinks;
  const bool* seen;
  W* out;
  int64_t heads, queries, d, kv_heads, keys, padded_keys, dv;
  Strides4 ss, bs;
  W scale, cap;
};

// The keys any of the `count` queries from `i0` sees lie in [first, last]: found from both ends of each row.
template <typename W>
void seen_range(const Inputs<W>& in, const bool* rows, int64_t count, int64_t& first, int64_t& last) {
  first = in.keys, last = -1;
  for (int64_t t = 0; t < count; ++t) {
    const bool* row = rows + t * in.ss.q;
    int64_t k = 0;
    while (k < in.keys && !row[k * in.ss.k]) ++k;
    first = std::min(first, k);
    k = in.keys - 1;
    while (k > last && !row[k * in.ss.k]) --k;
    last = std::max(last, k);
  }
}

// Each query's weight exp(score - maximum) for the keys in [lo, hi), 0 for a key it does not see; returns their sum
// in key order (with the sink's), the query's softmax denominator.
template <typename W>
W weights_of(const Inputs<W>& in, int64_t b, int64_t h, int64_t i, const bool* seen_row, W* w, int64_t lo,
             int64_t hi) {
  const W minus_inf = -std::numeric_limits<W>::infinity();
  const int64_t seen_hi = std::min(hi, in.keys);
  for (int64_t k = lo; k < hi; ++k) w[k] *= in.scale;
  if (in.cap != 0)
    for (int64_t k = lo; k < hi; ++k) w[k] = std::tanh(w[k] / in.cap) * in.cap;
  if (in.bias) {
    const W* bias_row = in.bias + b * in.bs.b + h * in.bs.h + i * in.bs.q;
    for (int64_t k = lo; k < seen_hi; ++k) w[k] += bias_row[k * in.bs.k];
  }
  const W sink = in.sinks ? in.sinks[h] : minus_inf;
  W top = sink;
  for (int64_t k = lo; k < seen_hi; ++k) {
    w[k] = seen_row[k * in.ss.k] ? w[k] : minus_inf;
    top = w[k] > top ? w[k] : top;
  }
  for (int64_t k = seen_hi; k < hi; ++k) w[k] = minus_inf;
  if (std::isinf(top)) top = 0;  // a query that sees nothing: every weight exp(-inf) = 0
  for (int64_t k = lo; k < hi; ++k) w[k] = exp_fixed(w[k] - top);  // a key not seen: exactly 0
  W total = 0;
  for (int64_t k = lo; k < hi; ++k) total += w[k];  // zeros added leave a sum's bits as they are
  return in.sinks ? total + exp_fixed(sink - top) : total;
}

// The `count` queries from `i0` of head `h` in row `b`; `weight`: [kTile][padded_keys], a thread's own.
template <typename W>
void attend_tile(const Inputs<W>& in, int64_t b, int64_t h, int64_t i0, int64_t count, W* weight) {
  const int64_t keys = in.padded_keys, d = in.d, dv = in.dv;
  const int64_t kv_head = b * in.kv_heads + h / (in.heads / in.kv_heads);
  const W* k_dims = in.k + kv_head * d * keys;  // [d, padded_keys]
  const W* v_rows = in.v + kv_head * keys * dv;  // [padded_keys, dv]
  const W* q_rows = in.q + ((b * in.heads + h) * in.queries + i0) * d;
  W* out_rows = in.out + ((b * in.heads + h) * in.queries + i0) * dv;
  const bool* seen_rows = in.seen + b * in.ss.b + h * in.ss.h + i0 * in.ss.q;
  int64_t first, last;
  seen_range(in, seen_rows, count, first, last);
  if (last < first) {  // no query of the tile sees a key
    std::fill(out_rows, out_rows + count * dv, W(0));
    return;
  }
  const int64_t lo = first - first % kLanes, hi = (last / kLanes + 1) * kLanes;
  // scores: q . k summed over the dimensions in order, kLanes keys at once
  W q_tile[kTile * kMaxDim];  // the tile's queries, zeros past `count`
  for (int64_t t = 0; t < kTile; ++t)
    for (int64_t j = 0; j < d; ++j) q_tile[t * d + j] = t < count ? q_rows[t * d + j] : W(0);
  for (int64_t k0 = lo; k0 < hi; k0 += kLanes) {
    Lanes<W> acc[kTile] = {};
    for (int64_t j = 0; j < d; ++j) {
      const Lanes<W> k_block = load(k_dims + j * keys + k0);
      for (int64_t t = 0; t < kTile; ++t) acc[t] += q_tile[t * d + j] * k_block;
    }
    for (int64_t t = 0; t < kTile; ++t) std::memcpy(weight + t * keys + k0, &acc[t], sizeof acc[t]);
  }
  W total[kTile] = {};
  for (int64_t t = 0; t < count; ++t)
    total[t] = weights_of(in, b, h, i0 + t, seen_rows + t * in.ss.q, weight + t * keys, lo, hi);
  for (int64_t t = count; t < kTile; ++t) std::fill(weight + t * keys + lo, weight + t * keys + hi, W(0));
  // weighted values, key after key; a key a query does not see adds 0 * value: nothing to a sum begun at +0
  for (int64_t j0 = 0; j0 < dv; j0 += kLanes) {
    Lanes<W> acc[kTile] = {};
    for (int64_t k = lo; k < hi; ++k) {
      const Lanes<W> v_block = load(v_rows + k * dv + j0);
      for (int64_t t = 0; t < kTile; ++t) acc[t] += weight[t * keys + k] * v_block;
    }
    for (int64_t t = 0; t < count; ++t) {
      W sums[kLanes];
      std::memcpy(sums, &acc[t], sizeof sums);
      for (int64_t l = 0; l < kLanes; ++l) out_rows[t * dv + j0 + l] = total[t] > 0 ? sums[l] / total[t] : W(0);
    }
  }
}

template <typename W>
void attend_all(const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& seen, const Tensor& bias,
                const Tensor& sinks, double scale, double softcap, Tensor& out, int64_t threads) {
  const auto qs = query.sizes();
  Inputs<W> in;
  in.q = static_cast<const W*>(query.data_ptr());
  in.k = static_cast<const W*>(key.data_ptr());
  in.v = static_cast<const W*>(value.data_ptr());
  in.bias = bias.numel() > 0 ? static_cast<const W*>(bias.data_ptr()) : nullptr;
  in.sinks = sinks.numel() > 0 ? static_cast<const W*>(sinks.data_ptr()) : nullptr;
  in.seen = static_cast<const bool*>(seen.data_ptr());
  in.out = static_cast<W*>(out.mutable_data_ptr());
  in.heads = qs[1], in.queries = qs[2], in.d = qs[3];
  in.kv_heads = key.sizes()[1], in.padded_keys = key.sizes()[3], in.keys = seen.sizes()[3], in.dv = value.sizes()[3];
  in.ss = strides_of(seen);
  in.bs = in.bias ? strides_of(bias) : Strides4{0, 0, 0, 0};
  in.scale = static_cast<W>(scale), in.cap = static_cast<W>(softcap);
  const int64_t batch = qs[0], tiles = (in.queries + kTile - 1) / kTile;

#pragma omp parallel num_threads(threads)
  {
    std::vector<W> weight(kTile * in.padded_keys);
#pragma omp for collapse(3) schedule(dynamic, 1)
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < in.heads; ++h)
        for (int64_t tile = 0; tile < tiles; ++tile) {
          const int64_t i0 = tile * kTile, count = std::min(kTile, in.queries - i0);
          attend_tile(in, b, h, i0, count, weight.data());
        }
  }
}

// query [b, h, q, d], key [b, hk, d, kvp] (transposed), value [b, hk, kvp, dvp], out [b, h, q, dvp]: contiguous, in
// float32 or float64 alike, kvp and dvp whole blocks of kLanes (zeros past the kv keys and the dv dimensions); seen
// (bool) and bias (empty where none) of [b, h, q, kv] in any strides (a broadcast's zeros too); sinks [h] or empty;
// softcap 0 where none. Writes out and returns it.
Tensor ordered_attention(Tensor query, Tensor key, Tensor value, Tensor seen, Tensor bias, Tensor sinks,
                         double scale, double softcap, int64_t threads, Tensor out) {
  STD_TORCH_CHECK(query.dim() == 4 && key.dim() == 4 && value.dim() == 4 && seen.dim() == 4 && out.dim() == 4,
                  "ordered_attention: 4-d tensors expected");
  STD_TORCH_CHECK(query.is_contiguous() && key.is_contiguous() && value.is_contiguous() && out.is_contiguous(),
                  "ordered_attention: contiguous query, key, value and out expected");
  STD_TORCH_CHECK(key.sizes()[2] == query.sizes()[3] && key.sizes()[3] % kLanes == 0 &&
                      key.sizes()[3] >= seen.sizes()[3] && value.sizes()[2] == key.sizes()[3] &&
                      value.sizes()[3] % kLanes == 0 && out.sizes()[3] == value.sizes()[3],
                  "ordered_attention: key [b, hk, d, kvp], value [b, hk, kvp, dvp] in whole blocks expected");
  STD_TORCH_CHECK(query.sizes()[3] <= kMaxDim, "ordered_attention: head dimension above kMaxDim");
  STD_TORCH_CHECK(query.sizes()[1] % key.sizes()[1] == 0, "ordered_attention: heads must be a multiple of kv heads");
  if (query.element_size() == 8)
    attend_all<double>(query, key, value, seen, bias, sinks, scale, softcap, out, threads);
  else
    attend_all<float>(query, key, value, seen, bias, sinks, scale, softcap, out, threads);
  return out;
}

}  // namespace

STABLE_TORCH_LIBRARY(batchtui, m) {
  m.def(
      "ordered_attention(Tensor query, Tensor key, Tensor value, Tensor seen, Tensor bias, Tensor sinks, "
      "float scale, float softcap, int threads, Tensor(a!) out) -> Tensor(a!)");
}

STABLE_TORCH_LIBRARY_IMPL(batchtui, CPU, m) { m.impl("ordered_attention", TORCH_BOX(&ordered_attention)); }
