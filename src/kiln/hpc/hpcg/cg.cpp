#include "kiln/hpc/hpcg/cg.h"

#include <chrono>
#include <cmath>

namespace kiln::hpcg {

namespace {
// Adds the seconds of a scope to a category; synchronises the device so that queued work counts.
class Stopwatch {
 public:
  Stopwatch(Engine& engine, double* into) : engine_(engine), into_(into), start_(std::chrono::steady_clock::now()) {}
  ~Stopwatch() {
    if (!into_) return;
    engine_.synchronize();
    *into_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  Stopwatch(const Stopwatch&) = delete;
  Stopwatch& operator=(const Stopwatch&) = delete;

 private:
  Engine& engine_;
  double* into_;
  std::chrono::steady_clock::time_point start_;
};
}  // namespace

CgResult cg(Engine& e, CgWorkspace& w, const Vector& b, Vector& x, int max_iterations, double tolerance,
            bool precondition, Ordering ordering, CgTimes* times) {
  CgTimes local;
  CgTimes& t = times ? *times : local;
  Stopwatch total(e, &t.total);
  CgResult out;
  double rtz = 0.0;

  // r0 = b - A x0
  {
    Stopwatch s(e, &t.waxpby);
    e.copy(x, w.p, 0);
  }
  {
    Stopwatch s(e, &t.spmv);
    e.compute_spmv(0, w.p, w.ap);
  }
  {
    Stopwatch s(e, &t.waxpby);
    e.compute_waxpby(0, 1.0, b, -1.0, w.ap, w.r);
  }
  {
    Stopwatch s(e, &t.dot);
    out.normr = std::sqrt(e.compute_dot_product(0, w.r, w.r));
  }
  out.normr0 = out.normr;

  for (int k = 1; k <= max_iterations && out.normr / out.normr0 > tolerance; ++k) {
    {
      Stopwatch s(e, &t.mg);
      if (precondition) {
        e.compute_mg(0, w.r, w.z, ordering);
      } else {
        e.copy(w.r, w.z, 0);
      }
    }
    if (k == 1) {
      {
        Stopwatch s(e, &t.waxpby);
        e.compute_waxpby(0, 1.0, w.z, 0.0, w.z, w.p);
      }
      Stopwatch s(e, &t.dot);
      rtz = e.compute_dot_product(0, w.r, w.z);
    } else {
      double old_rtz = rtz;
      {
        Stopwatch s(e, &t.dot);
        rtz = e.compute_dot_product(0, w.r, w.z);
      }
      double beta = rtz / old_rtz;
      Stopwatch s(e, &t.waxpby);
      e.compute_waxpby(0, 1.0, w.z, beta, w.p, w.p);
    }
    {
      Stopwatch s(e, &t.spmv);
      e.compute_spmv(0, w.p, w.ap);
    }
    double pap;
    {
      Stopwatch s(e, &t.dot);
      pap = e.compute_dot_product(0, w.p, w.ap);
    }
    double alpha = rtz / pap;
    if (ordering == Ordering::Reference) {
      {
        Stopwatch s(e, &t.waxpby);
        e.compute_waxpby(0, 1.0, x, alpha, w.p, x);
        e.compute_waxpby(0, 1.0, w.r, -alpha, w.ap, w.r);
      }
      Stopwatch s(e, &t.dot);
      out.normr = std::sqrt(e.compute_dot_product(0, w.r, w.r));
    } else {
      Stopwatch s(e, &t.waxpby);
      out.normr = std::sqrt(e.compute_cg_update(alpha, w.p, w.ap, x, w.r));
    }
    out.iterations = k;
  }
  return out;
}

}  // namespace kiln::hpcg
