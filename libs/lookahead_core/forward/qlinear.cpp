// y[M, N] = x[M, K] W[N, K]^T (+ b[N]) over weights kept in affine groups, as a GGUF file's blocks hold them:
// W[n, k] = fma(scale[n, g], code[n, k], offset[n, g]) with g = k / G, codes 4-bit (two a byte), int8, or
// fp32 (a dense weight served through the same width-invariant loop).
//
// Width-invariant by construction: every output y[r, n] is computed by one thread, by the same sequence of
// operations whatever M is and whichever rows share the call: its weight vectors are de-quantized by the same
// fma (on the fly for a few rows, or once into a buffer that later row tiles re-read: the same bits), each
// lane accumulates fma(w, x, acc) over k in order, the lanes are folded by one fixed tree, the bias is added
// last. So a tree row's logits are its one-token forward's bit for bit.
//
// Built twice from this source: with AVX-512 (16 lanes, a tile of 4 weight rows by 6 x rows) and with AVX2
// (8 lanes, 4 by 2); one process uses one build for every forward (qlinear.py chooses it by a probe run in a
// child process, since a CPU may advertise what it cannot run). The parallel loop is a plain OpenMP one over
// weight-row tiles, in torch's own pool (cext.py links its libgomp).
#include <torch/extension.h>
#include <immintrin.h>
#include <omp.h>

#include <vector>

namespace {

inline float hsum256(__m256 v) {  // fixed tree: 8 -> 4 -> 2 -> 1
  __m128 b = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  b = _mm_add_ps(b, _mm_movehl_ps(b, b));
  b = _mm_add_ss(b, _mm_movehdup_ps(b));
  return _mm_cvtss_f32(b);
}

#ifdef __AVX512F__
#define VX(op) _mm512_##op
using vf = __m512;
using vi = __m512i;
constexpr int kLanes = 16;
constexpr int kTileN = 4;   // weight rows a tile holds
constexpr int kTileM = 6;   // x rows a tile holds (4 x 6 accumulators + 4 weights + x <= 32 registers)
inline __m128i lane_bytes(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }
inline float hsum(vf v) { return hsum256(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1))); }
#else
#define VX(op) _mm256_##op
using vf = __m256;
using vi = __m256i;
constexpr int kLanes = 8;
constexpr int kTileN = 4;
constexpr int kTileM = 2;   // 4 x 2 accumulators + 4 weights + x <= 16 registers
inline __m128i lane_bytes(const void* p) { return _mm_loadl_epi64(static_cast<const __m128i*>(p)); }
inline float hsum(vf v) { return hsum256(v); }
#endif

inline vf vzero() { return VX(setzero_ps)(); }
inline vf vset1(float v) { return VX(set1_ps)(v); }
inline vf vload(const float* p) { return VX(loadu_ps)(p); }
inline void vstore(float* p, vf v) { VX(storeu_ps)(p, v); }
inline vf vfma(vf a, vf b, vf c) { return VX(fmadd_ps)(a, b, c); }
inline vf i8_to_f(const int8_t* p) { return VX(cvtepi32_ps)(VX(cvtepi8_epi32)(lane_bytes(p))); }  // kLanes bytes
inline vi nibbles(const uint8_t* p) { return VX(cvtepu8_epi32)(lane_bytes(p)); }  // kLanes bytes, one a lane
inline vf hi_f(vi b) { return VX(cvtepi32_ps)(VX(srli_epi32)(b, 4)); }  // each byte's high nibble
inline vf lo_f(vi b) { return VX(cvtepi32_ps)(VX(sub_epi32)(b, VX(slli_epi32)(VX(srli_epi32)(b, 4), 4))); }

