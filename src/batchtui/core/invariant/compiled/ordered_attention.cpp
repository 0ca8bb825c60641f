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
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
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

// Where a 4-d tensor's element [i0, i1, i2, i3] lies, in elements from its start (any strides: a broadcast's zeros).
struct Strides4 {
  int64_t s0, s1, s2, s3;
  int64_t at(int64_t i0, int64_t i1, int64_t i2) const { return i0 * s0 + i1 * s1 + i2 * s2; }
};

Strides4 strides_of(const Tensor& t) {
  auto s = t.strides();
  return {s[0], s[1], s[2], s[3]};
}

// A thread takes kTile queries of one head together and the keys and values in blocks of kLanes: the tile's queries
// are independent chains that the core runs side by side (each query's own sums stay in its own order, key after key
// and dimension after dimension, whatever the other queries of the tile), and each block is loaded once for them all.
// A block is one vector register (16 float32 lanes with AVX-512, 8 with AVX2), so that a tile's sums stay in the
// registers (AVX2 has 16: a tile's 8 sums of two registers each spilled to memory at every step, 4.5x slower). Neither
// changes a sum: a block's lanes are other keys' or other dimensions', and a block past the last key adds zeros.
constexpr int64_t kTile = 8;
#if defined(__AVX512F__)
constexpr int64_t kLanes = 16;
#else
constexpr int64_t kLanes = 8;
#endif

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

int64_t whole_blocks(int64_t n) { return (n + kLanes - 1) / kLanes * kLanes; }

// T: the tensors' dtype (bfloat16, float16: exact in float32), W: the dtype the sums are made in.
template <typename T, typename W>
struct Inputs {
  const T *q, *k, *v;
  const W *bias, *sinks;
  const bool* seen;
  T* out;
  int64_t heads, queries, d, kv_heads, keys, dv;
  Strides4 qs, ks, vs, ss, bs;
  W scale, cap;
};

// A thread's own room: the tile's queries [kTile][d] and weights [kTile][span], for a span of at most the keys in
// whole blocks.
template <typename W>
struct Room {
  std::vector<W> queries, weights;
  Room(int64_t d, int64_t keys_in_blocks) : queries(kTile * d), weights(kTile * keys_in_blocks) {}
};

// The keys and values in W, once a call for all its queries: each key head's keys transposed, [d][kvp] (kLanes keys
// side by side), and values [kvp][dvp], zeros past the last key and the last dimension (kvp, dvp: whole blocks).
template <typename W>
struct Operands {
  W *keys, *values;
  int64_t kvp, dvp;
};

// The calling thread's room for a call's converted keys and values, kept from call to call: memory freshly taken from
// the system for every decoding step cost more than the conversion itself. Never zero-filled: each element of a call
// is written once, padding included.
template <typename W>
W* scratch(std::vector<W>& room, int64_t size) {
  if (static_cast<int64_t>(room.size()) < size) room.resize(size);
  return room.data();
}

template <typename T, typename W>
void allocate_operands(const Inputs<T, W>& in, int64_t batch, Operands<W>& ops) {
  ops.kvp = whole_blocks(in.keys), ops.dvp = whole_blocks(in.dv);
  thread_local std::vector<W> keys, values;
  ops.keys = scratch(keys, batch * in.kv_heads * in.d * ops.kvp);
  ops.values = scratch(values, batch * in.kv_heads * ops.kvp * ops.dvp);
}

