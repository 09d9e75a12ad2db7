#include "kiln/hpc/md/mdrun.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <random>

#include "kiln/hpc/md/atomic_write.h"
#include "kiln/hpc/md/dispersion_correction.h"
#include "kiln/hpc/md/domain_decomposition.h"
#include "kiln/hpc/md/ewald_parameters.h"
#include "kiln/hpc/md/lincs.h"
#include "kiln/hpc/md/mdp_options.h"
#include "kiln/hpc/md/topology.h"
#include "kiln/hpc/md/trajectory_files.h"
#include "kiln/hpc/md/trajectory_output.h"
#include "kiln/hpc/md/units.h"
#include "kiln/hpc/md/velocities.h"
#include "kiln/hpc/md/verlet_buffer.h"
#include "kiln/runtime/error.h"

namespace kiln::md {

namespace fs = std::filesystem;

namespace {

// Pair-list buffer when verlet-buffer-tolerance is set. GROMACS sizes it from an estimate of the
// energy error; kiln keeps the list exact instead, rebuilding early once two atoms could together
// have crossed the buffer, so the buffer only trades list size against rebuild frequency.
constexpr double kDefaultBuffer = 0.1;  // nm

// The .xtc and .trr files of a run, fed by the engine's on_frame.
class Trajectories {
 public:
  Trajectories(const MdrunSetup& setup, const fs::path& outdir) {
    const MdpOptions& o = setup.settings.mdp;
    if (o.nstxout_compressed == 0 && o.nstxout == 0 && o.nstvout == 0 && o.nstfout == 0) return;
    KILN_CHECK(!setup.settings.use_gpu,
               "mdrun: trajectories ({}: nstxout-compressed {}, nstxout {}, nstvout {}, nstfout {}) are written by the "
               "CPU engine only so far; use --device cpu, or set them to 0",
               o.source, o.nstxout_compressed, o.nstxout, o.nstvout, o.nstfout);
    std::optional<std::int64_t> resume_step;
    if (setup.settings.resume) resume_step = setup.settings.resume->next_step;
    if (o.nstxout_compressed > 0)
      xtc_ = std::make_unique<TrajectoryOutput>(setup.xtc_path.empty() ? outdir / "traj.xtc" : setup.xtc_path,
                                                resume_step, xtc_bytes_before_step);
    if (o.nstxout > 0 || o.nstvout > 0 || o.nstfout > 0)
      trr_ = std::make_unique<TrajectoryOutput>(setup.trr_path.empty() ? outdir / "traj.trr" : setup.trr_path,
                                                resume_step, trr_bytes_before_step);
  }

  std::vector<const TrajectoryOutput*> files() const {
    std::vector<const TrajectoryOutput*> out;
    for (const auto* t : {xtc_.get(), trr_.get()})
      if (t) out.push_back(t);
    return out;
  }

  void write(const MdpOptions& o, const StepState& s) {
    auto due = [&](std::int64_t every) { return every > 0 && s.step % every == 0; };
    if (xtc_ && due(o.nstxout_compressed))
      xtc_->append(encode_xtc_frame(s.step, s.time, s.box, s.positions, o.compressed_x_precision));
    if (trr_ && (due(o.nstxout) || due(o.nstvout) || due(o.nstfout)))
      trr_->append(encode_trr_frame(s.step, s.time, s.box, due(o.nstxout) ? &s.positions : nullptr,
                                    due(o.nstvout) ? &s.velocities : nullptr, due(o.nstfout) ? &s.forces : nullptr));
  }

  // For the log: which file gets what.
  std::string describe(const MdpOptions& o) const {
    std::string out;
    if (xtc_)
      out += fmt::format("trajectory {}: positions every {} steps at {} per nm\n", xtc_->path().string(),
                         o.nstxout_compressed, o.compressed_x_precision);
    if (trr_)
      out += fmt::format("trajectory {}: positions every {}, velocities every {}, forces every {} steps (0: none)\n",
                         trr_->path().string(), o.nstxout, o.nstvout, o.nstfout);
    return out;
  }

