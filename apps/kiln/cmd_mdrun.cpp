// `kiln mdrun`: molecular dynamics from GROMACS inputs (.gro, .top, .mdp), grompp and mdrun in one.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>

#include "commands.h"
#include "kiln/dist/communicator.h"
#include "kiln/hpc/md/mdrun.h"
#include "kiln/runtime/backend.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/error.h"

namespace kiln::cli {

namespace {

struct MdrunOptions {
  std::string gro, top, mdp, outdir = ".";
  std::optional<std::int64_t> nsteps;
  int threads = 0;
  std::string device;  // empty: cuda:0 when there is a GPU, else cpu
  std::string precision;
  std::string cpi, cpo;  // checkpoint to resume from; to write (default <outdir>/state.cpt)
  std::int64_t cpt_steps = 0;
  bool resethway = false;
  std::string xtc, trr;  // trajectory files (default <outdir>/traj.xtc, traj.trr)
  int nstlist = 0;       // gmx mdrun -nstlist (0: chosen as gmx mdrun does)
  // GROMACS's default (first run on a GPU 2026-12-05: its tests pass, 1.17-1.46x the single list).
  std::string prune = "on";
  std::vector<int> dd;                     // gmx mdrun -dd nx ny nz (empty: chosen from the ranks and the box)
  std::string pme_decomposition = "slab";  // PME under domain decomposition (pme_decomposition.h)
};

void run(const MdrunOptions& o) {
  auto setup = md::prepare_mdrun(o.gro, o.top, o.mdp);
  if (o.nsteps) {
    KILN_CHECK(*o.nsteps >= 0, "mdrun: --nsteps {} must be >= 0", *o.nsteps);
    setup.settings.mdp.nsteps = *o.nsteps;
  }
  KILN_CHECK(o.threads >= 0, "mdrun: --nt {} must be >= 0 (0: every hardware thread)", o.threads);
  // Under mpirun (domain decomposition) the ranks share the hardware threads.
  const dist::Communicator world = dist::Communicator::world();
  setup.settings.threads =
      o.threads > 0
          ? o.threads
          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / world.split_node_local().size());
  const Device device = o.device.empty() ? (device_count(DeviceKind::CUDA) > 0 ? Device::cuda(0) : Device::cpu())
                                         : Device::parse(o.device);
  KILN_CHECK(device.is_cpu() || device.is_cuda(), "mdrun: --device {} is neither cpu nor cuda[:N]", o.device);
  setup.settings.use_gpu = device.is_cuda();
  setup.settings.gpu_index = device.is_cuda() ? device.index : 0;
  KILN_CHECK(o.precision.empty() || o.precision == "mixed" || o.precision == "double",
             "mdrun: --precision {} is not mixed or double", o.precision);
  KILN_CHECK(!(device.is_cpu() && o.precision == "mixed"),
             "mdrun: --precision mixed is for the CUDA engine; the CPU engine is double precision throughout");
  setup.settings.gpu_double = o.precision == "double";
  KILN_CHECK(o.cpt_steps >= 0, "mdrun: --cpt-steps {} must be >= 0", o.cpt_steps);
  if (o.cpt_steps > 0) {
    const std::string cpo = o.cpo.empty() ? o.outdir + "/state.cpt" : o.cpo;
    std::filesystem::create_directories(std::filesystem::path(cpo).parent_path().empty()
                                            ? std::filesystem::path(".")
                                            : std::filesystem::path(cpo).parent_path());
    setup.settings.checkpoint_steps = o.cpt_steps;
    setup.settings.on_checkpoint = [cpo](const md::EngineCheckpoint& c) { md::write_checkpoint(cpo, c); };
  }
  if (!o.cpi.empty()) {
    auto c = std::make_shared<md::EngineCheckpoint>(md::read_checkpoint(o.cpi, setup.system.atom_count));
    KILN_CHECK(c->next_step <= setup.settings.mdp.nsteps, "mdrun: --cpi {} continues at step {}, beyond nsteps {}",
               o.cpi, c->next_step, setup.settings.mdp.nsteps);
    setup.notes.push_back(fmt::format("continuing from {} at step {}", o.cpi, c->next_step));
    setup.settings.resume = std::move(c);
  }
  KILN_CHECK(o.prune == "on" || o.prune == "off", "mdrun: --prune {} is not on or off", o.prune);
  if (setup.settings.use_gpu) {
    md::plan_gpu_pair_lists(setup, o.nstlist, o.prune == "on");
  } else if (o.nstlist > 0) {
    setup.settings.mdp.nstlist = o.nstlist;  // the CPU engine's list stays exact: only the interval
  }
  KILN_CHECK(o.dd.empty() || o.dd.size() == 3, "mdrun: --dd takes three numbers (nx ny nz), got {}", o.dd.size());
  setup.settings.pme_decomposition = md::parse_pme_decomposition(o.pme_decomposition);
  md::use_domain_decomposition(
      setup, world, o.dd.empty() ? std::array<int, 3>{0, 0, 0} : std::array<int, 3>{o.dd[0], o.dd[1], o.dd[2]});
  setup.reset_halfway = o.resethway;
  setup.xtc_path = o.xtc;
  setup.trr_path = o.trr;
  auto result = md::run_mdrun(setup, o.outdir, stdout);
  if (world.rank() != 0) return;
  std::string trajectories;
  for (const auto& t : result.trajectories) trajectories += ", " + t.string();
  fmt::print("wrote {0}/confout.gro, {0}/energy.json, {0}/md.log{1}\n", o.outdir, trajectories);
}

}  // namespace

