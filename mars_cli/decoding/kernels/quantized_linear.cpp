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

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <cstdint>
#include <optional>
#include <vector>

#include "ops.h"
#include "simd.h"

namespace {

using mars_simd::dot;
using mars_simd::horizontal_sum;

constexpr int64_t kGroup = 32;
constexpr int64_t kRowsPerPass = 8;  // rows of x that share one group's converted codes (8 FMA chains)

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
  __m256 second = _mm256_setzero_ps();  // one row's second chain
  for (int64_t g = 0; g < groups; ++g) {
    __m256 w[4];
    group_codes<Bits>(codes + g * bytes_per_group, w);
    const __m256 s = _mm256_set1_ps(scale[g]);
    const float* xg = x + g * kGroup;
    if constexpr (Rows == 1) {  // one row: scale the group's dot product, not its codes (fewer operations)
      const __m256 even = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xg + 16), _mm256_mul_ps(w[0], _mm256_loadu_ps(xg)));
      const __m256 odd = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xg + 24), _mm256_mul_ps(w[1], _mm256_loadu_ps(xg + 8)));
      second = _mm256_fmadd_ps(s, _mm256_add_ps(even, odd), second);  // alternate groups: two chains
      std::swap(acc[0], second);
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
  acc[0] = _mm256_add_ps(acc[0], second);
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
        y[(first + r) * N + n] = sums[r] + dot(row_offset, x_sums + (first + r) * groups, groups);
      }
    }
  }
}

// ---- q4a8: the same codes against 8-bit activations, multiplied in integers (llama.cpp's way) ----
//
// Each group of 32 inputs of a row of x becomes int8 codes a_j with one scale d_a = max|x| / 127.
// Then sum_j (offset + scale q_j) x_j ~= scale d_a sum_j q_j a_j + offset d_a sum_j a_j: the integer
// dot product is _mm256_maddubs_epi16 (unsigned 4-bit codes times signed activations; 8-bit codes are
// moved to -128..127 first and the sign trick makes them unsigned, 128 d_a sum_j a_j added back), a
// quarter of the float path's instructions. Every term takes the same rounded activations, so the
// result is the exact product of the dequantised weights with the rounded x (as llama.cpp's Q8_1
// sums are): had the offset and shift terms used x's float sums, the rounding error of the code term
// would be multiplied by about |code - 128| instead of cancelling (5-bit codes: 0.16 relative error).

// With 4-bit weights two groups are multiplied at once: 32 bytes of codes hold groups g and g + 1,
// their low nibbles codes 0-15 of each, their high nibbles codes 16-31; so the activations of a pair
// are stored to match, [g 0-15, g+1 0-15, g 16-31, g+1 16-31], and the pair's two scales as one
// vector (four lanes each), which halves the conversions and multiplications per group.
struct QuantizedRows {
  std::vector<int8_t> codes;        // [M, K]: pairs of groups interleaved when paired (a last odd group as is)
  std::vector<float> scales;        // [M, K / 32]
  std::vector<float> sums;          // [M, K / 32]: each group's sum of its rounded x, d_a sum_j a_j
  std::vector<float> pair_scales;   // [M, K / 64, 8] when paired: a pair's two scales, four lanes each
};

inline int32_t integer_sum(__m256i v) {
  __m128i sum = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  sum = _mm_hadd_epi32(sum, sum);
  sum = _mm_hadd_epi32(sum, sum);
  return _mm_cvtsi128_si32(sum);
}

