#include "kiln/hpc/md/domain_decomposition.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kiln/runtime/error.h"

namespace kiln::md {

namespace {

constexpr const char* kAxis[3] = {"x", "y", "z"};

std::string grid_text(const std::array<int, 3>& g) { return fmt::format("{} x {} x {}", g[0], g[1], g[2]); }

// Blocks of doubles to each rank (blocks[r] goes to rank r; this rank's own stays empty) in one
// neighbour exchange: the counts are all-gathered first, so each rank knows what comes from whom.
// Returns what arrived, rank by rank.
std::vector<double> exchange_blocks(const dist::Communicator& comm, const std::vector<std::vector<double>>& blocks,
                                    std::vector<std::size_t>* received_counts = nullptr) {
  const int size = comm.size(), rank = comm.rank();
  std::vector<std::int64_t> mine(size), all(static_cast<std::size_t>(size) * size);
  for (int r = 0; r < size; ++r) mine[r] = static_cast<std::int64_t>(blocks[r].size());
  comm.all_gather<std::int64_t>(mine, all);
  std::vector<dist::HaloPeer> peers;
  std::vector<double> send;
  std::size_t recv_total = 0;
  if (received_counts) received_counts->assign(size, 0);
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    const auto to = static_cast<std::size_t>(all[static_cast<std::size_t>(rank) * size + r]);
    const auto from = static_cast<std::size_t>(all[static_cast<std::size_t>(r) * size + rank]);
    if (received_counts) (*received_counts)[r] = from;
    if (to == 0 && from == 0) continue;
    peers.push_back({r, 0, 0, send.size(), to, recv_total, from});
    send.insert(send.end(), blocks[r].begin(), blocks[r].end());
    recv_total += from;
  }
  std::vector<double> recv(recv_total);
  dist::HaloExchange(comm, std::move(peers)).exchange(send, recv);
  return recv;
}

// The distance from coordinate u (any image) to the periodic interval [lo, hi) of a ring of length L.
double ring_distance(double u, double lo, double hi, double length) {
  if (hi - lo >= length) return 0;
  u -= length * std::floor(u / length);
  if (u >= lo && u < hi) return 0;
  double below = lo - u, above = u - hi;
  below -= length * std::floor(below / length);
  above -= length * std::floor(above / length);
  return std::min(below, above);
}

}  // namespace

std::array<int, 3> choose_domain_grid(int ranks, const Vec3& box, double min_width, double cutoff,
                                      std::array<int, 3> requested) {
  auto refuse_thin = [&](const std::array<int, 3>& g) {
    for (int d = 0; d < 3; ++d) {
      const double width = box[d] / g[d];
      KILN_CHECK(width >= min_width,
                 "mdrun: domain decomposition {} over {} ranks: the domains are {:.4f} nm wide along {} (box {:.4f} "
                 "nm), thinner than the cut-off + buffer (rlist {:.4f} nm = rc {:.4f} + {:.4f} nm); every domain must "
                 "be at least rlist wide: use fewer ranks or another --dd",
                 grid_text(g), ranks, width, kAxis[d], box[d], min_width, cutoff, min_width - cutoff);
    }
  };
  if (requested != std::array<int, 3>{0, 0, 0}) {
    KILN_CHECK(requested[0] > 0 && requested[1] > 0 && requested[2] > 0,
               "mdrun: --dd {} needs three positive domain counts", grid_text(requested));
    KILN_CHECK(requested[0] * requested[1] * requested[2] == ranks,
               "mdrun: --dd {} has {} domains but mpirun started {} ranks (one domain per rank)", grid_text(requested),
               requested[0] * requested[1] * requested[2], ranks);
    refuse_thin(requested);
    return requested;
  }
  // The halo a domain receives grows with its faces: sum over the cut dimensions of the face area.
  std::array<int, 3> best{};
  double best_cost = 0;
  const double volume = box[0] * box[1] * box[2];
  for (int nx = ranks; nx >= 1; --nx) {
    if (ranks % nx) continue;
    for (int ny = ranks / nx; ny >= 1; --ny) {
      if ((ranks / nx) % ny) continue;
      const std::array<int, 3> g{nx, ny, ranks / nx / ny};
      bool wide = true;
      double cost = 0;
      for (int d = 0; d < 3; ++d) {
        wide = wide && box[d] / g[d] >= min_width;
        if (g[d] > 1) cost += volume / box[d] / (static_cast<double>(ranks) / g[d]);
      }
      if (wide && (best[0] == 0 || cost < best_cost * (1 - 1e-12))) {
        best = g;
        best_cost = cost;
      }
    }
  }
  if (best[0] == 0) {
    // Name the widest way it could be cut: the grid that comes closest.
    std::array<int, 3> closest{ranks, 1, 1};
    for (int d = 1; d < 3; ++d)
      if (box[d] > box[0]) closest = d == 1 ? std::array<int, 3>{1, ranks, 1} : std::array<int, 3>{1, 1, ranks};
    refuse_thin(closest);
  }
  return best;
}

