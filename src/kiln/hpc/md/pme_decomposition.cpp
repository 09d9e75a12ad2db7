#include "kiln/hpc/md/pme_decomposition.h"

#include <fftw3.h>

#include <algorithm>
#include <complex>
#include <span>

#include "kiln/hpc/md/pme_kernels.h"
#include "kiln/runtime/error.h"

namespace kiln::md {

std::string_view pme_decomposition_name(PmeDecomposition decomposition) {
  return decomposition == PmeDecomposition::Slab ? "slab" : "replicated";
}

PmeDecomposition parse_pme_decomposition(std::string_view text) {
  if (text == "slab") return PmeDecomposition::Slab;
  KILN_CHECK(text == "replicated", "mdrun: --pme-decomposition {} is not slab or replicated", text);
  return PmeDecomposition::Replicated;
}

std::vector<std::array<int, 2>> slab_ranges(int count, int ranks) {
  KILN_CHECK(count >= 0 && ranks >= 1, "slab_ranges: cannot split {} items over {} ranks", count, ranks);
  std::vector<std::array<int, 2>> ranges(ranks);
  int begin = 0;
  for (int r = 0; r < ranks; ++r) {
    const int size = count / ranks + (r < count % ranks ? 1 : 0);
    ranges[r] = {begin, begin + size};
    begin += size;
  }
  return ranges;
}

int slab_axis_for(const std::array<int, 3>& domain_grid) {
  return static_cast<int>(std::max_element(domain_grid.begin(), domain_grid.end()) - domain_grid.begin());
}

namespace {
std::array<int, 3> cyclic_axes(int first) {
  KILN_CHECK(first >= 0 && first < 3, "PME: slab axis {} is not 0, 1 or 2 (x, y, z)", first);
  return {first, (first + 1) % 3, (first + 2) % 3};
}
}  // namespace

// This rank's FFTW buffers and plans: its x-planes in real space [x][y][z] and after the 2-D
// transforms [x][y][z/2+1]; its y columns with every x, [x][y - y0][z/2+1], for the 1-D transforms.
struct SlabPme::Transforms {
  double* planes_real = nullptr;
  fftw_complex* planes_complex = nullptr;
  fftw_complex* columns = nullptr;
  fftw_plan planes_forward = nullptr, planes_backward = nullptr, x_forward = nullptr, x_backward = nullptr;