QuantizedRows quantize_rows(const float* x, int64_t M, int64_t K, bool paired) {
  const int64_t groups = K / kGroup, pairs = paired ? groups / 2 : 0;
  QuantizedRows rows{std::vector<int8_t>(M * K), std::vector<float>(M * groups), std::vector<float>(M * groups),
                     std::vector<float>(M * pairs * 8)};
  const __m256 sign_bit = _mm256_set1_ps(-0.0f);
  for (int64_t i = 0; i < M * groups; ++i) {
    const float* xg = x + i * kGroup;
    __m256 v[4];
    __m256 peak = _mm256_setzero_ps();
    for (int j = 0; j < 4; ++j) {
      v[j] = _mm256_loadu_ps(xg + 8 * j);
      peak = _mm256_max_ps(peak, _mm256_andnot_ps(sign_bit, v[j]));
    }
    __m128 top = _mm_max_ps(_mm256_castps256_ps128(peak), _mm256_extractf128_ps(peak, 1));
    top = _mm_max_ps(top, _mm_movehl_ps(top, top));
    top = _mm_max_ss(top, _mm_movehdup_ps(top));
    const float amax = _mm_cvtss_f32(top);
    const float scale = amax / 127.f;
    const __m256 inverse = _mm256_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
    __m256i q[4];
    for (int j = 0; j < 4; ++j) {
      q[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], inverse));  // rounds to nearest (MXCSR's default)
    }
    // 32 int32 -> 32 int8, in order (packs interleave 128-bit lanes: permute back)
    const __m256i pair0 = _mm256_packs_epi32(q[0], q[1]);
    const __m256i pair1 = _mm256_packs_epi32(q[2], q[3]);
    __m256i bytes = _mm256_packs_epi16(pair0, pair1);
    bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    const int64_t row = i / groups, g = i % groups;
    if (g < 2 * pairs) {  // codes 0-15 and 16-31 beside the pair's other group's
      int8_t* pair = rows.codes.data() + row * K + (g / 2) * 2 * kGroup + (g % 2) * 16;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(pair), _mm256_castsi256_si128(bytes));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(pair + kGroup), _mm256_extracti128_si256(bytes, 1));
      std::fill_n(rows.pair_scales.data() + (row * pairs + g / 2) * 8 + (g % 2) * 4, 4, scale);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(rows.codes.data() + i * kGroup), bytes);
    }
    rows.scales[i] = scale;
    const __m256i total = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    rows.sums[i] = scale * static_cast<float>(integer_sum(total));  // |a_j| <= 127: the int8s as stored
  }
  return rows;
}

// One group's 32 weight codes as 32 bytes in weight order: unsigned 0..15, or (8 bits) signed c - 128.
template <int Bits>
inline __m256i group_bytes(const uint8_t* bytes) {
  if constexpr (Bits == 4) {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes));
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m128i low = _mm_and_si128(packed, mask);
    const __m128i high = _mm_and_si128(_mm_srli_epi16(packed, 4), mask);
    return _mm256_set_m128i(high, low);
  } else {
    const __m256i codes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bytes));
    return _mm256_xor_si256(codes, _mm256_set1_epi8(static_cast<char>(0x80)));
  }
}

// acc + factor a[g] b[g] for g < n, lane-wise (eight groups a vector, the last ones masked), before
// acc's horizontal sum: the offsets' terms cost a few vector operations per output and row instead of
// a dot product of their own, in one fixed order at every width.
inline __m256 add_products(__m256 acc, const float* a, const float* b, int64_t n, float factor = 1.f) {
  const __m256 times = _mm256_set1_ps(factor);
  int64_t g = 0;
  for (; g + 8 <= n; g += 8) acc = _mm256_fmadd_ps(_mm256_mul_ps(times, _mm256_loadu_ps(a + g)), _mm256_loadu_ps(b + g), acc);
  if (g < n) {
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n - g)), lanes);
    acc = _mm256_fmadd_ps(_mm256_mul_ps(times, _mm256_maskload_ps(a + g, mask)), _mm256_maskload_ps(b + g, mask), acc);
  }
  return acc;
}

// The tiles, once per instruction set (tiles.h): AVX2's integer products, and AVX512-VNNI's
// (vpdpbusd: the same int32 sums in fewer instructions), chosen at run time (`isa()`).
using Tile = void (*)(const QuantizedRows&, int64_t, int64_t, const uint8_t*, int64_t, const float*, const float*, int64_t,
                      float*);
constexpr int kMaxTileOutputs = 4;
constexpr int kMaxTileRows = 8;
constexpr auto kRowCounts = std::make_index_sequence<kMaxTileRows>();

struct Tiles {
  std::array<std::array<Tile, kMaxTileRows>, kMaxTileOutputs> pairs;  // [o - 1][r - 1]: o outputs by r rows, 4-bit codes
  std::array<Tile, kMaxTileRows> bytes;                               // [r - 1]: r rows, 8-bit codes
};

namespace avx2 {
#define MARS_VNNI 0
#include "tiles.h"
#undef MARS_VNNI
}  // namespace avx2

#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512vnni")
namespace vnni {
#define MARS_VNNI 1
#include "tiles.h"
#undef MARS_VNNI
}  // namespace vnni
#pragma GCC pop_options

