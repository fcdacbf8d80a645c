// y[M, N] = x[M, K] W[N, K]^T (+ b[N]) with x quantized to int8 and the weight's integer codes multiplied as
// integers (AVX-512 VNNI vpdpbusd), as llama.cpp multiplies a GGUF file's blocks: per block of 32 x elements
// one scale dx = max |x| / 127 and codes q = round(x / dx); per span of min(G, 32) elements the exact integer
// sum of code(w) * q(x), then acc += float(sum) * scale(w) * dx in fp32; a group's offset adds
// offset(w) * dx * sum(q) (W[n, k] = scale * code + offset, as qlinear.cpp reads the same blocks).
//
// The weights are tiled by 16 output rows, one a 32-bit lane (qdot.py repacks them once at load): a vector of
// 64 code bytes holds 4 consecutive k of 16 rows, so one vpdpbusd with 4 x bytes broadcast adds 64 products
// into 16 outputs and no horizontal sum is ever taken.
//   u4 (4-bit codes 0..15): [N/16, K/32, 4, 16, 4] bytes; byte (t, g, j, l, b) holds code k = 32g + 4j + b of
//       row 16t + l in its low nibble and code k + 16 in its high one;
//   i8 (int8 codes): [N/16, K/4, 16, 4] bytes, code + 128 (vpdpbusd's first operand is unsigned; the sum is
//       corrected by -128 * sum(q) of the span, an exact integer, before it is converted);
//   scales and offsets: [N/16, K/G, 16] fp32.
//
// Built with AMX-INT8 (-mamx-int8: the "amx512" build), a product of several rows runs each span's integer
// sums on AMX tiles (tdpbsud: 16 x rows by 16 outputs by one span) and the same fp32 chain after them; the
// sums are integers, so they and every output are the VNNI path's bit for bit, whichever path a width takes.
//
// Width-invariant by construction: x rows are quantized one by one; y[r, n] is one lane of one thread, the
// same integer sums and the same fp32 fma chain over spans in order whatever M is, whichever rows share
// the call and however many threads run it; the bias is added last. So a tree row's logits are its one-token
// forward's bit for bit.
#include <torch/extension.h>
#include <immintrin.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace {

constexpr int kLanes = 16;        // output rows a weight tile holds, one a 32-bit lane
constexpr int64_t kXBlock = 32;   // x elements sharing one int8 scale
constexpr int kTileM = 8;         // x rows one pass over a weight span multiplies (8 code vectors + 8 acc)
constexpr int kU4 = 0;            // the code layouts, numbered as qlinear.cpp's
constexpr int kI8 = 1;
constexpr int32_t kI8Bias = 128;  // what i8 codes are stored plus
constexpr float kQMax = 127.0f;   // the largest |q|

struct Weights {
  const uint8_t* codes;   // tiled as above
  const float* scales;    // [N/16, K/G, 16]
  const float* offsets;   // [N/16, K/G, 16], or null
  int64_t N, K, G, fmt;
};

// x rows quantized: codes, the block scales, and the sums the i8 bias and the offsets need.
struct XQ {
  int64_t K, G, span;
  std::vector<int8_t> q;      // [M, K]
  std::vector<float> d;       // [M, K / 32]: dx of each block
  std::vector<int32_t> neg;   // [M, K / span]: -128 * sum(q) over each span
  std::vector<float> sums;    // [M, K / G]: sum over each group's spans of dx * sum(q), in order
};

#if defined(__AMX_INT8__)
constexpr int kAmxRows = 16;               // x rows an A tile holds
constexpr int kAmxSpans = 2;               // spans whose tile products are in flight at once
constexpr long kArchReqXcompPerm = 0x1023;  // arch_prctl: ask the kernel for a state component
constexpr long kXtileData = 18;            // the AMX tile data state component
int64_t g_amx_rows = kAmxRows;              // products of at least this many rows run on AMX (0: never)
#else
constexpr int kAmxRows = 1;  // no AMX in this build
int64_t g_amx_rows = 0;
#endif

