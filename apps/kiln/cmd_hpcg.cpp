// `kiln hpcg`: the HPCG 3.1 benchmark (problem, validation, rating as the reference; Kiln kernels).
#include <fmt/format.h>

#include <filesystem>
#include <optional>

#include "commands.h"
#include "kiln/dist/communicator.h"
#include "kiln/hpc/hpcg/benchmark.h"
#include "kiln/hpc/hpcg/peers.h"
#include "kiln/runtime/backend.h"
#include "kiln/runtime/error.h"

namespace kiln::cli {

namespace {

struct HpcgOptions {
  std::string dat;
  std::optional<int> nx, ny, nz, npx, npy, npz;
  std::optional<double> rt;
  std::string kernels = "optimized";
  std::string device = "cpu";
  std::string report_dir = ".";
  double copy_bandwidth_gbs = 0.0;
  std::string peer;
};

int run(const HpcgOptions& o) {
  hpcg::HpcgParams p;
  std::string dat = o.dat;
  if (dat.empty() && !o.nx && std::filesystem::exists("hpcg.dat")) dat = "hpcg.dat";  // as the reference
  if (!dat.empty()) p = hpcg::read_hpcg_dat(dat, p);
  if (o.nx || o.ny || o.nz) {
    p.nx = o.nx.value_or(16);
    p.ny = o.ny.value_or(p.nx);
    p.nz = o.nz.value_or(p.nx);
  }
  if (o.rt) p.run_seconds = *o.rt;
  if (o.npx || o.npy || o.npz) {
    KILN_CHECK(o.npx && o.npy && o.npz, "hpcg: give all of --npx --npy --npz or none");
    p.process_grid = std::array{*o.npx, *o.npy, *o.npz};
  }
  // Values are checked before MPI starts (seconds on a loaded node), so bad input fails at once.
  hpcg::check_params(p);
  auto comm = dist::Communicator::world();
  p.kernels = o.kernels;
  p.device = Device::parse(o.device);
  if (p.device.is_cuda() && o.device == "cuda") {
    int gpus = device_count(DeviceKind::CUDA);
    KILN_CHECK(gpus > 0, "hpcg: --device cuda but no CUDA device is visible");
    p.device.index = comm.rank() % gpus;  // one GPU per rank, round robin
  }
  p.report_dir = o.report_dir;
  if (o.copy_bandwidth_gbs > 0) {
    p.copy_bandwidth = o.copy_bandwidth_gbs * 1e9;
    p.copy_bandwidth_source = "given with --copy-bandwidth";
  }

  if (o.peer == "cusparse") {
    KILN_CHECK(p.device.is_cuda(), "hpcg: --peer cusparse needs --device cuda");
    auto r = hpcg::run_cusparse_spmv_peer(p.nx, p.ny, p.nz, p.device.index);
    if (comm.rank() == 0) fmt::print("{}", hpcg::describe(r));
    return 0;
  }
  KILN_CHECK(o.peer.empty(), "hpcg: --peer must be cusparse, not '{}'", o.peer);

  // run_hpcg checks the values, the report directory and the memory before it starts.
  auto results = hpcg::run_hpcg(p, comm);
  if (comm.rank() == 0) {
    // The summary first: if the report cannot be written, the figures are still on stdout.
    fmt::print("{}", hpcg::summary(results));
    std::fflush(stdout);
    fmt::print("report: {}\n", hpcg::write_report(results));
  }
  return results.valid() ? 0 : 2;
}

}  // namespace

void add_hpcg(CLI::App& app) {
  auto o = std::make_shared<HpcgOptions>();
  auto* cmd = app.add_subcommand("hpcg", "HPCG 3.1: CG with a multigrid preconditioner on a 27-point stencil");
  cmd->add_option("--dat", o->dat, "hpcg.dat (2 header lines, 'nx ny nz', run time); default ./hpcg.dat if present");
  cmd->add_option("--nx", o->nx, "local grid points in x (multiple of 8, at least 16)");
  cmd->add_option("--ny", o->ny, "local grid points in y (default: nx)");
  cmd->add_option("--nz", o->nz, "local grid points in z (default: nx)");
  cmd->add_option("--rt", o->rt,
                  "seconds of the timed phase, which ends at the first CG set boundary after it; setup, validation and "
                  "profiling come on top (official: at least 1800)");
  cmd->add_option("--npx", o->npx, "process grid in x (with --npy --npz; default: most cubic)");
  cmd->add_option("--npy", o->npy, "process grid in y");
  cmd->add_option("--npz", o->npz, "process grid in z");
  cmd->add_option("--kernels", o->kernels, "ref (the reference kernels, CPU) or optimized")->capture_default_str();
  cmd->add_option("--device", o->device, "cpu, cuda (one GPU per rank) or cuda:N")->capture_default_str();
  cmd->add_option("--report-dir", o->report_dir, "where the report .txt goes")->capture_default_str();
  cmd->add_option("--copy-bandwidth", o->copy_bandwidth_gbs, "GB/s to rate against (default: measured in the run)");
  cmd->add_option("--peer", o->peer, "run a peer instead: cusparse (cuSPARSE CSR SpMV on the same matrix)");
  cmd->callback([o] {
    if (int rc = run(*o); rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace kiln::cli
