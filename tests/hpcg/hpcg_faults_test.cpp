// HPCG's bad input and faults (issue 15): run times that overflow the set count, boxes beyond the
// 32-bit indices or the memory, and an unwritable report directory are refused before the run; the
// timed phase honours --rt; the bandwidth bound is not claimed for a problem that runs from cache;
// a report that cannot be written whole is an error, never a cut file.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "kiln/hpc/hpcg/benchmark.h"
#include "kiln/hpc/hpcg/engine.h"
#include "kiln/hpc/hpcg/geometry.h"
#include "kiln/runtime/error.h"

namespace kiln::hpcg {
namespace hpcg_faults_test {

namespace fs = std::filesystem;

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

fs::path scratch(const std::string& name) {
  fs::path dir = fs::path(::testing::TempDir()) / ("kiln-hpcg-faults-" + std::to_string(::getpid())) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

TEST(HpcgInput, RunTimesThatOverflowOrNeverEndAreRefused) {
  HpcgParams p;
  for (double bad : {-1.0, std::numeric_limits<double>::infinity(), std::nan(""), 1e300}) {
    p.run_seconds = bad;
    std::string error = error_of([&] { check_params(p); });
    EXPECT_NE(error.find("run time (--rt or hpcg.dat line 4)"), std::string::npos) << bad << ": " << error;
    EXPECT_NE(error.find("is not a number of seconds in [0, 31536000]"), std::string::npos) << error;
  }
  p.run_seconds = 0;
  EXPECT_EQ(error_of([&] { check_params(p); }), "no error");

  fs::path dat = scratch("dat") / "hpcg.dat";
  std::ofstream(dat) << "HPCG benchmark input file\nheader\n16 16 16\n-5\n";
  EXPECT_NE(error_of([&] { read_hpcg_dat(dat.string()); }).find("line 4: run time -5 s is not a number of seconds"),
            std::string::npos);
}

TEST(HpcgInput, ABoxBeyondThirtyTwoBitIndicesIsRefusedAtOnce) {
  auto start = std::chrono::steady_clock::now();
  std::string error = error_of([] { check_local_dimensions(2048, 2048, 2048); });
  EXPECT_NE(error.find("the local box 2048x2048x2048 has 8615125000 points with its halo, beyond the 32-bit row"),
            std::string::npos)
      << error;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  EXPECT_EQ(error_of([] { check_local_dimensions(1280, 1280, 1280); }), "no error");
}

TEST(HpcgInput, TheMemoryEstimateCoversWhatAnEngineHolds) {
  auto comm = dist::Communicator::world();
  auto levels = make_hierarchy(make_geometry(32, 24, 16, choose_process_grid(comm.size(), std::nullopt), comm.rank()));
  auto engine = make_engine(EngineKind::CpuOptimized, levels, comm);
  double vectors = 13 * 8.0 * engine->local_columns(0);
  double held = engine->matrix_bytes() / comm.size() + vectors;
  double estimate = estimated_bytes_per_process(32, 24, 16);
  EXPECT_GE(estimate, held);
  EXPECT_LE(estimate, 1.5 * held);
}

TEST(HpcgInput, AProblemLargerThanMemoryIsRefusedBeforeSetup) {
  HpcgParams p;
  p.nx = p.ny = p.nz = 1280;  // about 1 TB a process
  p.report_dir = scratch("memory").string();
  auto start = std::chrono::steady_clock::now();
  std::string error = error_of([&] { run_hpcg(p, dist::Communicator::world()); });
  EXPECT_NE(error.find("hpcg: local 1280x1280x1280 needs about"), std::string::npos) << error;
  EXPECT_NE(error.find("GB are available (MemAvailable)"), std::string::npos) << error;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(HpcgInput, AnUnwritableReportDirectoryIsFoundBeforeTheRun) {
  fs::path file = scratch("report-dir") / "a-file";
  std::ofstream(file) << "not a directory";
  HpcgParams p;
  p.report_dir = (file / "reports").string();
  p.run_seconds = 1000;  // would take that long if it ran
  auto start = std::chrono::steady_clock::now();
  std::string error = error_of([&] { run_hpcg(p, dist::Communicator::world()); });
  EXPECT_NE(error.find("cannot create the report directory '" + p.report_dir + "'"), std::string::npos) << error;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

// Writes beyond `bytes` fail with EFBIG, as on a full disk (RLIMIT_FSIZE; SIGXFSZ ignored, so the
// write returns the error instead of killing the process).
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &saved_);
    previous_ = ::signal(SIGXFSZ, SIG_IGN);
    rlimit limited = saved_;
    limited.rlim_cur = bytes;
    ::setrlimit(RLIMIT_FSIZE, &limited);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &saved_);
    ::signal(SIGXFSZ, previous_);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;

 private:
  rlimit saved_{};
  sighandler_t previous_ = SIG_DFL;
};

TEST(HpcgRun, HonoursRunTimeQualifiesTheBoundAndReportsAFullDisk) {
  HpcgParams p;
  p.run_seconds = 0.5;
  p.report_dir = scratch("run").string();
  HpcgResults r = run_hpcg(p, dist::Communicator::world());
  ASSERT_TRUE(r.valid());

  // The timed phase ends at the first set boundary after --rt.
  double per_set = r.phases.timed / r.cg_sets;
  EXPECT_GE(r.phases.timed, p.run_seconds);
  // (Noise on a shared machine can stretch the last set: allow a few sets' worth.)
  EXPECT_LE(r.phases.timed, p.run_seconds + std::max(3 * per_set, 0.25)) << r.cg_sets << " sets";
  EXPECT_GE(r.phases.total, r.phases.setup + r.phases.validation + r.phases.timed);
  std::string text = summary(r);
  EXPECT_NE(text.find("wall time:"), std::string::npos) << text;
  EXPECT_NE(text.find("(--rt 0.5;"), std::string::npos) << text;

  {
    FileSizeLimit limit(1024);
    std::string error = error_of([&] { write_report(r); });
    EXPECT_NE(error.find("hpcg: cannot write the report"), std::string::npos) << error;
    EXPECT_NE(error.find("File too large"), std::string::npos) << error;
  }
  EXPECT_TRUE(fs::is_empty(p.report_dir)) << "a cut report or its temporary was left";
  std::string path = write_report(r);
  EXPECT_GT(fs::file_size(path), 1024u);

  // 16^3 is a few MB: it runs from cache, and the memory bound is not claimed.
  if (r.cache_bytes <= 0) GTEST_SKIP() << "this system does not report its last-level cache size";
  EXPECT_FALSE(r.bound_applies()) << r.working_set_bytes << " B working set, " << r.cache_bytes << " B cache";
  EXPECT_NE(text.find("bandwidth bound: none at this size"), std::string::npos) << text;
  EXPECT_EQ(text.find("stricter bound"), std::string::npos) << text;
}

}  // namespace hpcg_faults_test
}  // namespace kiln::hpcg
