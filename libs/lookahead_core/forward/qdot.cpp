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
// Width-invariant by construction: x rows are quantized one by one; y[r, n] is one lane of one thread, the
// same integer sums and the same fp32 fma chain over spans in order whatever M is, whichever rows share
// the call and however many threads run it; the bias is added last. So a tree row's logits are its one-token
// forward's bit for bit.
#include <torch/extension.h>
#include <immintrin.h>
#include <omp.h>

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

template <int FMT, int SPAN, bool OFF>
void product(const Weights& w, const XQ& xq, int64_t M, float* y, const float* bias) {
  const int64_t tiles = w.N / kLanes;
#pragma omp parallel for schedule(static) if (tiles > 1)
  for (int64_t t = 0; t < tiles; ++t) {
    int64_t r = 0;
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
}

template <int FMT, int SPAN>
void with_offsets(const Weights& w, const XQ& xq, int64_t M, float* y, const float* bias) {
  w.offsets ? product<FMT, SPAN, true>(w, xq, M, y, bias) : product<FMT, SPAN, false>(w, xq, M, y, bias);
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

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("qdot", &qdot, "x W^T + b, x as int8 blocks times the codes as integers (width-invariant)");
  m.def("dequant_rows", &dequant_rows, "rows of the de-quantized tiled weight");
  m.def("lanes", &lanes, "output rows a weight tile holds");
}