std::vector<std::array<int, 2>> update_groups(const MdSystem& s) {
  std::vector<int> parent(s.atom_count);
  std::iota(parent.begin(), parent.end(), 0);
  auto find = [&](int a) {
    while (parent[a] != a) a = parent[a] = parent[parent[a]];
    return a;
  };
  auto join = [&](int a, int b) {
    a = find(a);
    b = find(b);
    if (a != b) parent[std::max(a, b)] = std::min(a, b);
  };
  for (const auto& b : s.bonds) join(b.i, b.j);
  for (const auto& c : s.constraints) join(c.i, c.j);
  for (const auto& w : s.settles) {
    join(w.o, w.o + 1);
    join(w.o, w.o + 2);
  }
  for (const auto& a : s.angles) {
    join(a.i, a.j);
    join(a.j, a.k);
  }
  for (const auto* list : {&s.proper_dihedrals, &s.periodic_impropers})
    for (const auto& d : *list) {
      join(d.i, d.j);
      join(d.j, d.k);
      join(d.k, d.l);
    }
  for (const auto& d : s.rb_dihedrals) {
    join(d.i, d.j);
    join(d.j, d.k);
    join(d.k, d.l);
  }
  for (const auto& p : s.pairs) join(p.i, p.j);
  for (int i = 0; i < s.atom_count; ++i)
    for (int j : s.exclusions[i]) join(i, j);
  std::vector<std::array<int, 2>> groups;
  for (int i = 0; i < s.atom_count; ++i) {
    const int root = find(i);
    if (root == i) {
      groups.push_back({i, i + 1});
    } else {
      // Molecules are contiguous in a GROMACS topology; the decomposition moves them as ranges.
      KILN_CHECK(!groups.empty() && find(groups.back()[0]) == root,
                 "mdrun: domain decomposition: atom {} is bonded to atom {} across other molecules' atoms; update "
                 "groups must be contiguous in the atom order",
                 i + 1, root + 1);
      groups.back()[1] = i + 1;
    }
  }
  return groups;
}

DomainDecomposition::DomainDecomposition(const MdSystem& global, dist::Communicator comm, std::array<int, 3> grid,
                                         double rlist, double cutoff)
    : global_(global),
      comm_(std::move(comm)),
      rank_(comm_.rank()),
      size_(comm_.size()),
      grid_(grid),
      rlist_(rlist),
      cutoff_(cutoff),
      groups_(update_groups(global)) {
  group_of_.resize(global.atom_count);
  for (int g = 0; g < static_cast<int>(groups_.size()); ++g)
    for (int i = groups_[g][0]; i < groups_[g][1]; ++i) group_of_[i] = g;
  local_.name = global.name;
  local_.type_count = global.type_count;
  local_.c6 = global.c6;
  local_.c12 = global.c12;
}

int DomainDecomposition::domain_of(const Vec3& p, const Vec3& box) const {
  std::array<int, 3> c{};
  for (int d = 0; d < 3; ++d) {
    double f = p[d] / box[d];
    f -= std::floor(f);
    c[d] = std::min(static_cast<int>(f * grid_[d]), grid_[d] - 1);
  }
  return (c[0] * grid_[1] + c[1]) * grid_[2] + c[2];
}