// Whether the VNNI tiles give the AVX2 tiles' bits on fixed inputs: every tile shape, both code
// widths, a pair of groups and an odd one. Run once, on a CPU that has VNNI, before it is used.
bool vnni_agrees() {
  constexpr int64_t K = 96, N = 4, M = kMaxTileRows, groups = K / kGroup;
  uint32_t state = 12345u;
  auto next = [&state] { state = state * 1664525u + 1013904223u; return state >> 8; };
  std::vector<float> x(M * K), scale(N * groups), offset(N * groups);
  for (float& v : x) v = static_cast<float>(static_cast<int>(next() % 2001) - 1000) / 997.f;
  for (float& v : scale) v = static_cast<float>(next() % 1000 + 1) / 65536.f;
  for (float& v : offset) v = static_cast<float>(static_cast<int>(next() % 2001) - 1000) / 16384.f;
  std::vector<uint8_t> codes4(N * K / 2), codes8(N * K);
  for (uint8_t& c : codes4) c = static_cast<uint8_t>(next());
  for (uint8_t& c : codes8) c = static_cast<uint8_t>(next());
  float ours[kMaxTileOutputs * kMaxTileRows], theirs[kMaxTileOutputs * kMaxTileRows];
  const QuantizedRows paired = quantize_rows(x.data(), M, K, true), plain = quantize_rows(x.data(), M, K, false);
  for (int o = 1; o <= kMaxTileOutputs; ++o) {
    for (int r = 1; r <= kMaxTileRows; ++r) {
      avx2::kTiles.pairs[o - 1][r - 1](paired, 0, K, codes4.data(), K / 2, scale.data(), offset.data(), groups, theirs);
      vnni::kTiles.pairs[o - 1][r - 1](paired, 0, K, codes4.data(), K / 2, scale.data(), offset.data(), groups, ours);
      if (std::memcmp(ours, theirs, sizeof(float) * o * r) != 0) return false;
    }
  }
  for (int r = 1; r <= kMaxTileRows; ++r) {
    avx2::kTiles.bytes[r - 1](plain, 0, K, codes8.data(), K, scale.data(), offset.data(), groups, theirs);
    vnni::kTiles.bytes[r - 1](plain, 0, K, codes8.data(), K, scale.data(), offset.data(), groups, ours);
    if (std::memcmp(ours, theirs, sizeof(float) * r) != 0) return false;
  }
  return true;
}

// The instruction set the products run on, chosen once per process: AVX512-VNNI where the CPU has
// it (and it agrees with AVX2 bit for bit), else AVX2; MARS_KERNEL_ISA=avx2 forces AVX2 (to compare
// the two on one machine). `name` says which, and why not VNNI where it is there.
struct IsaChoice {
  const Tiles* tiles;
  std::string name;
};

const IsaChoice& isa() {
  static const IsaChoice chosen = [] {
    __builtin_cpu_init();
    const bool has_vnni = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512f");
    const char* forced = std::getenv("MARS_KERNEL_ISA");
    if (!has_vnni) return IsaChoice{&avx2::kTiles, "avx2"};
    if (forced != nullptr && std::string(forced) == "avx2") return IsaChoice{&avx2::kTiles, "avx2 (MARS_KERNEL_ISA)"};
    if (!vnni_agrees()) return IsaChoice{&avx2::kTiles, "avx2 (avx512-vnni disagreed with it: not used)"};
    return IsaChoice{&vnni::kTiles, "avx512-vnni"};
  }();
  return chosen;
}

const Tiles& active_tiles() { return *isa().tiles; }

template <int Bits>
void outputs_a8(const QuantizedRows& rows, const uint8_t* codes, const float* scale, const float* offset, float* y,
                int64_t M, int64_t N, int64_t K, int64_t begin, int64_t end) {
  const int64_t groups = K / kGroup;
  const int64_t row_bytes = groups * kGroup * Bits / 8;
  // one row: four outputs at a time (its activations loaded once for them); wider: one output by up
  // to eight rows (its codes unpacked once for them; measured ahead of 2 x 4 and 4 x 2 tiles)
  const int64_t tile_outputs = Bits == 4 && M == 1 ? kMaxTileOutputs : 1;
  const int64_t tile_rows = M == 1 ? 1 : kMaxTileRows;
  const Tiles& tiles = active_tiles();
  float sums[kMaxTileOutputs * kMaxTileRows];
  for (int64_t n = begin; n < end; n += tile_outputs) {
    const int64_t outputs = std::min(tile_outputs, end - n);
    for (int64_t first = 0; first < M; first += tile_rows) {
      const int64_t count = std::min(tile_rows, M - first);
      const Tile tile = Bits == 4 ? tiles.pairs[outputs - 1][count - 1] : tiles.bytes[count - 1];
      tile(rows, first, K, codes + n * row_bytes, row_bytes, scale + n * groups, offset + n * groups, groups, sums);
      for (int64_t o = 0; o < outputs; ++o)
        for (int64_t r = 0; r < count; ++r) y[(first + r) * N + n + o] = sums[o * count + r];
    }
  }
}