  Transforms(const std::array<int, 3>& grid, int planes, int columns_owned) {
    const int K0 = grid[0], K1 = grid[1], K2 = grid[2], K2c = K2 / 2 + 1;
    // FFTW may return null for 0 elements: a rank that owns nothing still gets a buffer.
    planes_real = fftw_alloc_real(std::max<size_t>(1, static_cast<size_t>(planes) * K1 * K2));
    planes_complex = fftw_alloc_complex(std::max<size_t>(1, static_cast<size_t>(planes) * K1 * K2c));
    columns = fftw_alloc_complex(std::max<size_t>(1, static_cast<size_t>(K0) * columns_owned * K2c));
    KILN_CHECK(planes_real != nullptr && planes_complex != nullptr && columns != nullptr,
               "PME: cannot allocate {} x-planes and {} y columns of the {}x{}x{} grid", planes, columns_owned, K0, K1,
               K2);
    if (planes > 0) {
      const int n[2] = {K1, K2};
      planes_forward = fftw_plan_many_dft_r2c(2, n, planes, planes_real, nullptr, 1, K1 * K2, planes_complex, nullptr,
                                              1, K1 * K2c, FFTW_ESTIMATE);
      planes_backward = fftw_plan_many_dft_c2r(2, n, planes, planes_complex, nullptr, 1, K1 * K2c, planes_real, nullptr,
                                               1, K1 * K2, FFTW_ESTIMATE);
      KILN_CHECK(planes_forward != nullptr && planes_backward != nullptr,
                 "PME: FFTW could not plan {} 2-D {}x{} transforms", planes, K1, K2);
    }
    if (columns_owned > 0) {
      // Every (y, z) point of the block is one transform along x, K0 points `stride` apart.
      const int stride = columns_owned * K2c;
      x_forward = fftw_plan_many_dft(1, &K0, stride, columns, nullptr, stride, 1, columns, nullptr, stride, 1,
                                     FFTW_FORWARD, FFTW_ESTIMATE);
      x_backward = fftw_plan_many_dft(1, &K0, stride, columns, nullptr, stride, 1, columns, nullptr, stride, 1,
                                      FFTW_BACKWARD, FFTW_ESTIMATE);
      KILN_CHECK(x_forward != nullptr && x_backward != nullptr, "PME: FFTW could not plan {} 1-D transforms of {}",
                 stride, K0);
    }
  }
  ~Transforms() {
    for (fftw_plan plan : {planes_forward, planes_backward, x_forward, x_backward})
      if (plan) fftw_destroy_plan(plan);
    fftw_free(planes_real);
    fftw_free(planes_complex);
    fftw_free(columns);
  }
  Transforms(const Transforms&) = delete;
  Transforms& operator=(const Transforms&) = delete;
};

// The counts of the transposes, in doubles (two a complex number): rank r sends rank s its planes'
// part of s's columns.
namespace {
std::vector<std::size_t> transpose_counts(const std::vector<std::array<int, 2>>& planes,
                                          const std::vector<std::array<int, 2>>& columns, int rank, bool by_plane,
                                          int K2c) {
  std::vector<std::size_t> counts(planes.size());
  for (std::size_t r = 0; r < planes.size(); ++r) {
    // by_plane: my planes x their columns (what I send towards columns); else their planes x my columns.
    const auto& p = by_plane ? planes[rank] : planes[r];
    const auto& c = by_plane ? columns[r] : columns[rank];
    counts[r] = 2 * static_cast<std::size_t>(p[1] - p[0]) * (c[1] - c[0]) * K2c;
  }
  return counts;
}
}  // namespace

SlabPme::SlabPme(std::array<int, 3> grid, int order, double beta, dist::Communicator comm, int slab_axis)
    : axes_(cyclic_axes(slab_axis)),
      grid_{grid[axes_[0]], grid[axes_[1]], grid[axes_[2]]},
      order_(order),
      comm_(std::move(comm)),
      rank_(comm_.rank()),
      ranks_(comm_.size()),
      planes_(slab_ranges(grid_[0], ranks_)),
      columns_(slab_ranges(grid_[1], ranks_)),
      influence_(std::make_unique<PmeInfluence>(grid_, order, beta)),
      splines_(std::make_unique<PmeSplines>()),
      local_counts_(ranks_),
      owned_counts_(ranks_) {
  const auto [x0, x1] = planes_[rank_];
  const auto [y0, y1] = columns_[rank_];
  transforms_ = std::make_unique<Transforms>(grid_, x1 - x0, y1 - y0);
  planes_by_columns_ = transpose_counts(planes_, columns_, rank_, true, grid_[2] / 2 + 1);
  columns_by_planes_ = transpose_counts(planes_, columns_, rank_, false, grid_[2] / 2 + 1);
}

SlabPme::~SlabPme() = default;

std::int64_t SlabPme::others_bytes(const std::vector<std::size_t>& counts) const {
  std::int64_t doubles = 0;
  for (int r = 0; r < ranks_; ++r)
    if (r != rank_) doubles += static_cast<std::int64_t>(counts[r]);
  return doubles * static_cast<std::int64_t>(sizeof(double));
}

void SlabPme::exchange_touched_planes(int atoms, const std::vector<double>& charges) {
  const int K0 = grid_[0];
  const std::size_t plane = static_cast<std::size_t>(grid_[1]) * grid_[2];
  touched_.assign(K0, 0);
  for (int i = 0; i < atoms; ++i)
    if (charges[i] != 0) splines_->mark_x_planes(i, order_, K0, touched_.data());
  all_touched_.resize(static_cast<std::size_t>(ranks_) * K0);
  comm_.all_gather<unsigned char>(touched_, all_touched_);
  bytes_sent_ = static_cast<std::int64_t>(K0) * (ranks_ - 1);
  // The local buffer holds the touched planes in ascending order, so the planes for each owner
  // are one block of it, and the blocks lie in rank order as all_to_all_v sends them.
  plane_slot_.assign(K0, -1);
  int touched = 0;
  for (int gx = 0; gx < K0; ++gx)
    if (touched_[gx]) plane_slot_[gx] = touched++;
  local_.assign(touched * plane, 0.0);
  const auto [x0, x1] = planes_[rank_];
  for (int r = 0; r < ranks_; ++r) {
    local_counts_[r] = owned_counts_[r] = 0;
    for (int gx = planes_[r][0]; gx < planes_[r][1]; ++gx) local_counts_[r] += touched_[gx] ? plane : 0;
    for (int gx = x0; gx < x1; ++gx)
      owned_counts_[r] += all_touched_[static_cast<std::size_t>(r) * K0 + gx] ? plane : 0;
  }
}

void SlabPme::sum_spread_planes() {
  const int K0 = grid_[0];
  const std::size_t plane = static_cast<std::size_t>(grid_[1]) * grid_[2];
  const auto [x0, x1] = planes_[rank_];
  std::size_t total = 0;
  for (std::size_t c : owned_counts_) total += c;
  received_.resize(total);
  comm_.all_to_all_v<double>(local_, local_counts_, received_, owned_counts_);
  bytes_sent_ += others_bytes(local_counts_);
  // Rank 0's planes first, then rank 1's...: the same sum on every run.
  double* owned = transforms_->planes_real;
  std::fill(owned, owned + static_cast<std::size_t>(x1 - x0) * plane, 0.0);
  const double* from = received_.data();
  for (int s = 0; s < ranks_; ++s)
    for (int gx = x0; gx < x1; ++gx) {
      if (!all_touched_[static_cast<std::size_t>(s) * K0 + gx]) continue;
      double* to = owned + static_cast<std::size_t>(gx - x0) * plane;
      for (std::size_t k = 0; k < plane; ++k) to[k] += from[k];
      from += plane;
    }
}

void SlabPme::return_potential_planes() {
  const int K0 = grid_[0];
  const std::size_t plane = static_cast<std::size_t>(grid_[1]) * grid_[2];
  const auto [x0, x1] = planes_[rank_];
  // Each sender gets back the planes it spread onto, in the order it sent them.
  double* to = received_.data();
  for (int s = 0; s < ranks_; ++s)
    for (int gx = x0; gx < x1; ++gx) {
      if (!all_touched_[static_cast<std::size_t>(s) * K0 + gx]) continue;
      const double* from = transforms_->planes_real + static_cast<std::size_t>(gx - x0) * plane;
      std::copy(from, from + plane, to);
      to += plane;
    }
  comm_.all_to_all_v<double>(received_, owned_counts_, local_, local_counts_);
  bytes_sent_ += others_bytes(owned_counts_);
}

void SlabPme::transpose_to_columns() {
  const int K0 = grid_[0], K1 = grid_[1], K2c = grid_[2] / 2 + 1;
  const auto [x0, x1] = planes_[rank_];
  const auto [y0, y1] = columns_[rank_];
  const auto& out = planes_by_columns_;
  const auto& in = columns_by_planes_;
  packed_.resize(2 * static_cast<std::size_t>(x1 - x0) * K1 * K2c);
  auto* packed = reinterpret_cast<std::complex<double>*>(packed_.data());
  const auto* planes = reinterpret_cast<const std::complex<double>*>(transforms_->planes_complex);
  for (int r = 0; r < ranks_; ++r)
    for (int a = 0; a < x1 - x0; ++a)
      for (int b = columns_[r][0]; b < columns_[r][1]; ++b) {
        const auto* row = planes + (static_cast<std::size_t>(a) * K1 + b) * K2c;
        packed = std::copy(row, row + K2c, packed);
      }
  // Rank s's block is its planes x my columns, and the planes ascend with the rank: received in
  // rank order they are the [x][y - y0][z] block itself.
  std::span<double> columns(reinterpret_cast<double*>(transforms_->columns),
                            2 * static_cast<std::size_t>(K0) * (y1 - y0) * K2c);
  comm_.all_to_all_v<double>(packed_, out, columns, in);
  bytes_sent_ += others_bytes(out);
}

void SlabPme::transpose_to_planes() {
  const int K0 = grid_[0], K1 = grid_[1], K2c = grid_[2] / 2 + 1;
  const auto [x0, x1] = planes_[rank_];
  const auto [y0, y1] = columns_[rank_];
  const auto& out = columns_by_planes_;
  const auto& in = planes_by_columns_;
  std::span<const double> columns(reinterpret_cast<const double*>(transforms_->columns),
                                  2 * static_cast<std::size_t>(K0) * (y1 - y0) * K2c);
  comm_.all_to_all_v<double>(columns, out, packed_, in);
  bytes_sent_ += others_bytes(out);
  const auto* packed = reinterpret_cast<const std::complex<double>*>(packed_.data());
  auto* planes = reinterpret_cast<std::complex<double>*>(transforms_->planes_complex);
  for (int r = 0; r < ranks_; ++r)
    for (int a = 0; a < x1 - x0; ++a)
      for (int b = columns_[r][0]; b < columns_[r][1]; ++b) {
        std::copy(packed, packed + K2c, planes + (static_cast<std::size_t>(a) * K1 + b) * K2c);
        packed += K2c;
      }
}

double SlabPme::compute(const std::vector<Vec3>& x, const std::vector<double>& charges, const Vec3& box,
                        std::vector<Vec3>& forces, Mat3* virial, int atoms) {
  KILN_CHECK(atoms >= 0 && atoms <= static_cast<int>(x.size()) && x.size() <= charges.size(),
             "PME: {} home atoms of {} positions and {} charges", atoms, x.size(), charges.size());
  Transforms& t = *transforms_;
  const auto [y0, y1] = columns_[rank_];
  // Into the slab frame: its first dimension is the slab axis.
  const Vec3 slab_box{box[axes_[0]], box[axes_[1]], box[axes_[2]]};
  slab_x_.resize(atoms);
  slab_forces_.assign(atoms, Vec3{0, 0, 0});
  for (int i = 0; i < atoms; ++i) slab_x_[i] = {x[i][axes_[0]], x[i][axes_[1]], x[i][axes_[2]]};
  splines_->compute(slab_x_, slab_box, grid_, order_, atoms);
  exchange_touched_planes(atoms, charges);
  spread_charges(*splines_, charges, atoms, grid_, order_, plane_slot_.data(), local_.data());
  sum_spread_planes();
  if (t.planes_forward) fftw_execute(t.planes_forward);
  transpose_to_columns();
  double energy = 0;
  Mat3 slab_virial{};
  if (t.x_forward) {
    fftw_execute(t.x_forward);
    energy = influence_->solve(reinterpret_cast<std::complex<double>*>(t.columns), slab_box, y0, y1, &slab_virial);
    fftw_execute(t.x_backward);
  }
  transpose_to_planes();
  if (t.planes_backward) fftw_execute(t.planes_backward);
  return_potential_planes();
  gather_forces(*splines_, charges, atoms, grid_, order_, slab_box, plane_slot_.data(), local_.data(), slab_forces_);
  // Back to the box's axes.
  for (int i = 0; i < atoms; ++i)
    for (int d = 0; d < 3; ++d) forces[i][axes_[d]] += slab_forces_[i][d];
  if (virial)
    for (int r = 0; r < 3; ++r)
      for (int c = 0; c < 3; ++c) (*virial)[axes_[r]][axes_[c]] += slab_virial[r][c];
  return energy;
}

}  // namespace kiln::md