// Key head g of row b converted: its keys a block of kLanes at a time, each dimension's kLanes values written side by
// side (reading kLanes keys' rows along), then its values row by row.
template <typename T, typename W>
void convert_head(const Inputs<T, W>& in, Operands<W>& ops, int64_t b, int64_t g) {
  const int64_t d = in.d, dv = in.dv, kvp = ops.kvp, dvp = ops.dvp;
  W* keys = ops.keys + (b * in.kv_heads + g) * d * kvp;
  W* values = ops.values + (b * in.kv_heads + g) * kvp * dvp;
  const T* rows[kLanes];
  for (int64_t k0 = 0; k0 < kvp; k0 += kLanes) {
    const int64_t real = std::min(kLanes, in.keys - k0);
    for (int64_t l = 0; l < real; ++l) rows[l] = in.k + in.ks.at(b, g, k0 + l);
    for (int64_t j = 0; j < d; ++j) {
      W* out = keys + j * kvp + k0;
      for (int64_t l = 0; l < real; ++l) out[l] = W(rows[l][j * in.ks.s3]);
      std::fill(out + real, out + kLanes, W(0));
    }
  }
  for (int64_t k = 0; k < in.keys; ++k) {
    const T* value = in.v + in.vs.at(b, g, k);
    for (int64_t j = 0; j < dv; ++j) values[k * dvp + j] = W(value[j * in.vs.s3]);
    std::fill(values + k * dvp + dv, values + (k + 1) * dvp, W(0));
  }
  std::fill(values + in.keys * dvp, values + kvp * dvp, W(0));
}

// The keys any of the `count` queries from `i0` sees lie in [first, last]: found from both ends of each row.
template <typename T, typename W>
void seen_range(const Inputs<T, W>& in, const bool* rows, int64_t count, int64_t& first, int64_t& last) {
  first = in.keys, last = -1;
  for (int64_t t = 0; t < count; ++t) {
    const bool* row = rows + t * in.ss.s2;
    int64_t k = 0;
    while (k < in.keys && !row[k * in.ss.s3]) ++k;
    first = std::min(first, k);
    k = in.keys - 1;
    while (k > last && !row[k * in.ss.s3]) --k;
    last = std::max(last, k);
  }
}

// One query's weight exp(score - maximum) for the keys lo + [0, span) (`w`: their scores, relative to lo), 0 for a
// key it does not see; returns their sum in key order (with the sink's), the query's softmax denominator.
template <typename T, typename W>
W weights_of(const Inputs<T, W>& in, int64_t b, int64_t h, int64_t i, W* w, int64_t lo, int64_t span) {
  const W minus_inf = -std::numeric_limits<W>::infinity();
  const int64_t real = std::min(span, in.keys - lo);  // past the last key: padding
  const bool* seen_row = in.seen + in.ss.at(b, h, i) + lo * in.ss.s3;
  for (int64_t k = 0; k < span; ++k) w[k] *= in.scale;
  if (in.cap != 0)
    for (int64_t k = 0; k < span; ++k) w[k] = std::tanh(w[k] / in.cap) * in.cap;
  if (in.bias) {
    const W* bias_row = in.bias + in.bs.at(b, h, i) + lo * in.bs.s3;
    for (int64_t k = 0; k < real; ++k) w[k] += bias_row[k * in.bs.s3];
  }
  const W sink = in.sinks ? in.sinks[h] : minus_inf;
  W top = sink;
  for (int64_t k = 0; k < real; ++k) {
    w[k] = seen_row[k * in.ss.s3] ? w[k] : minus_inf;
    top = w[k] > top ? w[k] : top;
  }
  for (int64_t k = real; k < span; ++k) w[k] = minus_inf;
  if (std::isinf(top)) top = 0;  // a query that sees nothing: every weight exp(-inf) = 0
  for (int64_t k = 0; k < span; ++k) w[k] = exp_fixed(w[k] - top);  // a key not seen: exactly 0
  W total = 0;
  for (int64_t k = 0; k < span; ++k) total += w[k];  // zeros added leave a sum's bits as they are
  return in.sinks ? total + exp_fixed(sink - top) : total;
}

