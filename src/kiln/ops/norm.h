#pragma once
// Raw normalisation ops (batch, layer and RMS norm). Saved statistics are f32.
#include "kiln/tensor/tensor.h"

namespace kiln::ops {

struct BatchNormResult {
  Tensor y, save_mean, save_invstd;  // save_* [C] f32, f64 for an f64 input (batch statistics; training only)
};
// What batch_norm may fuse after the normalisation, in the same elementwise pass (ResNet's blocks:
// BN + ReLU, and BN + shortcut add + ReLU): y = relu?(normalised x + residual?). The residual has
// x's shape and dtype; the ReLU keeps NaN.
struct BatchNormEpilogue {
  Tensor residual;
  bool relu = false;
};
// x [N, C] or [N, C, ...]; weight/bias [C] or undefined; running_mean/var [C] or undefined
// (then batch statistics are used in eval too, as PyTorch does with track_running_stats=False).
BatchNormResult batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                           const Tensor& running_var, bool training, double momentum, double eps,
                           const BatchNormEpilogue& epilogue = {});
struct NormGrads {
  Tensor x, w, b;
};
// The training-mode backward (batch statistics).
NormGrads batch_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& save_mean,
                              const Tensor& save_invstd, bool need_x, bool need_w, bool need_b);
struct BatchNormEpilogueGrads {
  Tensor x, w, b, residual;
};
// The training-mode backward of batch_norm with an epilogue. y: the forward's output (the ReLU's
// mask; may be undefined without relu). The residual's gradient (need_residual) is grad_y itself
// without the ReLU, else grad_y where y > 0.
BatchNormEpilogueGrads batch_norm_epilogue_backward(const Tensor& grad_y, const Tensor& x, const Tensor& y, bool relu,
                                                    const Tensor& weight, const Tensor& save_mean,
                                                    const Tensor& save_invstd, bool need_x, bool need_w, bool need_b,
                                                    bool need_residual);

struct LayerNormResult {
  Tensor y, mean, rstd;  // mean/rstd [rows] f32, f64 for an f64 input (mean undefined for rms_norm)
};
// Normalises over the trailing `normalized` elements (weight's element count when defined, else
// the last dimension); weight/bias shaped like those trailing dimensions.
LayerNormResult layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps);
NormGrads layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& mean,
                              const Tensor& rstd, bool need_x, bool need_w, bool need_b);
LayerNormResult rms_norm(const Tensor& x, const Tensor& weight, double eps);
NormGrads rms_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                            bool need_x, bool need_w);

}  // namespace kiln::ops