inline int32_t hsum_i(__m512i v) { return _mm512_reduce_add_epi32(v); }  // integers: any order is exact

void quantize_row(const float* x, XQ& xq, int64_t r) {
  const int64_t K = xq.K, span = xq.span;
  int8_t* q = xq.q.data() + r * K;
  float* d = xq.d.data() + r * (K / kXBlock);
  for (int64_t b = 0; b < K / kXBlock; ++b) {
    const float* xb = x + b * kXBlock;
    const __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + kLanes);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    const float dx = amax / kQMax;
    const float inv = dx > 0.0f ? 1.0f / dx : 0.0f;
    d[b] = dx;
    const __m512 s = _mm512_set1_ps(inv);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * kXBlock),
                     _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v0, s))));  // nearest, ties even
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * kXBlock + kLanes),
                     _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v1, s))));
  }
  int32_t* neg = xq.neg.data() + r * (K / span);
  float* sums = xq.sums.data() + r * (K / xq.G);
  const int64_t per_group = xq.G / span;
  for (int64_t s = 0; s < K / span; ++s) {
    int32_t total = 0;
    for (int64_t i = 0; i < span; i += kLanes)
      total += hsum_i(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + s * span + i))));
    neg[s] = -kI8Bias * total;
    const float part = d[s * span / kXBlock] * static_cast<float>(total);
    sums[s / per_group] = (s % per_group == 0) ? part : sums[s / per_group] + part;
  }
}

inline int32_t four_bytes(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// The span's code vectors of weight tile t: SPAN / 4 vectors of 64 bytes (16 lanes of 4 k each).
template <int FMT, int SPAN>
inline void span_codes(const Weights& w, int64_t t, int64_t s, __m512i* cv) {
  if constexpr (FMT == kU4) {
    static_assert(SPAN == 32, "4-bit codes group by 32");
    const uint8_t* base = w.codes + (t * (w.K / 32) + s) * (4 * 64);
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int j = 0; j < 4; ++j) {
      const __m512i p = _mm512_loadu_si512(base + 64 * j);
      cv[j] = _mm512_and_si512(p, low);
      cv[j + 4] = _mm512_and_si512(_mm512_srli_epi16(p, 4), low);
    }
  } else {
    const uint8_t* base = w.codes + (t * (w.K / 4) + s * (SPAN / 4)) * 64;
    for (int j = 0; j < SPAN / 4; ++j) cv[j] = _mm512_loadu_si512(base + 64 * j);
  }
}

// Weight tile t (outputs [16t, 16t + 16)) by x rows [r0, r0 + TM): y[r, 16t + l] (+ bias).
template <int FMT, int SPAN, bool OFF, int TM>
void tile(const Weights& w, const XQ& xq, int64_t t, int64_t r0, float* y, const float* bias) {
  const int64_t K = w.K, groups = K / w.G, per_group = w.G / SPAN;
  __m512 acc[TM];
  for (int r = 0; r < TM; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t s = 0; s < K / SPAN; ++s) {
    const int64_t g = s / per_group;
    __m512i cv[SPAN / 4];
    span_codes<FMT, SPAN>(w, t, s, cv);
    const __m512 ws = _mm512_loadu_ps(w.scales + (t * groups + g) * kLanes);
    for (int r = 0; r < TM; ++r) {
      const int64_t row = r0 + r;
      const int8_t* xs = xq.q.data() + row * K + s * SPAN;
      __m512i ia = FMT == kI8 ? _mm512_set1_epi32(xq.neg[row * (K / SPAN) + s]) : _mm512_setzero_si512();
      for (int j = 0; j < SPAN / 4; ++j) ia = _mm512_dpbusd_epi32(ia, cv[j], _mm512_set1_epi32(four_bytes(xs + 4 * j)));
      const __m512 dx = _mm512_set1_ps(xq.d[row * (K / kXBlock) + s * SPAN / kXBlock]);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia), _mm512_mul_ps(ws, dx), acc[r]);
    }
    if (OFF && (s + 1) % per_group == 0) {
      const __m512 ov = _mm512_loadu_ps(w.offsets + (t * groups + g) * kLanes);
      for (int r = 0; r < TM; ++r) acc[r] = _mm512_fmadd_ps(ov, _mm512_set1_ps(xq.sums[(r0 + r) * groups + g]), acc[r]);
    }
  }
  const __m512 b = bias ? _mm512_loadu_ps(bias + t * kLanes) : _mm512_setzero_ps();
  for (int r = 0; r < TM; ++r) _mm512_storeu_ps(y + (r0 + r) * w.N + t * kLanes, _mm512_add_ps(acc[r], b));
}

