// The CUDA engine of kiln mdrun. Positions and velocities (double) and forces (Real) stay on the
// device for the whole run; the host only launches, draws the thermostat's random numbers, reads
// the pair-list size at each list build, and reads the energy accumulators (and the error flags)
// at energy steps.
//  - Pair list: built on the GPU every nstlist steps. Atoms are binned into columns of the xy plane
//    (about two cluster widths of atoms per column edge), sorted by z within each column (cub radix
//    sort), and cut into clusters of 8; cluster pairs whose bounding boxes are within rlist are
//    listed with a 64-bit interaction mask (padding, exclusions, the self-cluster half). This is a
//    simplified GROMACS cluster scheme: one 8 x 8 list without dynamic pruning; the kernel applies
//    the minimum image per pair instead of shift vectors.
//  - Non-bonded: one warp per i-cluster (kernels.cu), LJ and Coulomb with potential-shift; the
//    Ewald corrections of excluded pairs run as their own kernel over the exclusion pairs.
//  - PME: spread with atomics, cuFFT R2C/C2R (D2Z/Z2D in double), solve with energy and virial,
//    gather.
//  - Update: v-rescale factor, leap-frog, SETTLE, kinetic energy and COM removal as kernels.
#include <cufft.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <random>
#include <type_traits>

#include "kiln/hpc/md/crescale.h"
#include "kiln/hpc/md/cuda/kernels.h"
#include "kiln/hpc/md/dispersion_correction.h"
#include "kiln/hpc/md/engine.h"
#include "kiln/hpc/md/lincs.h"
#include "kiln/hpc/md/pme.h"
#include "kiln/hpc/md/settle.h"
#include "kiln/hpc/md/units.h"
#include "kiln/hpc/md/velocities.h"
#include "kiln/hpc/md/vrescale.h"
#include "kiln/runtime/backend.h"
#include "kiln/runtime/cuda/cuda_context.h"
#include "kiln/runtime/cuda/device_array.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/vendor/cuda.h"

