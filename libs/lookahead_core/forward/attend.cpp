// Attention of one request's segment of several rows (a prefill chunk or a draft tree) over its cache, for the
// lean loop (attend.py). Written for the shapes a step makes on CPU, where sdpa's flash kernel and MKL's GEMMs
// run at ~140 GFLOP/s: head_dim 64, a few hundred keys, q/k/v of a kv head shared by `group` query heads.
//
// The rows of one kv head (every query head of its group, every token of the segment) are taken LANES at a time,
// one vector lane per row (queries transposed, scaled), so that:
// - scores: for each key, its head_dim values broadcast from the cache as it is (no transposed copy of the keys)
//   times the rows' transposed queries, one FMA chain over head_dim per lane;
// - softmax: max, exp and sum run along the keys lane by lane, in key order;
// - output: each row's probabilities broadcast times the value rows, summed in key order.
// So every row is computed by the same sequence of operations whatever rows share its call: its result does
// not depend on the tree or chunk around it, nor on the number of threads (a plain omp parallel for over
// (kv head, block of rows), in torch's own OpenMP pool). The sums run in another order than sdpa's (~1e-7
// relative), as every tree kernel's do; one-token forwards keep sdpa (attend.py).
// The cache is fp32 or IEEE half (binary16, converted to fp32 exactly as it is read): the same rows from the same
// stored values give the same bits whatever their call, so a half cache keeps every row width-invariant too.
#include <immintrin.h>
#include <torch/extension.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

#if defined(__AVX512F__)
constexpr int kLanes = 16;  // floats per vector register (zmm)
#else
constexpr int kLanes = 8;   // floats per vector register (ymm)
#endif
constexpr int kKeys = 4;    // keys per score tile (broadcast each), times 1 or kBlocks row vectors
constexpr int kBlocks = 2;  // row vectors per score tile of a segment with more rows than lanes: kKeys * kBlocks accumulators
constexpr int kPvVecs = 4;  // vectors of head_dim per output tile (head_dim: a multiple of kPvVecs * kLanes)
#if defined(__AVX512F__)
constexpr int kPvRows = 4;  // rows per output tile: kPvRows * kPvVecs accumulators (of 32 registers)
#else
constexpr int kPvRows = 2;  // rows per output tile: kPvRows * kPvVecs accumulators (of 16 registers)
#endif

typedef float vf __attribute__((vector_size(kLanes * 4)));
typedef int vi __attribute__((vector_size(kLanes * 4)));
typedef float vfu __attribute__((vector_size(kLanes * 4), aligned(4)));

using half = uint16_t;  // an IEEE binary16 cache entry, as its bits (torch's kHalf)

inline vf load(const float* p) { return *reinterpret_cast<const vfu*>(p); }
// kLanes half values widened to fp32 (exact)
inline vf load(const half* p) {
#if defined(__AVX512F__)
  return (vf)_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#else
  return (vf)_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#endif
}
inline void store(float* p, vf v) { *reinterpret_cast<vfu*>(p) = v; }
inline vf splat(float x) { return vf{} + x; }

// e^x lane by lane for x <= 0 (Cephes' expf: x = n ln2 + r, a degree-6 polynomial in r, times 2^n); lanes
// below -87 give ~1e-38 rather than underflowing, and -inf lanes are zeroed by the caller
inline vf exp_nonpositive(vf x) {
  x = x < splat(-87.0f) ? splat(-87.0f) : x;
  const vf t = x * 1.44269504088896341f;
  const vi n = -__builtin_convertvector(0.5f - t, vi);  // round(t): 0.5 - t > 0 truncates down
  const vf nf = __builtin_convertvector(n, vf);
  vf r = x - nf * 0.693359375f;
  r = r - nf * -2.12194440e-4f;
  vf y = splat(1.9875691500e-4f);
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * (r * r) + r + 1.0f;
  const vi bits = (n + 127) << 23;  // 2^n as a float's exponent
  return y * reinterpret_cast<const vf&>(bits);
}