// Rows [r, M) of weight tile t on VNNI: passes of kTileM rows, then the remainder.
template <int FMT, int SPAN, bool OFF>
void vnni_rows(const Weights& w, const XQ& xq, int64_t t, int64_t r, int64_t M, float* y, const float* bias) {
  for (; r + kTileM <= M; r += kTileM) tile<FMT, SPAN, OFF, kTileM>(w, xq, t, r, y, bias);
  switch (M - r) {
    case 7: tile<FMT, SPAN, OFF, 7>(w, xq, t, r, y, bias); break;
    case 6: tile<FMT, SPAN, OFF, 6>(w, xq, t, r, y, bias); break;
    case 5: tile<FMT, SPAN, OFF, 5>(w, xq, t, r, y, bias); break;
    case 4: tile<FMT, SPAN, OFF, 4>(w, xq, t, r, y, bias); break;
    case 3: tile<FMT, SPAN, OFF, 3>(w, xq, t, r, y, bias); break;
    case 2: tile<FMT, SPAN, OFF, 2>(w, xq, t, r, y, bias); break;
    case 1: tile<FMT, SPAN, OFF, 1>(w, xq, t, r, y, bias); break;
    default: break;
  }
}

template <int FMT, int SPAN, bool OFF>
void product(const Weights& w, const XQ& xq, int64_t M, float* y, const float* bias) {
  const int64_t tiles = w.N / kLanes;
#pragma omp parallel for schedule(static) if (tiles > 1)
  for (int64_t t = 0; t < tiles; ++t) vnni_rows<FMT, SPAN, OFF>(w, xq, t, 0, M, y, bias);
}

#if defined(__AMX_INT8__)
bool amx_permitted() {  // once a process: Linux hands out AMX state only on request
  static const bool ok = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXtileData) == 0;
  return ok;
}