namespace kiln::md {

namespace {

#define KILN_CUFFT_CHECK(call)                                                                                     \
  do {                                                                                                             \
    cufftResult kiln_fft_ = (call);                                                                                \
    KILN_CHECK(kiln_fft_ == CUFFT_SUCCESS, "cuFFT: {} failed with status {}", #call, static_cast<int>(kiln_fft_)); \
  } while (0)

// cuFFT's names for the real-to-complex transforms of one precision.
template <class Real>
struct Fft;
template <>
struct Fft<float> {
  static constexpr cufftType forward_type = CUFFT_R2C, backward_type = CUFFT_C2R;
  static cufftResult forward(cufftHandle p, float* in, float* out) {
    return cufftExecR2C(p, in, reinterpret_cast<cufftComplex*>(out));
  }
  static cufftResult backward(cufftHandle p, float* in, float* out) {
    return cufftExecC2R(p, reinterpret_cast<cufftComplex*>(in), out);
  }
};
template <>
struct Fft<double> {
  static constexpr cufftType forward_type = CUFFT_D2Z, backward_type = CUFFT_Z2D;
  static cufftResult forward(cufftHandle p, double* in, double* out) {
    return cufftExecD2Z(p, in, reinterpret_cast<cufftDoubleComplex*>(out));
  }
  static cufftResult backward(cufftHandle p, double* in, double* out) {
    return cufftExecZ2D(p, reinterpret_cast<cufftDoubleComplex*>(in), out);
  }
};

template <class T>
DeviceArray<T> upload(int device, const std::vector<T>& host, cudaStream_t stream) {
  DeviceArray<T> d(device, host.size());
  if (!host.empty())
    KILN_CUDA_CHECK(cudaMemcpyAsync(d.data(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, stream));
  return d;
}

std::vector<double> flatten(const std::vector<Vec3>& v) {
  std::vector<double> out(3 * v.size());
  std::memcpy(out.data(), v.data(), out.size() * sizeof(double));
  return out;
}

template <class T>
std::vector<T> download(const T* d, std::size_t n, cudaStream_t stream) {
  std::vector<T> out(n);
  if (n) KILN_CUDA_CHECK(cudaMemcpyAsync(out.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost, stream));
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
  return out;
}

std::vector<Vec3> to_vec3(const std::vector<double>& flat) {
  std::vector<Vec3> out(flat.size() / 3);
  std::memcpy(out.data(), flat.data(), flat.size() * sizeof(double));
  return out;
}

// The torsion and 1-4 terms from the device accumulators.
void copy_listed_terms(const std::vector<double>& a, StepEnergies& e) {
  e.proper_dih = a[gpu::kProperDih];
  e.rb_dih = a[gpu::kRbDih];
  e.improper_dih = a[gpu::kImproperDih];
  e.lj14 = a[gpu::kLj14];
  e.coulomb14 = a[gpu::kCoulomb14];
}

// The dispersion correction is a host-side scalar of the volume, as the CPU engine's: Disper. corr.
// and Pres. DC for the box at this step (before sum_potential and the pressure, which then include them).
void set_dispersion_terms(const DispersionCorrection& dc, double volume, StepEnergies& e) {
  const auto t = dc.at(volume);
  e.has_dispcorr = dc.enabled();
  e.disp_corr = t.energy;
  e.pres_dc = t.pressure;
}

// The column grid: columns about as wide as a cube holding one cluster of atoms at the system's
// mean density, so that a cluster cut from a column's z-sorted atoms is roughly cubic.
gpu::ColumnGrid column_grid(int n, const Vec3& box) {
  gpu::ColumnGrid g;
  const double density = n / (box[0] * box[1] * box[2]);
  const double width = std::cbrt(gpu::kClusterSize / density);
  g.ncx = std::max(1, static_cast<int>(box[0] / width));
  g.ncy = std::max(1, static_cast<int>(box[1] / width));
  g.sx = box[0] / g.ncx;
  g.sy = box[1] / g.ncy;
  g.max_clusters = (n + (gpu::kClusterSize - 1) * g.ncx * g.ncy + gpu::kClusterSize - 1) / gpu::kClusterSize;
  g.max_slots = g.max_clusters * gpu::kClusterSize;
  return g;
}

// The force field on the device: pair list, non-bonded, exclusions, PME and bonded terms.
template <class Real>
class GpuForceField {
 public:
  GpuForceField(const MdSystem& s, const EngineSettings& settings, const Vec3& box, int device)
      : system_(s), settings_(settings), device_(device), n_(s.atom_count) {
    KILN_CHECK(device >= 0 && device < device_count(DeviceKind::CUDA), "mdrun: no CUDA device {} ({} visible)", device,
               device_count(DeviceKind::CUDA));
    DeviceGuard guard(device_);
    stream_ = cuda_stream(device_);
    box_ = {box[0], box[1], box[2]};
    grid_ = column_grid(n_, box);
    const int ncol = grid_.ncx * grid_.ncy;
    charges_ = upload(device_, s.charges, stream_);
    types_ = upload(device_, s.types, stream_);
    std::vector<Real> c6(s.c6.begin(), s.c6.end()), c12(s.c12.begin(), s.c12.end());
    c6_ = upload(device_, c6, stream_);
    c12_ = upload(device_, c12, stream_);
    // Exclusions: CSR for the list's masks, and the i < j pairs for the Ewald corrections.
    std::vector<int> offsets(n_ + 1, 0), atoms, pairs;
    for (int i = 0; i < n_; ++i) {
      for (int j : s.exclusions[i]) {
        atoms.push_back(j);
        span_ = std::max(span_, std::abs(j - i));
        if (j > i) {
          pairs.push_back(i);
          pairs.push_back(j);
        }
      }
      offsets[i + 1] = static_cast<int>(atoms.size());
    }
    exclusion_count_ = static_cast<int>(pairs.size() / 2);
    excl_offsets_ = upload(device_, offsets, stream_);
    excl_atoms_ = upload(device_, atoms.empty() ? std::vector<int>{0} : atoms, stream_);
    exclusion_pairs_ = upload(device_, pairs, stream_);
    std::vector<gpu::GpuBond> bonds;
    for (const auto& b : s.bonds) bonds.push_back({b.i, b.j, b.b0, b.kb});
    std::vector<gpu::GpuAngle> angles;
    for (const auto& a : s.angles) angles.push_back({a.i, a.j, a.k, a.theta0, a.kth});
    bonds_ = upload(device_, bonds, stream_);
    angles_ = upload(device_, angles, stream_);
    std::vector<gpu::GpuDihedral> dihedrals;
    auto periodic = [&](const PeriodicDihedral& d, int kind) {
      dihedrals.push_back({d.i, d.j, d.k, d.l, kind, d.n, {d.phi_s, d.k_phi, 0, 0, 0, 0}});
    };
    for (const auto& d : s.proper_dihedrals) periodic(d, 0);
    for (const auto& d : s.periodic_impropers) periodic(d, 1);
    for (const auto& d : s.rb_dihedrals)
      dihedrals.push_back({d.i, d.j, d.k, d.l, 2, 0, {d.c[0], d.c[1], d.c[2], d.c[3], d.c[4], d.c[5]}});
    std::vector<gpu::GpuPair14> pairs14;
    for (const auto& p : s.pairs) pairs14.push_back({p.i, p.j, p.c6, p.c12, kCoulombFactor * p.qq});
    dihedral_count_ = static_cast<int>(dihedrals.size());
    pair14_count_ = static_cast<int>(pairs14.size());
    dihedrals_ = upload(device_, dihedrals, stream_);
    pairs14_ = upload(device_, pairs14, stream_);
    // Pair-list work arrays.
    keys_ = DeviceArray<std::uint64_t>(device_, n_);
    sorted_keys_ = DeviceArray<std::uint64_t>(device_, n_);
    values_ = DeviceArray<int>(device_, n_);
    sorted_values_ = DeviceArray<int>(device_, n_);
    sort_temp_bytes_ = gpu::sort_temp_bytes(n_);
    sort_temp_ = DeviceArray<unsigned char>(device_, std::max<std::size_t>(sort_temp_bytes_, 1));
    column_counts_ = DeviceArray<int>(device_, ncol);
    column_atom_start_ = DeviceArray<int>(device_, ncol + 1);
    column_cluster_start_ = DeviceArray<int>(device_, ncol + 1);
    slot_atom_ = DeviceArray<int>(device_, grid_.max_slots);
    slot_type_ = DeviceArray<int>(device_, grid_.max_slots);
    xq_ = DeviceArray<Real>(device_, 4 * static_cast<std::size_t>(grid_.max_slots));
    bounds_ = DeviceArray<float>(device_, 6 * static_cast<std::size_t>(grid_.max_clusters));
    pair_counts_ = DeviceArray<int>(device_, grid_.max_clusters);
    pair_start_ = DeviceArray<int>(device_, grid_.max_clusters + 1);
    nonbonded_ = {kCoulombFactor, settings.cutoff, settings.beta, settings.reaction_field,
                  settings.k_rf,  settings.c_rf,   s.type_count};
    if (!settings.reaction_field) {
      const auto& k = settings.pme_grid;
      pme_ = {k[0], k[1], k[2], settings.mdp.pme_order, settings.beta, kCoulombFactor};
      for (int d = 0; d < 3; ++d) {
        KILN_CHECK(k[d] >= 2 * (pme_.order - 1), "PME grid {} in {} is below 2 * (pme-order - 1)", k[d], "xyz"[d]);
        auto mod = bspline_moduli(k[d], pme_.order);
        std::vector<Real> inverse(mod.size());
        for (std::size_t m = 0; m < mod.size(); ++m) inverse[m] = static_cast<Real>(1.0 / mod[m]);
        moduli_[d] = upload(device_, inverse, stream_);
      }
      const std::size_t real_size = static_cast<std::size_t>(k[0]) * k[1] * k[2];
      const std::size_t complex_size = static_cast<std::size_t>(k[0]) * k[1] * (k[2] / 2 + 1);
      real_grid_ = DeviceArray<Real>(device_, real_size);
      complex_grid_ = DeviceArray<Real>(device_, 2 * complex_size);
      KILN_CUFFT_CHECK(cufftPlan3d(&forward_, k[0], k[1], k[2], Fft<Real>::forward_type));
      KILN_CUFFT_CHECK(cufftPlan3d(&backward_, k[0], k[1], k[2], Fft<Real>::backward_type));
      // PME runs on a stream of its own, overlapping the pair kernel (which it does not share data
      // with but the force array, which both add to atomically); events order it after the step's
      // update and before the next.
      KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&pme_stream_, cudaStreamNonBlocking));
      KILN_CUDA_CHECK(cudaEventCreateWithFlags(&forces_zeroed_, cudaEventDisableTiming));
      KILN_CUDA_CHECK(cudaEventCreateWithFlags(&pme_done_, cudaEventDisableTiming));
      KILN_CUFFT_CHECK(cufftSetStream(forward_, pme_stream_));
      KILN_CUFFT_CHECK(cufftSetStream(backward_, pme_stream_));
      has_pme_ = true;
    }
    if (settings.nstlist_prune > 0) {
      KILN_CHECK(settings.rlist_inner >= settings.cutoff && settings.rlist_inner <= settings.rlist,
                 "mdrun: the inner list radius {} is not between the cut-off {} and rlist {}", settings.rlist_inner,
                 settings.cutoff, settings.rlist);
      prune_parts_ = std::max(1, settings.prune_parts);
      kept_ = DeviceArray<unsigned long long>(device_, prune_parts_);
      KILN_CUDA_CHECK(cudaMemsetAsync(kept_.data(), 0, prune_parts_ * sizeof(unsigned long long), stream_));
    }
    double q2 = 0;
    for (double q : s.charges) q2 += q * q;
    self_energy_ = -kCoulombFactor * q2 *
                   (settings.reaction_field ? 0.5 * settings.c_rf : settings.beta / std::sqrt(std::numbers::pi));
  }
  ~GpuForceField() {
    if (has_pme_) {
      cufftDestroy(forward_);
      cufftDestroy(backward_);
      cudaEventDestroy(forces_zeroed_);
      cudaEventDestroy(pme_done_);
      cudaStreamDestroy(pme_stream_);
    }
  }
  GpuForceField(const GpuForceField&) = delete;
  GpuForceField& operator=(const GpuForceField&) = delete;

  cudaStream_t stream() const { return stream_; }
  gpu::Box box() const { return box_; }
  // c-rescale scaled the box: the same columns (and PME grid), widths scaled with it. The list
  // must be rebuilt before the next force evaluation.
  void set_box(const Vec3& box) {
    box_ = {box[0], box[1], box[2]};
    grid_.sx = box[0] / grid_.ncx;
    grid_.sy = box[1] / grid_.ncy;
  }
  // Coulomb (SR)'s self term, constant for a run: -f sum q^2 beta / sqrt(pi) (or c_rf / 2).
  double self_energy() const { return self_energy_; }
  std::size_t cluster_pairs() const { return cluster_pair_count_; }
  bool pruning() const { return prune_parts_ > 0; }
  int prune_parts() const { return prune_parts_; }
  // The inner list's cluster pairs now (each part's count from its last prune); synchronises.
  std::size_t inner_cluster_pairs() const {
    if (!pruning()) return cluster_pair_count_;
    std::size_t total = 0;
    for (auto c : download(kept_.data(), prune_parts_, stream_)) total += c;
    return total;
  }

  // The cluster-pair list for positions x (device, atom order); one host read of its size.
  void build_list(const double* x) {
    DeviceGuard guard(device_);
    const int ncol = grid_.ncx * grid_.ncy;
    KILN_CUDA_CHECK(cudaMemsetAsync(column_counts_.data(), 0, ncol * sizeof(int), stream_));
    gpu::assign_columns(n_, x, box_, grid_, keys_.data(), values_.data(), column_counts_.data(), stream_);
    KILN_CUDA_CHECK_LAUNCH();
    gpu::sort_by_column(n_, keys_.data(), sorted_keys_.data(), values_.data(), sorted_values_.data(), sort_temp_.data(),
                        sort_temp_bytes_, stream_);
    KILN_CUDA_CHECK_LAUNCH();
    gpu::column_offsets(ncol, column_counts_.data(), column_atom_start_.data(), column_cluster_start_.data(), stream_);
    KILN_CUDA_CHECK_LAUNCH();
    KILN_CUDA_CHECK(cudaMemsetAsync(slot_atom_.data(), 0xff, grid_.max_slots * sizeof(int), stream_));
    gpu::fill_slots(n_, sorted_keys_.data(), sorted_values_.data(), column_atom_start_.data(),
                    column_cluster_start_.data(), slot_atom_.data(), stream_);
    KILN_CUDA_CHECK_LAUNCH();
    gpu::cluster_bounds(grid_, column_cluster_start_.data(), slot_atom_.data(), x, box_, bounds_.data(), stream_);
    KILN_CUDA_CHECK_LAUNCH();
    gpu::cluster_pairs(grid_, column_cluster_start_.data(), bounds_.data(), box_, settings_.rlist, slot_atom_.data(),
                       excl_offsets_.data(), excl_atoms_.data(), span_, pair_counts_.data(), nullptr, nullptr, nullptr,
                       stream_);
    KILN_CUDA_CHECK_LAUNCH();
    gpu::exclusive_scan(grid_.max_clusters, pair_counts_.data(), pair_start_.data(), stream_);
    KILN_CUDA_CHECK_LAUNCH();
    int total = 0;
    KILN_CUDA_CHECK(
        cudaMemcpyAsync(&total, pair_start_.data() + grid_.max_clusters, sizeof(int), cudaMemcpyDeviceToHost, stream_));
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (static_cast<std::size_t>(total) > pair_cluster_.size()) {
      // Room for growth, so the list is not reallocated at every build while the system settles.
      const std::size_t capacity = static_cast<std::size_t>(total) + total / 4 + 64;
      pair_cluster_ = DeviceArray<int>(device_, capacity);
      pair_mask_ = DeviceArray<std::uint64_t>(device_, capacity);
      if (pruning()) inner_mask_ = DeviceArray<std::uint64_t>(device_, capacity);
    }
    gpu::cluster_pairs(grid_, column_cluster_start_.data(), bounds_.data(), box_, settings_.rlist, slot_atom_.data(),
                       excl_offsets_.data(), excl_atoms_.data(), span_, pair_counts_.data(), pair_start_.data(),
                       pair_cluster_.data(), pair_mask_.data(), stream_);
    KILN_CUDA_CHECK_LAUNCH();
    cluster_pair_count_ = static_cast<std::size_t>(total);
  }

  static constexpr int kPruneAll = -1, kPruneNone = -2;

  // Forces (overwritten) at x; with `energies`, the potential terms and virial trace added to acc.
  // With pruning on, `prune` is the part of the inner list to prune at x first (kPruneAll: all of
  // it, at an outer build) or kPruneNone.
  void compute(const double* x, Real* f, bool energies, double* acc, unsigned long long* flags,
               int prune = kPruneNone) {
    DeviceGuard guard(device_);
    KILN_CUDA_CHECK(cudaMemsetAsync(f, 0, 3 * static_cast<std::size_t>(n_) * sizeof(Real), stream_));
    if (has_pme_) {
      KILN_CUDA_CHECK(cudaEventRecord(forces_zeroed_, stream_));
      KILN_CUDA_CHECK(cudaStreamWaitEvent(pme_stream_, forces_zeroed_, 0));
      compute_pme(x, f, energies, acc);
      KILN_CUDA_CHECK(cudaEventRecord(pme_done_, pme_stream_));
    }
    gpu::pack_slots<Real>(grid_.max_slots, slot_atom_.data(), x, charges_.data(), types_.data(), box_, xq_.data(),
                          slot_type_.data(), stream_);
    KILN_CUDA_CHECK_LAUNCH();
    const int ncol = grid_.ncx * grid_.ncy;
    if (pruning() && prune != kPruneNone) {
      const int first = prune == kPruneAll ? 0 : prune, last = prune == kPruneAll ? prune_parts_ - 1 : prune;
      for (int part = first; part <= last; ++part) {
        KILN_CUDA_CHECK(cudaMemsetAsync(kept_.data() + part, 0, sizeof(unsigned long long), stream_));
        gpu::prune_pairs<Real>(grid_.max_clusters, column_cluster_start_.data(), ncol, pair_start_.data(),
                               pair_cluster_.data(), pair_mask_.data(), xq_.data(), box_, settings_.rlist_inner, part,
                               prune_parts_, inner_mask_.data(), kept_.data(), stream_);
        KILN_CUDA_CHECK_LAUNCH();
      }
    }
    gpu::nonbonded<Real>(grid_.max_clusters, column_cluster_start_.data(), ncol, pair_start_.data(),
                         pair_cluster_.data(), pair_mask_.data(), pruning() ? inner_mask_.data() : nullptr, xq_.data(),
                         slot_type_.data(), slot_atom_.data(), c6_.data(), c12_.data(), nonbonded_, box_, f, energies,
                         acc, flags, stream_);
    KILN_CUDA_CHECK_LAUNCH();
    gpu::exclusion_corrections<Real>(exclusion_count_, exclusion_pairs_.data(), x, charges_.data(), nonbonded_, box_, f,
                                     energies, acc, flags, stream_);
    KILN_CUDA_CHECK_LAUNCH();
    gpu::bonded<Real>(static_cast<int>(system_.bonds.size()), bonds_.data(), static_cast<int>(system_.angles.size()),
                      angles_.data(), x, box_, f, energies, acc, stream_);
    KILN_CUDA_CHECK_LAUNCH();
    gpu::dihedrals_and_pairs<Real>(dihedral_count_, dihedrals_.data(), pair14_count_, pairs14_.data(), x, box_, f,
                                   energies, acc, stream_);
    KILN_CUDA_CHECK_LAUNCH();
    // The forces are complete once PME's are in: everything after this on the stream sees them.
    if (has_pme_) KILN_CUDA_CHECK(cudaStreamWaitEvent(stream_, pme_done_, 0));
  }

 private:
  // Spread, transforms, solve and gather on pme_stream_ (the caller orders it with events).
  void compute_pme(const double* x, Real* f, bool energies, double* acc) {
    KILN_CUDA_CHECK(cudaMemsetAsync(real_grid_.data(), 0, real_grid_.size() * sizeof(Real), pme_stream_));
    gpu::pme_spread<Real>(n_, x, charges_.data(), box_, pme_, real_grid_.data(), pme_stream_);
    KILN_CUDA_CHECK_LAUNCH();
    KILN_CUFFT_CHECK(Fft<Real>::forward(forward_, real_grid_.data(), complex_grid_.data()));
    gpu::pme_solve<Real>(pme_, box_, moduli_[0].data(), moduli_[1].data(), moduli_[2].data(), complex_grid_.data(),
                         energies, acc, pme_stream_);
    KILN_CUDA_CHECK_LAUNCH();
    KILN_CUFFT_CHECK(Fft<Real>::backward(backward_, complex_grid_.data(), real_grid_.data()));
    gpu::pme_gather<Real>(n_, x, charges_.data(), box_, pme_, real_grid_.data(), f, pme_stream_);
    KILN_CUDA_CHECK_LAUNCH();
  }

  const MdSystem& system_;
  EngineSettings settings_;
  int device_;
  int n_;
  cudaStream_t stream_ = nullptr;
  cudaStream_t pme_stream_ = nullptr;
  cudaEvent_t forces_zeroed_ = nullptr, pme_done_ = nullptr;
  int prune_parts_ = 0;  // 0: no pruning
  DeviceArray<std::uint64_t> inner_mask_;
  DeviceArray<unsigned long long> kept_;
  gpu::Box box_{};
  gpu::ColumnGrid grid_;
  gpu::NonbondedParams nonbonded_{};
  gpu::PmeGrid pme_{};
  bool has_pme_ = false;
  double self_energy_ = 0;
  int span_ = 0, exclusion_count_ = 0;
  std::size_t cluster_pair_count_ = 0;
  DeviceArray<double> charges_;
  DeviceArray<int> types_;
  DeviceArray<Real> c6_, c12_;
  DeviceArray<int> excl_offsets_, excl_atoms_, exclusion_pairs_;
  DeviceArray<gpu::GpuBond> bonds_;
  DeviceArray<gpu::GpuAngle> angles_;
  DeviceArray<gpu::GpuDihedral> dihedrals_;
  DeviceArray<gpu::GpuPair14> pairs14_;
  int dihedral_count_ = 0, pair14_count_ = 0;
  DeviceArray<std::uint64_t> keys_, sorted_keys_;
  DeviceArray<int> values_, sorted_values_;
  std::size_t sort_temp_bytes_ = 0;
  DeviceArray<unsigned char> sort_temp_;
  DeviceArray<int> column_counts_, column_atom_start_, column_cluster_start_, slot_atom_, slot_type_;
  DeviceArray<Real> xq_;
  DeviceArray<float> bounds_;
  DeviceArray<int> pair_counts_, pair_start_, pair_cluster_;
  DeviceArray<std::uint64_t> pair_mask_;
  std::array<DeviceArray<Real>, 3> moduli_;
  DeviceArray<Real> real_grid_, complex_grid_;
  cufftHandle forward_ = 0, backward_ = 0;
};

// What the kernels flagged, as the CPU engine's errors; x (host) names the atoms' distances.
void throw_flags(const MdSystem& s, const std::vector<unsigned long long>& flags, const std::vector<Vec3>& x,
                 const Vec3& box, double cutoff, double max_force) {
  if (flags[gpu::kOverlap]) {
    // The kernel saw each pair in cluster order; name it as the CPU engine does, lower index first.
    const unsigned long long key = ~flags[gpu::kOverlap];
    const int a = static_cast<int>(key >> 32), b = static_cast<int>(key & 0xffffffffu);
    const int i = std::min(a, b), j = std::max(a, b);
    KILN_FAIL(
        "atoms {} ({}) and {} ({}) overlap: {:.5f} nm apart; the coordinates need fixing (energy "
        "minimisation or a different start)",
        i + 1, s.atom_names[i], j + 1, s.atom_names[j], norm(min_image(x[j] - x[i], box)));
  }
  if (flags[gpu::kFarExclusion]) {
    const unsigned long long key = ~flags[gpu::kFarExclusion];
    const int i = static_cast<int>(key >> 32), j = static_cast<int>(key & 0xffffffffu);
    KILN_FAIL(
        "excluded atoms {} ({}) and {} ({}) are {:.4f} nm apart, beyond the cut-off {} nm: a "
        "molecule is broken over the box or the cut-off is too short for it",
        i + 1, s.atom_names[i], j + 1, s.atom_names[j], norm(min_image(x[j] - x[i], box)), cutoff);
  }
  if (flags[gpu::kForce]) {
    const unsigned long long key = ~flags[gpu::kForce];
    const int i = static_cast<int>(key & 0xffffffffu);
    KILN_FAIL(
        "step {}: the force on atom {} ({}) is above the limit {:.4g} kJ/mol/nm. Atoms overlap: fix the "
        "coordinates (energy minimisation) before running MD",
        key >> 32, i + 1, s.atom_names[i], max_force);
  }
  if (flags[gpu::kSettleWater]) {
    const int o = static_cast<int>(~flags[gpu::kSettleWater]);
    KILN_FAIL(
        "SETTLE: water at atom {} moved too far in one step to be constrained (is dt too large, or are "
        "atoms overlapping?)",
        o + 1);
  }
}

template <class Real>
class CudaEngine final : public MdEngine {
 public:
  CudaEngine(const MdSystem& system, const EngineSettings& settings, MdState initial)
      : system_(system),
        settings_(settings),
        state_(std::move(initial)),
        device_(settings.gpu_index),
        field_(system, settings, state_.box, settings.gpu_index),
        dispersion_(system, settings.mdp.dispcorr, settings.cutoff) {
    std::uint64_t seed =
        settings.mdp.ld_seed >= 0 ? static_cast<std::uint64_t>(settings.mdp.ld_seed) : std::random_device{}();
    rng_.seed(seed);
  }

