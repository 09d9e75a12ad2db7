// Weak placeholders for the differentiable functions that nn/ layers call and that are being
// implemented on another branch (autograd/functions/conv_pool.cpp, norm.cpp,
// dropout_embedding.cpp). A strong definition anywhere in libkiln replaces these at link time,
// so this file can stay until the real ones land and then be deleted. Calling a placeholder
// raises an error that says the function is not available yet (tests skip on it).
#include "kiln/autograd/functions.h"

#define KILN_PENDING(name) KILN_FAIL("{}: not available yet (pending implementation)", name)

namespace kiln {

[[gnu::weak]] Tensor conv2d(const Tensor&, const Tensor&, const Tensor&, ops::Conv2dParams) { KILN_PENDING("conv2d"); }
[[gnu::weak]] Tensor max_pool2d(const Tensor&, int, int, int) { KILN_PENDING("max_pool2d"); }
[[gnu::weak]] Tensor avg_pool2d(const Tensor&, int, int, int, bool) { KILN_PENDING("avg_pool2d"); }
[[gnu::weak]] Tensor adaptive_avg_pool2d(const Tensor&, int, int) { KILN_PENDING("adaptive_avg_pool2d"); }
[[gnu::weak]] Tensor batch_norm(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool, double,
                                double) {
  KILN_PENDING("batch_norm");
}
[[gnu::weak]] Tensor layer_norm(const Tensor&, const Tensor&, const Tensor&, double) { KILN_PENDING("layer_norm"); }
[[gnu::weak]] Tensor rms_norm(const Tensor&, const Tensor&, double) { KILN_PENDING("rms_norm"); }
[[gnu::weak]] Tensor dropout(const Tensor&, double, bool, std::uint64_t, std::uint64_t) { KILN_PENDING("dropout"); }
[[gnu::weak]] Tensor embedding(const Tensor&, const Tensor&) { KILN_PENDING("embedding"); }

}  // namespace kiln
