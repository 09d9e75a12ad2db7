#include "kiln/te/fp8_primary_weight.h"

#include "kiln/ops/copy.h"
#include "kiln/ops/fp8.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln::te {

Tensor fp8_primary_weight_value(const Fp8PrimaryWeight& w) {
  NoGradGuard no_grad;
  Fp8Tensor q = w.cast;
  q.data = w.cast.data.detach();
  return ops::fp8_dequantize(q, w.value_dtype);
}

void fp8_primary_weight_quantize(const Fp8PrimaryWeight& w, const Tensor& value, const Fp8Recipe& recipe) {
  KILN_CHECK(
      value.defined() && value.shape() == w.cast.data.shape() && is_floating(value.dtype()) && !is_fp8(value.dtype()),
      "fp8_primary_weight_quantize: the value {} must be a high-precision tensor of the weight's shape {}",
      value.defined() ? value.describe() : "undefined", shape_str(w.cast.data.shape()));
  NoGradGuard no_grad;
  Tensor v = value.detach();
  if (v.device() != w.cast.device()) v = v.to(w.cast.device());
  if (v.dtype() == DType::F64) v = v.to(DType::F32);
  Fp8Tensor q = w.cast;
  q.data = w.cast.data.detach();
  // Delayed: the cast's amax is the history's entry 0, which only the master cast may record into.
  if (w.delayed != nullptr) q.amax = Tensor::empty(q.amax.shape(), DType::F32, q.device());
  ops::Fp8CastOptions o;
  o.current_scaling = recipe.recipe == Fp8ScalingRecipe::Tensorwise;
  o.power_of_two_scales = recipe.recipe == Fp8ScalingRecipe::Blockwise;
  ops::fp8_quantize_into(ops::contiguous(v), q, o);
  w.cast.data.storage()->bump_version();
}

Fp8Tensor fp8_transposed(const Fp8Tensor& w) {
  KILN_CHECK(w.layout != ScalingLayout::Block1x128,
             "fp8_transposed: 1x128 tiles run along the rows and do not transpose; cast x^T instead");
  NoGradGuard no_grad;
  Fp8Tensor t = w;
  t.data = ops::contiguous(w.data.detach().t());
  if (w.layout == ScalingLayout::PerTensor) return t;
  // The 128x128 grid of W [R, C] is [ceil(R/128), round_up(ceil(C/128), 4)]; W^T's is
  // [ceil(C/128), round_up(ceil(R/128), 4)] with entry (cb, rb) = W's (rb, cb). Padding: scale 1.
  const std::int64_t R = w.rows(), C = w.cols();
  const std::int64_t nbr = (R + kFp8BlockSize - 1) / kFp8BlockSize, nbc = (C + kFp8BlockSize - 1) / kFp8BlockSize;
  auto grid_t = [&](const Tensor& g) {
    Tensor out = Tensor::ones(fp8_scale_shape(w.layout, C, R), DType::F32, w.device());
    out.narrow(1, 0, nbr).copy_(g.narrow(1, 0, nbc).t());
    return out;
  };
  t.scale = grid_t(w.scale);
  t.scale_inv = grid_t(w.scale_inv);
  t.amax = grid_t(w.amax);
  return t;
}

}  // namespace kiln::te
