// The HPL driver (HPL_pddriver + HPL_pdinfo's echo + HPL_pdtest's report): validates every run
// first, then runs the sweep and prints what netlib HPL prints.
#include "kiln/hpc/hpl/hpl.h"

#include <fmt/format.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <string>

#include "kiln/build_info.h"
#include "kiln/dist/process_grid.h"
#include "kiln/hpc/hpl/cpu_solver.h"
#include "kiln/runtime/backend.h"
#include "kiln/runtime/error.h"
#if KILN_WITH_CUDA
#include "kiln/hpc/hpl/cuda/cuda_solver.h"
#endif

namespace kiln::hpl {

namespace {

constexpr const char* kRule = "================================================================================\n";
constexpr const char* kDash = "--------------------------------------------------------------------------------\n";

double gigabytes(double bytes) { return bytes / 1e9; }

// MemAvailable from /proc/meminfo: what the node can give without swapping.
std::size_t available_host_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::size_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

void check_cpu_memory(const RunConfig& run, const dist::Communicator& world) {
  // Every process of the node adds its share; the grid position follows PMAP like the run will.
  const int rank = world.rank();
  std::size_t mine = 0;
  if (rank < run.p * run.q) {
    int my_row = run.column_major_map ? rank % run.p : rank / run.q;
    int my_col = run.column_major_map ? rank / run.p : rank % run.q;
    mine = cpu_bytes_per_process(run, my_row, my_col);
  }
  dist::Communicator node = world.split_node_local();
  auto node_need = node.all_reduce_value(static_cast<std::int64_t>(mine));
  auto available = static_cast<std::int64_t>(available_host_bytes());
  // The worst node decides, and every process learns its numbers.
  double shortfall = static_cast<double>(node_need - available);
  double worst = world.all_reduce_value(shortfall, dist::ReduceOp::Max);
  if (worst <= 0) return;
  double need = 0, have = 0;
  if (shortfall == worst) {
    need = static_cast<double>(node_need);
    have = static_cast<double>(available);
  }
  need = world.all_reduce_value(need, dist::ReduceOp::Max);
  have = world.all_reduce_value(have, dist::ReduceOp::Max);
  KILN_FAIL(
      "HPL N={} NB={} on a {} x {} grid does not fit in memory: it needs {:.2f} GB on one node ([A|b] is {} x {} "
      "doubles = {:.2f} GB in all), but only {:.2f} GB are available there (MemAvailable); choose a smaller N or "
      "more nodes",
      run.n, run.nb, run.p, run.q, gigabytes(need), run.n, run.n + 1,
      gigabytes(static_cast<double>(run.n) * static_cast<double>(run.n + 1) * 8), gigabytes(have));
}

std::string timestamp() {
  std::time_t now = std::time(nullptr);
  char text[64];
  std::strftime(text, sizeof text, "%a %b %e %H:%M:%S %Y", std::localtime(&now));
  return text;
}

std::string header_text(const Parameters& p, Device device) {
  std::string text;
  auto out = std::back_inserter(text);
  fmt::format_to(out, "{}", kRule);
  fmt::format_to(out, "HPLinpack 2.3 algorithm  --  Kiln {} `kiln hpl`  --  device {}\n", build_info::version,
                 device.str());
  fmt::format_to(out, "Netlib HPL: A. Petitet, R. C. Whaley, J. Dongarra, A. Cleary, ICL, UTK\n");
  fmt::format_to(out, "{}\n", kRule);
  fmt::format_to(out,
                 "An explanation of the input/output parameters follows:\n"
                 "T/V    : Wall time / encoded variant.\n"
                 "N      : The order of the coefficient matrix A.\n"
                 "NB     : The partitioning blocking factor.\n"
                 "P      : The number of process rows.\n"
                 "Q      : The number of process columns.\n"
                 "Time   : Time in seconds to solve the linear system.\n"
                 "Gflops : Rate of execution for solving the linear system.\n\n"
                 "The following parameter values will be used:\n\n");
  auto list = [&](const char* name, auto const& values, auto&& format) {
    fmt::format_to(out, "{:<7}:", name);
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (i > 0 && i % 8 == 0) fmt::format_to(out, "\n{:<7} ", "");
      fmt::format_to(out, " {:>8}", format(values[i]));
    }
    fmt::format_to(out, "\n");
  };
  auto same = [](auto v) { return fmt::format("{}", v); };
  auto fact = [](Factorization f) { return std::string(factorization_name(f)); };
  auto bcast = [](Broadcast b) { return std::string(broadcast_name(b)); };
  list("N", p.ns, same);
  list("NB", p.nbs, same);
  fmt::format_to(out, "PMAP   : {} process mapping\n", p.column_major_map ? "Column-major" : "Row-major");
  list("P", p.ps, same);
  list("Q", p.qs, same);
  list("PFACT", p.pfacts, fact);
  list("NBMIN", p.nbmins, same);
  list("NDIV", p.ndivs, same);
  list("RFACT", p.rfacts, fact);
  list("BCAST", p.bcasts, bcast);
  list("DEPTH", p.depths, same);
  fmt::format_to(out, "SWAP   : {} (threshold = {})\n", swap_name(p.swap), p.swap_threshold);
  fmt::format_to(out, "L1     : {} form\n", p.l1_transposed ? "transposed" : "no-transposed");
  fmt::format_to(out, "U      : {} form\n", p.u_transposed ? "transposed" : "no-transposed");
  fmt::format_to(out, "EQUIL  : {}\n", p.equilibration ? "yes" : "no");
  fmt::format_to(out, "ALIGN  : {} double precision words\n\n", p.align);
  fmt::format_to(out, "{}\n", kDash);
  fmt::format_to(out,
                 "- The matrix A is randomly generated for each test.\n"
                 "- The following scaled residual check will be computed:\n"
                 "      ||Ax-b||_oo / ( eps * ( || x ||_oo * || A ||_oo + || b ||_oo ) * N )\n"
                 "- The relative machine precision (eps) is taken to be          {:e}\n"
                 "- Computational tests pass if scaled residuals are less than   {:>14.1f}\n\n",
                 std::numeric_limits<double>::epsilon() / 2, p.threshold);
  return text;
}

std::string result_text(const RunConfig& run, const RunResult& r, const std::string& start, const std::string& end) {
  std::string text;
  auto out = std::back_inserter(text);
  fmt::format_to(out, "{}", kRule);
  fmt::format_to(out, "T/V                N    NB     P     Q               Time                 Gflops\n");
  fmt::format_to(out, "{}", kDash);
  fmt::format_to(out, "{:<10}{:>9}{:>6}{:>6}{:>6}{:>19.2f}{:>23.4e}\n", variant_code(run), run.n, run.nb, run.p, run.q,
                 r.seconds, r.gflops);
  fmt::format_to(out, "HPL_pdgesv() start time {}\n\n", start);
  fmt::format_to(out, "HPL_pdgesv() end time   {}\n\n", end);
  fmt::format_to(out, "{}", kDash);
  fmt::format_to(out, "||Ax-b||_oo/(eps*(||A||_oo*||x||_oo+||b||_oo)*N)= {:>16.8e} ...... {}\n", r.residual,
                 r.passed ? "PASSED" : "FAILED");
  if (!r.passed)
    fmt::format_to(out,
                   "||Ax-b||_oo  . . . . . . . . . . . . . . . . . = {:>18.6e}\n"
                   "||A||_oo . . . . . . . . . . . . . . . . . . . = {:>18.6e}\n"
                   "||x||_oo . . . . . . . . . . . . . . . . . . . = {:>18.6e}\n"
                   "||b||_oo . . . . . . . . . . . . . . . . . . . = {:>18.6e}\n",
                   r.norm_r, r.norm_a, r.norm_x, r.norm_b);
  return text;
}

std::string summary_text(std::size_t runs, const SuiteSummary& summary) {
  std::string text;
  auto out = std::back_inserter(text);
  fmt::format_to(out, "{}", kRule);
  fmt::format_to(out,
                 "\nFinished {:>6} tests with the following results:\n"
                 "         {:>6} tests completed and passed residual checks,\n"
                 "         {:>6} tests completed and failed residual checks,\n"
                 "         {:>6} tests skipped because of illegal input values.\n",
                 runs, summary.passed, summary.failed, 0);
  fmt::format_to(out, "{}", kDash);
  fmt::format_to(out, "\nEnd of Tests.\n{}", kRule);
  return text;
}

// Rank 0's report: every piece is written and flushed at once (a long sweep shows its results as
// they come) and checked, so a full disk or a closed pipe is an error, not a cut or empty HPL.out
// and exit status 0. The first error is kept; the caller makes every process stop on it.
class ReportWriter {
 public:
  ReportWriter(std::FILE* out, std::string name) : out_(out), name_(std::move(name)) {}

