// HPL: the HPL.dat reader and its errors, the generator, block-cyclic arithmetic, solves on a
// one-process grid for every factorisation variant, and refusal of runs that cannot fit.
#include "kiln/hpc/hpl/hpl.h"

#include <gtest/gtest.h>

#include <string>

#include "kiln/dist/process_grid.h"
#include "kiln/hpc/hpl/block_cyclic.h"
#include "kiln/hpc/hpl/cpu_solver.h"
#include "kiln/hpc/hpl/hpl_params.h"
#include "kiln/hpc/hpl/hpl_random.h"
#include "kiln/runtime/error.h"

namespace kiln::hpl {
namespace hpl_test {

// netlib HPL's sample HPL.dat (the one shipped with HPL 2.3), lines 3..31 varied a little.
const char* kSampleDat =
    "HPLinpack benchmark input file\n"
    "Innovative Computing Laboratory, University of Tennessee\n"
    "HPL.out      output file name (if any)\n"
    "6            device out (6=stdout,7=stderr,file)\n"
    "4            # of problems sizes (N)\n"
    "29 30 34 35  Ns\n"
    "2            # of NBs\n"
    "1 2 3 4      NBs\n"
    "0            PMAP process mapping (0=Row-,1=Column-major)\n"
    "3            # of process grids (P x Q)\n"
    "2 1 4        Ps\n"
    "2 4 1        Qs\n"
    "16.0         threshold\n"
    "3            # of panel fact\n"
    "0 1 2        PFACTs (0=left, 1=Crout, 2=Right)\n"
    "2            # of recursive stopping criterium\n"
    "2 4          NBMINs (>= 1)\n"
    "1            # of panels in recursion\n"
    "2            NDIVs\n"
    "3            # of recursive panel fact.\n"
    "0 1 2        RFACTs (0=left, 1=Crout, 2=Right)\n"
    "1            # of broadcast\n"
    "0            BCASTs (0=1rg,1=1rM,2=2rg,3=2rM,4=Lng,5=LnM)\n"
    "1            # of lookahead depth\n"
    "0            DEPTHs (>=0)\n"
    "2            SWAP (0=bin-exch,1=long,2=mix)\n"
    "64           swapping threshold\n"
    "0            L1 in (0=transposed,1=no-transposed) form\n"
    "0            U  in (0=transposed,1=no-transposed) form\n"
    "1            Equilibration (0=no,1=yes)\n"
    "8            memory alignment in double (> 0)\n";

std::string with_line(int line, const std::string& text) {
  std::string dat = kSampleDat;
  std::size_t begin = 0;
  for (int i = 1; i < line; ++i) begin = dat.find('\n', begin) + 1;
  std::size_t end = dat.find('\n', begin);
  return dat.substr(0, begin) + text + dat.substr(end);
}

std::string error_of(const std::string& dat) {
  try {
    parse_hpl_dat(dat, "HPL.dat");
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(HplDat, ParsesHplsSampleFile) {
  Parameters p = parse_hpl_dat(kSampleDat);
  EXPECT_EQ(p.ns, (std::vector<long>{29, 30, 34, 35}));
  EXPECT_EQ(p.nbs, (std::vector<int>{1, 2}));  // the count line says 2: the rest is ignored, as in HPL
  EXPECT_EQ(p.ps, (std::vector<int>{2, 1, 4}));
  EXPECT_EQ(p.qs, (std::vector<int>{2, 4, 1}));
  EXPECT_DOUBLE_EQ(p.threshold, 16.0);
  EXPECT_EQ(p.pfacts.size(), 3u);
  EXPECT_EQ(p.rfacts[1], Factorization::Crout);
  EXPECT_EQ(p.nbmins, (std::vector<int>{2, 4}));
  EXPECT_EQ(p.bcasts[0], Broadcast::Ring);
  EXPECT_EQ(p.depths, (std::vector<int>{0}));
  EXPECT_EQ(p.swap, SwapAlgorithm::Mix);
  EXPECT_EQ(expand_runs(p).size(), 4u * 2 * 3 * 3 * 2 * 3);
}

TEST(HplDat, MalformedValueNamesLineAndValue) {
  std::string e = error_of(with_line(8, "64 abc      NBs"));
  EXPECT_NE(e.find("HPL.dat line 8"), std::string::npos) << e;
  EXPECT_NE(e.find("'abc'"), std::string::npos) << e;
}

TEST(HplDat, TooFewValuesNamesBothLines) {
  std::string e = error_of(with_line(6, "29 30      Ns"));
  EXPECT_NE(e.find("line 6"), std::string::npos) << e;
  EXPECT_NE(e.find("expected 4 values"), std::string::npos) << e;
  EXPECT_NE(e.find("line 5 says 4"), std::string::npos) << e;
}

TEST(HplDat, OutOfRangeAndShortFile) {
  std::string e = error_of(with_line(15, "0 1 7        PFACTs"));
  EXPECT_NE(e.find("line 15"), std::string::npos) << e;
  EXPECT_NE(e.find("PFACTs 7 is out of range"), std::string::npos) << e;
  e = error_of(with_line(13, "sixteen      threshold"));
  EXPECT_NE(e.find("line 13"), std::string::npos) << e;
  e = error_of("HPLinpack benchmark input file\nonly two lines\n");
  EXPECT_NE(e.find("has 2 lines"), std::string::npos) << e;
}

// `kiln hpl` writes its flags as HPL.dat text: an error then names what the line came from (the
// flag), never "HPL.dat line 25", a file the user did not write.
TEST(HplDat, LineOriginNamesTheSourceInsteadOfTheLine) {
  auto origin = [](int line) { return line == 24 || line == 25 ? std::string("kiln hpl --depth") : "other"; };
  std::string e;
  try {
    parse_hpl_dat(with_line(25, "2            DEPTHs"), "kiln hpl flags", origin);
  } catch (const Error& error) {
    e = error.what();
  }
  EXPECT_NE(e.find("kiln hpl --depth: DEPTHs 2 is out of range [0, 1]"), std::string::npos) << e;
  EXPECT_EQ(e.find("line 25"), std::string::npos) << e;
}

TEST(HplDat, VariantCodeMatchesHpl) {
  RunConfig r;  // HPL's defaults: depth 1, 1ringM, Crout, NDIV 2, Right, NBMIN 4
  EXPECT_EQ(variant_code(r), "WR11C2R4");
  r.column_major_map = true;
  r.depth = 0;
  r.bcast = Broadcast::Long;
  r.rfact = Factorization::Left;
  EXPECT_EQ(variant_code(r), "WC04L2R4");
}

TEST(HplRandom, JumpEqualsSteps) {
  std::uint64_t x = hpl_first_state(100);
  EXPECT_EQ(x, kHplMultiplier * 100 + 1);
  std::uint64_t stepped = x;
  for (int k = 1; k <= 1000; ++k) {
    stepped = kHplMultiplier * stepped + kHplIncrement;
    ASSERT_EQ(hpl_jump(k).apply(x), stepped) << k;
  }
  // Entry (i, j) of an n-row matrix is number i + j*n.
  EXPECT_EQ(hpl_state_at(100, 7, 3, 2), hpl_jump(3 + 2 * 7).apply(x));
}

TEST(HplRandom, ValuesLieInHalfOpenUnitInterval) {
  EXPECT_DOUBLE_EQ(hpl_value(0), 0.5);
  // The largest states round to -0.5 exactly, as in HPL (its "(-0.5, 0.5]" is before rounding).
  EXPECT_DOUBLE_EQ(hpl_value(~std::uint64_t{0}), -0.5);
  EXPECT_GT(hpl_value(~std::uint64_t{0} << 12), -0.5);
  EXPECT_DOUBLE_EQ(hpl_value(std::uint64_t{1} << 63), 0.0);
  double sum = 0;
  std::uint64_t x = hpl_first_state(42);
  for (int i = 0; i < 100000; ++i, x = kHplMultiplier * x + kHplIncrement) {
    double v = hpl_value(x);
    ASSERT_GE(v, -0.5);
    ASSERT_LE(v, 0.5);
    sum += v;
  }
  EXPECT_LT(std::abs(sum / 100000), 0.01);  // uniform: mean near 0
}

TEST(BlockCyclic, MatchesCountingOneByOne) {
  for (int procs : {1, 2, 3}) {
    for (long nb : {1L, 4L, 7L}) {
      BlockCyclic bc{nb, procs};
      std::vector<long> seen(procs, 0);
      for (long g = 0; g < 60; ++g) {
        for (int me = 0; me < procs; ++me) ASSERT_EQ(bc.count_before(g, me), seen[me]);
        int owner = bc.owner(g);
        ASSERT_EQ(bc.local(g), seen[owner]);
        ASSERT_EQ(bc.global(bc.local(g), owner), g);
        seen[owner] += 1;
      }
    }
  }
}

TEST(HplCpu, EveryVariantPassesOnOneProcess) {
  dist::ProcessGrid grid(dist::Communicator::world(), 1, 1);
  for (Factorization pfact : {Factorization::Left, Factorization::Crout, Factorization::Right}) {
    for (Factorization rfact : {Factorization::Left, Factorization::Crout, Factorization::Right}) {
      RunConfig run;
      run.n = 301;  // not a multiple of NB: a short last panel
      run.nb = 32;
      run.pfact = pfact;
      run.rfact = rfact;
      run.nbmin = 3;
      run.ndiv = 3;
      run.depth = static_cast<int>(pfact) % 2;
      RunResult r = solve_on_cpu(run, grid);
      EXPECT_TRUE(r.passed) << factorization_name(pfact) << "/" << factorization_name(rfact) << " " << r.residual;
      EXPECT_GT(r.residual, 0.0);  // an exact zero would mean the check compared nothing
      EXPECT_GT(r.norm_a, 1.0);
      EXPECT_GT(r.gflops, 0.0);
    }
  }
}

TEST(HplCpu, LargerProblemAndBlockSizes) {
  dist::ProcessGrid grid(dist::Communicator::world(), 1, 1);
  for (long n : {1L, 2L, 64L, 1000L}) {
    for (int nb : {1, 64, 200}) {
      RunConfig run;
      run.n = n;
      run.nb = nb;
      RunResult r = solve_on_cpu(run, grid);
      EXPECT_TRUE(r.passed) << "N=" << n << " NB=" << nb << " residual " << r.residual;
    }
  }
}

TEST(HplValidate, GridLargerThanProcessCountIsRefused) {
  RunConfig run;
  run.n = 100;
  run.nb = 16;
  run.p = 2;
  run.q = 3;
  try {
    validate_run(run, Device::cpu());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("2 x 3 needs 6 processes, but only 1 are running"), std::string::npos)
        << e.what();
  }
}

TEST(HplValidate, MatrixLargerThanMemoryIsRefused) {
  RunConfig run;
  run.n = 10'000'000;  // 800 TB
  run.nb = 256;
  try {
    validate_run(run, Device::cpu());
    FAIL() << "no error";
  } catch (const Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("N=10000000"), std::string::npos) << what;
    EXPECT_NE(what.find("does not fit in memory"), std::string::npos) << what;
    EXPECT_NE(what.find("GB are available"), std::string::npos) << what;
  }
}

}  // namespace hpl_test
}  // namespace kiln::hpl