struct Segment {
  const float* q;       // [heads, T, D] rotated queries
  const void* keys;     // [kv_heads, cap, D] the request's cache (fp32 or half: `half_cache`)
  const void* values;   // [kv_heads, cap, D]
  const uint8_t* visible;  // [T, T]: token t sees segment token u (the keys from `past` on)
  float* out;           // [T, heads * D]: row t's head h at t * heads * D + h * D
  int64_t T, D, heads, kv_heads, cap, past;
  float scale;
  bool half_cache;      // keys/values hold half values
};

// rows [first, first + kLanes * Blocks) of kv head h: row r is query head h * group + r / T, token r % T (rows
// past group * T repeat the last one and are not written out). Every lane runs the same operations whatever
// Blocks is: one score FMA chain over head_dim, the softmax along the keys, one output FMA chain over the keys.
template <int Blocks, typename KV>
void attend_block(const Segment& s, int64_t h, int64_t first, std::vector<float>& qt, std::vector<float>& sc,
                  std::vector<float>& bias, std::vector<float>& kt) {
  constexpr int kRows = kLanes * Blocks;  // rows of this block
  const int64_t group = s.heads / s.kv_heads, R = group * s.T, D = s.D;
  int64_t head[kRows], tok[kRows];
  for (int i = 0; i < kRows; ++i) {
    const int64_t r = std::min(first + i, R - 1);
    head[i] = h * group + r / s.T;
    tok[i] = r % s.T;
  }
  qt.resize(D * kRows);  // [D, kRows]: the rows' queries, transposed and scaled
  for (int i = 0; i < kRows; ++i) {
    const float* src = s.q + (head[i] * s.T + tok[i]) * D;
    for (int64_t d = 0; d < D; ++d) qt[d * kRows + i] = src[d] * s.scale;
  }
  bias.resize(s.T * kRows);  // [T, kRows]: 0 where the row sees the segment's key, -inf where not
  const float hidden = -std::numeric_limits<float>::infinity();
  int64_t reach = 0;  // segment keys up to the last one a row of the block sees: those past it weigh exactly 0
  for (int64_t u = 0; u < s.T; ++u)
    for (int i = 0; i < kRows; ++i) {
      const bool seen = s.visible[tok[i] * s.T + u];
      bias[u * kRows + i] = seen ? 0.0f : hidden;
      reach = seen ? u + 1 : reach;
    }
  // keys [0, n) of the block: adding the skipped keys' exact zeros (to the sum, and 0 * value to the output) would
  // change no bit, so every row's result is still independent of its block (a causal chunk's early rows skip half)
  const int64_t n = s.past + reach;
  sc.resize(((n + kKeys - 1) / kKeys * kKeys) * kRows);  // [keys, kRows] scores, then probabilities
  const KV* kh = static_cast<const KV*>(s.keys) + h * s.cap * D;
  const KV* vh = static_cast<const KV*>(s.values) + h * s.cap * D;
  kt.resize(kKeys * D);  // [kKeys, D]: a half cache's key tile widened to fp32
  // scores: kKeys keys at a time (a tail tile re-reads key n - 1), each key's values broadcast
  for (int64_t j = 0; j < n; j += kKeys) {
    const float* kr[kKeys];
    for (int k = 0; k < kKeys; ++k) {
      const KV* key = kh + std::min(j + k, n - 1) * D;
      if constexpr (std::is_same_v<KV, float>) {
        kr[k] = key;
      } else {
        for (int64_t d = 0; d < D; d += kLanes) store(&kt[k * D + d], load(key + d));
        kr[k] = &kt[k * D];
      }
    }
    vf acc[kKeys][Blocks] = {};
    for (int64_t d = 0; d < D; ++d) {
      vf qv[Blocks];
      for (int b = 0; b < Blocks; ++b) qv[b] = load(&qt[d * kRows + b * kLanes]);
      for (int k = 0; k < kKeys; ++k) {
        const vf kv = splat(kr[k][d]);
        for (int b = 0; b < Blocks; ++b) acc[k][b] = kv * qv[b] + acc[k][b];
      }
    }
    for (int k = 0; k < kKeys; ++k)
      for (int b = 0; b < Blocks; ++b) store(&sc[(j + k) * kRows + b * kLanes], acc[k][b]);
  }
  // softmax along the keys, lane by lane
  for (int64_t u = 0; u < reach; ++u)
    for (int b = 0; b < Blocks; ++b) {
      float* p = &sc[(s.past + u) * kRows + b * kLanes];
      store(p, load(p) + load(&bias[u * kRows + b * kLanes]));
    }
  vf total[Blocks];
  for (int b = 0; b < Blocks; ++b) {
    vf top = splat(hidden);
    for (int64_t j = 0; j < n; ++j) {
      const vf x = load(&sc[j * kRows + b * kLanes]);
      top = x > top ? x : top;
    }
    vf sum = {};
    for (int64_t j = 0; j < n; ++j) {
      float* p = &sc[j * kRows + b * kLanes];
      const vf x = load(p);
      const vf e = x == splat(hidden) ? vf{} : exp_nonpositive(x - top);
      store(p, e);
      sum = sum + e;
    }
    total[b] = sum;
  }
  // output: kPvRows rows' probabilities broadcast times kPvVecs vectors of each value row, summed in key order
  float inv[kRows];
  for (int b = 0; b < Blocks; ++b)
    for (int l = 0; l < kLanes; ++l) inv[b * kLanes + l] = 1.0f / total[b][l];
  const int64_t rows = std::min<int64_t>(kRows, R - first);
  for (int64_t i0 = 0; i0 < rows; i0 += kPvRows)
    for (int64_t d0 = 0; d0 < D; d0 += kPvVecs * kLanes) {
      vf acc[kPvRows][kPvVecs] = {};
      for (int64_t j = 0; j < n; ++j) {
        const KV* v = vh + j * D + d0;
        vf vv[kPvVecs];
        for (int c = 0; c < kPvVecs; ++c) vv[c] = load(v + c * kLanes);
        for (int i = 0; i < kPvRows; ++i) {
          const vf p = splat(sc[j * kRows + i0 + i]);
          for (int c = 0; c < kPvVecs; ++c) acc[i][c] = p * vv[c] + acc[i][c];
        }
      }
      for (int i = 0; i < kPvRows && i0 + i < rows; ++i)
        for (int c = 0; c < kPvVecs; ++c)
          store(s.out + tok[i0 + i] * s.heads * D + head[i0 + i] * D + d0 + c * kLanes, acc[i][c] * inv[i0 + i]);
    }
}