  std::string name() const override {
    return fmt::format("CUDA ({} precision) on cuda:{}", std::is_same_v<Real, float> ? "mixed" : "double", device_);
  }
  MdState state() const override { return state_; }
  EngineCounters counters() const override { return counters_; }

  void run(const std::function<void(const StepEnergies&)>& on_energies) override {
    DeviceGuard guard(device_);
    const MdpOptions& o = settings_.mdp;
    const MdSystem& s = system_;
    const int n = s.atom_count;
    const double dt = o.dt;
    const cudaStream_t stream = field_.stream();
    gpu::Box box = field_.box();
    double volume = box.x * box.y * box.z;
    const EngineCheckpoint* resume = settings_.resume.get();
    std::int64_t first_step = 0;
    if (resume) {
      // The checkpoint's state (written by either engine: the files are the same) before this step's
      // forces: x, v, the box, the generators; its pair list and thermostat work are set below.
      first_step = resume->next_step;
      state_.positions = resume->positions;
      state_.velocities = resume->velocities;
      state_.box = resume->box;
      field_.set_box(state_.box);
      box = field_.box();
      volume = box.x * box.y * box.z;
      restore_generators(resume->generators, rng_, barostat_noise_);
    } else if (!o.continuation && (!s.settles.empty() || !s.constraints.empty())) {
      // The start is constrained and its COM motion removed on the host, as the CPU engine does.
      Lincs start(s, o.lincs_order, o.lincs_iter);
      std::vector<Vec3> ref = state_.positions;
      settle_positions(s, ref, state_.positions, state_.box);
      start.apply(ref, state_.positions, state_.box, dt, nullptr);
      std::vector<Vec3> back(n);
      for (int i = 0; i < n; ++i) back[i] = state_.positions[i] - dt * state_.velocities[i];
      settle_positions(s, state_.positions, back, state_.box);
      start.apply(state_.positions, back, state_.box, dt, nullptr);
      for (int i = 0; i < n; ++i) state_.velocities[i] = (1 / dt) * (state_.positions[i] - back[i]);
    }
    if (!resume && o.comm_mode == ComMode::Linear) remove_com_velocity(s, state_.velocities);
    DeviceArray<double> x = upload(device_, flatten(state_.positions), stream);
    DeviceArray<double> v = upload(device_, flatten(state_.velocities), stream);
    DeviceArray<double> x_new(device_, 3 * static_cast<std::size_t>(n)),
        v_new(device_, 3 * static_cast<std::size_t>(n));
    DeviceArray<double> x_list(device_, 3 * static_cast<std::size_t>(n));
    DeviceArray<Real> f(device_, 3 * static_cast<std::size_t>(n));
    DeviceArray<double> acc(device_, gpu::kAccumulatorCount), partial(device_, 2 * gpu::kReduceBlocks);
    DeviceArray<unsigned long long> flags(device_, gpu::kFlagCount);
    std::vector<double> inv_mass(n);
    for (int i = 0; i < n; ++i) inv_mass[i] = 1.0 / s.masses[i];
    DeviceArray<double> inv_mass_d = upload(device_, inv_mass, stream), masses = upload(device_, s.masses, stream);
    std::vector<int> oxygens;
    std::vector<double> distances;
    for (const auto& w : s.settles) {
      oxygens.push_back(w.o);
      distances.push_back(w.d_oh);
      distances.push_back(w.d_hh);
    }
    DeviceArray<int> oxygens_d = upload(device_, oxygens, stream);
    DeviceArray<double> distances_d = upload(device_, distances, stream);
    // LINCS: the CPU engine's coupling arrays, and work arrays, on the device.
    const LincsCoupling coupling = lincs_coupling(s);
    const int nc = static_cast<int>(s.constraints.size());
    std::vector<int> constraint_atoms;
    std::vector<double> constraint_lengths;
    for (const auto& c : s.constraints) {
      constraint_atoms.push_back(c.i);
      constraint_atoms.push_back(c.j);
      constraint_lengths.push_back(c.length);
    }
    DeviceArray<int> lincs_atoms = upload(device_, constraint_atoms, stream),
                     lincs_start = upload(device_, coupling.start, stream),
                     lincs_other = upload(device_, coupling.other, stream);
    DeviceArray<double> lincs_length = upload(device_, constraint_lengths, stream),
                        lincs_s = upload(device_, coupling.s, stream),
                        lincs_coef = upload(device_, coupling.coef, stream);
    DeviceArray<double> lincs_work(device_, 9 * static_cast<std::size_t>(nc) + coupling.other.size());
    gpu::LincsArrays lincs{nc,
                           o.lincs_order,
                           o.lincs_iter,
                           lincs_atoms.data(),
                           lincs_length.data(),
                           lincs_s.data(),
                           lincs_start.data(),
                           lincs_other.data(),
                           lincs_coef.data(),
                           lincs_work.data(),
                           lincs_work.data() + 3 * nc,
                           lincs_work.data() + 9 * nc,
                           lincs_work.data() + 4 * nc,
                           lincs_work.data() + 5 * nc,
                           lincs_work.data() + 6 * nc,
                           lincs_work.data() + 7 * nc,
                           lincs_work.data() + 8 * nc};
    double total_mass = 0;
    for (double m : s.masses) total_mass += m;
    const int water_count = static_cast<int>(oxygens.size());
    const bool thermostat = o.tcoupl == Thermostat::VRescale;
    const int ndf = settings_.degrees_of_freedom;
    const double ke_ref = 0.5 * o.ref_t * kBoltzmann * ndf;
    const double tau_factor = thermostat ? std::exp(-dt / o.tau_t) : 1.0;
    const std::size_t coords_bytes = 3 * static_cast<std::size_t>(n) * sizeof(double);
    auto zero_energy_terms = [&] {
      KILN_CUDA_CHECK(
          cudaMemsetAsync(acc.data() + gpu::kLj, 0, (gpu::kConstraintVirial - gpu::kLj + 1) * sizeof(double), stream));
    };
    // Dynamic pruning: all of the inner list at each outer build, then one part every
    // nstlist_prune / parts steps, so that each part is pruned every nstlist_prune steps.
    const bool pruning = field_.pruning();
    const int prune_interval = pruning ? std::max(1, settings_.nstlist_prune / field_.prune_parts()) : 1;
    std::int64_t built_at = 0;
    int next_part = 0;
    auto prune_for = [&](std::int64_t s, bool built) {
      if (!pruning) return GpuForceField<Real>::kPruneNone;
      if (built) {
        built_at = s;
        next_part = 0;
        ++counters_.prunes;
        return GpuForceField<Real>::kPruneAll;
      }
      if ((s - built_at) % prune_interval != 0) return GpuForceField<Real>::kPruneNone;
      const int part = next_part;
      next_part = (next_part + 1) % field_.prune_parts();
      ++counters_.prunes;
      return part;
    };
    // The list for the positions in x_list; a search step (rebuild) first makes them x's.
    auto build_at_list_positions = [&] {
      field_.build_list(x_list.data());
      ++counters_.pair_list_builds;
      counters_.cluster_pairs = field_.cluster_pairs();
    };
    auto rebuild = [&] {
      KILN_CUDA_CHECK(cudaMemcpyAsync(x_list.data(), x.data(), coords_bytes, cudaMemcpyDeviceToDevice, stream));
      build_at_list_positions();
    };
    // The state after `next_step - 1`'s update, as the CPU engine checkpoints it: x(next_step),
    // v(next_step - dt/2), the list's positions, the thermostat work so far and the generators.
    auto write_checkpoint = [&](std::int64_t next_step) {
      EngineCheckpoint c;
      c.next_step = next_step;
      c.positions = to_vec3(download(x.data(), 3 * static_cast<std::size_t>(n), stream));
      c.velocities = to_vec3(download(v.data(), 3 * static_cast<std::size_t>(n), stream));
      c.list_positions = to_vec3(download(x_list.data(), 3 * static_cast<std::size_t>(n), stream));
      c.box = state_.box;
      c.thermostat_work = download(acc.data(), gpu::kAccumulatorCount, stream)[gpu::kThermostatWork];
      c.generators = generator_state(rng_, barostat_noise_);
      settings_.on_checkpoint(c);
    };
    auto read_flags = [&] {
      auto host_flags = download(flags.data(), gpu::kFlagCount, stream);
      counters_.buffer_exceeded_steps = static_cast<std::int64_t>(host_flags[gpu::kBufferExceeded]);
      counters_.pruned_pairs_in_cutoff = static_cast<std::int64_t>(host_flags[gpu::kPrunedInCutoff]);
      return host_flags;
    };
    auto check_flags = [&](const std::vector<unsigned long long>& host_flags) {
      for (int k = 0; k < gpu::kFlagCount; ++k)
        if (k != gpu::kBufferExceeded && k != gpu::kPrunedInCutoff && host_flags[k] != 0) {
          auto positions = to_vec3(download(x.data(), 3 * static_cast<std::size_t>(n), stream));
          throw_flags(s, host_flags, positions, state_.box, settings_.cutoff, o.max_force);
        }
    };

    if (resume) {
      // The list the run that wrote the checkpoint was using (built where its atoms then were), and
      // its thermostat work. With pruning the whole inner list is pruned at this step, where that
      // run had pruned its parts at earlier steps: the same interactions within the cut-off.
      const std::vector<double> list_x = flatten(resume->list_positions);
      KILN_CUDA_CHECK(cudaMemcpyAsync(x_list.data(), list_x.data(), coords_bytes, cudaMemcpyHostToDevice, stream));
      build_at_list_positions();  // synchronises (the list's size): list_x may go
      KILN_CUDA_CHECK(cudaMemcpyAsync(acc.data() + gpu::kThermostatWork, &resume->thermostat_work, sizeof(double),
                                      cudaMemcpyHostToDevice, stream));
    } else {
      rebuild();
    }
    zero_energy_terms();
    field_.compute(x.data(), f.data(), true, acc.data(), flags.data(), prune_for(first_step, true));
    gpu::kinetic_energy(n, v.data(), masses.data(), acc.data(), gpu::kKineticOld, stream);
    KILN_CUDA_CHECK_LAUNCH();
    auto couple_step = [&](std::int64_t step) { return o.pressure_coupling && step % o.crescale.nstpcouple == 0; };
    bool box_scaled = false;
    for (std::int64_t step = first_step; step <= o.nsteps; ++step) {
      // Energy terms are summed at energy steps and at c-rescale steps (which need the pressure).
      const bool energy_step = step % o.nstenergy == 0 || step == o.nsteps || couple_step(step);
      if (thermostat) {
        gpu::vrescale(acc.data(), draw_vrescale_noise(rng_, ndf), ke_ref, ndf, tau_factor, stream);
        KILN_CUDA_CHECK_LAUNCH();
      }
      gpu::leapfrog<Real>(n, x.data(), v.data(), f.data(), inv_mass_d.data(), dt, thermostat, acc.data(), o.max_force,
                          step, x_new.data(), v_new.data(), flags.data(), stream);
      KILN_CUDA_CHECK_LAUNCH();
      gpu::settle(water_count, oxygens_d.data(), distances_d.data(), masses.data(), x.data(), x_new.data(),
                  v_new.data(), box, dt, energy_step, acc.data(), flags.data(), stream);
      KILN_CUDA_CHECK_LAUNCH();
      gpu::lincs(lincs, x.data(), inv_mass_d.data(), x_new.data(), v_new.data(), box, dt, energy_step, acc.data(),
                 stream);
      KILN_CUDA_CHECK_LAUNCH();
      KILN_CUDA_CHECK(cudaMemsetAsync(acc.data() + gpu::kKineticNew, 0, sizeof(double), stream));
      gpu::kinetic_energy(n, v_new.data(), masses.data(), acc.data(), gpu::kKineticNew, stream);
      KILN_CUDA_CHECK_LAUNCH();
      if (energy_step) {
        auto a = download(acc.data(), gpu::kAccumulatorCount, stream);
        check_flags(read_flags());
        StepEnergies e;
        e.step = step;
        e.time = o.tinit + step * dt;
        e.lj = a[gpu::kLj];
        e.coulomb_sr = a[gpu::kCoulombSr] + field_.self_energy();
        e.has_recip = !settings_.reaction_field;
        e.coulomb_recip = a[gpu::kCoulombRecip];
        e.bond = a[gpu::kBond];
        e.angle = a[gpu::kAngle];
        copy_listed_terms(a, e);
        set_dispersion_terms(dispersion_, volume, e);
        e.sum_potential();
        e.kinetic = 0.5 * (a[gpu::kKineticOld] + a[gpu::kKineticNew]);
        e.total = e.potential + e.kinetic;
        // As the CPU engine: the work before this step, and half of this step's.
        e.conserved = e.total - (a[gpu::kThermostatWork] - 0.5 * a[gpu::kStepWork]);
        e.temperature = ndf > 0 ? 2 * e.kinetic / (ndf * kBoltzmann) : 0.0;
        const double trace = a[gpu::kKineticOld] + a[gpu::kKineticNew] + a[gpu::kVirial] + a[gpu::kConstraintVirial];
        e.pressure = kPressureFactor * trace / (3 * volume) + e.pres_dc;  // c-rescale sees Pres. DC too
        e.constr_rmsd = nc > 0 ? std::sqrt(a[gpu::kConstraintDeviation2] / nc) : 0.0;
        if (o.pressure_coupling) e.set_box_terms({box.x, box.y, box.z});
        if (step % o.nstenergy == 0 || step == o.nsteps) on_energies(e);
        if (couple_step(step) && step < o.nsteps) {
          // c-rescale as the CPU engine: x(t + dt), v(t + dt/2) and the box, from this step's pressure.
          const double mu =
              crescale_mu(o.crescale, o.crescale.nstpcouple * dt, e.pressure, volume, o.ref_t, barostat_noise_(rng_));
          gpu::scale_coordinates(n, mu, x_new.data(), v_new.data(), stream);
          KILN_CUDA_CHECK_LAUNCH();
          state_.box = {box.x * mu, box.y * mu, box.z * mu};
          check_box_after_scaling(state_.box, settings_.rlist, step);
          field_.set_box(state_.box);
          box = field_.box();
          volume = box.x * box.y * box.z;
          KILN_CUDA_CHECK(cudaMemsetAsync(acc.data() + gpu::kKineticNew, 0, sizeof(double), stream));
          gpu::kinetic_energy(n, v_new.data(), masses.data(), acc.data(), gpu::kKineticNew, stream);
          KILN_CUDA_CHECK_LAUNCH();
          box_scaled = true;
        }
      }
      if (step == o.nsteps) break;  // the state stays at x(nsteps), v(nsteps - dt/2)
      std::swap(x, x_new);
      std::swap(v, v_new);
      KILN_CUDA_CHECK(cudaMemcpyAsync(acc.data() + gpu::kKineticOld, acc.data() + gpu::kKineticNew, sizeof(double),
                                      cudaMemcpyDeviceToDevice, stream));
      if (o.comm_mode == ComMode::Linear && (step + 1) % o.nstcomm == 0) {
        KILN_CUDA_CHECK(cudaMemsetAsync(acc.data() + gpu::kMomentumX, 0, 3 * sizeof(double), stream));
        gpu::remove_com_velocity(n, v.data(), masses.data(), total_mass, acc.data(), stream);
        KILN_CUDA_CHECK_LAUNCH();
      }
      bool built = false;
      if ((step + 1) % o.nstlist == 0 || box_scaled) {
        box_scaled = false;
        rebuild();
        built = true;
      } else {
        gpu::check_displacement(n, x.data(), x_list.data(), box, settings_.rlist - settings_.cutoff, partial.data(),
                                flags.data(), stream);
        KILN_CUDA_CHECK_LAUNCH();
      }
      if (settings_.checkpoint_steps > 0 && settings_.on_checkpoint &&
          ((step + 1) % settings_.checkpoint_steps == 0 || step + 1 == o.nsteps))
        write_checkpoint(step + 1);
      const bool next_energy = (step + 1) % o.nstenergy == 0 || step + 1 == o.nsteps || couple_step(step + 1);
      if (next_energy) zero_energy_terms();
      field_.compute(x.data(), f.data(), next_energy, acc.data(), flags.data(), prune_for(step + 1, built));
    }
    check_flags(read_flags());
    counters_.inner_cluster_pairs = field_.inner_cluster_pairs();
    state_.positions = to_vec3(download(x.data(), 3 * static_cast<std::size_t>(n), stream));
    state_.velocities = to_vec3(download(v.data(), 3 * static_cast<std::size_t>(n), stream));
  }