struct TileConfig {  // ldtilecfg's 64-byte operand, palette 1
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// per span in flight: C, 16 x rows by 16 int32 sums; A, 16 x rows by SPAN q bytes; B, SPAN / 4 rows of 64
// code bytes (16 outputs by 4 k: the tiled layout's own rows)
template <int SPAN>
void configure() {
  TileConfig c{};
  c.palette = 1;
  for (int i = 0; i < kAmxSpans; ++i) {  // tiles i, i + 2, i + 4: C, A and B of the i-th span in flight
    c.rows[i] = kAmxRows, c.colsb[i] = kLanes * sizeof(int32_t);
    c.rows[i + kAmxSpans] = kAmxRows, c.colsb[i + kAmxSpans] = SPAN;
    c.rows[i + 2 * kAmxSpans] = SPAN / 4, c.colsb[i + 2 * kAmxSpans] = 64;
  }
  _tile_loadconfig(&c);
}

// Span s's integer sums into C tile i (i < kAmxSpans; tile numbers are immediates, hence the branches).
template <int FMT, int SPAN>
inline void sums_of(const Weights& w, const XQ& xq, int64_t t, int64_t r0, int64_t s, int i, uint8_t* unpacked) {
  const int64_t K = w.K;
  const uint8_t* b = w.codes + (t * (K / 4) + s * (SPAN / 4)) * 64;
  if constexpr (FMT == kU4) {
    __m512i cv[SPAN / 4];
    span_codes<FMT, SPAN>(w, t, s, cv);
    for (int j = 0; j < SPAN / 4; ++j) _mm512_store_si512(unpacked + 64 * j, cv[j]);
    b = unpacked;
  }
  const int8_t* a = xq.q.data() + r0 * K + s * SPAN;
  if (i == 0) {
    _tile_zero(0);
    _tile_loadd(2, a, K);
    _tile_loadd(4, b, 64);
    _tile_dpbsud(0, 2, 4);
  } else {
    _tile_zero(1);
    _tile_loadd(3, a, K);
    _tile_loadd(5, b, 64);
    _tile_dpbsud(1, 3, 5);
  }
}

// Weight tile t by the 16 x rows from r0: each span's sums from one tdpbsud, then the fp32 chain of tile<>
// above, row by row.
template <int FMT, int SPAN, bool OFF>
void amx_tile(const Weights& w, const XQ& xq, int64_t t, int64_t r0, float* y, const float* bias) {
  const int64_t K = w.K, groups = K / w.G, per_group = w.G / SPAN;
  alignas(64) int32_t sums_all[kAmxSpans][kAmxRows * kLanes];
  alignas(64) uint8_t unpacked[kAmxSpans][SPAN / 4 * 64];
  __m512 acc[kAmxRows];
  for (int r = 0; r < kAmxRows; ++r) acc[r] = _mm512_setzero_ps();
  const int64_t spans = K / SPAN;
  for (int64_t s0 = 0; s0 < spans; s0 += kAmxSpans) {
    const int in_flight = static_cast<int>(std::min<int64_t>(kAmxSpans, spans - s0));
    for (int i = 0; i < in_flight; ++i) sums_of<FMT, SPAN>(w, xq, t, r0, s0 + i, i, unpacked[i]);
    for (int i = 0; i < in_flight; ++i) {
      const int64_t s = s0 + i, g = s / per_group;
      const int32_t* sums = sums_all[i];
      if (i == 0) _tile_stored(0, sums_all[0], kLanes * sizeof(int32_t));
      else _tile_stored(1, sums_all[1], kLanes * sizeof(int32_t));
      const __m512 ws = _mm512_loadu_ps(w.scales + (t * groups + g) * kLanes);
      for (int r = 0; r < kAmxRows; ++r) {
        const int64_t row = r0 + r;
        __m512i ia = _mm512_load_si512(sums + r * kLanes);
        if (FMT == kI8) ia = _mm512_add_epi32(ia, _mm512_set1_epi32(xq.neg[row * (K / SPAN) + s]));
        const __m512 dx = _mm512_set1_ps(xq.d[row * (K / kXBlock) + s * SPAN / kXBlock]);
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia), _mm512_mul_ps(ws, dx), acc[r]);
      }
      if (OFF && (s + 1) % per_group == 0) {
        const __m512 ov = _mm512_loadu_ps(w.offsets + (t * groups + g) * kLanes);
        for (int r = 0; r < kAmxRows; ++r)
          acc[r] = _mm512_fmadd_ps(ov, _mm512_set1_ps(xq.sums[(r0 + r) * groups + g]), acc[r]);
      }
    }
  }
  const __m512 bv = bias ? _mm512_loadu_ps(bias + t * kLanes) : _mm512_setzero_ps();
  for (int r = 0; r < kAmxRows; ++r)
    _mm512_storeu_ps(y + (r0 + r) * w.N + t * kLanes, _mm512_add_ps(acc[r], bv));
}

