// The MD engine's GPU kernels: the cluster-pair list, the non-bonded cluster kernel, PME spread,
// solve and gather, bonded terms, leap-frog, SETTLE and the reductions. See kernels.h for the data
// layout; the host side is cuda_engine.cpp.
#include <cuda_runtime.h>

#include <cstdint>
#include <cub/device/device_radix_sort.cuh>

#include "kiln/hpc/md/bspline.h"
#include "kiln/hpc/md/cuda/kernels.h"
#include "kiln/hpc/md/dihedral_terms.h"
#include "kiln/hpc/md/settle_water.h"

namespace kiln::md::gpu {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxPmeOrder = 12;
constexpr double kSqrtPi = 1.7724538509055160273;
constexpr double kPi = 3.14159265358979323846;

int blocks_for(long long n, int threads = kThreads) { return static_cast<int>((n + threads - 1) / threads); }
cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

// Overloads so the templated kernels call the float functions in float and the double ones in double.
__device__ inline float erfc_of(float v) { return erfcf(v); }
__device__ inline double erfc_of(double v) { return erfc(v); }
__device__ inline float erf_of(float v) { return erff(v); }
__device__ inline double erf_of(double v) { return erf(v); }
__device__ inline float exp_of(float v) { return expf(v); }
__device__ inline double exp_of(double v) { return exp(v); }
__device__ inline float rsqrt_of(float v) { return rsqrtf(v); }
__device__ inline double rsqrt_of(double v) { return rsqrt(v); }
__device__ inline float rint_of(float v) { return rintf(v); }
__device__ inline double rint_of(double v) { return rint(v); }

__device__ inline double wrap_fraction(double f) {
  f -= floor(f);
  return f >= 1.0 ? 0.0 : f;
}

__device__ inline double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The block's sum of v, valid in thread 0; every thread of the block must call it.
__device__ double block_sum(double v) {
  __shared__ double partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  double r = 0;
  if (warp == 0) r = warp_sum(lane < warps ? partial[lane] : 0.0);
  __syncthreads();
  return r;
}

__device__ inline void add_to(double* acc, int slot, double v) {
  double s = block_sum(v);
  if (threadIdx.x == 0 && s != 0) atomicAdd(&acc[slot], s);
}

// Keeps the smallest (a, b) in lexicographic order: the complement of a << 32 | b under atomicMax
// (the flags start at 0, below every complement), so the report does not depend on thread order.
__device__ inline void flag_first(unsigned long long* flags, int slot, long long a, long long b) {
  const unsigned long long key = (static_cast<unsigned long long>(a) << 32) | static_cast<unsigned long long>(b);
  atomicMax(&flags[slot], ~key);
}

__device__ inline double min_image_d(double d, double l) { return d - l * rint(d / l); }

// ---- pair list ---------------------------------------------------------------------------------

__global__ void assign_columns_kernel(int n, const double* x, Box box, ColumnGrid g, std::uint64_t* keys, int* values,
                                      int* counts) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  double fx = wrap_fraction(x[3 * i] / box.x), fy = wrap_fraction(x[3 * i + 1] / box.y),
         fz = wrap_fraction(x[3 * i + 2] / box.z);
  int cx = min(static_cast<int>(fx * g.ncx), g.ncx - 1), cy = min(static_cast<int>(fy * g.ncy), g.ncy - 1);
  int column = cx * g.ncy + cy;
  auto zq = static_cast<std::uint64_t>(fz * 2147483648.0);  // z to 31 bits: sorts the column by height
  keys[i] = (static_cast<std::uint64_t>(column) << 32) | zq;
  values[i] = i;
  atomicAdd(&counts[column], 1);
}

// One block: each thread scans a chunk sequentially, the chunk totals are scanned in shared
// memory. With `clusters`, counts are rounded up to whole clusters first.
__global__ void scan_kernel(int n, const int* counts, int* out, bool clusters) {
  __shared__ int sums[1024];
  const int t = threadIdx.x, chunk = (n + blockDim.x - 1) / blockDim.x;
  const int first = min(n, t * chunk), last = min(n, first + chunk);
  int local = 0;
  for (int k = first; k < last; ++k) local += clusters ? (counts[k] + kClusterSize - 1) / kClusterSize : counts[k];
  sums[t] = local;
  __syncthreads();
  for (int o = 1; o < static_cast<int>(blockDim.x); o <<= 1) {
    int add = t >= o ? sums[t - o] : 0;
    __syncthreads();
    sums[t] += add;
    __syncthreads();
  }
  int running = sums[t] - local;
  for (int k = first; k < last; ++k) {
    out[k] = running;
    running += clusters ? (counts[k] + kClusterSize - 1) / kClusterSize : counts[k];
  }
  if (t == static_cast<int>(blockDim.x) - 1) out[n] = sums[t];
}

__global__ void fill_slots_kernel(int n, const std::uint64_t* keys, const int* atoms, const int* column_atom_start,
                                  const int* column_cluster_start, int* slot_atom) {
  int p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p >= n) return;
  int column = static_cast<int>(keys[p] >> 32);
  int rank = p - column_atom_start[column];
  slot_atom[column_cluster_start[column] * kClusterSize + rank] = atoms[p];
}

__global__ void cluster_bounds_kernel(int ncol, int max_clusters, const int* column_cluster_start, const int* slot_atom,
                                      const double* x, Box box, float* bounds) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= max_clusters || c >= column_cluster_start[ncol]) return;
  const double l[3] = {box.x, box.y, box.z};
  double lo[3] = {1e30, 1e30, 1e30}, hi[3] = {-1e30, -1e30, -1e30};
  for (int s = 0; s < kClusterSize; ++s) {
    int a = slot_atom[c * kClusterSize + s];
    if (a < 0) continue;
    for (int d = 0; d < 3; ++d) {
      double w = wrap_fraction(x[3 * a + d] / l[d]) * l[d];
      lo[d] = fmin(lo[d], w);
      hi[d] = fmax(hi[d], w);
    }
  }
  for (int d = 0; d < 3; ++d) {
    bounds[6 * c + d] = static_cast<float>(0.5 * (lo[d] + hi[d]));
    bounds[6 * c + 3 + d] = static_cast<float>(0.5 * (hi[d] - lo[d]));
  }
}

__device__ bool excluded(int a, int b, const int* excl_offsets, const int* excl_atoms, int span) {
  if (abs(a - b) > span) return false;
  for (int k = excl_offsets[a]; k < excl_offsets[a + 1]; ++k)
    if (excl_atoms[k] == b) return true;
  return false;
}

