// Small AVX2 helpers shared by this project's kernels.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace mars_simd {

inline float horizontal_sum(__m256 v) {
  __m128 sum = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
  sum = _mm_add_ss(sum, _mm_movehdup_ps(sum));
  return _mm_cvtss_f32(sum);
}

// sum_t a[t] b[t]: eight lanes at a time, two independent chains, the tail in scalar.
inline float dot(const float* a, const float* b, int64_t n) {
  __m256 even = _mm256_setzero_ps(), odd = _mm256_setzero_ps();
  int64_t t = 0;
  for (; t + 16 <= n; t += 16) {
    even = _mm256_fmadd_ps(_mm256_loadu_ps(a + t), _mm256_loadu_ps(b + t), even);
    odd = _mm256_fmadd_ps(_mm256_loadu_ps(a + t + 8), _mm256_loadu_ps(b + t + 8), odd);
  }
  if (t + 8 <= n) {
    even = _mm256_fmadd_ps(_mm256_loadu_ps(a + t), _mm256_loadu_ps(b + t), even);
    t += 8;
  }
  float sum = horizontal_sum(_mm256_add_ps(even, odd));
  for (; t < n; ++t) sum += a[t] * b[t];
  return sum;
}

}  // namespace mars_simd