template <int FMT, int SPAN, bool OFF>
void amx_product(const Weights& w, const XQ& xq, int64_t M, float* y, const float* bias) {
  const int64_t tiles = w.N / kLanes;
#pragma omp parallel if (tiles > 1)
  {
    configure<SPAN>();
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tiles; ++t) {  // whole A tiles on AMX, the rows after them on VNNI (the same bits)
      int64_t r0 = 0;
      for (; r0 + kAmxRows <= M; r0 += kAmxRows) amx_tile<FMT, SPAN, OFF>(w, xq, t, r0, y, bias);
      vnni_rows<FMT, SPAN, OFF>(w, xq, t, r0, M, y, bias);
    }
    _tile_release();
  }
}

bool use_amx(int64_t M) { return g_amx_rows > 0 && M >= std::max<int64_t>(g_amx_rows, kAmxRows) && amx_permitted(); }
#else
template <int FMT, int SPAN, bool OFF> void amx_product(const Weights&, const XQ&, int64_t, float*, const float*) {}
bool use_amx(int64_t) { return false; }
#endif

template <int FMT, int SPAN>
void with_offsets(const Weights& w, const XQ& xq, int64_t M, float* y, const float* bias) {
  if (use_amx(M)) {
    w.offsets ? amx_product<FMT, SPAN, true>(w, xq, M, y, bias) : amx_product<FMT, SPAN, false>(w, xq, M, y, bias);
  } else {
    w.offsets ? product<FMT, SPAN, true>(w, xq, M, y, bias) : product<FMT, SPAN, false>(w, xq, M, y, bias);
  }
}

int64_t span_of(int64_t G) { return std::min<int64_t>(G, kXBlock); }
Weights weights_of(const torch::Tensor& codes, const torch::Tensor& scales, const c10::optional<torch::Tensor>& offsets,
                   int64_t K, int64_t G, int64_t fmt) {
  TORCH_CHECK(fmt == kU4 || fmt == kI8, "qdot: unknown code format ", fmt);
  TORCH_CHECK(K % kXBlock == 0 && K % G == 0 && (G == 16 || G % kXBlock == 0), "qdot: K ", K, " and group ", G,
              " must be multiples of 32 (the group 16 or a multiple of 32, dividing K)");
  TORCH_CHECK(fmt != kU4 || G % kXBlock == 0, "qdot: 4-bit codes group by multiples of 32, not ", G);
  TORCH_CHECK(codes.is_contiguous() && codes.element_size() == 1 && scales.is_contiguous() &&
              scales.scalar_type() == torch::kFloat32 && scales.dim() == 3 && scales.size(2) == kLanes,
              "qdot: contiguous byte codes and fp32 scales [N/16, K/G, 16]");
  TORCH_CHECK(scales.size(1) == K / G, "qdot: scales hold ", scales.size(1), " groups, K / G is ", K / G);
  const int64_t N = scales.size(0) * kLanes;
  TORCH_CHECK(codes.numel() == (fmt == kU4 ? N * K / 2 : N * K), "qdot: codes do not hold N x K");
  if (offsets) TORCH_CHECK(offsets->is_contiguous() && offsets->numel() == scales.numel() &&
                           offsets->scalar_type() == torch::kFloat32, "qdot: offsets must be like scales");
  return Weights{codes.data_ptr<uint8_t>(), scales.data_ptr<float>(), offsets ? offsets->data_ptr<float>() : nullptr,
                 N, K, G, fmt};
}

// Weight row n's element k de-quantized: fma(scale, code, offset), the same single rounding as qlinear.cpp's.
inline float element(const Weights& w, int64_t n, int64_t k) {
  const int64_t t = n / kLanes, l = n % kLanes;
  float code;
  if (w.fmt == kU4) {
    const int64_t g = k / 32, within = k % 32, j = (within % 16) / 4, b = within % 4;
    const uint8_t byte = w.codes[(((t * (w.K / 32) + g) * 4 + j) * kLanes + l) * 4 + b];
    code = static_cast<float>(within < 16 ? (byte & 0x0F) : (byte >> 4));
  } else {
    code = static_cast<float>(static_cast<int32_t>(w.codes[((t * (w.K / 4) + k / 4) * kLanes + l) * 4 + k % 4]) - kI8Bias);
  }
  const int64_t at = (t * (w.K / w.G) + k / w.G) * kLanes + l;
  return std::fmaf(w.scales[at], code, w.offsets ? w.offsets[at] : 0.0f);
}

}  // namespace

