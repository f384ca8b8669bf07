// The kernels' entry points, shared between this project's sources (the decoder layer composes them).
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace mars_kernels {

at::Tensor quantized_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scale,
                            const at::Tensor& offset, int64_t bits, const std::optional<at::Tensor>& bias);
at::Tensor quantized_linear_a8(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scale,
                               const at::Tensor& offset, int64_t bits, const std::optional<at::Tensor>& bias);

}  // namespace mars_kernels