  void write(const std::string& text) {
    if (!error_.empty() || out_ == nullptr) return;
    errno = 0;
    bool ok = std::fwrite(text.data(), 1, text.size(), out_) == text.size();
    ok = std::fflush(out_) == 0 && ok && !std::ferror(out_);
    if (!ok) error_ = fmt::format("cannot write the HPL report to {}: {}", name_, std::strerror(errno ? errno : EIO));
  }
  const std::string& error() const { return error_; }

 private:
  std::FILE* out_;
  std::string name_;
  std::string error_;
};

std::string report_name(const Parameters& p) {
  if (p.device_out == 6) return "standard output";
  if (p.device_out == 7) return "standard error";
  return fmt::format("'{}' (HPL.dat line 3)", p.output_file);
}

// Rank 0 knows whether its writes failed; every process must stop together (the others would
// wait in the next run's collectives).
void stop_on_write_error(const dist::Communicator& world, const ReportWriter& report, const std::string& when) {
  int failed = report.error().empty() ? 0 : 1;
  world.broadcast(std::span<int>(&failed, 1), 0);
  if (failed == 0) return;
  KILN_FAIL("{}{}", world.rank() == 0 ? report.error() : "rank 0 cannot write the HPL report", when);
}

}  // namespace

void validate_run(const RunConfig& run, Device device) {
  auto world = dist::Communicator::world();
  KILN_CHECK(run.n >= 1 && run.nb >= 1, "HPL N={} NB={}: both must be at least 1", run.n, run.nb);
  KILN_CHECK(std::isfinite(run.threshold) && run.threshold > 0,
             "HPL residual threshold {} must be a positive finite number (HPL's is 16.0)", run.threshold);
  KILN_CHECK(run.p * run.q <= world.size(),
             "HPL grid P x Q = {} x {} needs {} processes, but only {} are running (start it with mpirun -np {})",
             run.p, run.q, run.p * run.q, world.size(), run.p * run.q);
  KILN_CHECK(run.nbmin >= 1 && run.ndiv >= 2, "HPL NBMIN={} must be >= 1 and NDIV={} >= 2", run.nbmin, run.ndiv);
  KILN_CHECK(run.depth == 0 || run.depth == 1, "HPL DEPTH={}: kiln implements look-ahead depth 0 and 1", run.depth);
  KILN_CHECK(run.n < (1L << 31) / 2, "HPL N={} is beyond what 32-bit BLAS dimensions can index", run.n);
  if (device.is_cpu()) {
    check_cpu_memory(run, world);
    return;
  }
  KILN_CHECK(device.is_cuda(), "HPL runs on cpu or cuda, not {}", device.str());
#if KILN_WITH_CUDA
  KILN_CHECK(world.size() == 1 && run.p == 1 && run.q == 1,
             "HPL on {} runs one process on a 1 x 1 grid (one GPU); got a {} x {} grid over {} processes. Multi-GPU "
             "grids are not implemented; use --device cpu for grids.",
             device.str(), run.p, run.q, world.size());
  KILN_CHECK(device.index < device_count(DeviceKind::CUDA), "HPL: {} is not present ({} CUDA devices)", device.str(),
             device_count(DeviceKind::CUDA));
  KILN_CHECK(run.nb <= kCudaMaxNb, "HPL NB={} on {}: the GPU solver takes NB up to {}", run.nb, device.str(),
             kCudaMaxNb);
  auto props = backend_for(device).properties(device.index);
  std::size_t need = cuda_bytes(run);
  KILN_CHECK(
      need <= props.free_memory,
      "HPL N={} NB={} does not fit on {} ({}): it needs {:.2f} GB ([A|b] is {} x {} doubles), but only {:.2f} GB "
      "of its {:.2f} GB are free",
      run.n, run.nb, device.str(), props.name, gigabytes(static_cast<double>(need)), run.n, run.n + 1,
      gigabytes(static_cast<double>(props.free_memory)), gigabytes(static_cast<double>(props.total_memory)));
#else
  KILN_FAIL("HPL on {}: this kiln was built without CUDA (configure with -DKILN_CUDA=ON)", device.str());
#endif
}