// The geometric centre, with the group's atoms taken as the images nearest its first atom.
Vec3 DomainDecomposition::group_centre(const std::vector<Vec3>& x, int first_local, int group, const Vec3& box) const {
  const int n = groups_[group][1] - groups_[group][0];
  const Vec3 origin = x[first_local];
  Vec3 sum{0, 0, 0};
  for (int k = 1; k < n; ++k) sum += min_image(x[first_local + k] - origin, box);
  return origin + (1.0 / n) * sum;
}

void DomainDecomposition::check_domain_widths(const Vec3& box, std::int64_t step) const {
  for (int d = 0; d < 3; ++d)
    KILN_CHECK(box[d] / grid_[d] >= rlist_,
               "mdrun: step {}: the box shrank to {:.4f} nm along {}: domain decomposition {} leaves domains {:.4f} nm "
               "wide, thinner than the cut-off + buffer (rlist {:.4f} nm = rc {:.4f} + {:.4f} nm); use fewer ranks",
               step, box[d], kAxis[d], grid_text(grid_), box[d] / grid_[d], rlist_, cutoff_, rlist_ - cutoff_);
}

void DomainDecomposition::distribute(const std::vector<Vec3>& x, const std::vector<Vec3>& v, const Vec3& box,
                                     std::vector<Vec3>& x_home, std::vector<Vec3>& v_home) {
  check_domain_widths(box, 0);
  home_.clear();
  x_home.clear();
  v_home.clear();
  for (int g = 0; g < static_cast<int>(groups_.size()); ++g) {
    if (domain_of(group_centre(x, groups_[g][0], g, box), box) != rank_) continue;
    for (int i = groups_[g][0]; i < groups_[g][1]; ++i) {
      home_.push_back(i);
      x_home.push_back(x[i]);
      v_home.push_back(v[i]);
    }
  }
  select_halo(x_home, box);
}

void DomainDecomposition::repartition(std::vector<Vec3>& x_home, std::vector<Vec3>& v_home, const Vec3& box,
                                      std::int64_t step) {
  check_domain_widths(box, step);
  // Each group that left: [global index, x, v] per atom to its new rank.
  std::vector<std::vector<double>> leaving(size_);
  std::vector<int> kept;
  for (int i = 0; i < home_count();) {
    const int g = group_of_[home_[i]];
    const int n = groups_[g][1] - groups_[g][0];
    const int owner = domain_of(group_centre(x_home, i, g, box), box);
    for (int k = i; k < i + n; ++k) {
      if (owner == rank_) {
        kept.push_back(k);
        continue;
      }
      auto& out = leaving[owner];
      out.push_back(home_[k]);
      for (int d = 0; d < 3; ++d) out.push_back(x_home[k][d]);
      for (int d = 0; d < 3; ++d) out.push_back(v_home[k][d]);
      ++migrated_;
    }
    i += n;
  }
  const std::vector<double> arrived = exchange_blocks(comm_, leaving);
  // The new home atoms in global order: kept and arrived, sorted by global index.
  struct Atom {
    int global;
    Vec3 x, v;
  };
  std::vector<Atom> atoms;
  atoms.reserve(kept.size() + arrived.size() / 7);
  for (int k : kept) atoms.push_back({home_[k], x_home[k], v_home[k]});
  for (std::size_t a = 0; a < arrived.size(); a += 7)
    atoms.push_back({static_cast<int>(arrived[a]),
                     {arrived[a + 1], arrived[a + 2], arrived[a + 3]},
                     {arrived[a + 4], arrived[a + 5], arrived[a + 6]}});
  std::sort(atoms.begin(), atoms.end(), [](const Atom& a, const Atom& b) { return a.global < b.global; });
  home_.resize(atoms.size());
  x_home.resize(atoms.size());
  v_home.resize(atoms.size());
  for (std::size_t k = 0; k < atoms.size(); ++k) {
    home_[k] = atoms[k].global;
    x_home[k] = atoms[k].x;
    v_home[k] = atoms[k].v;
  }
  select_halo(x_home, box);
}

