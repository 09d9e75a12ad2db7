#pragma once
// The type CPU kernels compute in: double for f64 and integers, float for the float types.
#include <type_traits>

#include "kiln/tensor/dtype.h"

namespace kiln::ops::cpu {

template <class T>
using acc_t = std::conditional_t<std::is_same_v<T, double> || std::is_integral_v<T>, double, float>;

template <class T, class A>
inline T from_acc(A v) {
  if constexpr (std::is_arithmetic_v<T>)
    return static_cast<T>(v);
  else
    return T(static_cast<float>(v));
}

}  // namespace kiln::ops::cpu
