// The lean layer loop's small fused steps, each the stock operations' arithmetic in fewer calls:
// - add_rms_norm: x + d, then the Llama/Qwen2 RMSNorm of it: w * (x * (1 / sqrt(sum(x * x) / H + eps))),
//   the sum in ATen's cascade order (SumKernel.cpp: vectors of `lanes` floats, four of them a row of the
//   cascade, levels of 16 rows and more, then the rows' four vectors, then the lanes in turn), each step
//   rounded as ATen rounds it (no FMA: built with -ffp-contract=off);
// - rotary_into_cache: q and k of a request's tokens rotated (q * cos + rotate_half(q) * sin, three roundings
//   as HF's apply_rotary_pos_emb makes them), k and v written into the request's cache from `past` on.
// lean.py checks the loop built on them against the stock forward bit for bit before any forward uses it
// (another torch build may sum with other vectors: then the loop runs the stock operations instead).
#include <torch/extension.h>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t kRows = 4;     // vectors per row of the cascade (ATen's ilp_factor)
constexpr int kLevels = 4;       // levels of the cascade (ATen's num_levels)
constexpr int64_t kMinPower = 4; // 2^4 = 16 rows at least per level step

int64_t ceil_log2(int64_t x) {  // ATen's utils::CeilLog2
  if (x <= 2) return 1;
  int64_t bits = 0;
  for (uint64_t v = static_cast<uint64_t>(x - 1); v; v >>= 1) ++bits;
  return bits;
}

// sum of x[i] * x[i] over n floats, as at::sum sums x.pow(2) along a contiguous last dimension
template <int L>
float sum_of_squares(const float* x, int64_t n) {
  const int64_t vecs = n / L, size = vecs / kRows;
  const int64_t power = std::max(kMinPower, ceil_log2(size) / kLevels);
  const int64_t step = int64_t(1) << power, mask = step - 1;
  float acc[kLevels][kRows][L] = {};
  auto add_row = [&](int64_t row) {
    for (int64_t k = 0; k < kRows; ++k) {
      const float* v = x + (row * kRows + k) * L;
      for (int l = 0; l < L; ++l) acc[0][k][l] += v[l] * v[l];
    }
  };
  int64_t i = 0;
  while (i + step <= size) {
    for (int64_t j = 0; j < step; ++j, ++i) add_row(i);
    for (int j = 1; j < kLevels; ++j) {
      for (int64_t k = 0; k < kRows; ++k) {
        for (int l = 0; l < L; ++l) {
          acc[j][k][l] += acc[j - 1][k][l];
          acc[j - 1][k][l] = 0.f;
        }
      }
      if ((i & (mask << (j * power))) != 0) break;
    }
  }
  for (; i < size; ++i) add_row(i);
  for (int j = 1; j < kLevels; ++j)
    for (int64_t k = 0; k < kRows; ++k)
      for (int l = 0; l < L; ++l) acc[0][k][l] += acc[j][k][l];
  for (int64_t v = size * kRows; v < vecs; ++v)  // vectors past the last whole row
    for (int l = 0; l < L; ++l) acc[0][0][l] += x[v * L + l] * x[v * L + l];
  for (int64_t k = 1; k < kRows; ++k)
    for (int l = 0; l < L; ++l) acc[0][0][l] += acc[0][k][l];
  float total = 0.f;
  for (int64_t t = vecs * L; t < n; ++t) total += x[t] * x[t];  // floats past the last whole vector
  for (int l = 0; l < L; ++l) total += acc[0][0][l];
  return total;
}

float sum_of_squares(const float* x, int64_t n, int64_t lanes) {
  if (lanes == 8) return sum_of_squares<8>(x, n);
  if (lanes == 16) return sum_of_squares<16>(x, n);
  TORCH_CHECK(false, "lanes must be 8 or 16");
}

}  // namespace

// (x + d, rmsnorm(x + d)) row by row: x, d [..., H]; weight [H]; d may be None (then x is normed as is)
std::vector<torch::Tensor> add_rms_norm(torch::Tensor x, c10::optional<torch::Tensor> d, torch::Tensor weight,
                                        double eps, int64_t lanes) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat && weight.scalar_type() == torch::kFloat, "fp32 only");
  const int64_t H = weight.numel();
  TORCH_CHECK(x.size(-1) == H && weight.is_contiguous(), "rows of the weight's width");
  const int64_t M = x.numel() / H;
  auto xs = x.contiguous();
  auto sum = d.has_value() ? torch::empty_like(xs) : xs;  // [..., H]: the residual stream after the add
  if (d.has_value()) {
    TORCH_CHECK(d->scalar_type() == torch::kFloat && d->numel() == M * H, "d: x's shape");
    auto ds = d->contiguous();
    const float* a = xs.data_ptr<float>();
    const float* b = ds.data_ptr<float>();
    float* t = sum.data_ptr<float>();
    for (int64_t i = 0; i < M * H; ++i) t[i] = a[i] + b[i];
  }
  auto out = torch::empty_like(sum);  // [..., H]
  const float* w = weight.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m) {
    const float* s = sum.data_ptr<float>() + m * H;
    float* y = out.data_ptr<float>() + m * H;
    const float variance = sum_of_squares(s, H, lanes) / static_cast<float>(H);
    const float scale = 1.f / std::sqrt(variance + static_cast<float>(eps));
    for (int64_t i = 0; i < H; ++i) y[i] = w[i] * (s[i] * scale);
  }
  return {sum, out};
}