__global__ void cluster_pairs_kernel(ColumnGrid g, const int* column_cluster_start, const float* bounds, Box box,
                                     double rlist, const int* slot_atom, const int* excl_offsets, const int* excl_atoms,
                                     int span, int* counts, const int* pair_start, int* pair_cluster,
                                     std::uint64_t* pair_mask) {
  const int ic = blockIdx.x * blockDim.x + threadIdx.x;
  const int ncol = g.ncx * g.ncy;
  if (ic >= g.max_clusters) return;
  const int total = column_cluster_start[ncol];
  if (ic >= total) {
    if (!pair_mask) counts[ic] = 0;
    return;
  }
  // The column of ic: the last column starting at or before it.
  int lo = 0, hi = ncol;
  while (hi - lo > 1) {
    int mid = (lo + hi) / 2;
    if (column_cluster_start[mid] <= ic)
      lo = mid;
    else
      hi = mid;
  }
  const int cix = lo / g.ncy, ciy = lo % g.ncy;
  const float l[3] = {static_cast<float>(box.x), static_cast<float>(box.y), static_cast<float>(box.z)};
  float ci[3], hi_i[3];
  for (int d = 0; d < 3; ++d) {
    ci[d] = bounds[6 * ic + d];
    hi_i[d] = bounds[6 * ic + 3 + d];
  }
  const float r2list = static_cast<float>(rlist * rlist);
  // Columns within rlist of ic's column; all of them once when the range would wrap onto itself.
  const int rx = static_cast<int>(ceil(rlist / g.sx)), ry = static_cast<int>(ceil(rlist / g.sy));
  const bool all_x = 2 * rx + 1 >= g.ncx, all_y = 2 * ry + 1 >= g.ncy;
  const int x_first = all_x ? 0 : cix - rx, x_count = all_x ? g.ncx : 2 * rx + 1;
  const int y_first = all_y ? 0 : ciy - ry, y_count = all_y ? g.ncy : 2 * ry + 1;
  int found = 0;
  const int out = pair_mask ? pair_start[ic] : 0;
  for (int a = 0; a < x_count; ++a) {
    const int jx = ((x_first + a) % g.ncx + g.ncx) % g.ncx;
    for (int b = 0; b < y_count; ++b) {
      const int jy = ((y_first + b) % g.ncy + g.ncy) % g.ncy;
      const int column = jx * g.ncy + jy;
      for (int jc = max(ic, column_cluster_start[column]); jc < column_cluster_start[column + 1]; ++jc) {
        float d2 = 0;
        for (int d = 0; d < 3; ++d) {
          float dc = bounds[6 * jc + d] - ci[d];
          dc -= l[d] * rintf(dc / l[d]);
          float gap = fmaxf(0.f, fabsf(dc) - hi_i[d] - bounds[6 * jc + 3 + d]);
          d2 += gap * gap;
        }
        if (d2 >= r2list) continue;
        if (pair_mask) {
          std::uint64_t mask = 0;
          for (int si = 0; si < kClusterSize; ++si) {
            const int ai = slot_atom[ic * kClusterSize + si];
            if (ai < 0) continue;
            for (int sj = jc == ic ? si + 1 : 0; sj < kClusterSize; ++sj) {
              const int aj = slot_atom[jc * kClusterSize + sj];
              if (aj < 0 || excluded(ai, aj, excl_offsets, excl_atoms, span)) continue;
              mask |= std::uint64_t{1} << (si * kClusterSize + sj);
            }
          }
          pair_cluster[out + found] = jc;
          pair_mask[out + found] = mask;
        }
        ++found;
      }
    }
  }
  if (!pair_mask) counts[ic] = found;
}

// ---- non-bonded --------------------------------------------------------------------------------

template <class Real>
__global__ void pack_slots_kernel(int max_slots, const int* slot_atom, const double* x, const double* charges,
                                  const int* types, Box box, Real* xq, int* slot_type) {
  int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= max_slots) return;
  int a = slot_atom[s];
  if (a < 0) {
    xq[4 * s] = xq[4 * s + 1] = xq[4 * s + 2] = xq[4 * s + 3] = 0;
    slot_type[s] = 0;
    return;
  }
  xq[4 * s] = static_cast<Real>(wrap_fraction(x[3 * a] / box.x) * box.x);
  xq[4 * s + 1] = static_cast<Real>(wrap_fraction(x[3 * a + 1] / box.y) * box.y);
  xq[4 * s + 2] = static_cast<Real>(wrap_fraction(x[3 * a + 2] / box.z) * box.z);
  xq[4 * s + 3] = static_cast<Real>(charges[a]);
  slot_type[s] = types[a];
}

constexpr int kNonbondedWarps = 4;