  // Before a checkpoint claims the frames up to its step, they go to the disk.
  void sync() {
    for (auto* t : {xtc_.get(), trr_.get()})
      if (t) t->sync();
  }

 private:
  std::unique_ptr<TrajectoryOutput> xtc_, trr_;
};

// Opens the files and routes the engine's frames (and its checkpoints, after a sync) through them.
std::unique_ptr<Trajectories> open_trajectories(const MdrunSetup& setup, const fs::path& outdir,
                                                EngineSettings& settings) {
  auto t = std::make_unique<Trajectories>(setup, outdir);
  if (t->files().empty()) return t;
  Trajectories* files = t.get();
  settings.on_frame = [files, o = settings.mdp](const StepState& s) { files->write(o, s); };
  if (settings.on_checkpoint)
    settings.on_checkpoint = [files, write = settings.on_checkpoint](const EngineCheckpoint& c) {
      files->sync();
      write(c);
    };
  return t;
}

}  // namespace

MdrunSetup prepare_mdrun(const fs::path& gro, const fs::path& top, const fs::path& mdp_path) {
  MdrunSetup s;
  MdpOptions mdp = read_mdp(mdp_path);
  TopologyOptions topts;
  topts.defines = mdp.defines;
  s.system = read_topology(top, topts);
  if (mdp.h_bond_constraints) constrain_h_bonds(s.system);
  s.frame = read_gro(gro);
  const MdSystem& sys = s.system;
  KILN_CHECK(static_cast<int>(s.frame.positions.size()) == sys.atom_count,
             "{} has {} atoms but the topology {} has {} ([ molecules ] counts)", gro.string(),
             s.frame.positions.size(), top.string(), sys.atom_count);
  int name_mismatches = 0;
  for (int i = 0; i < sys.atom_count; ++i)
    if (s.frame.atom_names[i] != sys.atom_names[i] && name_mismatches++ == 0)
      s.notes.push_back(fmt::format("warning: atom {} is '{}' in {} but '{}' in the topology (as grompp, only warned)",
                                    i + 1, s.frame.atom_names[i], gro.string(), sys.atom_names[i]));
  const Vec3& box = s.frame.box;
  const double rc = std::max(mdp.rcoulomb, mdp.rvdw);
  double min_box = std::min({box[0], box[1], box[2]});
  KILN_CHECK(min_box >= 2 * rc,
             "{}: the box ({:.5f} x {:.5f} x {:.5f} nm) is smaller than twice the cut-off (2 x {} "
             "nm); use a larger box or a shorter rcoulomb/rvdw",
             gro.string(), box[0], box[1], box[2], rc);
  EngineSettings& e = s.settings;
  e.mdp = mdp;
  e.cutoff = rc;
  double rlist = mdp.verlet_buffer_tolerance > 0 ? rc + kDefaultBuffer : std::max(mdp.rlist, rc);
  if (rlist > 0.5 * min_box) {
    s.notes.push_back(fmt::format("rlist {:.3f} nm capped at half the box, {:.3f} nm", rlist, 0.5 * min_box));
    rlist = 0.5 * min_box;
  }
  e.rlist = rlist;
  std::string electrostatics;
  if (mdp.coulombtype == CoulombType::ReactionField) {
    // GROMACS: k_rf = (eps_rf - eps_r) / ((2 eps_rf + eps_r) rc^3), 1 / (2 rc^3) for eps_rf = 0
    // (infinity); the potential is shifted to 0 at rc by c_rf.
    e.reaction_field = true;
    e.k_rf =
        mdp.epsilon_rf == 0 ? 1 / (2 * rc * rc * rc) : (mdp.epsilon_rf - 1) / ((2 * mdp.epsilon_rf + 1) * rc * rc * rc);
    e.c_rf = 1 / rc + e.k_rf * rc * rc;
    electrostatics = fmt::format("reaction-field epsilon-rf {} (k_rf {:.6f} nm^-3, c_rf {:.6f} nm^-1)", mdp.epsilon_rf,
                                 e.k_rf, e.c_rf);
  } else {
    e.beta = ewald_coefficient(rc, mdp.ewald_rtol);
    e.pme_grid =
        pme_grid_size(box, mdp.fourierspacing, mdp.pme_order, {mdp.fourier_n[0], mdp.fourier_n[1], mdp.fourier_n[2]});
    electrostatics = fmt::format("PME beta {:.6f} nm^-1, grid {}x{}x{}, order {}", e.beta, e.pme_grid[0], e.pme_grid[1],
                                 e.pme_grid[2], mdp.pme_order);
  }
  e.degrees_of_freedom = 3 * sys.atom_count - sys.constraint_count() - (mdp.comm_mode == ComMode::Linear ? 3 : 0);
  s.initial.positions = s.frame.positions;
  s.initial.box = box;
  if (mdp.gen_vel) {
    std::uint64_t seed = mdp.gen_seed >= 0 ? static_cast<std::uint64_t>(mdp.gen_seed) : std::random_device{}();
    s.initial.velocities = maxwell_velocities(sys, mdp.gen_temp, seed);
    s.notes.push_back(fmt::format("velocities generated at {} K with seed {}", mdp.gen_temp, seed));
  } else if (!s.frame.velocities.empty()) {
    s.initial.velocities = s.frame.velocities;
  } else {
    s.initial.velocities.assign(sys.atom_count, Vec3{0, 0, 0});
    s.notes.push_back(fmt::format("{} has no velocities and gen-vel = no: starting from rest", gro.string()));
  }
  s.notes.push_back(fmt::format("cut-off {} nm, pair list {:.3f} nm every {} steps; {}; {} degrees of freedom", rc,
                                rlist, mdp.nstlist, electrostatics, e.degrees_of_freedom));
  // As GROMACS's "Long Range LJ corr.: <C6>" line; the engines build their own (the averages are cheap).
  if (mdp.dispcorr != DispCorr::No) s.notes.push_back(DispersionCorrection(sys, mdp.dispcorr, rc).describe());
  return s;
}

void plan_gpu_pair_lists(MdrunSetup& setup, int nstlist_override, bool dynamic_pruning) {
  EngineSettings& e = setup.settings;
  MdpOptions& o = e.mdp;
  KILN_CHECK(nstlist_override >= 0, "mdrun: --nstlist {} must be positive", nstlist_override);
  if (o.verlet_buffer_tolerance <= 0) {
    if (nstlist_override > 0) o.nstlist = nstlist_override;
    return;
  }
  // The temperature the buffer is sized for, as GROMACS: the reference temperature with a
  // thermostat; in NVE gen-temp, or that of the starting velocities.
  double temperature = o.ref_t;
  const bool nve = o.tcoupl == Thermostat::None;
  if (nve) {
    if (o.gen_vel) {
      temperature = o.gen_temp;
    } else {
      double ke = 0;
      for (int i = 0; i < setup.system.atom_count; ++i)
        ke += 0.5 * setup.system.masses[i] * dot(setup.initial.velocities[i], setup.initial.velocities[i]);
      temperature = e.degrees_of_freedom > 0 ? 2 * ke / (e.degrees_of_freedom * kBoltzmann) : 0.0;
    }
  }
  if (temperature <= 0) {
    if (nstlist_override > 0) o.nstlist = nstlist_override;
    setup.notes.push_back(
        fmt::format("NVE from 0 K: the pair list keeps rlist {:.3f} nm, nstlist {}", e.rlist, o.nstlist));
    return;
  }
  VerletBufferInput in;
  in.cutoff = e.cutoff;
  in.beta = e.beta;
  in.reaction_field = e.reaction_field;
  in.epsilon_rf = o.epsilon_rf;
  in.dt = o.dt;
  in.tolerance = o.verlet_buffer_tolerance;
  in.temperature = temperature;
  in.volume = setup.initial.box[0] * setup.initial.box[1] * setup.initial.box[2];
  // GROMACS does not raise nstlist in NVE (the buffer estimate then rests on one temperature).
  const int mdp_nstlist = o.nstlist;
  const int forced = nve && nstlist_override <= 0 ? mdp_nstlist : nstlist_override;
  PairListPlan plan = plan_pair_lists(setup.system, in, mdp_nstlist, setup.initial.box, true, forced, dynamic_pruning);
  setup.notes.push_back(
      fmt::format("Verlet buffer for a tolerance of {} kJ/mol/ps at {:g} K", in.tolerance, temperature));
  for (const auto& line : plan.log) setup.notes.push_back(line);
  KILN_CHECK(plan.rlist <= 0.5 * std::min({setup.initial.box[0], setup.initial.box[1], setup.initial.box[2]}),
             "mdrun: rlist {:.3f} nm for nstlist {} does not fit the box (half its smallest edge); lower nstlist",
             plan.rlist, plan.nstlist);
  o.nstlist = plan.nstlist;
  e.rlist = plan.rlist;
  e.nstlist_prune = plan.dynamic_pruning ? plan.nstlist_prune : 0;
  e.rlist_inner = plan.dynamic_pruning ? plan.rlist_inner : 0;
  e.prune_parts = plan.dynamic_pruning ? plan.rolling_parts : 1;
}

std::string format_energies(const StepEnergies& e, const MdSystem& system) {
  auto terms = named_terms(e, system);
  std::string out =
      fmt::format("{:>15}{:>15}\n{:>15}{:>15.5f}\n\n   Energies (kJ/mol)\n", "Step", "Time", e.step, e.time);
  for (size_t k = 0; k < terms.size(); k += 5) {
    std::string names, values;
    for (size_t j = k; j < std::min(k + 5, terms.size()); ++j) {
      names += fmt::format("{:>15}", terms[j].first);
      values += fmt::format("{:>15.6e}", terms[j].second);
    }
    out += names + "\n" + values + "\n";
  }
  return out + "\n";
}

std::string format_performance(const MdrunResult& r) {
  return fmt::format(
      "               Core t (s)   Wall t (s)        (%)\n       Time:{:>13.3f}{:>13.3f}{:>11.1f}\n"
      "                 (ns/day)    (hour/ns)\nPerformance:{:>13.3f}{:>13.3f}\n",
      r.wall_seconds * r.ranks, r.wall_seconds, 100.0 * r.ranks, r.ns_per_day, r.hours_per_ns);
}

std::string energies_json(const std::vector<StepEnergies>& energies, const MdSystem& system) {
  nlohmann::json frames = nlohmann::json::array();
  for (const auto& e : energies) {
    nlohmann::json f = {{"step", e.step}, {"time", e.time}};
    for (const auto& [name, value] : named_terms(e, system)) f[name] = value;
    frames.push_back(f);
  }
  return nlohmann::json{{"units", {{"energy", "kJ/mol"}, {"Temperature", "K"}, {"time", "ps"}}}, {"frames", frames}}
             .dump(1) +
         "\n";
}

void use_domain_decomposition(MdrunSetup& setup, const dist::Communicator& comm, std::array<int, 3> requested) {
  const int ranks = comm.size();
  if (ranks == 1 && (requested == std::array<int, 3>{0, 0, 0} || requested == std::array<int, 3>{1, 1, 1})) return;
  EngineSettings& s = setup.settings;
  KILN_CHECK(!s.use_gpu,
             "mdrun: --device cuda with {} MPI ranks: the CUDA engine has no domain decomposition yet (one GPU per "
             "rank, halo exchange of device buffers); run it on one rank, or use --device cpu for the CPU engine's "
             "domain decomposition",
             ranks);
  s.dd_grid = choose_domain_grid(ranks, setup.initial.box, s.rlist, s.cutoff, requested);
  s.dd_comm = std::make_shared<const dist::Communicator>(comm);
  const Vec3& box = setup.initial.box;
  setup.notes.push_back(fmt::format(
      "domain decomposition: {} x {} x {} domains of {:.4f} x {:.4f} x {:.4f} nm over {} MPI ranks; update groups "
      "(molecules) on the rank of their centre, halo rlist {} nm + the largest group radius",
      s.dd_grid[0], s.dd_grid[1], s.dd_grid[2], box[0] / s.dd_grid[0], box[1] / s.dd_grid[1], box[2] / s.dd_grid[2],
      ranks, s.rlist));
  if (!s.reaction_field)
    setup.notes.push_back(
        s.pme_decomposition == PmeDecomposition::Slab
            ? fmt::format("PME: the {} x {} x {} grid's planes along {} split over the ranks (slab decomposition, "
                          "--pme-decomposition slab)",
                          s.pme_grid[0], s.pme_grid[1], s.pme_grid[2], "xyz"[slab_axis_for(s.dd_grid)])
            : fmt::format("PME: every rank solves the whole {} x {} x {} grid, all-reduced (--pme-decomposition "
                          "replicated)",
                          s.pme_grid[0], s.pme_grid[1], s.pme_grid[2]));
}

MdrunResult run_mdrun(const MdrunSetup& setup, const fs::path& outdir, std::FILE* log) {
  // Domain decomposition: every rank runs the engine, rank 0 alone logs and writes.
  const bool root = !setup.settings.dd_comm || setup.settings.dd_comm->rank() == 0;
  if (!root) log = nullptr;
  const std::int64_t first_step = setup.settings.resume ? setup.settings.resume->next_step : 0;
  const std::int64_t nsteps = setup.settings.mdp.nsteps;
  // The first energy frame at or after half-way (frames come every nstenergy steps and at the last).
  const std::int64_t nstenergy = setup.settings.mdp.nstenergy;
  const std::int64_t halfway = first_step + (nsteps - first_step) / 2;
  const std::int64_t reset_step = (halfway + nstenergy - 1) / nstenergy * nstenergy;
  KILN_CHECK(!setup.reset_halfway || reset_step < nsteps,
             "mdrun: --resethway needs an energy frame in the run's second half before its last step "
             "(steps {} to {}): nstenergy {} has none; lower nstenergy (e.g. {})",
             halfway, nsteps - 1, nstenergy, std::max<std::int64_t>(1, (nsteps - first_step) / 4));
  if (root) fs::create_directories(outdir);
  MdrunResult result;
  result.ranks = setup.settings.dd_comm ? setup.settings.dd_comm->size() : 1;
  EngineSettings settings = setup.settings;
  MdrunSetup no_files;  // the other ranks open no trajectory files, but take part in gathering the frames
  std::unique_ptr<Trajectories> trajectories;
  if (root) {
    trajectories = open_trajectories(setup, outdir, settings);
  } else {
    no_files.settings.mdp = setup.settings.mdp;
    no_files.settings.mdp.nstxout_compressed = no_files.settings.mdp.nstxout = 0;
    no_files.settings.mdp.nstvout = no_files.settings.mdp.nstfout = 0;
    trajectories = std::make_unique<Trajectories>(no_files, outdir);
    const MdpOptions& o = setup.settings.mdp;
    if (o.nstxout_compressed > 0 || o.nstxout > 0 || o.nstvout > 0 || o.nstfout > 0)
      settings.on_frame = [](const StepState&) {};
  }
  for (const auto* t : trajectories->files()) result.trajectories.push_back(t->path());
  auto engine = settings.use_gpu ? make_cuda_engine(setup.system, settings, setup.initial)
                                 : make_cpu_engine(setup.system, settings, setup.initial);
  result.engine = engine->name();
  std::string log_text =
      setup.settings.use_gpu
          ? fmt::format("kiln mdrun: {} atoms, {} steps of {} ps, {} engine\n", setup.system.atom_count,
                        setup.settings.mdp.nsteps, setup.settings.mdp.dt, result.engine)
          : fmt::format("kiln mdrun: {} atoms, {} steps of {} ps, {} engine, {} thread(s)\n", setup.system.atom_count,
                        setup.settings.mdp.nsteps, setup.settings.mdp.dt, result.engine, setup.settings.threads);
  for (const auto& n : setup.notes) log_text += n + "\n";
  log_text += trajectories->describe(settings.mdp);
  log_text += "\n";
  if (log) std::fputs(log_text.c_str(), log);
  auto start = std::chrono::steady_clock::now();
  std::int64_t timed_from = first_step;
  engine->run([&](const StepEnergies& e) {
    // The energies of a frame are on the host once the callback runs (the CUDA engine has synchronised),
    // so the clock restarts after every step up to this one has finished.
    if (setup.reset_halfway && e.step == reset_step) {
      start = std::chrono::steady_clock::now();
      timed_from = e.step;
    }
    result.energies.push_back(e);
    std::string block = format_energies(e, setup.system);
    log_text += block;
    if (log) {
      std::fputs(block.c_str(), log);
      std::fflush(log);
    }
  });
  result.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.counters = engine->counters();
  result.timed_steps = nsteps - timed_from;
  double simulated_ns = static_cast<double>(result.timed_steps) * setup.settings.mdp.dt * 1e-3;
  if (simulated_ns > 0 && result.wall_seconds > 0) {
    result.ns_per_day = simulated_ns / result.wall_seconds * 86400.0;
    result.hours_per_ns = 24.0 / result.ns_per_day;
  }
  std::string tail =
      setup.settings.use_gpu
          ? fmt::format(
                "pair list: {} builds, {} cluster pairs (8x8); the two largest displacements reached the buffer "
                "at {} steps{}\n\n",
                result.counters.pair_list_builds, result.counters.cluster_pairs, result.counters.buffer_exceeded_steps,
                setup.settings.nstlist_prune > 0
                    ? fmt::format("\npruned list: {} prunes, {} cluster pairs after the last; atom pairs within the "
                                  "cut-off that pruning dropped (counted at energy steps): {}",
                                  result.counters.prunes, result.counters.inner_cluster_pairs,
                                  result.counters.pruned_pairs_in_cutoff)
                    : std::string())
          : fmt::format("pair list: {} builds ({} early), {} pairs\n{}\n", result.counters.pair_list_builds,
                        result.counters.early_rebuilds, result.counters.pairs_in_list,
                        result.ranks > 1 ? fmt::format("domain decomposition: {} atoms moved to another rank at "
                                                       "search steps\n",
                                                       result.counters.migrated_atoms)
                                         : std::string());
  if (result.counters.pme_calls > 0) {
    const double calls = static_cast<double>(result.counters.pme_calls);
    tail += result.ranks > 1
                ? fmt::format(
                      "PME ({} over {} ranks): {} calls, {:.3f} ms a call (the slowest rank), {:.0f} bytes a "
                      "call sent between ranks (all ranks)\n",
                      pme_decomposition_name(setup.settings.pme_decomposition), result.ranks, result.counters.pme_calls,
                      1e3 * result.counters.pme_seconds / calls,
                      static_cast<double>(result.counters.pme_bytes_sent) / calls)
                : fmt::format("PME: {} calls, {:.3f} ms a call\n", result.counters.pme_calls,
                              1e3 * result.counters.pme_seconds / calls);
  }
  if (setup.reset_halfway)
    tail += fmt::format("performance counted over steps {} to {} (--resethway)\n", timed_from, nsteps);
  tail += format_performance(result);
  log_text += tail;
  if (log) std::fputs(tail.c_str(), log);

  if (!root) return result;
  MdState final_state = engine->state();
  GroFrame out = setup.frame;
  out.title = fmt::format("{} (kiln mdrun, step {})", setup.system.name, setup.settings.mdp.nsteps);
  out.positions = final_state.positions;
  out.velocities = final_state.velocities;
  write_gro(outdir / "confout.gro", out);
  write_file_atomically(outdir / "energy.json", energies_json(result.energies, setup.system));
  write_file_atomically(outdir / "md.log", log_text);
  return result;
}

}  // namespace kiln::md
