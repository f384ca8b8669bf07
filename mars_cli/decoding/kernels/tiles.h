// The q4a8 product's tiles (quantized_linear.cpp), included once per instruction set: MARS_VNNI 0
// multiplies bytes with AVX2's maddubs + madd, MARS_VNNI 1 with AVX512-VNNI's vpdpbusd (compiled
// for it by a target pragma, run only where the CPU has it). Both give every int32 lane the same
// four products' exact sum, and everything after the integer sums is the same code: the paths'
// outputs are bit for bit equal (checked at run time before the VNNI path is used, and by
// tests/decoding/test_kernel_version.py's digest on whichever path a machine runs).
// No include guard: each inclusion defines its own namespace's copy.

// Each int32 lane: the sum of its four bytes' products u * s (u unsigned, s signed), over two
// vector pairs: four bytes of `low` x `a_low` plus four of `high` x `a_high`.
inline __m256i pair_dot(__m256i low, __m256i a_low, __m256i high, __m256i a_high) {
#if MARS_VNNI
  return _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), low, a_low), high, a_high);
#else  // int16 sums of two products cannot saturate here: |u| <= 128, |s| <= 127
  const __m256i halves = _mm256_add_epi16(_mm256_maddubs_epi16(low, a_low), _mm256_maddubs_epi16(high, a_high));
  return _mm256_madd_epi16(halves, _mm256_set1_epi16(1));
#endif
}

// Each int32 lane: the sum of its four bytes' products u * s.
inline __m256i byte_dot(__m256i u, __m256i s) {
#if MARS_VNNI
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

// sum_j w_j a_j of one group as eight int32 lanes: 4-bit codes unsigned; 8-bit codes (moved to
// -128..127) as |w| times a with w's sign.
template <int Bits>
inline __m256i group_dot(__m256i w, __m256i a) {
  if constexpr (Bits == 4) return byte_dot(w, a);
  return byte_dot(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
}

// A tile of O outputs by R rows of x over 4-bit codes in pairs of groups (see QuantizedRows): a
// pair's codes are unpacked once for the tile's R rows, and a row's activations loaded once for its
// O outputs, so a wide pass reads and unpacks each code once per R rows instead of once per row.
// out[o * R + r] gets output o's scaled sum for row r, each summed in one order whatever the tile
// (pair by pair, then a last odd group): a row's output must not depend on how many rows or outputs
// came with it, or 8-bit rounding of the next layer's inputs turns a last-bit difference into a
// different token (strict verification would then not reproduce plain decoding).
template <int O, int R>
void tile_pairs(const QuantizedRows& rows, int64_t first, int64_t K, const uint8_t* codes, int64_t row_bytes,
                const float* scale, const float* offset, int64_t groups, float* out) {
  const int64_t pairs = groups / 2;
  const __m256i mask = _mm256_set1_epi8(0x0F);
  const __m256i spread = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
  const int8_t* a_rows = rows.codes.data() + first * K;
  const float* a_scales = rows.pair_scales.data() + first * pairs * 8;
  __m256 acc[O][R];
  for (int o = 0; o < O; ++o)
    for (int r = 0; r < R; ++r) acc[o][r] = _mm256_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    __m256i low[O], high[O];
    __m256 weight_scale[O];
    for (int o = 0; o < O; ++o) {
      const __m256i both = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + o * row_bytes + p * kGroup));
      low[o] = _mm256_and_si256(both, mask);
      high[o] = _mm256_and_si256(_mm256_srli_epi16(both, 4), mask);
      const __m128 two = _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(scale + o * groups + 2 * p)));
      weight_scale[o] = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(two), spread);
    }
    for (int r = 0; r < R; ++r) {
      const int8_t* a = a_rows + r * K + p * 2 * kGroup;
      const __m256i a_low = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
      const __m256i a_high = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + kGroup));
      const __m256 a_scale = _mm256_loadu_ps(a_scales + (r * pairs + p) * 8);
      for (int o = 0; o < O; ++o) {
        const __m256 dot = _mm256_cvtepi32_ps(pair_dot(low[o], a_low, high[o], a_high));
        acc[o][r] = _mm256_fmadd_ps(_mm256_mul_ps(weight_scale[o], a_scale), dot, acc[o][r]);
      }
    }
  }
  for (int o = 0; o < O; ++o)
    for (int r = 0; r < R; ++r) {
      const float* group_sums = rows.sums.data() + (first + r) * groups;
      out[o * R + r] = horizontal_sum(add_products(acc[o][r], offset + o * groups, group_sums, groups));
    }
  if (groups % 2) {  // the last group, as is
    const int64_t g = groups - 1;
    for (int o = 0; o < O; ++o) {
      const __m256i w = group_bytes<4>(codes + o * row_bytes + g * 16);
      for (int r = 0; r < R; ++r) {
        const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a_rows + r * K + g * kGroup));
        out[o * R + r] += scale[o * groups + g] * rows.scales[(first + r) * groups + g] *
                          static_cast<float>(integer_sum(group_dot<4>(w, av)));
      }
    }
  }
}

// 8-bit codes (the Q8_0 output layer, a head's), one output by R rows: a group's codes are loaded
// and their signs taken once for the R rows. Every row sums even and odd groups on two chains, in
// the same order whatever R.
template <int R>
void tile_bytes(const QuantizedRows& rows, int64_t first, int64_t K, const uint8_t* codes, int64_t row_bytes,
                const float* scale, const float* offset, int64_t groups, float* out) {
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  const int8_t* a = rows.codes.data() + first * K;
  const float* a_scale = rows.scales.data() + first * groups;
  for (int64_t g = 0; g < groups; ++g) {
    const __m256i w = group_bytes<8>(codes + g * kGroup);
    const __m256i magnitude = _mm256_sign_epi8(w, w);
    const __m256 weight_scale = _mm256_broadcast_ss(scale + g);
    for (int r = 0; r < R; ++r) {
      const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + r * K + g * kGroup));
      const __m256 dot = _mm256_cvtepi32_ps(byte_dot(magnitude, _mm256_sign_epi8(av, w)));  // |w| times a with w's sign
      const __m256 both = _mm256_mul_ps(weight_scale, _mm256_broadcast_ss(a_scale + r * groups + g));
      acc[r][g & 1] = _mm256_fmadd_ps(both, dot, acc[r][g & 1]);
    }
  }
  for (int r = 0; r < R; ++r) {
    const float* group_sums = rows.sums.data() + (first + r) * groups;
    __m256 total = add_products(_mm256_add_ps(acc[r][0], acc[r][1]), offset, group_sums, groups);
    total = add_products(total, scale, group_sums, groups, 128.f);  // codes moved down by 128
    out[r] = horizontal_sum(total);
  }
}

template <int O, size_t... R>
constexpr std::array<Tile, kMaxTileRows> pair_tiles(std::index_sequence<R...>) {
  return {&tile_pairs<O, static_cast<int>(R) + 1>...};
}

template <size_t... R>
constexpr std::array<Tile, kMaxTileRows> byte_tiles(std::index_sequence<R...>) {
  return {&tile_bytes<static_cast<int>(R) + 1>...};
}

const Tiles kTiles = {{pair_tiles<1>(kRowCounts), pair_tiles<2>(kRowCounts), pair_tiles<3>(kRowCounts),
                       pair_tiles<4>(kRowCounts)},
                      byte_tiles(kRowCounts)};