// The `count` queries from `i0` of head `h` in row `b`, in the thread's `room`, computed as a tile of C queries
// (C >= count, the rest zeros): a decoding step's single query is not made to carry seven empty ones.
template <typename T, typename W, int64_t C>
void attend_tile(const Inputs<T, W>& in, const Operands<W>& ops, int64_t b, int64_t h, int64_t i0, int64_t count,
                 Room<W>& room) {
  const int64_t d = in.d, dv = in.dv, dvp = ops.dvp, kvp = ops.kvp;
  const int64_t kv_head = b * in.kv_heads + h / (in.heads / in.kv_heads);
  T* out_rows = in.out + ((b * in.heads + h) * in.queries + i0) * dv;
  int64_t first, last;
  seen_range(in, in.seen + in.ss.at(b, h, i0), count, first, last);
  if (last < first) {  // no query of the tile sees a key
    std::fill(out_rows, out_rows + count * dv, T(0));
    return;
  }
  const int64_t lo = first - first % kLanes, span = whole_blocks(last + 1 - lo);
  W* queries = room.queries.data();  // the tile's queries in W, zeros past `count`
  for (int64_t t = 0; t < C; ++t)
    for (int64_t j = 0; j < d; ++j)
      queries[t * d + j] = t < count ? W(in.q[in.qs.at(b, h, i0 + t) + j * in.qs.s3]) : W(0);
  const W* keys = ops.keys + kv_head * d * kvp + lo;  // [d][kvp], from key lo
  const W* values = ops.values + (kv_head * kvp + lo) * dvp;  // [kvp][dvp], from key lo
  // scores: q . k summed over the dimensions in order, kLanes keys at once
  W* weights = room.weights.data();
  for (int64_t k0 = 0; k0 < span; k0 += kLanes) {
    Lanes<W> acc[C] = {};
    for (int64_t j = 0; j < d; ++j) {
      const Lanes<W> key_block = load(keys + j * kvp + k0);
      for (int64_t t = 0; t < C; ++t) acc[t] += queries[t * d + j] * key_block;
    }
    for (int64_t t = 0; t < C; ++t) std::memcpy(weights + t * span + k0, &acc[t], sizeof acc[t]);
  }
  W total[C] = {};
  for (int64_t t = 0; t < count; ++t) total[t] = weights_of(in, b, h, i0 + t, weights + t * span, lo, span);
  std::fill(weights + count * span, weights + C * span, W(0));
  // weighted values, key after key; a key a query does not see adds 0 * value: nothing to a sum begun at +0
  for (int64_t j0 = 0; j0 < dvp; j0 += kLanes) {
    Lanes<W> acc[C] = {};
    for (int64_t k = 0; k < span; ++k) {
      const Lanes<W> value_block = load(values + k * dvp + j0);
      for (int64_t t = 0; t < C; ++t) acc[t] += weights[t * span + k] * value_block;
    }
    for (int64_t t = 0; t < count; ++t) {
      W sums[kLanes];
      std::memcpy(sums, &acc[t], sizeof sums);
      for (int64_t l = 0; l < kLanes && j0 + l < dv; ++l)
        out_rows[t * dv + j0 + l] = T(total[t] > 0 ? sums[l] / total[t] : W(0));
    }
  }
}

// A decoding step's single query in a tile of one, every other count in a tile of kTile (each query's sums the same
// in both; two heights, not four: each is compiled for every dtype, and the build is the first process's wait).
template <typename T, typename W>
void attend_queries(const Inputs<T, W>& in, const Operands<W>& ops, int64_t b, int64_t h, int64_t i0, int64_t count,
                    Room<W>& room) {
  if (count == 1)
    attend_tile<T, W, 1>(in, ops, b, h, i0, count, room);
  else
    attend_tile<T, W, kTile>(in, ops, b, h, i0, count, room);
}

