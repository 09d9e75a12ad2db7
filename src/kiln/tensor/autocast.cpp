#include "kiln/tensor/autocast.h"

namespace kiln {

namespace {
thread_local std::optional<DType> g_autocast_dtype;
}

std::optional<DType> autocast_dtype() { return g_autocast_dtype; }
void set_autocast_dtype(std::optional<DType> dtype) { g_autocast_dtype = dtype; }

}  // namespace kiln