constexpr int kU4 = 0;          // codes: 4 bits, two a byte; a group of 32 is 16 bytes, byte j = code j | code j+16 << 4
constexpr int kI8 = 1;          // codes: one int8 each
constexpr int kF32 = 2;         // dense fp32 weights as codes (scale 1, no offset: fma(1, w, 0) is w)
constexpr int64_t kU4Group = 32;  // the 4-bit layout's group (every 4-bit GGUF block type groups 32)
constexpr int64_t kFlyRows = 2 * kTileM;  // up to this many x rows, weights are de-quantized on the fly each
// row tile (measured: 8 rows 18.2 -> 13 ms of SmolLM2's products); past it, once into a buffer

// The weights of one product, as qlinear.py hands them.
struct Weights {
  const uint8_t* codes;   // [N, K / 2] (u4) or [N, K] (i8)
  const float* scales;    // [N, K / G]
  const float* offsets;   // [N, K / G], or null: every offset is 0
  int64_t K, G, fmt;
};

// The codes of weight row n's elements [k, k + kLanes) (k a multiple of kLanes), as floats.
template <int FMT>
inline vf codes_vec(const Weights& w, int64_t n, int64_t k) {
  if constexpr (FMT == kU4) {
    const int64_t within = k & (kU4Group - 1);  // 0, kLanes, ... < 32 within its group of 32
    const auto b = nibbles(w.codes + n * (w.K / 2) + (k - within) / 2 + (within & 15));
    return within < 16 ? lo_f(b) : hi_f(b);
  } else if constexpr (FMT == kI8) {
    return i8_to_f(reinterpret_cast<const int8_t*>(w.codes) + n * w.K + k);
  } else {
    return vload(reinterpret_cast<const float*>(w.codes) + n * w.K + k);
  }
}

// Weight row n's elements [k, k + kLanes) of group g: fma(scale, code, offset), the one de-quantization.
template <int FMT, bool OFF>
inline vf weight_vec(const Weights& w, int64_t n, int64_t g, int64_t k) {
  const int64_t at = n * (w.K / w.G) + g;
  return vfma(vset1(w.scales[at]), codes_vec<FMT>(w, n, k), OFF ? vset1(w.offsets[at]) : vzero());
}

// Weight row n de-quantized into out[K].
template <int FMT, bool OFF>
inline void dequant_row(const Weights& w, int64_t n, float* out) {
  for (int64_t g = 0, k = 0; g < w.K / w.G; ++g)
    for (int64_t v = 0; v < w.G; v += kLanes, k += kLanes) vstore(out + k, weight_vec<FMT, OFF>(w, n, g, k));
}

// One tile: TN weight rows [n, n + TN) by TM x rows, written to y[r, n + j] (+ bias). Its weights are
// de-quantized on the fly (``buf`` null) or read from ``buf`` [TN, K] (filled by dequant_row: the same bits).
template <int FMT, bool OFF, int TN, int TM>
inline void tile(const Weights& w, const float* buf, const float* x, int64_t n, int64_t ldy, float* y,
                 const float* bias) {
  vf acc[TN][TM];
  for (int j = 0; j < TN; ++j)
    for (int r = 0; r < TM; ++r) acc[j][r] = vzero();
  for (int64_t g = 0, k = 0; g < w.K / w.G; ++g) {
    for (int64_t v = 0; v < w.G; v += kLanes, k += kLanes) {
      vf wv[TN];
      for (int j = 0; j < TN; ++j) wv[j] = buf ? vload(buf + j * w.K + k) : weight_vec<FMT, OFF>(w, n + j, g, k);
      for (int r = 0; r < TM; ++r) {
        const vf xv = vload(x + r * w.K + k);
        for (int j = 0; j < TN; ++j) acc[j][r] = vfma(wv[j], xv, acc[j][r]);
      }
    }
  }
  for (int j = 0; j < TN; ++j)
    for (int r = 0; r < TM; ++r) y[r * ldy + n + j] = hsum(acc[j][r]) + (bias ? bias[n + j] : 0.0f);
}