// x [..., K] fp32 -> [..., N]
torch::Tensor qdot(const torch::Tensor& x, const torch::Tensor& codes, const torch::Tensor& scales,
                   const c10::optional<torch::Tensor>& offsets, const c10::optional<torch::Tensor>& bias, int64_t G,
                   int64_t fmt) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && x.device().is_cpu(), "qdot: x must be fp32 on the CPU");
  const int64_t K = x.size(-1);
  const Weights w = weights_of(codes, scales, offsets, K, G, fmt);
  if (bias) TORCH_CHECK(bias->is_contiguous() && bias->numel() == w.N && bias->scalar_type() == torch::kFloat32,
                        "qdot: bias must be fp32 [N]");
  const auto xs = x.reshape({-1, K}).contiguous();
  const int64_t M = xs.size(0);
  auto sizes = x.sizes().vec();
  sizes.back() = w.N;
  auto y = torch::empty({M, w.N}, x.options());
  if (M == 0) return y.view(sizes);
  const int64_t span = span_of(G);
  XQ xq{K, G, span, std::vector<int8_t>(M * K), std::vector<float>(M * (K / kXBlock)),
        std::vector<int32_t>(M * (K / span)), std::vector<float>(M * (K / G))};
  const float* xp = xs.data_ptr<float>();
#pragma omp parallel for schedule(static) if (M > 1)
  for (int64_t r = 0; r < M; ++r) quantize_row(xp + r * K, xq, r);
  float* yp = y.data_ptr<float>();
  const float* bp = bias ? bias->data_ptr<float>() : nullptr;
  if (fmt == kU4) {
    with_offsets<kU4, 32>(w, xq, M, yp, bp);
  } else if (span == 16) {
    with_offsets<kI8, 16>(w, xq, M, yp, bp);
  } else {
    with_offsets<kI8, 32>(w, xq, M, yp, bp);
  }
  return y.view(sizes);
}

// rows ``ids`` of the de-quantized weight: [len(ids), K] (an embedding table's lookup)
torch::Tensor dequant_rows(const torch::Tensor& ids, const torch::Tensor& codes, const torch::Tensor& scales,
                           const c10::optional<torch::Tensor>& offsets, int64_t K, int64_t G, int64_t fmt) {
  const Weights w = weights_of(codes, scales, offsets, K, G, fmt);
  const auto flat = ids.reshape({-1}).to(torch::kLong).contiguous();
  auto out = torch::empty({flat.numel(), K}, scales.options());
  const int64_t* p = flat.data_ptr<int64_t>();
  float* o = out.data_ptr<float>();
  for (int64_t i = 0; i < flat.numel(); ++i) {
    TORCH_CHECK(p[i] >= 0 && p[i] < w.N, "dequant_rows: id ", p[i], " out of range [0, ", w.N, ")");
    for (int64_t k = 0; k < K; ++k) o[i * K + k] = element(w, p[i], k);
  }
  return out;
}

int64_t lanes() { return kLanes; }

// Products of at least ``rows`` x rows run on AMX tiles from now on (0: never); the previous setting. A
// build without AMX keeps 0. Either path gives the same bits: this moves only the cost.
int64_t amx_rows(int64_t rows) {
  const int64_t was = g_amx_rows;
#if defined(__AMX_INT8__)
  g_amx_rows = rows;
#endif
  return was;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("qdot", &qdot, "x W^T + b, x as int8 blocks times the codes as integers (width-invariant)");
  m.def("dequant_rows", &dequant_rows, "rows of the de-quantized tiled weight");
  m.def("lanes", &lanes, "output rows a weight tile holds");
  m.def("amx_rows", &amx_rows, "products of at least this many rows run on AMX (0: never); returns the last");
}