// One segment's tensors checked and read into a Segment
Segment segment(const torch::Tensor& q, const torch::Tensor& keys, const torch::Tensor& values, int64_t past,
                const torch::Tensor& visible, double scale, const torch::Tensor& out) {
  TORCH_CHECK(q.scalar_type() == torch::kFloat, "queries: fp32 only");
  TORCH_CHECK((keys.scalar_type() == torch::kFloat || keys.scalar_type() == torch::kHalf) &&
                  values.scalar_type() == keys.scalar_type(), "keys/values: both fp32 or both half");
  TORCH_CHECK(q.dim() == 4 && q.size(0) == 1 && q.is_contiguous(), "q: contiguous [1, heads, T, head_dim]");
  TORCH_CHECK(keys.dim() == 4 && keys.is_contiguous() && values.is_contiguous() && keys.sizes() == values.sizes(),
              "keys/values: contiguous [1, kv_heads, capacity, head_dim]");
  const int64_t heads = q.size(1), T = q.size(2), D = q.size(3), kv_heads = keys.size(1), cap = keys.size(2);
  TORCH_CHECK(keys.size(3) == D && D % (kPvVecs * kLanes) == 0, "head_dim: the cache's, a multiple of the output tile");
  TORCH_CHECK(heads % kv_heads == 0, "query heads: a multiple of the kv heads");
  TORCH_CHECK(past >= 0 && past + T <= cap, "the segment's entries must be in the cache");
  TORCH_CHECK(visible.scalar_type() == torch::kBool && visible.is_contiguous() && visible.numel() == T * T,
              "visible: contiguous bool [T, T]");
  TORCH_CHECK(out.scalar_type() == torch::kFloat && out.dim() == 2 && out.size(0) == T &&
                  out.size(1) == heads * D && out.stride(1) == 1 && out.stride(0) == heads * D,
              "out: [T, heads * head_dim] with contiguous rows");
  return Segment{q.data_ptr<float>(), keys.data_ptr(), values.data_ptr(),
                 reinterpret_cast<const uint8_t*>(visible.data_ptr<bool>()), out.data_ptr<float>(),
                 T, D, heads, kv_heads, cap, past, static_cast<float>(scale), keys.scalar_type() == torch::kHalf};
}

}  // namespace

