#pragma once
// The FP8 output of a fused CPU producer (a norm or an activation that writes an FP8 linear's input
// cast instead of its high-precision output): each value, already rounded to the data dtype, is
// cast with the delayed scale exactly as ops::fp8_quantize_into's CPU kernel casts it (the same
// single-precision multiply and Float8 conversion), and its magnitude joins the amax.
#include <cmath>
#include <cstdint>

#include "kiln/ops/fp8_scaling.h"
#include "kiln/tensor/fp8_tensor.h"

namespace kiln::te::cpu {

class Fp8Sink {
 public:
  explicit Fp8Sink(const Fp8Tensor& t)
      : q_(static_cast<std::uint8_t*>(t.data.data_ptr())),
        scale_(*static_cast<const float*>(t.scale.data_ptr())),
        e4m3_(t.dtype() == DType::F8E4M3) {}
  // Casts the value of element i; returns |value| for the caller's amax.
  float put(std::int64_t i, float v) const {
    const float s = ops::fp8::mul_rn(v, scale_);
    q_[i] = e4m3_ ? Float8E4M3::from_float(s) : Float8E5M2::from_float(s);
    return ops::fp8::abs_value(v);
  }
  // amax and scale_inv, once every value is cast.
  void finish(const Fp8Tensor& t, float amax) const {
    *static_cast<float*>(t.amax.data_ptr()) = amax;
    *static_cast<float*>(t.scale_inv.data_ptr()) = ops::fp8::reciprocal(scale_);
  }

 private:
  std::uint8_t* q_;
  float scale_;
  bool e4m3_;
};

}  // namespace kiln::te::cpu