// One warp per i-cluster. Lane l works on j-slot l % 8 with i-slots l / 8 and l / 8 + 4, so a
// cluster pair's 64 interactions are two per lane; j forces are summed over the 4 lanes that share
// a j-slot, i forces over the 8 lanes that share an i-slot once all j-clusters are done.
template <class Real>
__global__ void __launch_bounds__(32 * kNonbondedWarps)
    nonbonded_kernel(int max_clusters, const int* column_cluster_start, int ncol, const int* pair_start,
                     const int* pair_cluster, const std::uint64_t* pair_mask, const std::uint64_t* inner_mask,
                     const Real* xq, const int* slot_type, const int* slot_atom, const Real* c6, const Real* c12,
                     NonbondedParams p, Box box, Real* f, bool energies, double* acc, unsigned long long* flags) {
  const int lane = threadIdx.x & 31;
  const int ic = blockIdx.x * kNonbondedWarps + (threadIdx.x >> 5);
  const bool active = ic < max_clusters && ic < column_cluster_start[ncol];
  const int jj = lane & 7, i_first = lane >> 3;
  const Real rc2 = static_cast<Real>(p.cutoff * p.cutoff), beta = static_cast<Real>(p.beta);
  const Real two_beta_sqrt_pi = static_cast<Real>(2 * p.beta / kSqrtPi);
  const Real coulomb_shift = static_cast<Real>(erfc(p.beta * p.cutoff) / p.cutoff);
  const double inv_rc6 = 1.0 / (p.cutoff * p.cutoff * p.cutoff * p.cutoff * p.cutoff * p.cutoff);
  const Real lj6_shift = static_cast<Real>(inv_rc6), lj12_shift = static_cast<Real>(inv_rc6 * inv_rc6);
  const Real k_rf = static_cast<Real>(p.k_rf), c_rf = static_cast<Real>(p.c_rf);
  const Real coulomb_factor = static_cast<Real>(p.coulomb_factor);
  const Real lx = static_cast<Real>(box.x), ly = static_cast<Real>(box.y), lz = static_cast<Real>(box.z);
  double e_lj = 0, e_coul = 0, virial = 0;
  Real fi[2][3] = {{0, 0, 0}, {0, 0, 0}};
  Real xi[2][4];
  int ti[2] = {0, 0};
  if (active) {
    for (int h = 0; h < 2; ++h) {
      const int s = ic * kClusterSize + i_first + 4 * h;
      for (int d = 0; d < 4; ++d) xi[h][d] = xq[4 * s + d];
      xi[h][3] *= coulomb_factor;
      ti[h] = slot_type[s];
    }
    unsigned missed = 0;  // atom pairs within rc in pruned-away cluster pairs (energy steps)
    for (int k = pair_start[ic]; k < pair_start[ic + 1]; ++k) {
      const std::uint64_t mask = inner_mask ? inner_mask[k] : pair_mask[k];
      // Warp-uniform: every lane reads the same k. A pruned cluster pair costs its mask read, and at
      // energy steps a distance check that tells whether pruning dropped an interacting pair.
      if (mask == 0) {
        if (energies && inner_mask) {
          const std::uint64_t outer = pair_mask[k];
          const int sj = pair_cluster[k] * kClusterSize + jj;
          for (int h = 0; h < 2; ++h) {
            const int si = i_first + 4 * h;
            if (!((outer >> (si * kClusterSize + jj)) & 1)) continue;
            Real dx = xq[4 * sj] - xi[h][0], dy = xq[4 * sj + 1] - xi[h][1], dz = xq[4 * sj + 2] - xi[h][2];
            dx -= lx * rint_of(dx / lx);
            dy -= ly * rint_of(dy / ly);
            dz -= lz * rint_of(dz / lz);
            if (dx * dx + dy * dy + dz * dz < rc2) ++missed;
          }
        }
        continue;
      }
      const int jc = pair_cluster[k];
      const int sj = jc * kClusterSize + jj;
      const Real xj = xq[4 * sj], yj = xq[4 * sj + 1], zj = xq[4 * sj + 2], qj = xq[4 * sj + 3];
      const int tj = slot_type[sj];
      Real fj[3] = {0, 0, 0};
      for (int h = 0; h < 2; ++h) {
        const int si = i_first + 4 * h;
        if (!((mask >> (si * kClusterSize + jj)) & 1)) continue;
        Real dx = xj - xi[h][0], dy = yj - xi[h][1], dz = zj - xi[h][2];
        dx -= lx * rint_of(dx / lx);
        dy -= ly * rint_of(dy / ly);
        dz -= lz * rint_of(dz / lz);
        const Real r2 = dx * dx + dy * dy + dz * dz;
        if (r2 >= rc2) continue;
        if (r2 < Real(1e-6)) {
          flag_first(flags, kOverlap, slot_atom[ic * kClusterSize + si], slot_atom[sj]);
          continue;
        }
        const Real rinv = rsqrt_of(r2), rinv2 = rinv * rinv;
        Real fscal = 0;
        const Real a6 = c6[ti[h] * p.type_count + tj], a12 = c12[ti[h] * p.type_count + tj];
        if (a6 != 0 || a12 != 0) {
          const Real rinv6 = rinv2 * rinv2 * rinv2;
          const Real v6 = a6 * rinv6, v12 = a12 * rinv6 * rinv6;
          fscal += (12 * v12 - 6 * v6) * rinv2;
          if (energies) e_lj += static_cast<double>(v12 - v6 - (a12 * lj12_shift - a6 * lj6_shift));
        }
        const Real qq = xi[h][3] * qj;
        if (qq != 0) {
          if (p.reaction_field) {
            fscal += qq * (rinv * rinv2 - 2 * k_rf);
            if (energies) e_coul += static_cast<double>(qq * (rinv + k_rf * r2 - c_rf));
          } else {
            const Real r = r2 * rinv;
            const Real erfc_term = erfc_of(beta * r);
            fscal += qq * (erfc_term * rinv + two_beta_sqrt_pi * exp_of(-beta * beta * r2)) * rinv2;
            if (energies) e_coul += static_cast<double>(qq * (erfc_term * rinv - coulomb_shift));
          }
        }
        if (energies) virial += static_cast<double>(fscal * r2);
        const Real fx = fscal * dx, fy = fscal * dy, fz = fscal * dz;
        fj[0] += fx;
        fj[1] += fy;
        fj[2] += fz;
        fi[h][0] -= fx;
        fi[h][1] -= fy;
        fi[h][2] -= fz;
      }
      for (int d = 0; d < 3; ++d) {
        fj[d] += __shfl_xor_sync(0xffffffffu, fj[d], 8);
        fj[d] += __shfl_xor_sync(0xffffffffu, fj[d], 16);
      }
      if (lane < kClusterSize) {
        const int aj = slot_atom[sj];
        if (aj >= 0 && (fj[0] != 0 || fj[1] != 0 || fj[2] != 0))
          for (int d = 0; d < 3; ++d) atomicAdd(&f[3 * aj + d], fj[d]);
      }
    }
    if (missed != 0) atomicAdd(&flags[kPrunedInCutoff], static_cast<unsigned long long>(missed));
    for (int h = 0; h < 2; ++h) {
      for (int d = 0; d < 3; ++d)
        for (int o = 1; o < kClusterSize; o <<= 1) fi[h][d] += __shfl_xor_sync(0xffffffffu, fi[h][d], o);
      if (jj == 0) {
        const int ai = slot_atom[ic * kClusterSize + i_first + 4 * h];
        if (ai >= 0)
          for (int d = 0; d < 3; ++d) atomicAdd(&f[3 * ai + d], fi[h][d]);
      }
    }
  }
  if (energies) {
    add_to(acc, kLj, e_lj);
    add_to(acc, kCoulombSr, e_coul);
    add_to(acc, kVirial, virial);
  }
}

// One warp per i-cluster of the part, lanes laid out as in nonbonded_kernel (j-slot lane % 8,
// i-slots lane / 8 and lane / 8 + 4): a cluster pair is kept when any lane has an interacting atom
// pair within rlist_inner.
template <class Real>
__global__ void __launch_bounds__(32 * kNonbondedWarps)
    prune_kernel(int max_clusters, const int* column_cluster_start, int ncol, const int* pair_start,
                 const int* pair_cluster, const std::uint64_t* pair_mask, const Real* xq, Box box, Real rlist2,
                 int part, int parts, std::uint64_t* inner_mask, unsigned long long* kept) {
  const int lane = threadIdx.x & 31;
  const int ic = part + parts * (blockIdx.x * kNonbondedWarps + (threadIdx.x >> 5));
  if (ic >= max_clusters || ic >= column_cluster_start[ncol]) return;  // whole warps leave together
  const int jj = lane & 7, i_first = lane >> 3;
  const Real lx = static_cast<Real>(box.x), ly = static_cast<Real>(box.y), lz = static_cast<Real>(box.z);
  Real xi[2][3];
  for (int h = 0; h < 2; ++h)
    for (int d = 0; d < 3; ++d) xi[h][d] = xq[4 * (ic * kClusterSize + i_first + 4 * h) + d];
  unsigned count = 0;
  for (int k = pair_start[ic]; k < pair_start[ic + 1]; ++k) {
    const std::uint64_t mask = pair_mask[k];
    const int sj = pair_cluster[k] * kClusterSize + jj;
    bool within = false;
    for (int h = 0; h < 2; ++h) {
      const int si = i_first + 4 * h;
      if (!((mask >> (si * kClusterSize + jj)) & 1)) continue;
      Real dx = xq[4 * sj] - xi[h][0], dy = xq[4 * sj + 1] - xi[h][1], dz = xq[4 * sj + 2] - xi[h][2];
      dx -= lx * rint_of(dx / lx);
      dy -= ly * rint_of(dy / ly);
      dz -= lz * rint_of(dz / lz);
      within = within || dx * dx + dy * dy + dz * dz < rlist2;
    }
    const bool keep = __any_sync(0xffffffffu, within);
    if (lane == 0) inner_mask[k] = keep ? mask : 0;
    count += keep ? 1 : 0;
  }
  if (lane == 0 && count != 0) atomicAdd(&kept[part], static_cast<unsigned long long>(count));
}