void DomainDecomposition::select_halo(const std::vector<Vec3>& x_home, const Vec3& box) {
  // The halo reaches rlist beyond the farthest a home atom can be from the domain: the largest
  // distance of an atom from its group's centre, over all ranks.
  double radius = 0;
  for (int i = 0; i < home_count();) {
    const int g = group_of_[home_[i]];
    const int n = groups_[g][1] - groups_[g][0];
    const Vec3 c = group_centre(x_home, i, g, box);
    for (int k = i; k < i + n; ++k) radius = std::max(radius, norm(min_image(x_home[k] - c, box)));
    i += n;
  }
  radius = comm_.all_reduce_value(radius, dist::ReduceOp::Max);
  const double reach = rlist_ + radius;
  // Which of my home atoms each other domain needs.
  std::vector<std::vector<double>> wanted(size_);
  std::vector<std::vector<int>> send(size_);
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const std::array<int, 3> c{r / (grid_[1] * grid_[2]), (r / grid_[2]) % grid_[1], r % grid_[2]};
    for (int i = 0; i < home_count(); ++i) {
      double d2 = 0;
      for (int d = 0; d < 3; ++d) {
        const double lo = box[d] * c[d] / grid_[d], hi = box[d] * (c[d] + 1) / grid_[d];
        const double gap = ring_distance(x_home[i][d], lo, hi, box[d]);
        d2 += gap * gap;
      }
      if (d2 < reach * reach) {
        send[r].push_back(i);
        wanted[r].push_back(home_[i]);
      }
    }
  }
  std::vector<std::size_t> from;
  const std::vector<double> ids = exchange_blocks(comm_, wanted, &from);
  halo_.resize(ids.size());
  for (std::size_t k = 0; k < ids.size(); ++k) halo_[k] = static_cast<int>(ids[k]);
  // The per-step exchange: 3 doubles per atom, peers in rank order as exchange_blocks had them.
  send_atoms_.clear();
  std::vector<dist::HaloPeer> peers;
  std::size_t recv_offset = 0;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_ || (send[r].empty() && from[r] == 0)) continue;
    peers.push_back({r, 1, 1, 3 * send_atoms_.size(), 3 * send[r].size(), recv_offset, 3 * from[r]});
    send_atoms_.insert(send_atoms_.end(), send[r].begin(), send[r].end());
    recv_offset += 3 * from[r];
  }
  halo_exchange_ = dist::HaloExchange(comm_, std::move(peers));
  build_local_system();
}

void DomainDecomposition::build_local_system() {
  const int home = home_count(), n = local_count();
  std::vector<int> local_of(global_.atom_count, -1);
  for (int i = 0; i < n; ++i) local_of[global_index(i)] = i;
  MdSystem& l = local_;
  l.atom_count = n;
  l.charges.resize(n);
  l.masses.resize(n);
  l.types.resize(n);
  l.atom_names.resize(n);
  l.residue_names.resize(n);
  l.residue_numbers.resize(n);
  l.atom_numbers.resize(n);
  l.exclusions.assign(n, {});
  for (int i = 0; i < n; ++i) {
    const int g = global_index(i);
    l.charges[i] = global_.charges[g];
    l.masses[i] = global_.masses[g];
    l.types[i] = global_.types[g];
    l.atom_numbers[i] = g + 1;
    l.atom_names[i] = global_.atom_names[g];
    l.residue_names[i] = global_.residue_names.empty() ? std::string() : global_.residue_names[g];
    l.residue_numbers[i] = global_.residue_numbers.empty() ? 0 : global_.residue_numbers[g];
    // Exclusions stay within a group, which is home whole: home atoms' partners are home too.
    // Halo atoms need none (their pairs with each other are never computed here).
    if (i < home) {
      for (int j : global_.exclusions[g]) l.exclusions[i].push_back(local_of[j]);
      std::sort(l.exclusions[i].begin(), l.exclusions[i].end());
    }
  }
  auto is_home = [&](int global) { return local_of[global] >= 0 && local_of[global] < home; };
  auto keep = [&](const auto& all, auto& out, auto remap) {
    out.clear();
    for (auto t : all) {
      if (!is_home(t.i)) continue;
      remap(t);
      out.push_back(t);
    }
  };
  keep(global_.bonds, l.bonds, [&](HarmonicBond& t) { t.i = local_of[t.i], t.j = local_of[t.j]; });
  keep(global_.angles, l.angles,
       [&](HarmonicAngle& t) { t.i = local_of[t.i], t.j = local_of[t.j], t.k = local_of[t.k]; });
  auto remap4 = [&](auto& t) { t.i = local_of[t.i], t.j = local_of[t.j], t.k = local_of[t.k], t.l = local_of[t.l]; };
  keep(global_.proper_dihedrals, l.proper_dihedrals, remap4);
  keep(global_.periodic_impropers, l.periodic_impropers, remap4);
  keep(global_.rb_dihedrals, l.rb_dihedrals, remap4);
  keep(global_.pairs, l.pairs, [&](Pair14& t) { t.i = local_of[t.i], t.j = local_of[t.j]; });
  keep(global_.constraints, l.constraints, [&](Constraint& t) { t.i = local_of[t.i], t.j = local_of[t.j]; });
  l.settles.clear();
  for (auto w : global_.settles)
    if (is_home(w.o)) {
      w.o = local_of[w.o];
      l.settles.push_back(w);
    }
}

