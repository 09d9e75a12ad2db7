#pragma once
// Fused residual add + normalisation (TransformerEngine's fused LayerNorm/RMSNorm with the
// residual): one pass forms sum = x + residual and norm(sum). Both outputs are differentiable:
// the sum is the next block's residual, so its gradient joins the norm's in one backward pass,
// which gives dx (= dresidual), dweight and dbias.
#include <utility>

#include "kiln/tensor/fp8_tensor.h"
#include "kiln/tensor/tensor.h"

namespace kiln::te {

// x, residual [..., H] of one floating dtype and device (residual undefined: none); w [H] of x's
// dtype or float32. Returns (rms_norm(x + residual) * w, x + residual); the statistics in
// float32 (float64 at float64), saved for the backward.
std::pair<Tensor, Tensor> add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& w, double eps);
// As add_rms_norm with LayerNorm: (layer_norm(x + residual) * w + b, x + residual); w and b may be
// undefined (no scale / no shift).
std::pair<Tensor, Tensor> add_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& w, const Tensor& b,
                                         double eps);

// The FP8-output forms, for a norm whose only consumer is an FP8 linear (TE's LayerNormLinear):
// the normalised output is written as its FP8 cast into y8 (per tensor, [rows, H], y8.scale set:
// the linear's delayed input scale) with y8.amax = its amax and y8.scale_inv, in the same kernel;
// the bytes are those of fp8_quantize_into(y) with y as add_*_norm returns it. The returned first
// tensor has y's shape, dtype and autograd edge but is NOT written (no high-precision output is
// produced): pass it to te::fp8_linear together with y8, nowhere else. The sum and the backward are
// those of add_*_norm.
std::pair<Tensor, Tensor> add_rms_norm_fp8(const Tensor& x, const Tensor& residual, const Tensor& w, double eps,
                                           const Fp8Tensor& y8);
std::pair<Tensor, Tensor> add_layer_norm_fp8(const Tensor& x, const Tensor& residual, const Tensor& w, const Tensor& b,
                                             double eps, const Fp8Tensor& y8);

}  // namespace kiln::te
