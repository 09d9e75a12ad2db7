// Every optimised kernel against its reference twin, on the same problem. Runs on one rank under
// CTest's discovery and on four under mpirun (tests/hpcg/CMakeLists.txt), so halos are covered.
// With KILN_HPCG_TEST_CUDA=1 on a GPU machine the optimised engine is the CUDA one.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "kiln/hpc/hpcg/cg.h"
#include "kiln/hpc/hpcg/engine.h"
#include "kiln/hpc/hpcg/layout.h"
#include "kiln/hpc/hpcg/reference.h"
#include "kiln/hpc/hpcg/validation.h"

namespace kiln::hpcg {
namespace kernels_test {

struct Pair {
  std::unique_ptr<Engine> ref, opt;
};

Pair make_pair(int nx, int ny, int nz) {
  auto comm = dist::Communicator::world();
  auto grid = choose_process_grid(comm.size(), std::nullopt);
  auto levels = make_hierarchy(make_geometry(nx, ny, nz, grid, comm.rank()));
  Pair p;
  p.ref = make_reference_engine(levels, comm);
  // KILN_HPCG_TEST_CUDA=1: the CUDA engine (fails without a GPU, so a GPU run cannot silently test the CPU).
  p.opt = make_engine(std::getenv("KILN_HPCG_TEST_CUDA") ? EngineKind::Cuda : EngineKind::CpuOptimized, levels, comm);
  return p;
}

std::vector<double> random_values(int n, unsigned seed) {
  std::mt19937_64 rng(seed + 101u * static_cast<unsigned>(dist::Communicator::world().rank()));
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<double> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = u(rng);
  return v;
}

// Natural-order host values of the same random vector in both engines.
struct Twin {
  Vector ref, opt;
};
Twin twin(Pair& p, int level, unsigned seed) {
  auto v = random_values(p.ref->local_rows(level), seed);
  Twin t{p.ref->make_vector(level), p.opt->make_vector(level)};
  p.ref->upload(v, t.ref, level);
  p.opt->upload(v, t.opt, level);
  return t;
}

double max_diff(Pair& p, const Vector& a, const Vector& b, int level) {
  auto x = p.ref->download(a, level), y = p.opt->download(b, level);
  double m = 0;
  for (std::size_t i = 0; i < x.size(); ++i) m = std::max(m, std::fabs(x[i] - y[i]));
  return m;
}

class HpcgKernels : public ::testing::TestWithParam<std::array<int, 3>> {
 protected:
  void SetUp() override {
    auto [nx, ny, nz] = GetParam();
    p_ = make_pair(nx, ny, nz);
  }
  Pair p_;
};

TEST_P(HpcgKernels, ProblemMatches) {
  std::printf("optimised engine under test: %s on %s\n", p_.opt->name().c_str(), p_.opt->device().str().c_str());
  for (int l = 0; l < p_.ref->levels(); ++l) {
    EXPECT_EQ(p_.ref->global_nonzeros(l), p_.opt->global_nonzeros(l)) << "level " << l;
  }
  Vector b1 = p_.ref->make_vector(0), b2 = p_.opt->make_vector(0);
  p_.ref->rhs(b1);
  p_.opt->rhs(b2);
  EXPECT_EQ(max_diff(p_, b1, b2, 0), 0.0);
}

TEST_P(HpcgKernels, SpmvMatchesTheReferenceOnEveryLevel) {
  for (int l = 0; l < p_.ref->levels(); ++l) {
    auto x = twin(p_, l, 1);
    Vector y1 = p_.ref->make_vector(l), y2 = p_.opt->make_vector(l);
    p_.ref->compute_spmv(l, x.ref, y1);
    p_.opt->compute_spmv(l, x.opt, y2);
    EXPECT_LE(max_diff(p_, y1, y2, l), 1e-13) << "level " << l;
  }
}

TEST_P(HpcgKernels, NaturalOrderSymgsIsTheReferenceSweep) {
  for (int l = 0; l < p_.ref->levels(); ++l) {
    auto r = twin(p_, l, 2);
    auto x = twin(p_, l, 3);
    p_.ref->compute_symgs(l, r.ref, x.ref, Ordering::Reference);
    p_.opt->compute_symgs(l, r.opt, x.opt, Ordering::Reference);
    EXPECT_LE(max_diff(p_, x.ref, x.opt, l), 1e-13) << "level " << l;
  }
}

TEST_P(HpcgKernels, ColouredSymgsIsASymmetricSmoother) {
  // x'M^-1 y = y'M^-1 x for the coloured V-cycle, and a sweep from x = 0 reduces the residual.
  auto r = twin(p_, 0, 4);
  Vector x = p_.opt->make_vector(0), ax = p_.opt->make_vector(0), res = p_.opt->make_vector(0);
  p_.opt->compute_symgs(0, r.opt, x, Ordering::Optimized);
  p_.opt->compute_spmv(0, x, ax);
  p_.opt->compute_waxpby(0, 1.0, r.opt, -1.0, ax, res);
  double before = p_.opt->compute_dot_product(0, r.opt, r.opt);
  double after = p_.opt->compute_dot_product(0, res, res);
  EXPECT_LT(after, 0.5 * before);
  // The coloured sweep differs from the natural one (else the ordering would not be in effect).
  Vector xn = p_.opt->make_vector(0);
  p_.opt->compute_symgs(0, r.opt, xn, Ordering::Reference);
  EXPECT_GT(p_.opt->max_abs_difference(x, xn, 0), 1e-6);
}

TEST_P(HpcgKernels, ZeroGuessSweepSkipsOnlyZeros) {
  // The pre-smoother reads only the slots of already relaxed colours; the result must be the full
  // sweep's, on every level.
  for (int l = 0; l < p_.opt->levels(); ++l) {
    auto r = twin(p_, l, 12);
    Vector full = p_.opt->make_vector(l), skipping = p_.opt->make_vector(l);
    p_.opt->compute_symgs(l, r.opt, full, Ordering::Optimized, false);
    p_.opt->compute_symgs(l, r.opt, skipping, Ordering::Optimized, true);
    EXPECT_EQ(p_.opt->max_abs_difference(full, skipping, l), 0.0) << "level " << l;
  }
  // Only a strict subset of the 26 off-diagonal slots, and for the first colour none at all.
  EXPECT_EQ(lower_colour_slots(0), 0u);
  EXPECT_EQ(std::popcount(lower_colour_slots(7)), 26);
}

TEST_P(HpcgKernels, ResidualRestrictionAndProlongationMatchTheReference) {
  for (int l = 0; l + 1 < p_.ref->levels(); ++l) {
    auto r = twin(p_, l, 5);
    auto x = twin(p_, l, 6);
    Vector rc1 = p_.ref->make_vector(l + 1), rc2 = p_.opt->make_vector(l + 1);
    p_.ref->compute_residual_restriction(l, r.ref, x.ref, rc1);
    p_.opt->compute_residual_restriction(l, r.opt, x.opt, rc2);
    EXPECT_LE(max_diff(p_, rc1, rc2, l + 1), 1e-13) << "level " << l;
    p_.ref->compute_prolongation(l, rc1, x.ref);
    p_.opt->compute_prolongation(l, rc2, x.opt);
    EXPECT_LE(max_diff(p_, x.ref, x.opt, l), 1e-13) << "level " << l;
  }
}

TEST_P(HpcgKernels, VectorKernelsMatchTheReference) {
  auto a = twin(p_, 0, 7);
  auto b = twin(p_, 0, 8);
  double d1 = p_.ref->compute_dot_product(0, a.ref, b.ref), d2 = p_.opt->compute_dot_product(0, a.opt, b.opt);
  EXPECT_NEAR(d1, d2, 1e-12 * std::fabs(d1) + 1e-12);
  Vector w1 = p_.ref->make_vector(0), w2 = p_.opt->make_vector(0);
  p_.ref->compute_waxpby(0, 0.5, a.ref, -2.0, b.ref, w1);
  p_.opt->compute_waxpby(0, 0.5, a.opt, -2.0, b.opt, w2);
  EXPECT_EQ(max_diff(p_, w1, w2, 0), 0.0);
  // The fused CG update equals two WAXPBYs and a dot product.
  auto x = twin(p_, 0, 9);
  auto r = twin(p_, 0, 10);
  double rr1 = p_.ref->compute_cg_update(0.25, a.ref, b.ref, x.ref, r.ref);
  double rr2 = p_.opt->compute_cg_update(0.25, a.opt, b.opt, x.opt, r.opt);
  EXPECT_NEAR(rr1, rr2, 1e-12 * rr1);
  EXPECT_LE(max_diff(p_, x.ref, x.opt, 0), 1e-15);
  EXPECT_LE(max_diff(p_, r.ref, r.opt, 0), 1e-15);
}

TEST_P(HpcgKernels, NaturalOrderMultigridIsTheReference) {
  auto r = twin(p_, 0, 11);
  Vector z1 = p_.ref->make_vector(0), z2 = p_.opt->make_vector(0);
  p_.ref->compute_mg(0, r.ref, z1, Ordering::Reference);
  p_.opt->compute_mg(0, r.opt, z2, Ordering::Reference);
  EXPECT_LE(max_diff(p_, z1, z2, 0), 1e-12);
}

TEST_P(HpcgKernels, ReferenceCgRunsTheSameIterations) {
  Vector b1 = p_.ref->make_vector(0), b2 = p_.opt->make_vector(0), x1 = p_.ref->make_vector(0),
         x2 = p_.opt->make_vector(0);
  p_.ref->rhs(b1);
  p_.opt->rhs(b2);
  CgWorkspace w1(*p_.ref), w2(*p_.opt);
  auto c1 = cg(*p_.ref, w1, b1, x1, 8, 0.0, true, Ordering::Reference);
  auto c2 = cg(*p_.opt, w2, b2, x2, 8, 0.0, true, Ordering::Reference);
  EXPECT_EQ(c1.iterations, c2.iterations);
  EXPECT_NEAR(c1.scaled_residual(), c2.scaled_residual(), 1e-6 * c1.scaled_residual());
  EXPECT_LE(max_diff(p_, x1, x2, 0), 1e-10);
}

TEST_P(HpcgKernels, ValidationPassesForBothEngines) {
  for (auto* e : {p_.ref.get(), p_.opt.get()}) {
    Vector b = e->make_vector(0), x = e->make_vector(0), xe = e->make_vector(0);
    e->rhs(b);
    e->fill(xe, 0, 1.0);
    CgWorkspace w(*e);
    auto spectral = test_cg(*e, w, b, x);
    EXPECT_EQ(spectral.failed, 0) << e->name();
    EXPECT_LE(spectral.max_unpreconditioned, 12);
    auto sym = test_symmetry(*e, b, xe, 3);
    EXPECT_EQ(sym.failed, 0) << e->name() << " spmv " << sym.departure_spmv << " mg " << sym.departure_mg;
    // The right-hand side survived the exaggerated-diagonal test.
    Vector b0 = e->make_vector(0);
    e->rhs(b0);
    EXPECT_EQ(e->max_abs_difference(b, b0, 0), 0.0);
  }
}

INSTANTIATE_TEST_SUITE_P(Boxes, HpcgKernels, ::testing::Values(std::array{16, 16, 16}, std::array{24, 16, 32}),
                         [](const auto& info) {
                           return std::to_string(info.param[0]) + "x" + std::to_string(info.param[1]) + "x" +
                                  std::to_string(info.param[2]);
                         });

TEST(HpcgNorms, FlagsVaryingResiduals) {
  EXPECT_TRUE(test_norms({1e-6, 1e-6, 1e-6}).passed);
  EXPECT_FALSE(test_norms({0.0, 0.01, 0.0, 0.01}).passed);
}

}  // namespace kernels_test
}  // namespace kiln::hpcg