template <class Real>
__global__ void exclusion_kernel(int count, const int* pairs, const double* x, const double* charges, NonbondedParams p,
                                 Box box, Real* f, bool energies, double* acc, unsigned long long* flags) {
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  double energy = 0, virial = 0;
  if (k < count) {
    const int i = pairs[2 * k], j = pairs[2 * k + 1];
    const double qq = p.coulomb_factor * charges[i] * charges[j];
    const double dx = min_image_d(x[3 * j] - x[3 * i], box.x), dy = min_image_d(x[3 * j + 1] - x[3 * i + 1], box.y),
                 dz = min_image_d(x[3 * j + 2] - x[3 * i + 2], box.z);
    const double r2 = dx * dx + dy * dy + dz * dz;
    double fscal = 0;
    if (qq != 0) {
      // The reciprocal sum holds this pair's full interaction and only pairs within the cut-off
      // are corrected (GROMACS's Verlet scheme): refused, as on the CPU.
      if (r2 >= p.cutoff * p.cutoff) flag_first(flags, kFarExclusion, i, j);
      if (p.reaction_field) {
        energy = qq * (p.k_rf * r2 - p.c_rf);
        fscal = -2 * qq * p.k_rf;
      } else if (r2 < 1e-12) {
        energy = -qq * 2 * p.beta / kSqrtPi;  // the r -> 0 limit of erf(beta r) / r
      } else {
        const Real r = static_cast<Real>(sqrt(r2)), rinv = 1 / r, beta = static_cast<Real>(p.beta);
        const Real erf_term = erf_of(beta * r);
        energy = -qq * static_cast<double>(erf_term * rinv);
        fscal = -qq * static_cast<double>((erf_term * rinv - static_cast<Real>(2 * p.beta / kSqrtPi) *
                                                                 exp_of(-beta * beta * static_cast<Real>(r2))) *
                                          rinv * rinv);
      }
    }
    if (fscal != 0) {
      const double fv[3] = {fscal * dx, fscal * dy, fscal * dz};
      for (int d = 0; d < 3; ++d) {
        atomicAdd(&f[3 * j + d], static_cast<Real>(fv[d]));
        atomicAdd(&f[3 * i + d], static_cast<Real>(-fv[d]));
      }
      virial = fscal * r2;
    }
  }
  if (energies) {
    add_to(acc, kCoulombSr, energy);
    add_to(acc, kVirial, virial);
  }
}

template <class Real>
__global__ void bonded_kernel(int bond_count, const GpuBond* bonds, int angle_count, const GpuAngle* angles,
                              const double* x, Box box, Real* f, bool energies, double* acc) {
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  const double l[3] = {box.x, box.y, box.z};
  double e_bond = 0, e_angle = 0, virial = 0;
  if (k < bond_count) {
    const GpuBond b = bonds[k];
    double d[3], r2 = 0;
    for (int c = 0; c < 3; ++c) {
      d[c] = min_image_d(x[3 * b.j + c] - x[3 * b.i + c], l[c]);
      r2 += d[c] * d[c];
    }
    const double r = sqrt(r2), dr = r - b.b0;
    e_bond = 0.5 * b.kb * dr * dr;
    if (r > 0) {
      const double s = -b.kb * dr / r;  // force on j along d
      for (int c = 0; c < 3; ++c) {
        atomicAdd(&f[3 * b.j + c], static_cast<Real>(s * d[c]));
        atomicAdd(&f[3 * b.i + c], static_cast<Real>(-s * d[c]));
      }
      virial = s * r2;
    }
  } else if (k < bond_count + angle_count) {
    const GpuAngle a = angles[k - bond_count];
    double u[3], v[3], uu = 0, vv = 0, uv = 0;
    for (int c = 0; c < 3; ++c) {
      u[c] = min_image_d(x[3 * a.i + c] - x[3 * a.j + c], l[c]);
      v[c] = min_image_d(x[3 * a.k + c] - x[3 * a.j + c], l[c]);
      uu += u[c] * u[c];
      vv += v[c] * v[c];
      uv += u[c] * v[c];
    }
    const double nu = sqrt(uu), nv = sqrt(vv);
    if (nu > 0 && nv > 0) {
      const double cos_t = fmin(1.0, fmax(-1.0, uv / (nu * nv)));
      const double dt = acos(cos_t) - a.theta0;
      e_angle = 0.5 * a.kth * dt * dt;
      const double sin_t = sqrt(fmax(1 - cos_t * cos_t, 1e-24));
      const double c = a.kth * dt / sin_t;  // -dE/dcos
      for (int q = 0; q < 3; ++q) {
        const double fi = c * (v[q] / (nu * nv) - cos_t / (nu * nu) * u[q]);
        const double fk = c * (u[q] / (nu * nv) - cos_t / (nv * nv) * v[q]);
        atomicAdd(&f[3 * a.i + q], static_cast<Real>(fi));
        atomicAdd(&f[3 * a.k + q], static_cast<Real>(fk));
        atomicAdd(&f[3 * a.j + q], static_cast<Real>(-fi - fk));
        virial += u[q] * fi + v[q] * fk;
      }
    }
  }
  if (energies) {
    add_to(acc, kBond, e_bond);
    add_to(acc, kAngle, e_angle);
    add_to(acc, kVirial, virial);
  }
}

template <class Real>
__global__ void dihedrals_and_pairs_kernel(int dihedral_count, const GpuDihedral* dihedrals, int pair_count,
                                           const GpuPair14* pairs, const double* x, Box box, Real* f, bool energies,
                                           double* acc) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  const double l[3] = {box.x, box.y, box.z};
  double e_dih[3] = {0, 0, 0}, e_lj14 = 0, e_coul14 = 0, virial = 0;
  if (t < dihedral_count) {
    const GpuDihedral d = dihedrals[t];
    DihedralFrame fr;
    for (int c = 0; c < 3; ++c) {
      fr.r_ij[c] = min_image_d(x[3 * d.i + c] - x[3 * d.j + c], l[c]);
      fr.r_kj[c] = min_image_d(x[3 * d.k + c] - x[3 * d.j + c], l[c]);
      fr.r_kl[c] = min_image_d(x[3 * d.k + c] - x[3 * d.l + c], l[c]);
    }
    dihedral_frame(fr);
    double dv_dphi = 0;
    e_dih[d.kind] = d.kind == 2 ? rb_dihedral_energy(fr.phi, d.p, &dv_dphi)
                                : periodic_dihedral_energy(fr.phi, d.p[0], d.p[1], d.n, &dv_dphi);
    double fi[3], fj[3], fk[3], fl[3];
    dihedral_forces(fr, dv_dphi, fi, fj, fk, fl);
    for (int c = 0; c < 3; ++c) {
      atomicAdd(&f[3 * d.i + c], static_cast<Real>(fi[c]));
      atomicAdd(&f[3 * d.j + c], static_cast<Real>(fj[c]));
      atomicAdd(&f[3 * d.k + c], static_cast<Real>(fk[c]));
      atomicAdd(&f[3 * d.l + c], static_cast<Real>(fl[c]));
      // Relative to j: x_i - x_j = r_ij, x_k - x_j = r_kj, x_l - x_j = r_kj - r_kl.
      virial += fr.r_ij[c] * fi[c] + fr.r_kj[c] * fk[c] + (fr.r_kj[c] - fr.r_kl[c]) * fl[c];
    }
  } else if (t < dihedral_count + pair_count) {
    const GpuPair14 p = pairs[t - dihedral_count];
    double d[3], r2 = 0;
    for (int c = 0; c < 3; ++c) {
      d[c] = min_image_d(x[3 * p.j + c] - x[3 * p.i + c], l[c]);
      r2 += d[c] * d[c];
    }
    const double fscal = pair14_energies(r2, p.c6, p.c12, p.fqq, &e_lj14, &e_coul14);
    for (int c = 0; c < 3; ++c) {
      atomicAdd(&f[3 * p.j + c], static_cast<Real>(fscal * d[c]));
      atomicAdd(&f[3 * p.i + c], static_cast<Real>(-fscal * d[c]));
    }
    virial = fscal * r2;
  }
  if (energies) {
    add_to(acc, kProperDih, e_dih[0]);
    add_to(acc, kImproperDih, e_dih[1]);
    add_to(acc, kRbDih, e_dih[2]);
    add_to(acc, kLj14, e_lj14);
    add_to(acc, kCoulomb14, e_coul14);
    add_to(acc, kVirial, virial);
  }
}

