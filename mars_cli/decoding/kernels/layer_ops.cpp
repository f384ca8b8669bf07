// The small operations of a decoder layer around its linears, for the lean forward
// (decoding/lean.py): each replaces several eager torch operations whose dispatch cost more than
// their arithmetic at decoding widths (docs/benchmarks.md).
//
// mars::rms_norm(x, weight, eps): x / sqrt(mean(x^2) + eps) * weight over the last dimension.
// mars::attend(qkv, cos, sin, keys, values, past, heads, kv_heads, bias?): one layer's attention for
//   n fed rows. qkv [n, (heads + 2 kv_heads) * d] is the fused projection's output; q and k get the
//   rotary embedding (cos, sin [n, d], rotate-half convention); k and v are written into the cache
//   rows past .. past + n - 1 (keys, values [1, kv_heads, capacity, d]); each query row attends to
//   the cache rows its mask allows: bias [n, past + n] (0 or -inf), or causally without one.
//   Returns [n, heads * d], the input of the output projection.
// mars::silu_mul(gate_up): silu(gate) * up for gate_up [n, 2 f] (the fused gate and up outputs).
// mars::decoder_layer(...): all of the above and the layer's four quantized linears in one call: the
//   lean forward's whole layer, one dispatch from Python instead of a dozen.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <immintrin.h>

#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "ops.h"
#include "simd.h"

namespace {

using mars_simd::dot;

// acc += p * v over d floats.
inline void add_scaled(float* __restrict acc, const float* __restrict v, float p, int64_t d) {
  const __m256 scale = _mm256_set1_ps(p);
  int64_t t = 0;
  for (; t + 8 <= d; t += 8) {
    _mm256_storeu_ps(acc + t, _mm256_fmadd_ps(scale, _mm256_loadu_ps(v + t), _mm256_loadu_ps(acc + t)));
  }
  for (; t < d; ++t) acc[t] += p * v[t];
}

// p[j] = e^(p[j] - best) for j < count, in place, every lane by the same polynomial (a last partial
// vector through a padded copy): a score's weight must not depend on how many scores a row has.
inline void exponentiate(float* p, int64_t count, float best) {
  const __m256 shift = _mm256_set1_ps(best);
  int64_t j = 0;
  for (; j + 8 <= count; j += 8) {
    _mm256_storeu_ps(p + j, mars_simd::exp(_mm256_sub_ps(_mm256_loadu_ps(p + j), shift)));
  }
  if (j < count) {
    float tail[8];
    std::fill(tail, tail + 8, -std::numeric_limits<float>::infinity());
    std::copy(p + j, p + count, tail);
    _mm256_storeu_ps(tail, mars_simd::exp(_mm256_sub_ps(_mm256_loadu_ps(tail), shift)));
    std::copy(tail, tail + (count - j), p + j);
  }
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat, "rms_norm: float32 tensors");
  const int64_t D = x.size(-1);
  TORCH_CHECK(weight.numel() == D, "rms_norm: the weight must match the last dimension");
  const at::Tensor rows = x.reshape({-1, D}).contiguous();
  const at::Tensor w = weight.contiguous();
  at::Tensor y = at::empty_like(rows);
  const float* in = rows.data_ptr<float>();
  const float* scale = w.data_ptr<float>();
  float* out = y.data_ptr<float>();
  for (int64_t i = 0; i < rows.size(0); ++i) {
    const float* row = in + i * D;
    const float inverse = 1.f / std::sqrt(dot(row, row, D) / static_cast<float>(D) + static_cast<float>(eps));
    for (int64_t t = 0; t < D; ++t) out[i * D + t] = scale[t] * (row[t] * inverse);
  }
  return y.view(x.sizes());
}

// x [d] rotated into out [d] with the rotate-half convention: out = x * cos + rotate_half(x) * sin.
inline void rotate(const float* x, const float* cos, const float* sin, int64_t d, float* out) {
  const int64_t half = d / 2;
  for (int64_t t = 0; t < half; ++t) {
    out[t] = x[t] * cos[t] + (-x[t + half]) * sin[t];
    out[t + half] = x[t + half] * cos[t + half] + x[t] * sin[t + half];
  }
}

