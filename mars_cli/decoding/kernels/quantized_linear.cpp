// mars::quantized_linear: y = x @ W^T where W's rows are groups of 32 weights `offset + scale * q`
// with 4-bit or 8-bit codes q, read from the codes themselves (a quarter or half of float32's
// bytes) and multiplied in float32. Torch's own int4 and int8 CPU kernels are vectorised for
// AVX-512 only; on AVX2 they ran 10-17x slower than float32 F.linear (docs/benchmarks.md), so this
// is the AVX2 + FMA kernel `--dtype q4` uses where it builds (decoding/kernels/build.py).
//
// Layout (decoding/quantized.py packs it): codes [N, K/2] bytes for 4 bits, byte j of a group
// holding code j in its low nibble and code j + 16 in its high one (GGUF's Q4 layout); [N, K]
// bytes for 8 bits. scale, offset: float32 [N, K/32]. x: float32 [..., K]. y: float32 [..., N],
// plus the bias where one is given.
//
// Per output n and group g: sum_j (offset + scale q_j) x_j = sum_j (scale q_j) x_j + offset (sum_j x_j),
// the group sums of x taken once per call.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <immintrin.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace {

constexpr int64_t kGroup = 32;
constexpr int64_t kRowsPerPass = 8;  // rows of x that share one group's converted codes (8 FMA chains)

inline float horizontal_sum(__m256 v) {
  __m128 sum = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
  sum = _mm_add_ss(sum, _mm_movehdup_ps(sum));
  return _mm_cvtss_f32(sum);
}

// One group's 32 codes as four vectors of eight floats, in weight order.
template <int Bits>
inline void group_codes(const uint8_t* bytes, __m256 codes[4]) {
  if constexpr (Bits == 4) {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes));
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m128i low = _mm_and_si128(packed, mask);
    const __m128i high = _mm_and_si128(_mm_srli_epi16(packed, 4), mask);
    codes[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(low));
    codes[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(low, 8)));
    codes[2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(high));
    codes[3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(high, 8)));
  } else {
    for (int i = 0; i < 4; ++i) {
      const __m128i eight = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes + 8 * i));
      codes[i] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(eight));
    }
  }
}

// Rows rows of x against one output's codes: the group's codes converted and scaled once, then one
// FMA chain a row (Rows independent chains keep both FMA units busy). out[r] gets the scaled sum.
template <int Bits, int Rows>
inline void pass(const float* x, int64_t K, const uint8_t* codes, const float* scale, int64_t groups, float* out) {
  constexpr int64_t bytes_per_group = kGroup * Bits / 8;
  __m256 acc[Rows];
  for (int r = 0; r < Rows; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m256 w[4];
    group_codes<Bits>(codes + g * bytes_per_group, w);
    const __m256 s = _mm256_set1_ps(scale[g]);
    const float* xg = x + g * kGroup;
    if constexpr (Rows == 1) {  // one row: scale the group's dot product, not its codes (fewer operations)
      const __m256 even = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xg + 16), _mm256_mul_ps(w[0], _mm256_loadu_ps(xg)));
      const __m256 odd = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xg + 24), _mm256_mul_ps(w[1], _mm256_loadu_ps(xg + 8)));
      acc[0] = _mm256_fmadd_ps(s, _mm256_add_ps(even, odd), acc[0]);
      continue;
    }
    for (int i = 0; i < 4; ++i) w[i] = _mm256_mul_ps(w[i], s);
    for (int r = 0; r < Rows; ++r) {
      const float* xr = xg + r * K;
      acc[r] = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(xr), acc[r]);
      acc[r] = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xr + 8), acc[r]);
      acc[r] = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xr + 16), acc[r]);
      acc[r] = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xr + 24), acc[r]);
    }
  }
  for (int r = 0; r < Rows; ++r) out[r] = horizontal_sum(acc[r]);
}