// x rounded to the nearest half, ties to even (as torch's float -> half copy), as its bits
inline uint16_t to_half(float x) {
  const _Float16 h = static_cast<_Float16>(x);
  uint16_t bits;
  std::memcpy(&bits, &h, sizeof bits);
  return bits;
}

// the n floats of `from` into a cache row of fp32 or half (each rounded to the nearest half)
inline void put(const float* from, int64_t n, float* to) { std::copy(from, from + n, to); }
inline void put(const float* from, int64_t n, uint16_t* to) {
  for (int64_t i = 0; i < n; ++i) to[i] = to_half(from[i]);
}

template <typename KV>
void rotate_rows(const torch::Tensor& rows, const torch::Tensor& c, const torch::Tensor& s, float* qp, KV* kp, KV* vp,
                 int64_t n, int64_t heads, int64_t kv_heads, int64_t hd, int64_t cap, int64_t past, int64_t width) {
  const int64_t half = hd / 2;
  std::vector<float> k(hd);  // one rotated key row, before it is stored in the cache's dtype
  for (int64_t t = 0; t < n; ++t) {
    const float* src = rows.data_ptr<float>() + t * width;
    const float* cp = c.data_ptr<float>() + t * hd;
    const float* sp = s.data_ptr<float>() + t * hd;
    auto rotate = [&](const float* in, float* out) {
      for (int64_t i = 0; i < hd; ++i) {
        const float rotated = i < half ? -in[i + half] : in[i - half];  // rotate_half: cat(-x2, x1)
        const float a = in[i] * cp[i];
        const float b = rotated * sp[i];
        out[i] = a + b;
      }
    };
    for (int64_t h = 0; h < heads; ++h) rotate(src + h * hd, qp + (h * n + t) * hd);
    const float* ks = src + heads * hd;
    const float* vs = ks + kv_heads * hd;
    for (int64_t h = 0; h < kv_heads; ++h) {
      rotate(ks + h * hd, k.data());
      put(k.data(), hd, kp + (h * cap + past + t) * hd);
      put(vs + h * hd, hd, vp + (h * cap + past + t) * hd);
    }
  }
}

// q rotated ([1, heads, n, hd]); k rotated and v written into keys/values [1, kv_heads, capacity, hd] at
// past .. past + n (fp32, or each rounded to the nearest half in a half cache). qkv: [..., n, (heads + 2 kv_heads) *
// hd], n tokens; cos, sin: [..., n, hd]
torch::Tensor rotary_into_cache(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, torch::Tensor keys,
                                torch::Tensor values, int64_t past, int64_t heads, int64_t hd) {
  TORCH_CHECK(qkv.scalar_type() == torch::kFloat, "qkv: fp32 only");
  TORCH_CHECK((keys.scalar_type() == torch::kFloat || keys.scalar_type() == torch::kHalf) &&
                  values.scalar_type() == keys.scalar_type(), "keys/values: both fp32 or both half");
  TORCH_CHECK(keys.dim() == 4 && keys.is_contiguous() && values.is_contiguous() && keys.sizes() == values.sizes(),
              "keys/values: contiguous [1, kv_heads, capacity, head_dim]");
  const int64_t kv_heads = keys.size(1), cap = keys.size(2), width = (heads + 2 * kv_heads) * hd;
  TORCH_CHECK(hd % 2 == 0 && keys.size(3) == hd, "head_dim: even, the cache's");
  TORCH_CHECK(qkv.size(-1) == width, "qkv: each token's q, k and v");
  const int64_t n = qkv.numel() / width;
  TORCH_CHECK(cos.numel() == n * hd && sin.numel() == n * hd, "cos/sin: each token's head_dim");
  TORCH_CHECK(past >= 0 && past + n <= cap, "the tokens' entries must fit the cache");
  auto rows = qkv.contiguous(), c = cos.contiguous(), s = sin.contiguous();
  auto q = torch::empty({1, heads, n, hd}, qkv.options());  // [1, heads, n, hd]
  float* qp = q.data_ptr<float>();
  if (keys.scalar_type() == torch::kHalf) {
    auto* kp = reinterpret_cast<uint16_t*>(keys.data_ptr());
    auto* vp = reinterpret_cast<uint16_t*>(values.data_ptr());
    rotate_rows(rows, c, s, qp, kp, vp, n, heads, kv_heads, hd, cap, past, width);
  } else {
    rotate_rows(rows, c, s, qp, keys.data_ptr<float>(), values.data_ptr<float>(), n, heads, kv_heads, hd, cap, past,
                width);
  }
  return q;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("add_rms_norm", &add_rms_norm, "(x + d, RMSNorm(x + d)) row by row, in ATen's summation order",
        py::arg("x"), py::arg("d"), py::arg("weight"), py::arg("eps"), py::arg("lanes"),
        py::call_guard<py::gil_scoped_release>());
  m.def("rotary_into_cache", &rotary_into_cache, "the tokens' q and k rotated, k and v written into the cache",
        py::arg("qkv"), py::arg("cos"), py::arg("sin"), py::arg("keys"), py::arg("values"), py::arg("past"),
        py::arg("heads"), py::arg("head_dim"), py::call_guard<py::gil_scoped_release>());
}