at::Tensor attend(const at::Tensor& qkv_in, const at::Tensor& cos_in, const at::Tensor& sin_in, at::Tensor& keys,
                  at::Tensor& values, int64_t past, int64_t heads, int64_t kv_heads,
                  const std::optional<at::Tensor>& bias_in) {
  TORCH_CHECK(qkv_in.scalar_type() == at::kFloat && keys.scalar_type() == at::kFloat &&
                  values.scalar_type() == at::kFloat,
              "attend: float32 tensors");
  TORCH_CHECK(keys.is_contiguous() && values.is_contiguous() && keys.dim() == 4 && keys.sizes() == values.sizes(),
              "attend: contiguous keys and values [1, kv_heads, capacity, d]");
  const int64_t d = keys.size(3), capacity = keys.size(2);
  TORCH_CHECK(keys.size(1) == kv_heads && heads % kv_heads == 0 && d % 2 == 0, "attend: head counts and sizes");
  const at::Tensor qkv = qkv_in.reshape({-1, (heads + 2 * kv_heads) * d}).contiguous();
  const int64_t n = qkv.size(0), length = past + n;
  TORCH_CHECK(length <= capacity, "attend: the cache has no room for the fed rows");
  const at::Tensor cos = cos_in.reshape({n, d}).contiguous(), sin = sin_in.reshape({n, d}).contiguous();
  std::optional<at::Tensor> bias;
  if (bias_in.has_value()) {
    bias = bias_in->reshape({n, -1}).contiguous();
    TORCH_CHECK(bias->size(1) >= length && bias->scalar_type() == at::kFloat, "attend: the mask must cover every row");
  }
  const float* rows = qkv.data_ptr<float>();
  const float* c = cos.data_ptr<float>();
  const float* s = sin.data_ptr<float>();
  float* k_cache = keys.data_ptr<float>();
  float* v_cache = values.data_ptr<float>();
  const int64_t width = (heads + 2 * kv_heads) * d;
  // the new rows' keys (rotated) and values into the cache
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t h = 0; h < kv_heads; ++h) {
      const float* k = rows + i * width + (heads + h) * d;
      const float* v = rows + i * width + (heads + kv_heads + h) * d;
      const int64_t row = (h * capacity + past + i) * d;
      rotate(k, c + i * d, s + i * d, d, k_cache + row);
      std::copy(v, v + d, v_cache + row);
    }
  }
  at::Tensor y = at::empty({n, heads * d}, qkv.options());
  float* out = y.data_ptr<float>();
  const float* mask = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  const int64_t mask_stride = bias.has_value() ? bias->size(1) : 0;
  const float scaling = 1.f / std::sqrt(static_cast<float>(d));
  const int64_t group = heads / kv_heads;
  // a decoding step's few hundred dot products cost less than waking the thread pool
  const int64_t grain = heads * n * length * d < (int64_t{1} << 17) ? heads * n : 1;
  at::parallel_for(0, heads * n, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> q(d), scores(length), acc(d);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t h = task / n, i = task % n, kv = h / group;
      rotate(rows + i * width + h * d, c + i * d, s + i * d, d, q.data());
      const float* k_head = k_cache + kv * capacity * d;
      const float* v_head = v_cache + kv * capacity * d;
      const int64_t seen = mask ? length : past + i + 1;  // causal: itself and every row before it
      float best = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < seen; ++j) {
        float score = dot(q.data(), k_head + j * d, d) * scaling;
        if (mask) score += mask[i * mask_stride + j];
        scores[j] = score;
        best = std::max(best, score);
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      exponentiate(scores.data(), seen, best);
      float total = 0.f;  // in key order, masked keys skipped: a tree's row sums as the same row decoded plainly
      for (int64_t j = 0; j < seen; ++j) {
        const float p = scores[j];
        if (p == 0.f) continue;  // masked
        total += p;
        add_scaled(acc.data(), v_head + j * d, p, d);
      }
      float* o = out + i * heads * d + h * d;
      for (int64_t t = 0; t < d; ++t) o[t] = acc[t] / total;
    }
  });
  return y;
}