template <int FMT, bool OFF, int TN>
inline void rows_of(const Weights& w, const float* buf, const float* x, int64_t M, int64_t n, int64_t N,
                    float* y, const float* bias) {
  int64_t r = 0;
  for (; r + kTileM <= M; r += kTileM) tile<FMT, OFF, TN, kTileM>(w, buf, x + r * w.K, n, N, y + r * N, bias);
  const float* xr = x + r * w.K;
  float* yr = y + r * N;
  switch (M - r) {
#ifdef __AVX512F__
    case 5: tile<FMT, OFF, TN, 5>(w, buf, xr, n, N, yr, bias); break;
    case 4: tile<FMT, OFF, TN, 4>(w, buf, xr, n, N, yr, bias); break;
    case 3: tile<FMT, OFF, TN, 3>(w, buf, xr, n, N, yr, bias); break;
    case 2: tile<FMT, OFF, TN, 2>(w, buf, xr, n, N, yr, bias); break;
#endif
    case 1: tile<FMT, OFF, TN, 1>(w, buf, xr, n, N, yr, bias); break;
    default: break;
  }
}

// Weight rows [n, n + TN): on the fly for one x-row tile, else de-quantized once into ``buf``.
template <int FMT, bool OFF, int TN>
inline void panel(const Weights& w, std::vector<float>& buf, const float* x, int64_t M, int64_t n, int64_t N,
                  float* y, const float* bias) {
  if (M <= kFlyRows) {
    rows_of<FMT, OFF, TN>(w, nullptr, x, M, n, N, y, bias);
    return;
  }
  buf.resize(TN * w.K);
  for (int j = 0; j < TN; ++j) dequant_row<FMT, OFF>(w, n + j, buf.data() + j * w.K);
  rows_of<FMT, OFF, TN>(w, buf.data(), x, M, n, N, y, bias);
}

template <int FMT, bool OFF>
void qlinear_into(const Weights& w, const float* x, int64_t M, int64_t N, float* y, const float* bias) {
  const int64_t tiles = (N + kTileN - 1) / kTileN;
#pragma omp parallel if (tiles > 1)
  {
    std::vector<float> buf;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t n = t * kTileN;
      switch (std::min<int64_t>(kTileN, N - n)) {
        case 4: panel<FMT, OFF, 4>(w, buf, x, M, n, N, y, bias); break;
        case 3: panel<FMT, OFF, 3>(w, buf, x, M, n, N, y, bias); break;
        case 2: panel<FMT, OFF, 2>(w, buf, x, M, n, N, y, bias); break;
        default: panel<FMT, OFF, 1>(w, buf, x, M, n, N, y, bias); break;
      }
    }
  }
}

void dispatch(const Weights& w, const float* x, int64_t M, int64_t N, float* y, const float* bias) {
  if (w.fmt == kF32) {
    qlinear_into<kF32, false>(w, x, M, N, y, bias);
  } else if (w.fmt == kU4) {
    w.offsets ? qlinear_into<kU4, true>(w, x, M, N, y, bias) : qlinear_into<kU4, false>(w, x, M, N, y, bias);
  } else {
    w.offsets ? qlinear_into<kI8, true>(w, x, M, N, y, bias) : qlinear_into<kI8, false>(w, x, M, N, y, bias);
  }
}