SuiteSummary run_suite(const Parameters& params, Device device, std::FILE* out) {
  auto world = dist::Communicator::world();
  std::vector<RunConfig> runs = expand_runs(params);
  // Everything is checked before the first run starts, so a sweep never dies half-way.
  for (const RunConfig& run : runs) validate_run(run, device);
  const bool printer = world.rank() == 0;
  ReportWriter report(printer ? out : nullptr, report_name(params));
  report.write(header_text(params, device));
  // The header is written before the first run: an unwritable output is found in a second.
  stop_on_write_error(world, report, " (before any run started)");
  std::map<std::pair<int, int>, std::unique_ptr<dist::ProcessGrid>> grids;
  SuiteSummary summary;
  std::size_t done = 0;
  for (const RunConfig& run : runs) {
    auto& grid = grids[{run.p, run.q}];
    if (!grid)
      grid = std::make_unique<dist::ProcessGrid>(
          world, run.p, run.q, run.column_major_map ? dist::GridOrder::ColumnMajor : dist::GridOrder::RowMajor);
    std::string start = timestamp();
    RunResult result;
    if (grid->in_grid()) {
      if (device.is_cpu()) {
        result = solve_on_cpu(run, *grid);
      } else {
#if KILN_WITH_CUDA
        result = solve_on_cuda(run, device.index);
#endif
      }
    }
    std::string end = timestamp();
    ++done;
    if (printer) report.write(result_text(run, result, start, end));
    (result.passed ? summary.passed : summary.failed) += 1;
    world.barrier();
    stop_on_write_error(world, report, fmt::format(" (after run {} of {}, whose result is lost)", done, runs.size()));
  }
  if (printer) report.write(summary_text(runs.size(), summary));
  stop_on_write_error(world, report, " (the closing summary)");
  // Processes outside a grid did not see its result; rank 0 (always inside) decides.
  int counts[2] = {summary.passed, summary.failed};
  world.broadcast(std::span<int>(counts), 0);
  return {counts[0], counts[1]};
}

