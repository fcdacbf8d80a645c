// y[n] = x . W[n] (+ b[n]) for ONE row x, summed in the order this machine's MKL fp32 GEMV sums a dot
// product on AVX2 AMD CPUs: the first `peel` products added in turn, `peel` being what takes the weight row
// to a 16-byte boundary, or 4 where it is on one; then four lanes, lane 0 starting from that sum, each adding
// its products rounded (a multiply, then an add: no FMA); then (lane 0 + lane 2) + (lane 1 + lane 3); then
// the products past the last whole four, in turn; then the bias. MKL takes rows four at a time: the last
// N mod 4 rows go other ways, each after four products in turn whatever the alignment: the first and third
// with eight lanes, (lane i + lane i+4) then folded as above (`odd_row`); the second with the four lanes
// eight products at a time (`second_odd_row`); the rest in turn. gemv.py checks the result bit for bit against the
// stock product on the model's own weights before any forward uses it (another CPU's MKL may sum otherwise).
// Eight weight rows are in flight (two per AVX2 register), the next eight prefetched as these are read, over
// torch's own OpenMP pool as rows_gemm.cpp is.
#include <torch/extension.h>
#include <immintrin.h>
#include <omp.h>

namespace {

constexpr int64_t kLanes = 4;    // the lanes' width (an SSE register of MKL's kernel)
constexpr int64_t kWide = 8;     // the lanes' width for the last N mod 4 rows (an AVX register)
constexpr int64_t kRowGroup = 4; // MKL's rows per group; the rows past the last whole group are odd rows
constexpr uintptr_t kAlign = 16; // the boundary the weight row is peeled to
constexpr int kPairs = 4;        // AVX2 accumulators, two weight rows each
constexpr int64_t kGrain = 64;   // weight rows per parallel block
constexpr int64_t kLine = 64;    // bytes per cache line
// cache lines of the next rows prefetched per step of four columns: a step consumes 2 * kPairs rows x 16 bytes,
// 2 lines, so the next block streams in at the pace this one is read (2.0x the GB/s without, on a 2-core EPYC)
constexpr int64_t kAhead = 2 * kPairs * kLanes * sizeof(float) / kLine;

// products summed one by one before the lanes start: up to the row's next 16-byte boundary, 4 on one
inline int64_t peel_of(const float* w) {
  return kLanes - static_cast<int64_t>((reinterpret_cast<uintptr_t>(w) % kAlign) / sizeof(float));
}

inline float head(const float* w, const float* x, int64_t peel) {
  float s = w[0] * x[0];
  for (int64_t k = 1; k < peel; ++k) s += w[k] * x[k];
  return s;
}

inline float tail(float s, const float* w, const float* x, int64_t from, int64_t K) {
  for (int64_t k = from; k < K; ++k) s += w[k] * x[k];
  return s;
}

inline float finish(__m128 a) {  // (a0 + a2) + (a1 + a3)
  const __m128 t = _mm_add_ps(a, _mm_movehl_ps(a, a));  // [a0 + a2, a1 + a3, ., .]
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

// rows w[0 .. 2P) of the block, each K long; y gets their dot products with x
// (K a multiple of 4, so every row of the block has the first one's alignment and peel)
template <int P>
inline void pairs(const float* w, const float* x, int64_t K, int64_t peel, float* y) {
  const char* next = reinterpret_cast<const char*>(w + 2 * P * K);  // the rows read after these (a hint: never faults)
  const int64_t lines = 2 * P * K * static_cast<int64_t>(sizeof(float)) / kLine;  // their cache lines
  int64_t line = 0;
  __m256 acc[P];
  for (int p = 0; p < P; ++p) {
    const float* lo = w + 2 * p * K;
    acc[p] = _mm256_setr_ps(head(lo, x, peel), 0.f, 0.f, 0.f, head(lo + K, x, peel), 0.f, 0.f, 0.f);
  }
  int64_t k = peel;
  for (; k + kLanes <= K; k += kLanes) {
    const __m256 xv = _mm256_broadcast_ps(reinterpret_cast<const __m128*>(x + k));  // x[k..k+4) twice
    for (int64_t j = 0; j < kAhead && line < lines; ++j, ++line) _mm_prefetch(next + kLine * line, _MM_HINT_T0);
    for (int p = 0; p < P; ++p) {
      const float* lo = w + 2 * p * K + k;
      acc[p] = _mm256_add_ps(acc[p], _mm256_mul_ps(_mm256_loadu2_m128(lo + K, lo), xv));
    }
  }
  for (int p = 0; p < P; ++p) {
    const float* lo = w + 2 * p * K;
    y[2 * p] = tail(finish(_mm256_castps256_ps128(acc[p])), lo, x, k, K);
    y[2 * p + 1] = tail(finish(_mm256_extractf128_ps(acc[p], 1)), lo + K, x, k, K);
  }
}

inline void single(const float* w, const float* x, int64_t K, int64_t peel, float* y) {
  __m128 acc = _mm_setr_ps(head(w, x, peel), 0.f, 0.f, 0.f);
  int64_t k = peel;
  for (; k + kLanes <= K; k += kLanes) acc = _mm_add_ps(acc, _mm_mul_ps(_mm_loadu_ps(w + k), _mm_loadu_ps(x + k)));
  *y = tail(finish(acc), w, x, k, K);
}

// one of the last N mod 4 rows
inline float odd_row(const float* w, const float* x, int64_t K) {
  __m256 acc = _mm256_setr_ps(head(w, x, kLanes), 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f);
  int64_t k = kLanes;
  for (; k + kWide <= K; k += kWide) acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(w + k), _mm256_loadu_ps(x + k)));
  const __m128 folded = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));  // lane i + lane i+4
  return tail(finish(folded), w, x, k, K);
}

