// y[M, N] = x[M, K] W[N, K]^T (+ b[N]) for a few rows M: every weight row is read once from memory and
// multiplied by all M rows while it is in L1 (AVX2 FMA), over torch's own OpenMP pool. The parallel loop is
// a plain OpenMP one, not at::parallel_for: that one's inlined lazy start-up resets the calling thread's
// OpenMP threads to torch's process-wide default (one, in a serving process) the first time it runs here.
#include <torch/extension.h>
#include <immintrin.h>
#include <omp.h>

namespace {

constexpr int64_t kLanes = 8;       // floats per AVX2 register
constexpr int64_t kRowBlock = 8;    // x rows held in accumulators at once (8 + w + x <= 16 registers)
constexpr int64_t kGrain = 16;      // weight rows per parallel block

inline float hsum(__m256 v) {
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

template <int R>
inline void block(const float* w, const float* x, int64_t K, int64_t ldy, float* y, float bias) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + kLanes <= K; k += kLanes) {
    const __m256 wv = _mm256_loadu_ps(w + k);
    for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + r * K + k), acc[r]);
  }
  for (int r = 0; r < R; ++r) {
    float s = hsum(acc[r]);
    for (int64_t j = k; j < K; ++j) s += w[j] * x[r * K + j];
    y[r * ldy] = s + bias;
  }
}

void rows(const float* w, const float* x, int64_t m, int64_t K, int64_t N, float* y, float bias) {
  int64_t r = 0;
  for (; r + kRowBlock <= m; r += kRowBlock) block<kRowBlock>(w, x + r * K, K, N, y + r * N, bias);
  switch (m - r) {
    case 7: block<7>(w, x + r * K, K, N, y + r * N, bias); break;
    case 6: block<6>(w, x + r * K, K, N, y + r * N, bias); break;
    case 5: block<5>(w, x + r * K, K, N, y + r * N, bias); break;
    case 4: block<4>(w, x + r * K, K, N, y + r * N, bias); break;
    case 3: block<3>(w, x + r * K, K, N, y + r * N, bias); break;
    case 2: block<2>(w, x + r * K, K, N, y + r * N, bias); break;
    case 1: block<1>(w, x + r * K, K, N, y + r * N, bias); break;
    default: break;
  }
}

// y[M, N] = x W^T + b over torch's OpenMP pool, blocks of kGrain weight rows
void rows_into(const float* w, const float* xs, int64_t M, int64_t K, int64_t N, float* y, const float* bp) {
  const int64_t blocks = (N + kGrain - 1) / kGrain;
#pragma omp parallel for schedule(static) if (blocks > 1)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t hi = std::min(N, (blk + 1) * kGrain);
    for (int64_t n = blk * kGrain; n < hi; ++n) rows(w + n * K, xs, M, K, N, y + n, bp ? bp[n] : 0.0f);
  }
}

}  // namespace