// ---- PME ---------------------------------------------------------------------------------------

// The first grid index (kept non-negative) and the weights of atom i along one dimension.
template <class Real>
__device__ int pme_weights(double x, double l, int k, int order, Real* theta, Real* dtheta) {
  const double u = wrap_fraction(x / l) * k;
  int iu = static_cast<int>(u);
  if (iu >= k) iu = k - 1;
  bspline_weights_of(static_cast<Real>(u - iu), order, theta, dtheta);
  return iu - order + 1 + k;
}

// Order > 0: the B-spline order known at compile time (4 and 5, GROMACS's and OpenMM's defaults), so
// the weights live in registers; 0: any order, from g.order.
template <class Real, int Order>
__global__ void pme_spread_kernel(int n, const double* x, const double* charges, Box box, PmeGrid g, Real* grid) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n || charges[i] == 0) return;
  constexpr int kSize = Order > 0 ? Order : kMaxPmeOrder;
  Real tx[kSize], ty[kSize], tz[kSize], unused[kSize];
  const int p = Order > 0 ? Order : g.order;
  const int fx = pme_weights(x[3 * i], box.x, g.k0, p, tx, unused);
  const int fy = pme_weights(x[3 * i + 1], box.y, g.k1, p, ty, unused);
  const int fz = pme_weights(x[3 * i + 2], box.z, g.k2, p, tz, unused);
  const Real q = static_cast<Real>(charges[i]);
  for (int a = 0; a < p; ++a) {
    const int gx = (fx + a) % g.k0;
    for (int b = 0; b < p; ++b) {
      const int gy = (fy + b) % g.k1;
      const Real w = q * tx[a] * ty[b];
      Real* row = grid + (static_cast<long long>(gx) * g.k1 + gy) * g.k2;
      for (int c = 0; c < p; ++c) atomicAdd(&row[(fz + c) % g.k2], w * tz[c]);
    }
  }
}

template <class Real>
__global__ void pme_solve_kernel(PmeGrid g, Box box, const Real* mod0, const Real* mod1, const Real* mod2,
                                 Real* complex_grid, bool energies, double* acc) {
  const int n2c = g.k2 / 2 + 1;
  const long long total = static_cast<long long>(g.k0) * g.k1 * n2c;
  const long long idx = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  double energy = 0, virial = 0;
  if (idx < total) {
    const int c = static_cast<int>(idx % n2c), b = static_cast<int>((idx / n2c) % g.k1),
              a = static_cast<int>(idx / (static_cast<long long>(n2c) * g.k1));
    const double mx = (a <= g.k0 / 2 ? a : a - g.k0) / box.x, my = (b <= g.k1 / 2 ? b : b - g.k1) / box.y,
                 mz = c / box.z;
    const double m2 = mx * mx + my * my + mz * mz;
    Real* v = complex_grid + 2 * idx;
    if (m2 == 0) {
      v[0] = v[1] = 0;
    } else {
      const double pi2_over_beta2 = kPi * kPi / (g.beta * g.beta);
      const double prefactor = g.coulomb_factor / (kPi * box.x * box.y * box.z);
      const double eterm = prefactor * exp(-pi2_over_beta2 * m2) / m2 * static_cast<double>(mod0[a]) *
                           static_cast<double>(mod1[b]) * static_cast<double>(mod2[c]);
      if (energies) {
        // The half-complex layout holds m_z and -m_z once: count the others twice.
        const double weight = (c == 0 || (g.k2 % 2 == 0 && c == g.k2 / 2)) ? 1.0 : 2.0;
        const double re = static_cast<double>(v[0]), im = static_cast<double>(v[1]);
        energy = 0.5 * weight * eterm * (re * re + im * im);
        // Trace of W_ab = E_m (delta_ab - 2 (1/m^2 + pi^2/beta^2) m_a m_b).
        virial = energy * (3 - 2 * (1 / m2 + pi2_over_beta2) * m2);
      }
      v[0] = static_cast<Real>(v[0] * eterm);
      v[1] = static_cast<Real>(v[1] * eterm);
    }
  }
  if (energies) {
    add_to(acc, kCoulombRecip, energy);
    add_to(acc, kVirial, virial);
  }
}

template <class Real, int Order>
__global__ void pme_gather_kernel(int n, const double* x, const double* charges, Box box, PmeGrid g, const Real* grid,
                                  Real* f) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n || charges[i] == 0) return;
  constexpr int kSize = Order > 0 ? Order : kMaxPmeOrder;
  Real tx[kSize], ty[kSize], tz[kSize], dx[kSize], dy[kSize], dz[kSize];
  const int p = Order > 0 ? Order : g.order;
  const int fx = pme_weights(x[3 * i], box.x, g.k0, p, tx, dx);
  const int fy = pme_weights(x[3 * i + 1], box.y, g.k1, p, ty, dy);
  const int fz = pme_weights(x[3 * i + 2], box.z, g.k2, p, tz, dz);
  Real sx = 0, sy = 0, sz = 0;
  for (int a = 0; a < p; ++a) {
    const int gx = (fx + a) % g.k0;
    for (int b = 0; b < p; ++b) {
      const int gy = (fy + b) % g.k1;
      const Real* row = grid + (static_cast<long long>(gx) * g.k1 + gy) * g.k2;
      for (int c = 0; c < p; ++c) {
        const Real v = row[(fz + c) % g.k2];
        sx += dx[a] * ty[b] * tz[c] * v;
        sy += tx[a] * dy[b] * tz[c] * v;
        sz += tx[a] * ty[b] * dz[c] * v;
      }
    }
  }
  const Real q = static_cast<Real>(charges[i]);
  atomicAdd(&f[3 * i], -q * sx * static_cast<Real>(g.k0 / box.x));
  atomicAdd(&f[3 * i + 1], -q * sy * static_cast<Real>(g.k1 / box.y));
  atomicAdd(&f[3 * i + 2], -q * sz * static_cast<Real>(g.k2 / box.z));
}

// ---- integration -------------------------------------------------------------------------------

__global__ void vrescale_kernel(double* acc, VrescaleNoise noise, double ke_ref, int ndf, double factor) {
  const double ke = acc[kKineticOld];
  const double lambda = vrescale_lambda(ke, ke_ref, ndf, factor, noise);
  acc[kLambda] = lambda;
  acc[kStepWork] = (lambda * lambda - 1) * ke;
  acc[kThermostatWork] += acc[kStepWork];
}

template <class Real>
__global__ void leapfrog_kernel(int n, const double* x, const double* v, const Real* f, const double* inv_mass,
                                double dt, bool scaled, const double* acc, double max_force, long long step,
                                double* x_new, double* v_new, unsigned long long* flags) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const double lambda = scaled ? acc[kLambda] : 1.0;
  double f2 = 0;
  for (int d = 0; d < 3; ++d) {
    const double fd = static_cast<double>(f[3 * i + d]);
    f2 += fd * fd;
    const double vn = lambda * v[3 * i + d] + dt * inv_mass[i] * fd;
    v_new[3 * i + d] = vn;
    x_new[3 * i + d] = x[3 * i + d] + dt * vn;
  }
  if (!(f2 <= max_force * max_force)) flag_first(flags, kForce, step, i);
}