// the second of the last N mod 4 rows
inline float second_odd_row(const float* w, const float* x, int64_t K) {
  __m128 acc = _mm_setr_ps(head(w, x, kLanes), 0.f, 0.f, 0.f);
  int64_t k = kLanes;
  for (; k + kWide <= K; k += kWide) {
    acc = _mm_add_ps(acc, _mm_mul_ps(_mm_loadu_ps(w + k), _mm_loadu_ps(x + k)));
    acc = _mm_add_ps(acc, _mm_mul_ps(_mm_loadu_ps(w + k + kLanes), _mm_loadu_ps(x + k + kLanes)));
  }
  return tail(finish(acc), w, x, k, K);
}

void block(const float* w, const float* x, int64_t K, int64_t rows, float* y) {
  const int64_t peel = peel_of(w);
  int64_t n = 0;
  for (; n + 2 * kPairs <= rows; n += 2 * kPairs) pairs<kPairs>(w + n * K, x, K, peel, y + n);
  switch ((rows - n) / 2) {
    case 3: pairs<3>(w + n * K, x, K, peel, y + n); n += 6; break;
    case 2: pairs<2>(w + n * K, x, K, peel, y + n); n += 4; break;
    case 1: pairs<1>(w + n * K, x, K, peel, y + n); n += 2; break;
    default: break;
  }
  if (n < rows) single(w + n * K, x, K, peel, y + n);
}

}  // namespace

torch::Tensor gemv(torch::Tensor x, torch::Tensor weight, c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat && weight.scalar_type() == torch::kFloat, "fp32 only");
  TORCH_CHECK(weight.dim() == 2 && weight.is_contiguous(), "weight: contiguous [N, K]");
  const int64_t N = weight.size(0), K = weight.size(1);
  TORCH_CHECK(K >= kLanes && K % kLanes == 0, "in_features must be a multiple of 4");
  TORCH_CHECK(x.numel() == K, "x must be one row of the weight's in_features");
  auto row = x.contiguous();  // [K]
  auto out = torch::empty({N}, x.options());  // [N]
  const float* w = weight.data_ptr<float>();
  const float* xs = row.data_ptr<float>();
  float* y = out.data_ptr<float>();
  const int64_t grouped = N - N % kRowGroup;  // rows in MKL's groups of four
  const int64_t blocks = (grouped + kGrain - 1) / kGrain;
#pragma omp parallel for schedule(static) if (blocks > 1)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t lo = blk * kGrain, rows = std::min(grouped, lo + kGrain) - lo;
    block(w + lo * K, xs, K, rows, y + lo);
  }
  for (int64_t n = grouped; n < N; ++n) y[n] = (n - grouped == 1 ? second_odd_row : odd_row)(w + n * K, xs, K);
  if (bias.has_value()) out.add_(*bias);  // the stock product adds the bias after the sum
  auto sizes = x.sizes().vec();
  sizes.back() = N;
  return out.view(sizes);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("gemv", &gemv, "x W^T + b for one row, in MKL's fp32 GEMV summation order (AVX2)",
        py::arg("x"), py::arg("weight"), py::arg("bias") = py::none(), py::call_guard<py::gil_scoped_release>());
}