void DomainDecomposition::exchange_halo(const std::vector<Vec3>& x_home, std::vector<Vec3>& x_local) const {
  const int home = home_count();
  x_local.resize(local_count());
  std::copy(x_home.begin(), x_home.begin() + home, x_local.begin());
  std::vector<double> send(3 * send_atoms_.size());
  for (std::size_t k = 0; k < send_atoms_.size(); ++k)
    for (int d = 0; d < 3; ++d) send[3 * k + d] = x_home[send_atoms_[k]][d];
  std::vector<double> recv(3 * halo_.size());
  halo_exchange_.exchange(send, recv);
  for (std::size_t k = 0; k < halo_.size(); ++k) x_local[home + k] = {recv[3 * k], recv[3 * k + 1], recv[3 * k + 2]};
}

void DomainDecomposition::sum(std::span<double> values) const {
  std::vector<double> all(values.size() * size_);
  comm_.all_gather<double>(values, all);
  for (std::size_t k = 0; k < values.size(); ++k) {
    double s = 0;
    for (int r = 0; r < size_; ++r) s += all[r * values.size() + k];
    values[k] = s;
  }
}

void DomainDecomposition::sum_unordered(std::span<double> values) const { comm_.all_reduce(values); }

std::array<double, 2> DomainDecomposition::largest_two(double largest, double second) const {
  const double mine[2] = {largest, second};
  std::vector<double> all(2 * size_);
  comm_.all_gather<double>(mine, all);
  std::sort(all.begin(), all.end(), std::greater<>());
  return {all[0], all[1]};
}

std::vector<Vec3> DomainDecomposition::gather(const std::vector<Vec3>& home) const {
  std::vector<double> mine;
  mine.reserve(4 * home_.size());
  for (int i = 0; i < home_count(); ++i) {
    mine.push_back(home_[i]);
    for (int d = 0; d < 3; ++d) mine.push_back(home[i][d]);
  }
  std::vector<std::int64_t> counts(size_);
  comm_.all_gather<std::int64_t>(std::vector<std::int64_t>{static_cast<std::int64_t>(mine.size())}, counts);
  if (!is_root()) {
    comm_.send<double>(mine, 0, 7);
    return {};
  }
  std::vector<Vec3> out(global_.atom_count);
  auto unpack = [&](const std::vector<double>& block) {
    for (std::size_t a = 0; a < block.size(); a += 4)
      out[static_cast<int>(block[a])] = {block[a + 1], block[a + 2], block[a + 3]};
  };
  unpack(mine);
  for (int r = 1; r < size_; ++r) {
    std::vector<double> block(counts[r]);
    comm_.recv<double>(block, r, 7);
    unpack(block);
  }
  return out;
}

}  // namespace kiln::md
