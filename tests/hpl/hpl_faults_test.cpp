// HPL's gates (issue 15): the residual check can fail (a wrong x fails it), a threshold that would
// fail or skip every check is refused at input, and a report that cannot be written is an error
// before any run starts, not an empty HPL.out with exit status 0.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "kiln/dist/process_grid.h"
#include "kiln/hpc/hpl/cpu_solver.h"
#include "kiln/hpc/hpl/hpl.h"
#include "kiln/hpc/hpl/hpl_params.h"
#include "kiln/hpc/hpl/hpl_random.h"
#include "kiln/runtime/error.h"

namespace kiln::hpl {
namespace hpl_faults_test {

std::string dat_text(const std::string& threshold, const std::string& output_file = "HPL.out",
                     const std::string& device_out = "6") {
  return "HPLinpack benchmark input file\n"
         "Kiln's fault tests\n" +
         output_file + "      output file name (if any)\n" + device_out +
         "            device out (6=stdout,7=stderr,file)\n"
         "1            # of problems sizes (N)\n"
         "64           Ns\n"
         "1            # of NBs\n"
         "16           NBs\n"
         "0            PMAP process mapping (0=Row-,1=Column-major)\n"
         "1            # of process grids (P x Q)\n"
         "1            Ps\n"
         "1            Qs\n" +
         threshold +
         "         threshold\n"
         "1            # of panel fact\n"
         "2            PFACTs (0=left, 1=Crout, 2=Right)\n"
         "1            # of recursive stopping criterium\n"
         "4            NBMINs (>= 1)\n"
         "1            # of panels in recursion\n"
         "2            NDIVs\n"
         "1            # of recursive panel fact.\n"
         "1            RFACTs (0=left, 1=Crout, 2=Right)\n"
         "1            # of broadcast\n"
         "1            BCASTs (0=1rg,1=1rM,2=2rg,3=2rM,4=Lng,5=LnM)\n"
         "1            # of lookahead depth\n"
         "1            DEPTHs (>=0)\n"
         "2            SWAP (0=bin-exch,1=long,2=mix)\n"
         "64           swapping threshold\n"
         "0            L1 in (0=transposed,1=no-transposed) form\n"
         "0            U  in (0=transposed,1=no-transposed) form\n"
         "1            Equilibration (0=no,1=yes)\n"
         "8            memory alignment in double (> 0)\n";
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(HplThreshold, NanNegativeOrZeroIsRefusedAtInput) {
  EXPECT_EQ(error_of([] { parse_hpl_dat(dat_text("16.0"), "HPL.dat"); }), "no error");
  for (const char* bad : {"nan", "-1", "0", "inf", "-inf"}) {
    std::string error = error_of([&] { parse_hpl_dat(dat_text(bad), "HPL.dat"); });
    EXPECT_NE(
        error.find(std::string("HPL.dat line 13: the residual threshold ") + bad + " must be a positive finite number"),
        std::string::npos)
        << bad << ": " << error;
  }
  RunConfig run;
  run.n = 64;
  run.nb = 16;
  run.threshold = -16.0;
  EXPECT_NE(error_of([&] { validate_run(run, Device::cpu()); }).find("threshold -16 must be a positive"),
            std::string::npos);
}

// A and b as HPL generates them (column-major, b the last column), solved in float64 by Gaussian
// elimination with partial pivoting: an x found independently of Kiln's solver.
std::vector<double> reference_solution(const RunConfig& run) {
  const auto n = static_cast<std::size_t>(run.n);
  std::vector<double> a(n * (n + 1));
  for (std::size_t c = 0; c <= n; ++c)
    for (std::size_t r = 0; r < n; ++r) a[c * n + r] = hpl_value(hpl_state_at(run.seed, n, r, c));
  auto at = [&](std::size_t r, std::size_t c) -> double& { return a[c * n + r]; };
  for (std::size_t k = 0; k < n; ++k) {
    std::size_t p = k;
    for (std::size_t r = k + 1; r < n; ++r)
      if (std::fabs(at(r, k)) > std::fabs(at(p, k))) p = r;
    for (std::size_t c = k; c <= n; ++c) std::swap(at(k, c), at(p, c));
    for (std::size_t r = k + 1; r < n; ++r) {
      double l = at(r, k) / at(k, k);
      for (std::size_t c = k; c <= n; ++c) at(r, c) -= l * at(k, c);
    }
  }
  std::vector<double> x(n);
  for (std::size_t k = n; k-- > 0;) {
    double s = at(k, n);
    for (std::size_t c = k + 1; c < n; ++c) s -= at(k, c) * x[c];
    x[k] = s / at(k, k);
  }
  return x;
}

TEST(HplCheck, AWrongSolutionFailsTheResidualCheck) {
  dist::ProcessGrid grid(dist::Communicator::world(), 1, 1);
  RunConfig run;
  run.n = 97;
  run.nb = 16;
  std::vector<double> x = reference_solution(run);
  RunResult right = check_cpu_solution(run, grid, x);
  EXPECT_TRUE(right.passed) << right.residual;
  EXPECT_LT(right.residual, 1.0);

  // The largest entry wrong in its eighth digit: a residual thousands of times the threshold.
  std::vector<double> wrong = x;
  auto largest =
      std::max_element(wrong.begin(), wrong.end(), [](double a, double b) { return std::fabs(a) < std::fabs(b); });
  *largest *= 1 + 1e-8;
  RunResult off = check_cpu_solution(run, grid, wrong);
  EXPECT_FALSE(off.passed) << off.residual;
  EXPECT_GT(off.residual, run.threshold);

  RunResult zero = check_cpu_solution(run, grid, std::vector<double>(x.size(), 0.0));
  EXPECT_FALSE(zero.passed) << zero.residual;

  std::vector<double> nan = x;
  nan[3] = std::nan("");
  EXPECT_FALSE(check_cpu_solution(run, grid, nan).passed);

  // And the solver's own x passes the same check (the check is what solve_on_cpu reports).
  EXPECT_TRUE(solve_on_cpu(run, grid).passed);
}

TEST(HplReport, AFullDiskIsAnErrorBeforeAnyRunNotAnEmptyFile) {
  Parameters params = parse_hpl_dat(dat_text("16.0", "/dev/full", "8"), "HPL.dat");
  std::FILE* full = std::fopen("/dev/full", "w");
  if (full == nullptr) GTEST_SKIP() << "no /dev/full on this system";
  std::string error = error_of([&] { run_suite(params, Device::cpu(), full); });
  std::fclose(full);
  EXPECT_NE(error.find("cannot write the HPL report to '/dev/full' (HPL.dat line 3): No space left on device "
                       "(before any run started)"),
            std::string::npos)
      << error;
}

}  // namespace hpl_faults_test
}  // namespace kiln::hpl
