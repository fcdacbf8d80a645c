// y[M, N] = x[M, K] W[N, K]^T (+ b[N]) for a few rows M, on CPUs with AVX-512: the rows kernel's contract
// (every weight row read from memory once for all M rows) with a register tile instead of one weight row at a
// time. A tile is kRows weight rows by up to kCols x rows, one 16-float accumulator per pair (24 of the 32
// zmm registers); a step of 16 columns loads kRows weight vectors and kCols x vectors for kRows * kCols FMAs
// (the AVX2 kernel loads 1 + 8 for 8). The next tile's cache lines are prefetched while this one is multiplied,
// evenly over all its passes over the x rows, so the weights stream from memory at one pace however many passes
// the rows take. Every dot product is summed the same way whatever M and the row's place in
// it: sixteen lanes over K, folded by halves, plus the bias. A plain omp parallel for over blocks of weight
// rows, in torch's own OpenMP pool, as rows_gemm.cpp.
#include <torch/extension.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>

namespace {

constexpr int64_t kLanes = 16;  // floats per zmm register
constexpr int kRows = 4;        // weight rows per tile
constexpr int kCols = 6;        // x rows per tile at most: kRows * kCols accumulators + kRows weights + 1 x <= 32 registers
constexpr int64_t kGrain = 32;  // weight rows per parallel block (a multiple of kRows)
constexpr int64_t kLine = 64;   // bytes per cache line

// the sum of a's 16 lanes: halves folded, 8 + 8, 4 + 4, 2 + 2, 1 + 1
inline float fold(__m512 a) {
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
}

// the sums of a, b, c and d's 16 lanes, in that order: the same folds as fold(), four registers at a time
inline __m128 fold4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));  // [a01+a23, b01+b23] halves
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));
  const __m512 q = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));  // a, b, c, d quarters
  const __m512 p = _mm512_add_ps(q, _mm512_shuffle_ps(q, q, 0x4E));  // each quarter: [0+2, 1+3, 2+0, 3+1]
  const __m512 t = _mm512_add_ps(p, _mm512_shuffle_ps(p, p, 0xB1));  // each quarter's total in all four lanes
  return _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), t));
}

// 16 columns from p, or, for the last K mod 16 (Tail), the columns inside `mask` and zeros
template <bool Tail>
inline __m512 load(const float* p, __mmask16 mask) {
  if constexpr (Tail) return _mm512_maskz_loadu_ps(mask, p);
  return _mm512_loadu_ps(p);
}

// acc[c][r] += w[r][k, k + 16) * x[c][k, k + 16) for R weight rows and C x rows (each K long)
template <int R, int C, bool Tail>
inline void madd(__m512 (&acc)[C][R], const float* w, const float* x, int64_t K, int64_t k, __mmask16 mask) {
  __m512 wv[R];
  for (int r = 0; r < R; ++r) wv[r] = load<Tail>(w + r * K + k, mask);
  for (int c = 0; c < C; ++c) {
    const __m512 xv = load<Tail>(x + c * K + k, mask);
    for (int r = 0; r < R; ++r) acc[c][r] = _mm512_fmadd_ps(wv[r], xv, acc[c][r]);
  }
}

// y[c * ldy + r] = w[r] . x[c] + bias[r] for R weight rows and C x rows (each K long); the first `lines`
// cache lines of `next` are prefetched as the tile is read, spread evenly over its steps of 16 columns
template <int R, int C>
inline void tile(const float* w, const float* x, int64_t K, float* y, int64_t ldy, const float* bias,
                 const char* next, int64_t lines) {
  __m512 acc[C][R];
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < R; ++r) acc[c][r] = _mm512_setzero_ps();
  const int64_t steps = std::max<int64_t>(1, K / kLanes);
  const int64_t pace = (lines + steps - 1) / steps;  // lines prefetched a step
  int64_t line = 0;
  int64_t k = 0;
  for (; k + kLanes <= K; k += kLanes) {
    for (int64_t j = 0; j < pace && line < lines; ++j, ++line) _mm_prefetch(next + kLine * line, _MM_HINT_T0);
    madd<R, C, false>(acc, w, x, K, k, 0);
  }
  if (k < K) madd<R, C, true>(acc, w, x, K, k, static_cast<__mmask16>((1u << (K - k)) - 1u));  // the last K mod 16
  for (int c = 0; c < C; ++c) {
    if constexpr (R == kRows) {
      const __m128 s = fold4(acc[c][0], acc[c][1], acc[c][2], acc[c][3]);  // [w0 . x, w1 . x, w2 . x, w3 . x]
      _mm_storeu_ps(y + c * ldy, bias ? _mm_add_ps(s, _mm_loadu_ps(bias)) : s);
    } else {
      for (int r = 0; r < R; ++r) y[c * ldy + r] = fold(acc[c][r]) + (bias ? bias[r] : 0.0f);
    }
  }
}