Weights weights_of(const torch::Tensor& codes, const torch::Tensor& scales, const c10::optional<torch::Tensor>& offsets,
                   int64_t K, int64_t G, int64_t fmt) {
  TORCH_CHECK(fmt == kU4 || fmt == kI8 || fmt == kF32, "qlinear: unknown code format ", fmt);
  TORCH_CHECK(K % kLanes == 0 && G % kLanes == 0 && K % G == 0, "qlinear: K ", K, " and group ", G,
              " must be multiples of ", kLanes, " (and K of G)");
  TORCH_CHECK(fmt != kU4 || G % kU4Group == 0, "qlinear: 4-bit codes group by multiples of 32, not ", G);
  TORCH_CHECK(codes.is_contiguous() && scales.is_contiguous() && scales.scalar_type() == torch::kFloat32,
              "qlinear: contiguous codes and fp32 scales");
  const int64_t N = scales.size(0);
  TORCH_CHECK(scales.numel() == N * (K / G), "qlinear: scales must be [N, K / G]");
  TORCH_CHECK(codes.numel() == (fmt == kU4 ? N * K / 2 : N * K), "qlinear: codes do not hold N x K");
  TORCH_CHECK(codes.element_size() == (fmt == kF32 ? 4 : 1), "qlinear: codes of the wrong width for format ", fmt);
  if (offsets) TORCH_CHECK(offsets->is_contiguous() && offsets->numel() == scales.numel() &&
                           offsets->scalar_type() == torch::kFloat32, "qlinear: offsets must be like scales");
  return Weights{static_cast<const uint8_t*>(codes.data_ptr()), scales.data_ptr<float>(),
                 offsets ? offsets->data_ptr<float>() : nullptr, K, G, fmt};
}

}  // namespace

// x [..., K] fp32 -> [..., N]
torch::Tensor qlinear(const torch::Tensor& x, const torch::Tensor& codes, const torch::Tensor& scales,
                      const c10::optional<torch::Tensor>& offsets, const c10::optional<torch::Tensor>& bias,
                      int64_t G, int64_t fmt) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && x.device().is_cpu(), "qlinear: x must be fp32 on the CPU");
  const int64_t K = x.size(-1);
  const Weights w = weights_of(codes, scales, offsets, K, G, fmt);
  const int64_t N = scales.size(0);
  if (bias) TORCH_CHECK(bias->is_contiguous() && bias->numel() == N && bias->scalar_type() == torch::kFloat32,
                        "qlinear: bias must be fp32 [N]");
  const auto xs = x.reshape({-1, K}).contiguous();
  const int64_t M = xs.size(0);
  auto sizes = x.sizes().vec();
  sizes.back() = N;
  auto y = torch::empty({M, N}, x.options());
  if (M > 0) dispatch(w, xs.data_ptr<float>(), M, N, y.data_ptr<float>(), bias ? bias->data_ptr<float>() : nullptr);
  return y.view(sizes);
}

// rows ``ids`` of the de-quantized weight: [len(ids), K] (an embedding table's lookup, by the same fma)
torch::Tensor dequant_rows(const torch::Tensor& ids, const torch::Tensor& codes, const torch::Tensor& scales,
                           const c10::optional<torch::Tensor>& offsets, int64_t K, int64_t G, int64_t fmt) {
  const Weights w = weights_of(codes, scales, offsets, K, G, fmt);
  const int64_t N = scales.size(0);
  const auto flat = ids.reshape({-1}).to(torch::kLong).contiguous();
  auto out = torch::empty({flat.numel(), K}, scales.options());
  const int64_t* p = flat.data_ptr<int64_t>();
  for (int64_t i = 0; i < flat.numel(); ++i) {
    TORCH_CHECK(p[i] >= 0 && p[i] < N, "dequant_rows: id ", p[i], " out of range [0, ", N, ")");
    float* row = out.data_ptr<float>() + i * K;
    if (w.fmt == kF32) {
      dequant_row<kF32, false>(w, p[i], row);
    } else if (w.fmt == kU4) {
      w.offsets ? dequant_row<kU4, true>(w, p[i], row) : dequant_row<kU4, false>(w, p[i], row);
    } else {
      w.offsets ? dequant_row<kI8, true>(w, p[i], row) : dequant_row<kI8, false>(w, p[i], row);
    }
  }
  return out;
}

int64_t lanes() { return kLanes; }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("qlinear", &qlinear, "x W^T + b over affine-group codes (width-invariant)");
  m.def("dequant_rows", &dequant_rows, "rows of the de-quantized weight");
  m.def("lanes", &lanes, "floats per vector of this build");
}
