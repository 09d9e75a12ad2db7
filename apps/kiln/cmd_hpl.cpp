// `kiln hpl`: the HPL benchmark, from an HPL.dat (HPL's own 31-line format, a sweep) or from flags
// (one run), on the CPU over an MPI grid or on one GPU; `--peer dgemm|update|getrf` times the vendor
// libraries the GPU result is compared with.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "commands.h"
#include "kiln/dist/communicator.h"
#include "kiln/hpc/hpl/hpl.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/error.h"

namespace kiln::cli {

namespace {

struct HplOptions {
  std::string dat;
  std::vector<long> ns{2000};
  std::vector<int> nbs{128};
  std::vector<int> ps{1}, qs{1};
  std::string device = "cpu";
  std::vector<int> pfacts{2}, rfacts{1}, nbmins{4}, ndivs{2}, bcasts{1}, depths{1};
  int pmap = 0;
  double threshold = 16.0;
  std::string peer;
  int repeats = 3;
};

// The flag each line of the HPL.dat text below is written from, so a bad value is reported as the
// user's flag ("kiln hpl --depth"), not as a line of a file they never wrote.
std::string flag_of_line(int line) {
  struct Lines {
    int first, last;  // a count line and its list, or a single line
    const char* flag;
  };
  static constexpr Lines kFlags[] = {{5, 6, "--n"},       {7, 8, "--nb"},      {9, 9, "--pmap"},
                                     {10, 11, "--p"},     {12, 12, "--q"},     {13, 13, "--threshold"},
                                     {14, 15, "--pfact"}, {16, 17, "--nbmin"}, {18, 19, "--ndiv"},
                                     {20, 21, "--rfact"}, {22, 23, "--bcast"}, {24, 25, "--depth"}};
  for (const auto& l : kFlags)
    if (line >= l.first && line <= l.last) return fmt::format("kiln hpl {}", l.flag);
  return fmt::format("kiln hpl's fixed setting (HPL.dat line {})", line);
}

hpl::Parameters parameters_from_flags(const HplOptions& o) {
  KILN_CHECK(o.ps.size() == o.qs.size(), "kiln hpl: --p has {} values but --q has {}; they pair up into grids",
             o.ps.size(), o.qs.size());
  // The same text HPL.dat would hold, so flags and files go through one parser and one set of checks.
  auto join = [](const auto& v) { return fmt::format("{}", fmt::join(v, " ")); };
  std::string dat = fmt::format(
      "HPLinpack benchmark input file (from kiln hpl flags)\n"
      "kiln\n"
      "HPL.out      output file name (if any)\n"
      "6            device out (6=stdout,7=stderr,file)\n"
      "{}           # of problems sizes (N)\n{}  Ns\n"
      "{}           # of NBs\n{}  NBs\n"
      "{}           PMAP process mapping (0=Row-,1=Column-major)\n"
      "{}           # of process grids (P x Q)\n{}  Ps\n{}  Qs\n"
      "{}         threshold\n"
      "{}           # of panel fact\n{}  PFACTs (0=left, 1=Crout, 2=Right)\n"
      "{}           # of recursive stopping criterium\n{}  NBMINs (>= 1)\n"
      "{}           # of panels in recursion\n{}  NDIVs\n"
      "{}           # of recursive panel fact.\n{}  RFACTs (0=left, 1=Crout, 2=Right)\n"
      "{}           # of broadcast\n{}  BCASTs (0=1rg,1=1rM,2=2rg,3=2rM,4=Lng,5=LnM)\n"
      "{}           # of lookahead depth\n{}  DEPTHs (>=0)\n"
      "2            SWAP (0=bin-exch,1=long,2=mix)\n"
      "64           swapping threshold\n"
      "0            L1 in (0=transposed,1=no-transposed) form\n"
      "0            U  in (0=transposed,1=no-transposed) form\n"
      "1            Equilibration (0=no,1=yes)\n"
      "8            memory alignment in double (> 0)\n",
      o.ns.size(), join(o.ns), o.nbs.size(), join(o.nbs), o.pmap, o.ps.size(), join(o.ps), join(o.qs), o.threshold,
      o.pfacts.size(), join(o.pfacts), o.nbmins.size(), join(o.nbmins), o.ndivs.size(), join(o.ndivs), o.rfacts.size(),
      join(o.rfacts), o.bcasts.size(), join(o.bcasts), o.depths.size(), join(o.depths));
  return hpl::parse_hpl_dat(dat, "kiln hpl flags", flag_of_line);
}

int run_peer(const HplOptions& o) {
  Device device = Device::parse(o.device);
  KILN_CHECK(device.is_cuda(), "kiln hpl --peer {} runs on a GPU; pass --device cuda", o.peer);
  long n = o.ns.front();
  if (o.peer == "update-algos") {
    for (const auto& [config, tflops] : hpl::peer_update_algos(n, o.nbs.front(), 16, device.index, o.repeats))
      fmt::print("PEER update N={:<8} NB={} {:>10.3f} TFLOP/s  {} ({}, median of {} after one warm-up)\n", n,
                 o.nbs.front(), tflops, config, device.str(), o.repeats);
    return 0;
  }
  double tflops = 0;
  if (o.peer == "dgemm")
    tflops = hpl::peer_dgemm_tflops(n, device.index, o.repeats);
  else if (o.peer == "getrf")
    tflops = hpl::peer_getrf_tflops(n, device.index, o.repeats);
  else if (o.peer == "update")
    tflops = hpl::peer_update_tflops(n, o.nbs.front(), device.index, o.repeats);
  else
    KILN_FAIL("kiln hpl --peer '{}': expected dgemm, update, update-algos or getrf", o.peer);
  const std::string nb = o.peer == "update" ? fmt::format(" NB={}", o.nbs.front()) : "";
  fmt::print("PEER {:<6} N={:<8}{} {:>10.3f} TFLOP/s  ({}, median of {} after one warm-up)\n", o.peer, n, nb, tflops,
             device.str(), o.repeats);
  return 0;
}

int run_hpl(const HplOptions& o) {
  if (!o.peer.empty()) return run_peer(o);
  dist::initialize();
  Device device = Device::parse(o.device);
  hpl::Parameters params = o.dat.empty() ? parameters_from_flags(o) : hpl::read_hpl_dat(o.dat);
  std::FILE* out = stdout;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(nullptr, &std::fclose);
  if (params.device_out == 7) {
    out = stderr;
  } else if (params.device_out != 6 && dist::Communicator::world().rank() == 0) {
    file.reset(std::fopen(params.output_file.c_str(), "w"));
    KILN_CHECK(file != nullptr, "cannot write the HPL output file '{}' (HPL.dat line 3): {}", params.output_file,
               std::strerror(errno));
    out = file.get();
  }
  hpl::SuiteSummary summary = hpl::run_suite(params, device, out);
  // run_suite flushed and checked every write; closing can still fail (NFS, quotas).
  if (file) {
    std::FILE* f = file.release();
    KILN_CHECK(std::fclose(f) == 0, "cannot write the HPL output file '{}' (HPL.dat line 3): {}", params.output_file,
               std::strerror(errno));
  }
  return summary.failed == 0 ? 0 : 2;
}

}  // namespace

void add_hpl(CLI::App& app) {
  auto opts = std::make_shared<HplOptions>();
  auto* cmd = app.add_subcommand("hpl", "HPL (High-Performance Linpack): solve a random dense system, report Gflops");
  cmd->add_option("--dat", opts->dat, "HPL.dat in HPL's 31-line format (a sweep); overrides the run flags")
      ->check(CLI::ExistingFile);
  cmd->add_option("--n", opts->ns, "matrix order(s) N")->capture_default_str();
  cmd->add_option("--nb", opts->nbs, "block size(s) NB")->capture_default_str();
  cmd->add_option("--p", opts->ps, "process rows P (one per grid)")->capture_default_str();
  cmd->add_option("--q", opts->qs, "process columns Q (one per grid)")->capture_default_str();
  cmd->add_option("--pmap", opts->pmap, "0: row-major, 1: column-major process mapping")->capture_default_str();
  cmd->add_option("--device", opts->device, "cpu or cuda[:i]")->capture_default_str();
  cmd->add_option("--pfact", opts->pfacts, "panel factorisation 0=Left 1=Crout 2=Right")->capture_default_str();
  cmd->add_option("--rfact", opts->rfacts, "recursive factorisation 0=Left 1=Crout 2=Right")->capture_default_str();
  cmd->add_option("--nbmin", opts->nbmins, "recursion stops at this many columns")->capture_default_str();
  cmd->add_option("--ndiv", opts->ndivs, "panels in recursion")->capture_default_str();
  cmd->add_option("--bcast", opts->bcasts, "0=1ring 1=1ringM 2=2ring 3=2ringM 4=long 5=longM")->capture_default_str();
  cmd->add_option("--depth", opts->depths, "look-ahead depth 0 or 1")->capture_default_str();
  cmd->add_option("--threshold", opts->threshold, "residual threshold")->capture_default_str();
  cmd->add_option(
      "--peer", opts->peer,
      "time a peer instead, on --device cuda: dgemm (n x n x n), update (HPL's first trailing update: "
      "(n-nb) x (n-nb) x nb), update-algos (that update through cublasDgemm and each cuBLASLt candidate) or "
      "getrf (order n)");
  cmd->add_option("--repeats", opts->repeats, "timed repeats for --peer")->capture_default_str();
  cmd->callback([opts] {
    if (int rc = run_hpl(*opts); rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace kiln::cli
