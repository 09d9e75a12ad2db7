#pragma once
// CG: the reference's preconditioned conjugate gradient (CG.cpp / CG_ref.cpp), on any Engine.
// Ordering::Reference follows CG_ref call for call (two WAXPBYs and a dot product to update x and
// r); Ordering::Optimized uses the engine's fused update and its multi-coloured smoother.
#include "kiln/hpc/hpcg/engine.h"

namespace kiln::hpcg {

// Seconds per category, as the reference's times[]: total, DDOT, WAXPBY, SpMV, MG.
struct CgTimes {
  double total = 0, dot = 0, waxpby = 0, spmv = 0, mg = 0;
  CgTimes& operator+=(const CgTimes& o) {
    total += o.total;
    dot += o.dot;
    waxpby += o.waxpby;
    spmv += o.spmv;
    mg += o.mg;
    return *this;
  }
};

struct CgResult {
  int iterations = 0;
  double normr = 0;   // final residual norm
  double normr0 = 0;  // initial residual norm
  double scaled_residual() const { return normr0 > 0 ? normr / normr0 : 0.0; }
};

// The fine-level vectors CG needs besides b and x.
struct CgWorkspace {
  explicit CgWorkspace(const Engine& engine)
      : r(engine.make_vector(0)), z(engine.make_vector(0)), p(engine.make_vector(0)), ap(engine.make_vector(0)) {}
  Vector r, z, p, ap;
};

// Iterates until max_iterations or normr/normr0 <= tolerance; x holds the initial guess.
CgResult cg(Engine& engine, CgWorkspace& work, const Vector& b, Vector& x, int max_iterations, double tolerance,
            bool precondition, Ordering ordering, CgTimes* times = nullptr);

}  // namespace kiln::hpcg