// Both products' arguments: float32 x [..., K], uint8 codes [N, K * bits / 8], float32 scales and
// offsets [N, K / 32], all contiguous. `op` names the product in the error.
void check_arguments(const char* op, const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scale,
                     const at::Tensor& offset, int64_t bits) {
  TORCH_CHECK(bits == 4 || bits == 8, op, ": bits must be 4 or 8");
  TORCH_CHECK(x.dim() >= 1 && x.scalar_type() == at::kFloat, op, ": x must be float32");
  TORCH_CHECK(codes.scalar_type() == at::kByte && scale.scalar_type() == at::kFloat &&
                  offset.scalar_type() == at::kFloat,
              op, ": uint8 codes and float32 scales and offsets");
  const int64_t K = x.size(-1), N = codes.size(0);
  TORCH_CHECK(K % kGroup == 0, op, ": the input width must be a multiple of 32");
  TORCH_CHECK(codes.size(1) * 8 == K * bits && scale.size(0) == N && scale.size(1) == K / kGroup &&
                  offset.sizes() == scale.sizes(),
              op, ": codes, scales and offsets do not match the input width");
  TORCH_CHECK(codes.is_contiguous() && scale.is_contiguous() && offset.is_contiguous(),
              op, ": contiguous codes, scales and offsets");
}

}  // namespace

namespace mars_kernels {

at::Tensor quantized_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scale,
                            const at::Tensor& offset, int64_t bits, const std::optional<at::Tensor>& bias) {
  check_arguments("quantized_linear", x, codes, scale, offset, bits);
  const int64_t K = x.size(-1), N = codes.size(0);
  const at::Tensor rows = x.reshape({-1, K}).contiguous();
  const int64_t M = rows.size(0);
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


at::Tensor quantized_linear_a8(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scale,
                               const at::Tensor& offset, int64_t bits, const std::optional<at::Tensor>& bias) {
  check_arguments("quantized_linear_a8", x, codes, scale, offset, bits);
  const int64_t K = x.size(-1), N = codes.size(0);
  const at::Tensor input = x.reshape({-1, K}).contiguous();
  const int64_t M = input.size(0);
  const QuantizedRows rows = quantize_rows(input.data_ptr<float>(), M, K, bits == 4);
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape.back() = N;
  at::Tensor y = at::empty({M, N}, input.options());
  const uint8_t* code_data = codes.data_ptr<uint8_t>();
  const float* scale_data = scale.data_ptr<float>();
  const float* offset_data = offset.data_ptr<float>();
  float* y_data = y.data_ptr<float>();
  at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
    if (bits == 4) {
      outputs_a8<4>(rows, code_data, scale_data, offset_data, y_data, M, N, K, begin, end);
    } else {
      outputs_a8<8>(rows, code_data, scale_data, offset_data, y_data, M, N, K, begin, end);
    }
  });
  if (bias.has_value()) y.add_(*bias);
  return y.view(out_shape);
}

}  // namespace mars_kernels

static std::string kernel_path() { return isa().name; }

TORCH_LIBRARY(mars, m) {
  m.def("kernel_path() -> str", &kernel_path);
  m.def("quantized_linear(Tensor x, Tensor codes, Tensor scale, Tensor offset, int bits, Tensor? bias) -> Tensor");
  m.def("quantized_linear_a8(Tensor x, Tensor codes, Tensor scale, Tensor offset, int bits, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(mars, CPU, m) {
  m.impl("quantized_linear", &mars_kernels::quantized_linear);
  m.impl("quantized_linear_a8", &mars_kernels::quantized_linear_a8);
}
