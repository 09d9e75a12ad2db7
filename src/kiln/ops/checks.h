#pragma once
// Argument checks shared by the op wrappers. Messages name the op and every operand's dtype,
// shape and device, so the user sees exactly which call went wrong.
#include <initializer_list>

#include "kiln/tensor/tensor.h"

namespace kiln::ops {

void check_defined(const char* op, const Tensor& t, const char* name);
void check_same_device(const char* op, const Tensor& a, const Tensor& b);
void check_same_dtype(const char* op, const Tensor& a, const Tensor& b);
// Same device and dtype, as nearly every binary op needs.
void check_compatible(const char* op, const Tensor& a, const Tensor& b);
void check_dim(const char* op, const Tensor& t, std::int64_t ndim, const char* name);
void check_floating(const char* op, const Tensor& t);

}  // namespace kiln::ops