__global__ void settle_kernel(int count, const int* oxygens, const double* distances, const double* masses,
                              const double* x, double* x_new, double* v_new, Box box, double dt, bool energies,
                              double* acc, unsigned long long* flags) {
  const int w = blockIdx.x * blockDim.x + threadIdx.x;
  double virial = 0;
  if (w < count) {
    const int o = oxygens[w];
    const double l[3] = {box.x, box.y, box.z};
    double b0[3], c0[3], b1[3], c1[3], out[3][3];
    for (int d = 0; d < 3; ++d) {
      b0[d] = min_image_d(x[3 * (o + 1) + d] - x[3 * o + d], l[d]);
      c0[d] = min_image_d(x[3 * (o + 2) + d] - x[3 * o + d], l[d]);
      b1[d] = min_image_d(x_new[3 * (o + 1) + d] - x_new[3 * o + d], l[d]);
      c1[d] = min_image_d(x_new[3 * (o + 2) + d] - x_new[3 * o + d], l[d]);
    }
    const SettleGeometry g{masses[o], masses[o + 1], distances[2 * w], distances[2 * w + 1]};
    if (settle_water(b0, c0, b1, c1, g, out[0], out[1], out[2]) != SettleFailure::None) {
      flag_first(flags, kSettleWater, 0, o);
    } else {
      const double origin[3] = {x_new[3 * o], x_new[3 * o + 1], x_new[3 * o + 2]};
      const double inv_dt2 = 1 / (dt * dt);
      for (int a = 0; a < 3; ++a) {
        const int atom = o + a;
        for (int d = 0; d < 3; ++d) {
          const double unconstrained = x_new[3 * atom + d];
          const double constrained = origin[d] + out[a][d];
          // The constraint force m (constrained - unconstrained) / dt^2 acts at the reference
          // position, taken relative to the oxygen (the forces sum to zero per water).
          const double ref_rel = a == 0 ? 0.0 : (a == 1 ? b0[d] : c0[d]);
          virial += ref_rel * masses[atom] * (constrained - unconstrained) * inv_dt2;
          x_new[3 * atom + d] = constrained;
          v_new[3 * atom + d] = (constrained - x[3 * atom + d]) / dt;
        }
      }
    }
  }
  if (energies) add_to(acc, kConstraintVirial, virial);
}

__global__ void kinetic_kernel(int n, const double* v, const double* masses, double* acc, int slot) {
  double sum = 0;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    sum += 0.5 * masses[i] * (v[3 * i] * v[3 * i] + v[3 * i + 1] * v[3 * i + 1] + v[3 * i + 2] * v[3 * i + 2]);
  add_to(acc, slot, sum);
}

__global__ void momentum_kernel(int n, const double* v, const double* masses, double* acc) {
  double p[3] = {0, 0, 0};
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    for (int d = 0; d < 3; ++d) p[d] += masses[i] * v[3 * i + d];
  for (int d = 0; d < 3; ++d) add_to(acc, kMomentumX + d, p[d]);
}

__global__ void subtract_com_kernel(int n, double* v, double total_mass, const double* acc) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  for (int d = 0; d < 3; ++d) v[3 * i + d] -= acc[kMomentumX + d] / total_mass;
}

__device__ inline void keep_two_largest(double r2, double& first, double& second) {
  if (r2 > first) {
    second = first;
    first = r2;
  } else if (r2 > second) {
    second = r2;
  }
}

// The two largest squared displacements of the block's atoms, into partial[2 * block].
__global__ void displacement_kernel(int n, const double* x, const double* x_list, Box box, double* partial) {
  __shared__ double top[kThreads][2];
  double first = 0, second = 0;
  const double l[3] = {box.x, box.y, box.z};
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    double r2 = 0;
    for (int d = 0; d < 3; ++d) {
      const double dd = min_image_d(x[3 * i + d] - x_list[3 * i + d], l[d]);
      r2 += dd * dd;
    }
    keep_two_largest(r2, first, second);
  }
  top[threadIdx.x][0] = first;
  top[threadIdx.x][1] = second;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int t = 1; t < static_cast<int>(blockDim.x); ++t)
      for (int k = 0; k < 2; ++k) {
        const double r2 = top[t][k];
        keep_two_largest(r2, first, second);
      }
    partial[2 * blockIdx.x] = first;
    partial[2 * blockIdx.x + 1] = second;
  }
}

__global__ void displacement_finish_kernel(const double* partial, int blocks, double buffer,
                                           unsigned long long* flags) {
  double first = 0, second = 0;
  for (int k = 0; k < 2 * blocks; ++k) {
    const double r2 = partial[k];
    keep_two_largest(r2, first, second);
  }
  if (sqrt(first) + sqrt(second) >= buffer) ++flags[kBufferExceeded];
}

}  // namespace

// ---- launchers ---------------------------------------------------------------------------------

std::size_t sort_temp_bytes(int n) {
  std::size_t bytes = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const std::uint64_t*>(nullptr),
                                  static_cast<std::uint64_t*>(nullptr), static_cast<const int*>(nullptr),
                                  static_cast<int*>(nullptr), n);
  return bytes;
}

void assign_columns(int n, const double* x, Box box, ColumnGrid grid, std::uint64_t* keys, int* values,
                    int* column_counts, void* stream) {
  assign_columns_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(n, x, box, grid, keys, values,
                                                                           column_counts);
}

void sort_by_column(int n, const std::uint64_t* keys_in, std::uint64_t* keys_out, const int* values_in, int* values_out,
                    void* temp, std::size_t temp_bytes, void* stream) {
  cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, keys_out, values_in, values_out, n, 0, 64,
                                  as_stream(stream));
}

void column_offsets(int ncol, const int* column_counts, int* column_atom_start, int* column_cluster_start,
                    void* stream) {
  scan_kernel<<<1, 1024, 0, as_stream(stream)>>>(ncol, column_counts, column_atom_start, false);
  scan_kernel<<<1, 1024, 0, as_stream(stream)>>>(ncol, column_counts, column_cluster_start, true);
}

void exclusive_scan(int n, const int* counts, int* out, void* stream) {
  scan_kernel<<<1, 1024, 0, as_stream(stream)>>>(n, counts, out, false);
}

void fill_slots(int n, const std::uint64_t* sorted_keys, const int* sorted_atoms, const int* column_atom_start,
                const int* column_cluster_start, int* slot_atom, void* stream) {
  fill_slots_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(n, sorted_keys, sorted_atoms, column_atom_start,
                                                                       column_cluster_start, slot_atom);
}

void cluster_bounds(ColumnGrid grid, const int* column_cluster_start, const int* slot_atom, const double* x, Box box,
                    float* bounds, void* stream) {
  cluster_bounds_kernel<<<blocks_for(grid.max_clusters), kThreads, 0, as_stream(stream)>>>(
      grid.ncx * grid.ncy, grid.max_clusters, column_cluster_start, slot_atom, x, box, bounds);
}

void cluster_pairs(ColumnGrid grid, const int* column_cluster_start, const float* bounds, Box box, double rlist,
                   const int* slot_atom, const int* excl_offsets, const int* excl_atoms, int span, int* counts,
                   const int* pair_start, int* pair_cluster, std::uint64_t* pair_mask, void* stream) {
  cluster_pairs_kernel<<<blocks_for(grid.max_clusters, 128), 128, 0, as_stream(stream)>>>(
      grid, column_cluster_start, bounds, box, rlist, slot_atom, excl_offsets, excl_atoms, span, counts, pair_start,
      pair_cluster, pair_mask);
}