#if KILN_WITH_CUDA
namespace {

// What every GPU peer checks before it allocates: the device exists and N fits cuBLAS's ints;
// the update peers also need 1 <= NB < N.
void check_peer(const char* peer, long n, int device_index, long min_n = 1) {
  KILN_CHECK(device_index >= 0 && device_index < device_count(DeviceKind::CUDA),
             "kiln hpl --peer {}: cuda:{} is not present ({} CUDA devices)", peer, device_index,
             device_count(DeviceKind::CUDA));
  KILN_CHECK(n >= min_n && n < (1L << 31) / 2, "kiln hpl --peer {}: N={} out of range", peer, n);
}
void check_update_peer(const char* peer, long n, long nb, int device_index) {
  check_peer(peer, n, device_index, 2);
  KILN_CHECK(nb >= 1 && nb < n, "kiln hpl --peer {}: NB={} must be between 1 and N-1={}", peer, nb, n - 1);
}

}  // namespace
#endif

double peer_dgemm_tflops(long n, int device_index, int repeats) {
#if KILN_WITH_CUDA
  check_peer("dgemm", n, device_index);
  return cuda_peer_dgemm_tflops(n, device_index, repeats);
#else
  KILN_FAIL("kiln hpl --peer dgemm needs a CUDA build (n={}, device {}, {} repeats)", n, device_index, repeats);
#endif
}

double peer_update_tflops(long n, long nb, int device_index, int repeats) {
#if KILN_WITH_CUDA
  check_update_peer("update", n, nb, device_index);
  return cuda_peer_update_tflops(n, nb, device_index, repeats);
#else
  KILN_FAIL("kiln hpl --peer update needs a CUDA build (n={}, nb={}, device {}, {} repeats)", n, nb, device_index,
            repeats);
#endif
}

std::vector<PeerAlgo> peer_update_algos(long n, long nb, int count, int device_index, int repeats) {
#if KILN_WITH_CUDA
  check_update_peer("update-algos", n, nb, device_index);
  return cuda_peer_update_algos(n, nb, count, device_index, repeats);
#else
  KILN_FAIL("kiln hpl --peer update-algos needs a CUDA build (n={}, nb={}, {} candidates, device {}, {} repeats)", n,
            nb, count, device_index, repeats);
#endif
}

double peer_getrf_tflops(long n, int device_index, int repeats) {
#if KILN_WITH_CUDA
  check_peer("getrf", n, device_index);
  return cuda_peer_getrf_tflops(n, device_index, repeats);
#else
  KILN_FAIL("kiln hpl --peer getrf needs a CUDA build (n={}, device {}, {} repeats)", n, device_index, repeats);
#endif
}

}  // namespace kiln::hpl