// For each segment i: outs[i][t, h * D + d] = softmax over its n = past + T keys (those from `past` on where
// visible) of qs[i][h, t] . keys[h / group] * scale, times the values: every query head of one request's T new
// rows. All segments' (kv head, block of rows) tasks share one parallel loop.
void attend_segments(const std::vector<torch::Tensor>& qs, const std::vector<torch::Tensor>& keys,
                     const std::vector<torch::Tensor>& values, const std::vector<int64_t>& pasts,
                     const std::vector<torch::Tensor>& visibles, double scale, const std::vector<torch::Tensor>& outs) {
  const size_t count = qs.size();
  TORCH_CHECK(keys.size() == count && values.size() == count && pasts.size() == count && visibles.size() == count &&
                  outs.size() == count, "one key, value, past, visible and out per segment");
  std::vector<Segment> segs;
  std::vector<int64_t> first_task{0};  // segment i's tasks are [first_task[i], first_task[i + 1])
  std::vector<int> wide;  // whether segment i's blocks are kBlocks vectors (more rows than lanes) or one
  for (size_t i = 0; i < count; ++i) {
    segs.push_back(segment(qs[i], keys[i], values[i], pasts[i], visibles[i], scale, outs[i]));
    const Segment& s = segs.back();
    const int64_t rows = s.heads / s.kv_heads * s.T, block = rows > kLanes ? kLanes * kBlocks : kLanes;
    wide.push_back(rows > kLanes);
    first_task.push_back(first_task.back() + s.kv_heads * ((rows + block - 1) / block));
  }
  const int64_t tasks = first_task.back();
#pragma omp parallel if (tasks > 1)
  {
    std::vector<float> qt, sc, bias, kt;  // each thread's scratch
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < tasks; ++task) {
      const size_t i = std::upper_bound(first_task.begin(), first_task.end(), task) - first_task.begin() - 1;
      const Segment& s = segs[i];
      const int64_t block = wide[i] ? kLanes * kBlocks : kLanes, local = task - first_task[i];
      const int64_t blocks = (s.heads / s.kv_heads * s.T + block - 1) / block;
      const int64_t h = local / blocks, first = (local % blocks) * block;
      if (wide[i]) {
        if (s.half_cache) attend_block<kBlocks, half>(s, h, first, qt, sc, bias, kt);
        else attend_block<kBlocks, float>(s, h, first, qt, sc, bias, kt);
      } else {
        if (s.half_cache) attend_block<1, half>(s, h, first, qt, sc, bias, kt);
        else attend_block<1, float>(s, h, first, qt, sc, bias, kt);
      }
    }
  }
}

// attend_segments for one segment
void attend_rows(torch::Tensor q, torch::Tensor keys, torch::Tensor values, int64_t past, torch::Tensor visible,
                 double scale, torch::Tensor out) {
  attend_segments({q}, {keys}, {values}, {past}, {visible}, scale, {out});
}

int64_t tile() { return kPvVecs * kLanes; }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("attend_rows", &attend_rows, "several rows of one request attending to its cache (fp32 or half)",
        py::call_guard<py::gil_scoped_release>());
  m.def("attend_segments", &attend_segments, "several requests' segments, each attending to its own cache (fp32 or half)",
        py::call_guard<py::gil_scoped_release>());
  m.def("tile", &tile, "head_dim must be a multiple of this (the output tile's floats)");
}
