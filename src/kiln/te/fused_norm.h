#pragma once
// Fused residual add + normalisation (TransformerEngine's fused LayerNorm/RMSNorm with the
// residual): one pass forms sum = x + residual and norm(sum). Both outputs are differentiable:
// the sum is the next block's residual, so its gradient joins the norm's in one backward pass,
// which gives dx (= dresidual), dweight and dbias.
#include <utility>

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

}  // namespace kiln::te
