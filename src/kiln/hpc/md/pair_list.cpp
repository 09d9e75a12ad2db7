#include "kiln/hpc/md/pair_list.h"

#include <algorithm>
#include <cmath>

namespace kiln::md {

void PairList::build(const MdSystem& system, const std::vector<Vec3>& x, const Vec3& box, double rlist,
                     int home_count) {
  const int n = static_cast<int>(x.size());
  const int home = home_count < 0 ? n : home_count;
  const double r2 = rlist * rlist;
  std::array<int, 3> cells{};
  for (int d = 0; d < 3; ++d) cells[d] = static_cast<int>(std::floor(box[d] / rlist));
  used_cells_ = cells[0] >= 3 && cells[1] >= 3 && cells[2] >= 3;
  offsets_.assign(n + 1, 0);
  neighbors_.clear();
  std::vector<std::vector<int>> partners(n);
  auto consider = [&](int i, int j) {
    if (i == j) return;
    int a = std::min(i, j), b = std::max(i, j);
    if (a >= home) return;
    Vec3 dx = min_image(x[b] - x[a], box);
    if (dot(dx, dx) < r2 && !system.excluded(a, b)) partners[a].push_back(b);
  };
  if (!used_cells_) {
    for (int i = 0; i < home; ++i)
      for (int j = i + 1; j < n; ++j) consider(i, j);
  } else {
    // Bin atoms into cells (positions wrapped into the box), then pair each cell with itself and
    // its 13 "forward" neighbours, so every cell pair is visited once.
    auto cell_of = [&](const Vec3& p) {
      std::array<int, 3> c{};
      for (int d = 0; d < 3; ++d) {
        double f = p[d] / box[d];
        f -= std::floor(f);
        c[d] = std::min(static_cast<int>(f * cells[d]), cells[d] - 1);
      }
      return c;
    };
    const int total = cells[0] * cells[1] * cells[2];
    std::vector<std::vector<int>> members(total);
    auto flat = [&](int cx, int cy, int cz) { return (cx * cells[1] + cy) * cells[2] + cz; };
    for (int i = 0; i < n; ++i) {
      auto c = cell_of(x[i]);
      members[flat(c[0], c[1], c[2])].push_back(i);
    }
    for (int cx = 0; cx < cells[0]; ++cx)
      for (int cy = 0; cy < cells[1]; ++cy)
        for (int cz = 0; cz < cells[2]; ++cz) {
          const auto& own = members[flat(cx, cy, cz)];
          for (size_t a = 0; a < own.size(); ++a)
            for (size_t b = a + 1; b < own.size(); ++b) consider(own[a], own[b]);
          for (int dx = -1; dx <= 1; ++dx)
            for (int dy = -1; dy <= 1; ++dy)
              for (int dz = -1; dz <= 1; ++dz) {
                int code = (dx + 1) * 9 + (dy + 1) * 3 + (dz + 1);
                if (code <= 13) continue;  // the self cell and the half visited from the other side
                int ox = (cx + dx + cells[0]) % cells[0], oy = (cy + dy + cells[1]) % cells[1],
                    oz = (cz + dz + cells[2]) % cells[2];
                for (int i : own)
                  for (int j : members[flat(ox, oy, oz)]) consider(i, j);
              }
        }
  }
  for (int i = 0; i < n; ++i) {
    std::sort(partners[i].begin(), partners[i].end());
    offsets_[i + 1] = offsets_[i] + static_cast<int>(partners[i].size());
    neighbors_.insert(neighbors_.end(), partners[i].begin(), partners[i].end());
  }
}

}  // namespace kiln::md