template <int Bits>
void outputs(const float* x, const float* x_sums, const uint8_t* codes, const float* scale, const float* offset,
             float* y, int64_t M, int64_t N, int64_t K, int64_t begin, int64_t end) {
  const int64_t groups = K / kGroup;
  const int64_t bytes_per_group = kGroup * Bits / 8;
  float sums[kRowsPerPass];
  for (int64_t n = begin; n < end; ++n) {
    const uint8_t* row_codes = codes + n * groups * bytes_per_group;
    const float* row_scale = scale + n * groups;
    const float* row_offset = offset + n * groups;
    for (int64_t first = 0; first < M; first += kRowsPerPass) {
      const int64_t rows = std::min(kRowsPerPass, M - first);
      const float* xs = x + first * K;
      switch (rows) {
        case 8: pass<Bits, 8>(xs, K, row_codes, row_scale, groups, sums); break;
        case 7: pass<Bits, 7>(xs, K, row_codes, row_scale, groups, sums); break;
        case 6: pass<Bits, 6>(xs, K, row_codes, row_scale, groups, sums); break;
        case 5: pass<Bits, 5>(xs, K, row_codes, row_scale, groups, sums); break;
        case 4: pass<Bits, 4>(xs, K, row_codes, row_scale, groups, sums); break;
        case 3: pass<Bits, 3>(xs, K, row_codes, row_scale, groups, sums); break;
        case 2: pass<Bits, 2>(xs, K, row_codes, row_scale, groups, sums); break;
        default: pass<Bits, 1>(xs, K, row_codes, row_scale, groups, sums); break;
      }
      for (int64_t r = 0; r < rows; ++r) {
        const float* group_sums = x_sums + (first + r) * groups;
        float offsets = 0.f;
        for (int64_t g = 0; g < groups; ++g) offsets += row_offset[g] * group_sums[g];
        y[(first + r) * N + n] = sums[r] + offsets;
      }
    }
  }
}

at::Tensor quantized_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scale,
                            const at::Tensor& offset, int64_t bits, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(bits == 4 || bits == 8, "quantized_linear: bits must be 4 or 8");
  TORCH_CHECK(x.dim() >= 1 && x.scalar_type() == at::kFloat, "quantized_linear: x must be float32");
  TORCH_CHECK(codes.scalar_type() == at::kByte && scale.scalar_type() == at::kFloat &&
                  offset.scalar_type() == at::kFloat,
              "quantized_linear: uint8 codes and float32 scales and offsets");
  const int64_t K = x.size(-1), N = codes.size(0);
  const at::Tensor rows = x.reshape({-1, K}).contiguous();
  const int64_t M = rows.size(0);
  TORCH_CHECK(K % kGroup == 0, "quantized_linear: the input width must be a multiple of 32");
  TORCH_CHECK(codes.size(1) * 8 == K * bits && scale.size(0) == N && scale.size(1) == K / kGroup &&
                  offset.sizes() == scale.sizes(),
              "quantized_linear: codes, scales and offsets do not match the input width");
  TORCH_CHECK(codes.is_contiguous() && scale.is_contiguous() && offset.is_contiguous(),
              "quantized_linear: contiguous codes, scales and offsets");
  const int64_t groups = K / kGroup;
  const float* x_data = rows.data_ptr<float>();
  std::vector<float> x_sums(M * groups);  // each group's sum of x: what the offsets multiply
  for (int64_t i = 0; i < M * groups; ++i) {
    float sum = 0.f;
    for (int64_t j = 0; j < kGroup; ++j) sum += x_data[i * kGroup + j];
    x_sums[i] = sum;
  }
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape.back() = N;
  at::Tensor y = at::empty({M, N}, rows.options());
  const uint8_t* code_data = codes.data_ptr<uint8_t>();
  const float* scale_data = scale.data_ptr<float>();
  const float* offset_data = offset.data_ptr<float>();
  const float* sums = x_sums.data();
  float* y_data = y.data_ptr<float>();
  const int64_t grain = 16;  // outputs per task: the thread pool's unit of work
  at::parallel_for(0, N, grain, [&](int64_t begin, int64_t end) {
    if (bits == 4) {
      outputs<4>(x_data, sums, code_data, scale_data, offset_data, y_data, M, N, K, begin, end);
    } else {
      outputs<8>(x_data, sums, code_data, scale_data, offset_data, y_data, M, N, K, begin, end);
    }
  });
  if (bias.has_value()) y.add_(*bias);
  return y.view(out_shape);
}

}  // namespace

TORCH_LIBRARY(mars, m) {
  m.def("quantized_linear(Tensor x, Tensor codes, Tensor scale, Tensor offset, int bits, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(mars, CPU, m) { m.impl("quantized_linear", &quantized_linear); }