void add_mdrun(CLI::App& app) {
  auto o = std::make_shared<MdrunOptions>();
  auto* cmd = app.add_subcommand(
      "mdrun", "Molecular dynamics from GROMACS files (grompp + mdrun): leap-frog, PME, SETTLE, v-rescale");
  cmd->add_option("-s,-c,--gro", o->gro, "coordinates (.gro; velocities used when present)")->required();
  cmd->add_option("-p,--top", o->top,
                  "topology (.top; #include resolved beside it, then $GMXLIB, then "
                  "/usr/share/gromacs/top)")
      ->required();
  cmd->add_option("-f,--mdp", o->mdp, "run parameters (.mdp; unsupported options are refused by name)")->required();
  cmd->add_option("-o,--outdir", o->outdir, "folder for confout.gro, energy.json and md.log")->capture_default_str();
  cmd->add_option("--nsteps", o->nsteps, "override the .mdp's nsteps (as gmx mdrun -nsteps)");
  cmd->add_option("--nt,--threads", o->threads, "CPU threads for the pair interactions (0: all hardware threads)")
      ->capture_default_str();
  cmd->add_option("--device", o->device, "cpu, cuda or cuda:N (default: cuda:0 when there is a GPU, else cpu)");
  cmd->add_option("--precision", o->precision,
                  "the CUDA engine's arithmetic: mixed (float forces, double update; the default) or double");
  cmd->add_option("--cpt-steps", o->cpt_steps,
                  "write a checkpoint every this many steps and at the last step (0: none), atomically, to --cpo");
  cmd->add_option("--cpo", o->cpo, "checkpoint file to write (default <outdir>/state.cpt)");
  cmd->add_option("--cpi", o->cpi,
                  "continue from this checkpoint (as gmx mdrun -cpi; bit for bit the run that wrote it)");
  cmd->add_option("-x,--xtc", o->xtc,
                  "compressed trajectory (.xtc) for nstxout-compressed (default <outdir>/traj.xtc; as gmx mdrun -x)");
  cmd->add_option("--trr", o->trr,
                  "full-precision trajectory (.trr) for nstxout, nstvout, nstfout (default <outdir>/traj.trr; gmx "
                  "mdrun's -o, which names kiln's output folder)");
  cmd->add_option("--nstlist", o->nstlist,
                  "pair-list interval (as gmx mdrun -nstlist; default: the GPU engine raises the .mdp's as gmx mdrun "
                  "does for a GPU, with rlist from verlet-buffer-tolerance)");
  cmd->add_option("--prune", o->prune,
                  "the GPU engine's dynamic pruning of an inner pair list: on (GROMACS's default) or off (one list)")
      ->capture_default_str();
  cmd->add_option("--dd", o->dd,
                  "domain decomposition grid nx ny nz under mpirun -np nx*ny*nz (as gmx mdrun -dd; CPU engine; "
                  "default: chosen from the ranks and the box)")
      ->expected(3);
  cmd->add_option("--pme-decomposition", o->pme_decomposition,
                  "PME under domain decomposition: slab (the grid's x-planes split over the ranks, distributed FFT) "
                  "or replicated (every rank solves the whole all-reduced grid)")
      ->capture_default_str();
  cmd->add_flag("--resethway", o->resethway,
                "as gmx mdrun -resethway: ns/day counted from the first energy frame in the second half "
                "(needs nstenergy <= half the steps)");
  cmd->footer(
      "Energies use gmx energy's names (LJ (SR), Coulomb (SR), Coul. recip., Potential, Kinetic En., Total "
      "Energy, Conserved En., Temperature, Pressure in bar). See docs/mdrun.md.");
  cmd->callback([o] { run(*o); });
}

}  // namespace kiln::cli
