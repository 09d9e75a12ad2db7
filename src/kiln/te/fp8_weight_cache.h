#pragma once
// A weight's FP8 casts kept between calls (TransformerEngine casts a weight on the first micro-batch
// of a step only, its is_first_microbatch): the rowwise cast (fprop) and the columnwise one (the
// cast of W^T, dgrad's operand), both made by one transpose-cast. They stay valid while the weight
// is the same storage at the same version: every in-place write to a parameter (the optimizer's
// step, a checkpoint load, an initialisation) bumps its storage's version, so the next call casts
// again. With gradient accumulation the weight is therefore cast once per optimizer step.
#include <cstdint>
#include <memory>

#include "kiln/tensor/fp8_tensor.h"

namespace kiln::te {

// A matrix's two casts: rowwise [R, C] and columnwise, the cast of its transpose [C, R].
struct Fp8Casts {
  Fp8Tensor rowwise, columnwise;
};

class Fp8WeightCache {
 public:
  // The casts made for `weight` (with `dtype` and `layout`) if it has not changed since, else null.
  const Fp8Casts* find(const Tensor& weight, DType dtype, ScalingLayout layout) const;
  void store(const Tensor& weight, DType dtype, ScalingLayout layout, Fp8Casts casts);
  void clear() { casts_.reset(); }

 private:
  std::weak_ptr<Storage> storage_;  // weak: a freed storage's address may come back with version 0
  std::int64_t offset_ = 0;
  std::uint64_t version_ = 0;
  Shape shape_;
  DType source_dtype_ = DType::F32, dtype_ = DType::F8E4M3;
  ScalingLayout layout_ = ScalingLayout::PerTensor;
  std::unique_ptr<Fp8Casts> casts_;
};

}  // namespace kiln::te