at::Tensor silu_mul(const at::Tensor& gate_up_in) {
  TORCH_CHECK(gate_up_in.scalar_type() == at::kFloat, "silu_mul: float32");
  const int64_t width = gate_up_in.size(-1), f = width / 2;
  const at::Tensor gate_up = gate_up_in.reshape({-1, width}).contiguous();
  const int64_t n = gate_up.size(0);
  std::vector<int64_t> shape(gate_up_in.sizes().begin(), gate_up_in.sizes().end());
  shape.back() = f;
  at::Tensor y = at::empty({n, f}, gate_up.options());
  const float* in = gate_up.data_ptr<float>();
  float* out = y.data_ptr<float>();
  const __m256 one = _mm256_set1_ps(1.f), sign = _mm256_set1_ps(-0.f);
  for (int64_t i = 0; i < n; ++i) {
    const float* gate = in + i * width;
    const float* up = gate + f;
    int64_t t = 0;
    for (; t + 8 <= f; t += 8) {  // g / (1 + e^-g) * u
      const __m256 g = _mm256_loadu_ps(gate + t);
      const __m256 e = mars_simd::exp(_mm256_xor_ps(g, sign));
      _mm256_storeu_ps(out + i * f + t, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + t)));
    }
    for (; t < f; ++t) out[i * f + t] = gate[t] / (1.f + std::exp(-gate[t])) * up[t];
  }
  return y.view(shape);
}

// One quantized linear of a layer: [codes, scale, offset] or [codes, scale, offset, bias].
at::Tensor linear(const at::Tensor& x, at::TensorList matrix, int64_t bits, int64_t activations) {
  TORCH_CHECK(matrix.size() == 3 || matrix.size() == 4, "decoder_layer: a linear is codes, scale, offset[, bias]");
  std::optional<at::Tensor> bias;
  if (matrix.size() == 4) bias = matrix[3];
  if (activations == 8) return mars_kernels::quantized_linear_a8(x, matrix[0], matrix[1], matrix[2], bits, bias);
  return mars_kernels::quantized_linear(x, matrix[0], matrix[1], matrix[2], bits, bias);
}

// A whole decoder layer for x [n, hidden]: attention and MLP blocks with their residuals.
at::Tensor decoder_layer(const at::Tensor& x, const at::Tensor& input_norm, const at::Tensor& post_norm, double eps,
                         at::TensorList qkv, at::TensorList output, at::TensorList gate_up, at::TensorList down,
                         at::IntArrayRef bits, int64_t activations, const at::Tensor& cos, const at::Tensor& sin,
                         at::Tensor& keys, at::Tensor& values, int64_t past, int64_t heads, int64_t kv_heads,
                         const std::optional<at::Tensor>& mask) {
  TORCH_CHECK(bits.size() == 4, "decoder_layer: one bit width per linear (qkv, output, gate_up, down)");
  const at::Tensor projected = linear(rms_norm(x, input_norm, eps), qkv, bits[0], activations);
  at::Tensor attended = linear(attend(projected, cos, sin, keys, values, past, heads, kv_heads, mask), output, bits[1],
                               activations);
  attended.add_(x);
  at::Tensor out = linear(silu_mul(linear(rms_norm(attended, post_norm, eps), gate_up, bits[2], activations)), down,
                          bits[3], activations);
  return out.add_(attended);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mars, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("attend(Tensor qkv, Tensor cos, Tensor sin, Tensor(a!) keys, Tensor(b!) values, int past, int heads, "
        "int kv_heads, Tensor? bias) -> Tensor");
  m.def("silu_mul(Tensor gate_up) -> Tensor");
  m.def("decoder_layer(Tensor x, Tensor input_norm, Tensor post_norm, float eps, Tensor[] qkv, Tensor[] output, "
        "Tensor[] gate_up, Tensor[] down, int[] bits, int activations, Tensor cos, Tensor sin, Tensor(a!) keys, "
        "Tensor(b!) values, int past, int heads, int kv_heads, Tensor? mask) -> Tensor");
}

TORCH_LIBRARY_IMPL(mars, CPU, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("attend", &attend);
  m.impl("silu_mul", &silu_mul);
  m.impl("decoder_layer", &decoder_layer);
}