template <class Real>
void pack_slots(int max_slots, const int* slot_atom, const double* x, const double* charges, const int* types, Box box,
                Real* xq, int* slot_type, void* stream) {
  pack_slots_kernel<Real><<<blocks_for(max_slots), kThreads, 0, as_stream(stream)>>>(max_slots, slot_atom, x, charges,
                                                                                     types, box, xq, slot_type);
}

template <class Real>
void nonbonded(int max_clusters, const int* column_cluster_start, int ncol, const int* pair_start,
               const int* pair_cluster, const std::uint64_t* pair_mask, const std::uint64_t* inner_mask, const Real* xq,
               const int* slot_type, const int* slot_atom, const Real* c6, const Real* c12, NonbondedParams p, Box box,
               Real* f, bool energies, double* acc, unsigned long long* flags, void* stream) {
  nonbonded_kernel<Real><<<blocks_for(max_clusters, kNonbondedWarps), 32 * kNonbondedWarps, 0, as_stream(stream)>>>(
      max_clusters, column_cluster_start, ncol, pair_start, pair_cluster, pair_mask, inner_mask, xq, slot_type,
      slot_atom, c6, c12, p, box, f, energies, acc, flags);
}

template <class Real>
void prune_pairs(int max_clusters, const int* column_cluster_start, int ncol, const int* pair_start,
                 const int* pair_cluster, const std::uint64_t* pair_mask, const Real* xq, Box box, double rlist_inner,
                 int part, int parts, std::uint64_t* inner_mask, unsigned long long* kept, void* stream) {
  const int clusters = (max_clusters - part + parts - 1) / parts;
  if (clusters <= 0) return;
  prune_kernel<Real>
      <<<(clusters + kNonbondedWarps - 1) / kNonbondedWarps, 32 * kNonbondedWarps, 0, as_stream(stream)>>>(
          max_clusters, column_cluster_start, ncol, pair_start, pair_cluster, pair_mask, xq, box,
          static_cast<Real>(rlist_inner * rlist_inner), part, parts, inner_mask, kept);
}

template <class Real>
void exclusion_corrections(int count, const int* pairs, const double* x, const double* charges, NonbondedParams p,
                           Box box, Real* f, bool energies, double* acc, unsigned long long* flags, void* stream) {
  if (count == 0) return;
  exclusion_kernel<Real><<<blocks_for(count), kThreads, 0, as_stream(stream)>>>(count, pairs, x, charges, p, box, f,
                                                                                energies, acc, flags);
}

template <class Real>
void bonded(int bond_count, const GpuBond* bonds, int angle_count, const GpuAngle* angles, const double* x, Box box,
            Real* f, bool energies, double* acc, void* stream) {
  if (bond_count + angle_count == 0) return;
  bonded_kernel<Real><<<blocks_for(bond_count + angle_count), kThreads, 0, as_stream(stream)>>>(
      bond_count, bonds, angle_count, angles, x, box, f, energies, acc);
}

template <class Real>
void dihedrals_and_pairs(int dihedral_count, const GpuDihedral* dihedrals, int pair_count, const GpuPair14* pairs,
                         const double* x, Box box, Real* f, bool energies, double* acc, void* stream) {
  if (dihedral_count + pair_count == 0) return;
  dihedrals_and_pairs_kernel<Real><<<blocks_for(dihedral_count + pair_count), kThreads, 0, as_stream(stream)>>>(
      dihedral_count, dihedrals, pair_count, pairs, x, box, f, energies, acc);
}

template <class Real>
void pme_spread(int n, const double* x, const double* charges, Box box, PmeGrid g, Real* grid, void* stream) {
  auto launch = [&](auto kernel) {
    kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(n, x, charges, box, g, grid);
  };
  if (g.order == 4)
    launch(pme_spread_kernel<Real, 4>);
  else if (g.order == 5)
    launch(pme_spread_kernel<Real, 5>);
  else
    launch(pme_spread_kernel<Real, 0>);
}

template <class Real>
void pme_solve(PmeGrid g, Box box, const Real* moduli0, const Real* moduli1, const Real* moduli2, Real* complex_grid,
               bool energies, double* acc, void* stream) {
  const long long total = static_cast<long long>(g.k0) * g.k1 * (g.k2 / 2 + 1);
  pme_solve_kernel<Real><<<blocks_for(total), kThreads, 0, as_stream(stream)>>>(g, box, moduli0, moduli1, moduli2,
                                                                                complex_grid, energies, acc);
}

template <class Real>
void pme_gather(int n, const double* x, const double* charges, Box box, PmeGrid g, const Real* grid, Real* f,
                void* stream) {
  auto launch = [&](auto kernel) {
    kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(n, x, charges, box, g, grid, f);
  };
  if (g.order == 4)
    launch(pme_gather_kernel<Real, 4>);
  else if (g.order == 5)
    launch(pme_gather_kernel<Real, 5>);
  else
    launch(pme_gather_kernel<Real, 0>);
}

void vrescale(double* acc, VrescaleNoise noise, double ke_ref, int ndf, double factor, void* stream) {
  vrescale_kernel<<<1, 1, 0, as_stream(stream)>>>(acc, noise, ke_ref, ndf, factor);
}

template <class Real>
void leapfrog(int n, const double* x, const double* v, const Real* f, const double* inv_mass, double dt, bool scaled,
              const double* acc, double max_force, long long step, double* x_new, double* v_new,
              unsigned long long* flags, void* stream) {
  leapfrog_kernel<Real><<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(n, x, v, f, inv_mass, dt, scaled, acc,
                                                                           max_force, step, x_new, v_new, flags);
}

void settle(int count, const int* oxygens, const double* distances, const double* masses, const double* x,
            double* x_new, double* v_new, Box box, double dt, bool energies, double* acc, unsigned long long* flags,
            void* stream) {
  if (count == 0) return;
  settle_kernel<<<blocks_for(count), kThreads, 0, as_stream(stream)>>>(count, oxygens, distances, masses, x, x_new,
                                                                       v_new, box, dt, energies, acc, flags);
}

// ---- LINCS -------------------------------------------------------------------------------------

// Directions from the reference positions, the right-hand side from the unconstrained ones.
__global__ void lincs_setup_kernel(LincsArrays a, const double* x, const double* xp, Box box) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= a.count) return;
  const double l[3] = {box.x, box.y, box.z};
  const int i = a.atoms[2 * c], j = a.atoms[2 * c + 1];
  double r[3], len2 = 0, proj = 0;
  for (int d = 0; d < 3; ++d) {
    r[d] = min_image_d(x[3 * i + d] - x[3 * j + d], l[d]);
    len2 += r[d] * r[d];
  }
  const double len = sqrt(len2);
  for (int d = 0; d < 3; ++d) {
    a.dir[3 * c + d] = r[d] / len;
    proj += r[d] / len * min_image_d(xp[3 * i + d] - xp[3 * j + d], l[d]);
  }
  a.old_length[c] = len;
  a.rhs[c] = a.s[c] * (proj - a.length[c]);
  a.lambda[c] = 0;
}

__global__ void lincs_matrix_kernel(LincsArrays a) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= a.count) return;
  for (int k = a.start[c]; k < a.start[c + 1]; ++k) {
    const int o = a.other[k];
    double cos_co = 0;
    for (int d = 0; d < 3; ++d) cos_co += a.dir[3 * c + d] * a.dir[3 * o + d];
    a.blcc[k] = a.coef[k] * cos_co;
  }
}

__global__ void lincs_start_kernel(LincsArrays a) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c < a.count) a.solution[c] = a.term[c] = a.rhs[c];
}