 private:
  const MdSystem& system_;
  EngineSettings settings_;
  MdState state_;
  int device_;
  GpuForceField<Real> field_;
  DispersionCorrection dispersion_;
  EngineCounters counters_;
  std::mt19937_64 rng_;
  std::normal_distribution<double> barostat_noise_;  // c-rescale's draws (it caches one: checkpointed)
};

template <class Real>
GpuForceResult evaluate(const MdSystem& s, const EngineSettings& settings, const std::vector<Vec3>& positions,
                        const Vec3& box, const std::vector<Vec3>* list_x) {
  GpuForceField<Real> field(s, settings, box, settings.gpu_index);
  DeviceGuard guard(settings.gpu_index);
  const cudaStream_t stream = field.stream();
  const std::size_t n3 = 3 * static_cast<std::size_t>(s.atom_count);
  DeviceArray<double> x = upload(settings.gpu_index, flatten(positions), stream);
  DeviceArray<Real> f(settings.gpu_index, n3);
  DeviceArray<double> acc(settings.gpu_index, gpu::kAccumulatorCount);
  DeviceArray<unsigned long long> flags(settings.gpu_index, gpu::kFlagCount);
  if (list_x) {
    DeviceArray<double> xl = upload(settings.gpu_index, flatten(*list_x), stream);
    field.build_list(xl.data());
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream));  // xl goes back to the allocator at the end of this block
  } else {
    field.build_list(x.data());
  }
  KILN_CUDA_CHECK(cudaMemsetAsync(acc.data(), 0, gpu::kAccumulatorCount * sizeof(double), stream));
  KILN_CUDA_CHECK(cudaMemsetAsync(flags.data(), 0, gpu::kFlagCount * sizeof(unsigned long long), stream));
  field.compute(x.data(), f.data(), true, acc.data(), flags.data(), GpuForceField<Real>::kPruneAll);
  auto a = download(acc.data(), gpu::kAccumulatorCount, stream);
  auto host_flags = download(flags.data(), gpu::kFlagCount, stream);
  throw_flags(s, host_flags, positions, box, settings.cutoff, settings.mdp.max_force);
  auto forces = download(f.data(), n3, stream);
  GpuForceResult r;
  r.forces.resize(s.atom_count);
  for (std::size_t k = 0; k < n3; ++k) r.forces[k / 3][k % 3] = static_cast<double>(forces[k]);
  r.energies.lj = a[gpu::kLj];
  r.energies.coulomb_sr = a[gpu::kCoulombSr] + field.self_energy();
  r.energies.has_recip = !settings.reaction_field;
  r.energies.coulomb_recip = a[gpu::kCoulombRecip];
  r.energies.bond = a[gpu::kBond];
  r.energies.angle = a[gpu::kAngle];
  copy_listed_terms(a, r.energies);
  set_dispersion_terms(DispersionCorrection(s, settings.mdp.dispcorr, settings.cutoff), box[0] * box[1] * box[2],
                       r.energies);
  r.energies.sum_potential();
  r.virial_trace = a[gpu::kVirial];
  r.cluster_pairs = field.cluster_pairs();
  r.inner_cluster_pairs = field.inner_cluster_pairs();
  r.pruned_pairs_in_cutoff = static_cast<std::int64_t>(host_flags[gpu::kPrunedInCutoff]);
  return r;
}

}  // namespace

std::unique_ptr<MdEngine> make_cuda_engine(const MdSystem& system, const EngineSettings& settings, MdState initial) {
  if (settings.gpu_double) return std::make_unique<CudaEngine<double>>(system, settings, std::move(initial));
  return std::make_unique<CudaEngine<float>>(system, settings, std::move(initial));
}

GpuForceResult cuda_force_evaluation(const MdSystem& system, const EngineSettings& settings, const std::vector<Vec3>& x,
                                     const Vec3& box, const std::vector<Vec3>* list_x) {
  return settings.gpu_double ? evaluate<double>(system, settings, x, box, list_x)
                             : evaluate<float>(system, settings, x, box, list_x);
}

}  // namespace kiln::md