template <typename T, typename W>
void attend_all(const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& seen, const Tensor& bias,
                const Tensor& sinks, double scale, double softcap, Tensor& out, int64_t threads) {
  const auto qs = query.sizes();
  Inputs<T, W> in;
  in.q = static_cast<const T*>(query.data_ptr());
  in.k = static_cast<const T*>(key.data_ptr());
  in.v = static_cast<const T*>(value.data_ptr());
  in.bias = bias.numel() > 0 ? static_cast<const W*>(bias.data_ptr()) : nullptr;
  in.sinks = sinks.numel() > 0 ? static_cast<const W*>(sinks.data_ptr()) : nullptr;
  in.seen = static_cast<const bool*>(seen.data_ptr());
  in.out = static_cast<T*>(out.mutable_data_ptr());
  in.heads = qs[1], in.queries = qs[2], in.d = qs[3];
  in.kv_heads = key.sizes()[1], in.keys = key.sizes()[2], in.dv = value.sizes()[3];
  in.qs = strides_of(query), in.ks = strides_of(key), in.vs = strides_of(value), in.ss = strides_of(seen);
  in.bs = in.bias ? strides_of(bias) : Strides4{0, 0, 0, 0};
  in.scale = static_cast<W>(scale), in.cap = static_cast<W>(softcap);
  const int64_t batch = qs[0], tiles = (in.queries + kTile - 1) / kTile;
  Operands<W> ops;
  allocate_operands(in, batch, ops);

#pragma omp parallel num_threads(threads)
  {
#pragma omp for collapse(2)
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t g = 0; g < in.kv_heads; ++g) convert_head(in, ops, b, g);
    // (the loop's end waits for every thread: each query reads its key head whole)
    Room<W> room(in.d, ops.kvp);
#pragma omp for collapse(3) schedule(dynamic, 1)
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < in.heads; ++h)
        for (int64_t tile = 0; tile < tiles; ++tile) {
          const int64_t i0 = tile * kTile, count = std::min(kTile, in.queries - i0);
          attend_queries(in, ops, b, h, i0, count, room);
        }
  }
}

// query [b, h, q, d], key [b, hk, kv, d], value [b, hk, kv, dv], in any strides and one dtype (bfloat16, float16,
// float32 or float64); seen (bool) and bias (empty where none) of [b, h, q, kv] in any strides (a broadcast's zeros
// too) and sinks ([h] or empty) in the work dtype (float64 for float64, else float32); softcap 0 where none. Writes
// out ([b, h, q, dv], contiguous, the query's dtype) and returns it.
Tensor ordered_attention(Tensor query, Tensor key, Tensor value, Tensor seen, Tensor bias, Tensor sinks,
                         double scale, double softcap, int64_t threads, Tensor out) {
  using torch::headeronly::ScalarType;
  STD_TORCH_CHECK(query.dim() == 4 && key.dim() == 4 && value.dim() == 4 && seen.dim() == 4 && out.dim() == 4,
                  "ordered_attention: 4-d tensors expected");
  const ScalarType type = query.scalar_type();
  STD_TORCH_CHECK(key.scalar_type() == type && value.scalar_type() == type && out.scalar_type() == type &&
                      seen.scalar_type() == ScalarType::Bool && out.is_contiguous(),
                  "ordered_attention: query, key, value and out of one dtype, seen bool, out contiguous expected");
  STD_TORCH_CHECK(query.sizes()[1] % key.sizes()[1] == 0, "ordered_attention: heads must be a multiple of kv heads");
  switch (type) {
    case ScalarType::BFloat16:
      attend_all<c10::BFloat16, float>(query, key, value, seen, bias, sinks, scale, softcap, out, threads);
      break;
    case ScalarType::Half:
      attend_all<c10::Half, float>(query, key, value, seen, bias, sinks, scale, softcap, out, threads);
      break;
    case ScalarType::Float:
      attend_all<float, float>(query, key, value, seen, bias, sinks, scale, softcap, out, threads);
      break;
    case ScalarType::Double:
      attend_all<double, double>(query, key, value, seen, bias, sinks, scale, softcap, out, threads);
      break;
    default:
      STD_TORCH_CHECK(false, "ordered_attention: bfloat16, float16, float32 or float64 expected");
  }
  return out;
}

}  // namespace

STABLE_TORCH_LIBRARY(batchtui, m) {
  m.def(
      "ordered_attention(Tensor query, Tensor key, Tensor value, Tensor seen, Tensor bias, Tensor sinks, "
      "float scale, float softcap, int threads, Tensor(a!) out) -> Tensor(a!)");
}

STABLE_TORCH_LIBRARY_IMPL(batchtui, CPU, m) { m.impl("ordered_attention", TORCH_BOX(&ordered_attention)); }