// One term of the series: next = A term, solution += next.
__global__ void lincs_expand_kernel(LincsArrays a, const double* term, double* next) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= a.count) return;
  double sum = 0;
  for (int k = a.start[c]; k < a.start[c + 1]; ++k) sum += a.blcc[k] * term[a.other[k]];
  next[c] = sum;
  a.solution[c] += sum;
}

__global__ void lincs_update_kernel(LincsArrays a, const double* inv_mass, double* xp, double* v, double dt) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= a.count) return;
  const int i = a.atoms[2 * c], j = a.atoms[2 * c + 1];
  const double l = a.s[c] * a.solution[c];
  a.lambda[c] += l;
  for (int d = 0; d < 3; ++d) {
    const double di = -l * inv_mass[i] * a.dir[3 * c + d], dj = l * inv_mass[j] * a.dir[3 * c + d];
    atomicAdd(&xp[3 * i + d], di);
    atomicAdd(&xp[3 * j + d], dj);
    atomicAdd(&v[3 * i + d], di / dt);
    atomicAdd(&v[3 * j + d], dj / dt);
  }
}

// The right-hand side of a rotational-lengthening correction: the projection on the old direction
// should be sqrt(2 d^2 - l^2).
__global__ void lincs_lengthening_kernel(LincsArrays a, const double* xp, Box box) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= a.count) return;
  const double l[3] = {box.x, box.y, box.z};
  const int i = a.atoms[2 * c], j = a.atoms[2 * c + 1];
  double r2 = 0, proj = 0;
  for (int d = 0; d < 3; ++d) {
    const double r = min_image_d(xp[3 * i + d] - xp[3 * j + d], l[d]);
    r2 += r * r;
    proj += a.dir[3 * c + d] * r;
  }
  const double p2 = 2 * a.length[c] * a.length[c] - r2;
  a.rhs[c] = a.s[c] * (proj - (p2 > 0 ? sqrt(p2) : 0.0));
}

__global__ void lincs_energies_kernel(LincsArrays a, const double* xp, Box box, double dt, double* acc) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  double virial = 0, deviation2 = 0;
  if (c < a.count) {
    const double l[3] = {box.x, box.y, box.z};
    const int i = a.atoms[2 * c], j = a.atoms[2 * c + 1];
    double r2 = 0;
    for (int d = 0; d < 3; ++d) {
      const double r = min_image_d(xp[3 * i + d] - xp[3 * j + d], l[d]);
      r2 += r * r;
    }
    const double dev = (sqrt(r2) - a.length[c]) / a.length[c];
    deviation2 = dev * dev;
    // r_old (x) (-lambda dir / dt^2), traced: -lambda |r_old| / dt^2.
    virial = -a.lambda[c] * a.old_length[c] / (dt * dt);
  }
  add_to(acc, kConstraintVirial, virial);
  add_to(acc, kConstraintDeviation2, deviation2);
}

void lincs(const LincsArrays& a, const double* x, const double* inv_mass, double* x_new, double* v_new, Box box,
           double dt, bool energies, double* acc, void* stream) {
  if (a.count == 0) return;
  const cudaStream_t s = as_stream(stream);
  const int blocks = blocks_for(a.count);
  auto solve_and_update = [&] {
    lincs_start_kernel<<<blocks, kThreads, 0, s>>>(a);  // then `order` terms of the series
    double *term = a.term, *next = a.next;
    for (int p = 0; p < a.order; ++p) {
      lincs_expand_kernel<<<blocks, kThreads, 0, s>>>(a, term, next);
      double* t = term;
      term = next;
      next = t;
    }
    lincs_update_kernel<<<blocks, kThreads, 0, s>>>(a, inv_mass, x_new, v_new, dt);
  };
  lincs_setup_kernel<<<blocks, kThreads, 0, s>>>(a, x, x_new, box);
  lincs_matrix_kernel<<<blocks, kThreads, 0, s>>>(a);
  solve_and_update();
  for (int it = 0; it < a.iterations; ++it) {
    lincs_lengthening_kernel<<<blocks, kThreads, 0, s>>>(a, x_new, box);
    solve_and_update();
  }
  if (energies) lincs_energies_kernel<<<blocks, kThreads, 0, s>>>(a, x_new, box, dt, acc);
}

__global__ void scale_kernel(int n3, double mu, double* x, double* v) {
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= n3) return;
  x[k] *= mu;
  v[k] /= mu;
}

void scale_coordinates(int n, double mu, double* x, double* v, void* stream) {
  scale_kernel<<<blocks_for(3LL * n), kThreads, 0, as_stream(stream)>>>(3 * n, mu, x, v);
}

void kinetic_energy(int n, const double* v, const double* masses, double* acc, int slot, void* stream) {
  kinetic_kernel<<<kReduceBlocks, kThreads, 0, as_stream(stream)>>>(n, v, masses, acc, slot);
}

void remove_com_velocity(int n, double* v, const double* masses, double total_mass, double* acc, void* stream) {
  momentum_kernel<<<kReduceBlocks, kThreads, 0, as_stream(stream)>>>(n, v, masses, acc);
  subtract_com_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(n, v, total_mass, acc);
}

void check_displacement(int n, const double* x, const double* x_list, Box box, double buffer, double* partial,
                        unsigned long long* flags, void* stream) {
  displacement_kernel<<<kReduceBlocks, kThreads, 0, as_stream(stream)>>>(n, x, x_list, box, partial);
  displacement_finish_kernel<<<1, 1, 0, as_stream(stream)>>>(partial, kReduceBlocks, buffer, flags);
}

#define KILN_MD_INSTANTIATE(Real)                                                                                     \
  template void pack_slots<Real>(int, const int*, const double*, const double*, const int*, Box, Real*, int*, void*); \
  template void nonbonded<Real>(int, const int*, int, const int*, const int*, const std::uint64_t*,                   \
                                const std::uint64_t*, const Real*, const int*, const int*, const Real*, const Real*,  \
                                NonbondedParams, Box, Real*, bool, double*, unsigned long long*, void*);              \
  template void prune_pairs<Real>(int, const int*, int, const int*, const int*, const std::uint64_t*, const Real*,    \
                                  Box, double, int, int, std::uint64_t*, unsigned long long*, void*);                 \
  template void exclusion_corrections<Real>(int, const int*, const double*, const double*, NonbondedParams, Box,      \
                                            Real*, bool, double*, unsigned long long*, void*);                        \
  template void dihedrals_and_pairs<Real>(int, const GpuDihedral*, int, const GpuPair14*, const double*, Box, Real*,  \
                                          bool, double*, void*);                                                      \
  template void bonded<Real>(int, const GpuBond*, int, const GpuAngle*, const double*, Box, Real*, bool, double*,     \
                             void*);                                                                                  \
  template void pme_spread<Real>(int, const double*, const double*, Box, PmeGrid, Real*, void*);                      \
  template void pme_solve<Real>(PmeGrid, Box, const Real*, const Real*, const Real*, Real*, bool, double*, void*);    \
  template void pme_gather<Real>(int, const double*, const double*, Box, PmeGrid, const Real*, Real*, void*);         \
  template void leapfrog<Real>(int, const double*, const double*, const Real*, const double*, double, bool,           \
                               const double*, double, long long, double*, double*, unsigned long long*, void*);
KILN_MD_INSTANTIATE(float)
KILN_MD_INSTANTIATE(double)
#undef KILN_MD_INSTANTIATE

}  // namespace kiln::md::gpu