// every x row (M of them) times R weight rows, in ceil(M / kCols) passes of near-equal width (8 rows: 4 + 4,
// not 6 + 2); `next`'s lines are prefetched a share a pass, so that memory streams the next tile through every
// pass (the later passes read this tile from L1 and would otherwise leave it idle)
template <int R>
void panel(const float* w, const float* x, int64_t M, int64_t K, int64_t N, float* y, const float* bias,
           const char* next, int64_t lines) {
  const int64_t passes = (M + kCols - 1) / kCols;
  for (int64_t p = 0, m = 0; p < passes; ++p) {
    const int64_t width = M / passes + (p < M % passes ? 1 : 0);
    const float* xs = x + m * K;
    float* ys = y + m * N;
    const int64_t first = lines * p / passes, share = lines * (p + 1) / passes - first;  // this pass's lines
    const char* ahead = next ? next + kLine * first : nullptr;
    switch (width) {
      case 6: tile<R, 6>(w, xs, K, ys, N, bias, ahead, share); break;
      case 5: tile<R, 5>(w, xs, K, ys, N, bias, ahead, share); break;
      case 4: tile<R, 4>(w, xs, K, ys, N, bias, ahead, share); break;
      case 3: tile<R, 3>(w, xs, K, ys, N, bias, ahead, share); break;
      case 2: tile<R, 2>(w, xs, K, ys, N, bias, ahead, share); break;
      default: tile<R, 1>(w, xs, K, ys, N, bias, ahead, share); break;
    }
    m += width;
  }
}

// weight rows [lo, hi) times every x row
void rows(const float* w, const float* x, int64_t M, int64_t K, int64_t N, float* y, const float* bias,
          int64_t lo, int64_t hi) {
  const int64_t row_lines = K * static_cast<int64_t>(sizeof(float)) / kLine;  // lines of one weight row (floor)
  int64_t n = lo;
  for (; n + kRows <= hi; n += kRows) {
    const int64_t ahead = std::clamp<int64_t>(N - n - kRows, 0, kRows);  // rows of the next tile (the next block's)
    const char* next = reinterpret_cast<const char*>(w + (n + kRows) * K);
    panel<kRows>(w + n * K, x, M, K, N, y + n, bias ? bias + n : nullptr, next, ahead * row_lines);
  }
  const float* b = bias ? bias + n : nullptr;
  switch (hi - n) {
    case 3: panel<3>(w + n * K, x, M, K, N, y + n, b, nullptr, 0); break;
    case 2: panel<2>(w + n * K, x, M, K, N, y + n, b, nullptr, 0); break;
    case 1: panel<1>(w + n * K, x, M, K, N, y + n, b, nullptr, 0); break;
    default: break;
  }
}

// y[M, N] = x W^T + b over torch's OpenMP pool, blocks of kGrain weight rows
void rows_into(const float* w, const float* xs, int64_t M, int64_t K, int64_t N, float* y, const float* bp) {
  const int64_t blocks = (N + kGrain - 1) / kGrain;
#pragma omp parallel for schedule(static) if (blocks > 1)
  for (int64_t blk = 0; blk < blocks; ++blk) rows(w, xs, M, K, N, y, bp, blk * kGrain, std::min(N, (blk + 1) * kGrain));
}

}  // namespace
