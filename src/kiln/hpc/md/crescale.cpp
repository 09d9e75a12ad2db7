#include "kiln/hpc/md/crescale.h"

#include <algorithm>

#include "kiln/runtime/error.h"

namespace kiln::md {

void check_box_after_scaling(const Vec3& box, double rlist, std::int64_t step) {
  KILN_CHECK(std::min({box[0], box[1], box[2]}) >= 2 * rlist,
             "step {}: pcoupl = c-rescale shrank the box to {:.5f} x {:.5f} x {:.5f} nm, below twice the pair-list "
             "radius ({} nm); start from a larger box or a shorter cut-off",
             step, box[0], box[1], box[2], rlist);
}

}  // namespace kiln::md
