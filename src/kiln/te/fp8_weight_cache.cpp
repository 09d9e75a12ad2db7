#include "kiln/te/fp8_weight_cache.h"

namespace kiln::te {

const Fp8Casts* Fp8WeightCache::find(const Tensor& weight, DType dtype, ScalingLayout layout) const {
  if (!casts_) return nullptr;
  const std::shared_ptr<Storage> s = storage_.lock();
  const bool same = s && s == weight.storage() && offset_ == weight.storage_offset() && version_ == s->version() &&
                    shape_ == weight.shape() && source_dtype_ == weight.dtype() && dtype_ == dtype &&
                    layout_ == layout && weight.is_contiguous();
  return same ? casts_.get() : nullptr;
}

void Fp8WeightCache::store(const Tensor& weight, DType dtype, ScalingLayout layout, Fp8Casts casts) {
  storage_ = weight.storage();
  offset_ = weight.storage_offset();
  version_ = weight.storage()->version();
  shape_ = weight.shape();
  source_dtype_ = weight.dtype();
  dtype_ = dtype;
  layout_ = layout;
  casts_ = std::make_unique<Fp8Casts>(std::move(casts));
}

}  // namespace kiln::te
