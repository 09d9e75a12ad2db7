#include "kiln/hpc/md/cpu_engine.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <random>

#include "kiln/hpc/md/bonded.h"
#include "kiln/hpc/md/crescale.h"
#include "kiln/hpc/md/domain_decomposition.h"
#include "kiln/hpc/md/lincs.h"
#include "kiln/hpc/md/settle.h"
#include "kiln/hpc/md/units.h"
#include "kiln/hpc/md/velocities.h"
#include "kiln/hpc/md/vrescale.h"
#include "kiln/runtime/error.h"

namespace kiln::md {

CpuForceField::CpuForceField(const MdSystem& system, const EngineSettings& settings)
    : system_(&system), settings_(settings), dispersion_(system, settings.mdp.dispcorr, settings.cutoff) {
  if (!settings.reaction_field) pme_ = std::make_unique<Pme>(settings.pme_grid, settings.mdp.pme_order, settings.beta);
}

void CpuForceField::use_local_system(const MdSystem& local, int home_count) {
  system_ = &local;
  home_count_ = home_count;
}

void CpuForceField::use_domain_decomposition(std::function<void(std::span<double>)> grid_sum, bool root, int ranks) {
  if (pme_ && grid_sum) {
    const auto& g = pme_->grid();
    const std::int64_t grid_bytes = static_cast<std::int64_t>(g[0]) * g[1] * g[2] * sizeof(double);
    replicated_grid_bytes_ = 2 * (ranks - 1) * grid_bytes / ranks;
  }
  if (pme_) pme_->set_grid_reduction(std::move(grid_sum));
  counts_global_terms_ = root;
}

void CpuForceField::use_slab_pme(const dist::Communicator& comm, int slab_axis) {
  if (!pme_) return;  // reaction-field
  slab_pme_ = std::make_unique<SlabPme>(pme_->grid(), pme_->order(), settings_.beta, comm, slab_axis);
  pme_.reset();
}

void CpuForceField::build_pair_list(const std::vector<Vec3>& x, const Vec3& box) {
  list_.build(*system_, x, box, settings_.rlist, home_count_);
}

void CpuForceField::compute(const std::vector<Vec3>& x, const Vec3& box, std::vector<Vec3>& forces, StepEnergies& e) {
  const MdSystem& system = *system_;
  forces.assign(x.size(), Vec3{0, 0, 0});
  auto sr = compute_short_range(system, list_,
                                {settings_.cutoff, settings_.beta, settings_.threads, settings_.reaction_field,
                                 settings_.k_rf, settings_.c_rf, home_count_},
                                x, box, forces);
  e.lj = sr.lj;
  e.coulomb_sr = sr.coulomb;
  virial_ = sr.virial;
  e.has_recip = pme_ != nullptr || slab_pme_ != nullptr;
  e.coulomb_recip = 0;
  const auto pme_start = std::chrono::steady_clock::now();
  if (slab_pme_) {
    // Every rank's share of the energy and virial: the engine's ordered sum over ranks adds them.
    e.coulomb_recip = slab_pme_->compute(x, system.charges, box, forces, &virial_, home_count_);
    pme_counters_.bytes_sent += slab_pme_->bytes_sent_last_call();
  } else if (pme_ && counts_global_terms_) {
    e.coulomb_recip = pme_->compute(x, system.charges, box, forces, &virial_, home_count_);
    pme_counters_.bytes_sent += replicated_grid_bytes_;
  } else if (pme_) {
    // Every rank solves the same summed grid; its energy and virial count once, on the root.
    Mat3 unused{};
    pme_->compute(x, system.charges, box, forces, &unused, home_count_);
    pme_counters_.bytes_sent += replicated_grid_bytes_;
  }
  if (pme_ || slab_pme_) {
    pme_counters_.calls += 1;
    pme_counters_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - pme_start).count();
  }
  auto b = compute_bonded(system, x, box, forces);
  e.bond = b.bond;
  e.angle = b.angle;
  e.proper_dih = b.proper_dih;
  e.rb_dih = b.rb_dih;
  e.improper_dih = b.improper_dih;
  e.lj14 = b.lj14;
  e.coulomb14 = b.coulomb14;
  virial_ += b.virial;
  const auto dc = dispersion_.at(box[0] * box[1] * box[2]);
  e.has_dispcorr = dispersion_.enabled();
  e.disp_corr = dc.energy;
  e.pres_dc = dc.pressure;
  e.sum_potential();
}

namespace {

class CpuEngine final : public MdEngine {
 public:
  CpuEngine(const MdSystem& system, const EngineSettings& settings, MdState initial)
      : system_(system),
        settings_(settings),
        state_(std::move(initial)),
        forces_field_(system, settings),
        lincs_(std::make_unique<Lincs>(system, settings.mdp.lincs_order, settings.mdp.lincs_iter)) {
    std::uint64_t seed =
        settings.mdp.ld_seed >= 0 ? static_cast<std::uint64_t>(settings.mdp.ld_seed) : std::random_device{}();
    if (settings.dd_comm) {
      dd_ = std::make_unique<DomainDecomposition>(system, *settings.dd_comm, settings.dd_grid, settings.rlist,
                                                  settings.cutoff);
      // Every rank draws the thermostat's and barostat's numbers from the same stream (rank 0's seed).
      auto shared_seed = static_cast<std::int64_t>(seed);
      settings.dd_comm->broadcast(std::span<std::int64_t>(&shared_seed, 1), 0);
      seed = static_cast<std::uint64_t>(shared_seed);
      if (settings.pme_decomposition == PmeDecomposition::Slab) {
        forces_field_.use_domain_decomposition(nullptr, dd_->is_root(), dd_->size());
        forces_field_.use_slab_pme(*settings.dd_comm, slab_axis_for(dd_->grid()));
      } else {
        forces_field_.use_domain_decomposition([dd = dd_.get()](std::span<double> grid) { dd->sum_unordered(grid); },
                                               dd_->is_root(), dd_->size());
      }
    }
    rng_.seed(seed);
    set_masses();
  }

  std::string name() const override {
    return dd_ ? fmt::format("CPU (double precision), domain decomposition {} x {} x {} over {} ranks", dd_->grid()[0],
                             dd_->grid()[1], dd_->grid()[2], dd_->size())
               : "CPU (double precision)";
  }
  MdState state() const override { return state_; }
  EngineCounters counters() const override { return counters_; }

  void run(const std::function<void(const StepEnergies&)>& on_energies) override {
    const MdpOptions& o = settings_.mdp;
    const double dt = o.dt;
    auto& x = state_.positions;
    auto& v = state_.velocities;
    const Vec3& box = state_.box;
    const bool constrained = !system_.settles.empty() || !lincs_->empty();
    std::int64_t first_step = 0;
    double thermostat_work = 0;
    if (settings_.resume) {
      // Everything as the run that wrote the checkpoint had it before computing this step's forces.
      // The checkpoint is in the global atom order whatever the ranks that wrote it; every rank read it.
      const EngineCheckpoint& c = *settings_.resume;
      first_step = c.next_step;
      state_.box = c.box;
      if (dd_) {
        // The domains as at the last search step, where the atoms were when the list was built: a
        // decomposed run continues as the run that wrote it (on as many ranks) would have.
        std::vector<Vec3> list_home, v_home;
        dd_->distribute(c.list_positions, c.velocities, box, list_home, v_home);
        x.resize(list_home.size());
        for (int i = 0; i < dd_->home_count(); ++i) x[i] = c.positions[dd_->global_index(i)];
        v.swap(v_home);
        use_local_system();
        build_list(list_home, box);
      } else {
        x = c.positions;
        v = c.velocities;
        build_list(c.list_positions, box);
      }
      thermostat_work = c.thermostat_work;
      restore_generators(c.generators, rng_, barostat_noise_);
    } else {
      if (dd_) {
        // Every rank read the same files; the start is rank 0's all the same (gen-vel without a seed).
        broadcast_state(x, v);
        std::vector<Vec3> x_home, v_home;
        dd_->distribute(x, v, box, x_home, v_home);
        x.swap(x_home);
        v.swap(v_home);
        use_local_system();
      }
      if (!o.continuation && constrained) constrain_start(x, v, box, dt);
      if (o.comm_mode == ComMode::Linear) remove_com_velocity(v);
      rebuild(x, v, box, 0);
    }
    StepEnergies e;
    compute_forces(x, box, e);
    check_forces(first_step);
    double ke_half_old = kinetic_energy(v);
    Mat3 ke_tensor_old = kinetic_tensor(v);
    std::vector<Vec3> x_new, v_new, x_unconstrained;
    bool box_scaled = false;
    for (std::int64_t step = first_step; step <= o.nsteps; ++step) {
      const int n = static_cast<int>(x.size());  // home atoms (all of them on one rank)
      x_new.resize(n);
      v_new.resize(n);
      if (settings_.on_frame && trajectory_step(o, step)) write_frame(step, o.tinit + step * dt, x, v);
      // v(t + dt/2) = lambda v(t - dt/2) + a(t) dt, as GROMACS's leap-frog applies v-rescale:
      // lambda comes from, and scales, the last (constrained) half-step velocities, so the
      // thermostat changed the kinetic energy by exactly (lambda^2 - 1) times theirs.
      double lambda = 1, step_work = 0;
      if (o.tcoupl == Thermostat::VRescale) {
        lambda = vrescale_factor(ke_half_old);
        step_work = (lambda * lambda - 1) * ke_half_old;
      }
      for (int i = 0; i < n; ++i) v_new[i] = lambda * v[i] + (dt * inv_mass_[i]) * forces_[i];
      for (int i = 0; i < n; ++i) x_new[i] = x[i] + dt * v_new[i];
      Mat3 constraint_virial{};
      if (constrained) {
        x_unconstrained = x_new;
        settle_positions(local(), x, x_new, box);
        lincs_->apply(x, x_new, box, dt, &constraint_virial);
        // The velocity correction of both: v = (constrained x(t + dt) - x(t)) / dt.
        for (int i = 0; i < n; ++i) v_new[i] = (1 / dt) * (x_new[i] - x[i]);
        constraint_virial += settle_virial(local(), x, x_unconstrained, x_new, box, dt);
      }
      double ke_half_new = kinetic_energy(v_new);
      const bool couple_pressure = o.pressure_coupling && step % o.crescale.nstpcouple == 0;
      if (step % o.nstenergy == 0 || step == o.nsteps || couple_pressure) {
        e.step = step;
        e.time = o.tinit + step * dt;
        Mat3 ke_new = kinetic_tensor(v_new);
        double trace = 0;
        for (int k = 0; k < 3; ++k)
          trace += (ke_tensor_old[k][k] + ke_new[k][k]) + forces_field_.virial()[k][k] + constraint_virial[k][k];
        double rmsd = lincs_->rms_relative_deviation(x_new, box);
        if (dd_) sum_over_ranks(e, trace, rmsd);
        // Leap-frog's kinetic energy at t: the mean of the two half steps around it.
        e.kinetic = 0.5 * (ke_half_old + ke_half_new);
        e.total = e.potential + e.kinetic;
        // This step's scaling changed the half step after t, which is half of the kinetic energy at t.
        e.conserved = e.total - (thermostat_work + 0.5 * step_work);
        e.temperature =
            settings_.degrees_of_freedom > 0 ? 2 * e.kinetic / (settings_.degrees_of_freedom * kBoltzmann) : 0.0;
        // Pres. DC (compute() set it for this box) counts, as in GROMACS, for c-rescale below too.
        e.pressure = kPressureFactor * trace / (3 * box[0] * box[1] * box[2]) + e.pres_dc;
        e.constr_rmsd = rmsd;
        if (o.pressure_coupling) e.set_box_terms(box);
        if ((step % o.nstenergy == 0 || step == o.nsteps) && is_root()) on_energies(e);
      }
      if (couple_pressure && step < o.nsteps) {
        // c-rescale from this step's pressure, applied to x(t + dt), v(t + dt/2) and the box.
        const double volume = box[0] * box[1] * box[2];
        const double mu =
            crescale_mu(o.crescale, o.crescale.nstpcouple * dt, e.pressure, volume, o.ref_t, barostat_noise_(rng_));
        for (int i = 0; i < n; ++i) {
          x_new[i] = mu * x_new[i];
          v_new[i] = (1 / mu) * v_new[i];
        }
        for (int d = 0; d < 3; ++d) state_.box[d] *= mu;
        check_box_after_scaling(state_.box, settings_.rlist, step);
        ke_half_new = kinetic_energy(v_new);
        box_scaled = true;
      }
      thermostat_work += step_work;
      if (step == o.nsteps) break;  // the state stays at x(nsteps), v(nsteps - dt/2)
      x.swap(x_new);
      v.swap(v_new);
      ke_half_old = ke_half_new;
      ke_tensor_old = kinetic_tensor(v);
      if (o.comm_mode == ComMode::Linear && (step + 1) % o.nstcomm == 0) remove_com_velocity(v);
      // A scaled box moves every atom: the list is rebuilt (GROMACS keeps it to the next search and
      // sizes the buffer for that; kiln's exact-list check would not see the scaling).
      bool scheduled = (step + 1) % o.nstlist == 0 || box_scaled;
      box_scaled = false;
      if (scheduled || buffer_used_up(x, box)) {
        if (!scheduled) ++counters_.early_rebuilds;
        rebuild(x, v, box, step + 1);
      }
      // x and v now hold x(step + 1) and v(step + 1/2) as the next iteration uses them; at the last
      // step that iteration only reports energies, so this is also the final state.
      if (settings_.checkpoint_steps > 0 && settings_.on_checkpoint &&
          ((step + 1) % settings_.checkpoint_steps == 0 || step + 1 == o.nsteps))
        write_checkpoint(step + 1, x, v, thermostat_work);
      compute_forces(x, box, e);
      check_forces(step + 1);
    }
    const auto& pme = forces_field_.pme_counters();
    counters_.pme_calls = pme.calls;
    counters_.pme_seconds = pme.seconds;
    counters_.pme_bytes_sent = pme.bytes_sent;
    if (dd_) finish_domain_decomposition();
  }

 private:
  bool is_root() const { return !dd_ || dd_->is_root(); }
  // The system the arrays index: the whole one, or this rank's home atoms and halo.
  const MdSystem& local() const { return dd_ ? dd_->local_system() : system_; }

  void set_masses() {
    const MdSystem& s = local();
    const int n = dd_ ? dd_->home_count() : s.atom_count;
    inv_mass_.resize(n);
    for (int i = 0; i < n; ++i) inv_mass_[i] = 1.0 / s.masses[i];
  }

  // After the home atoms changed: masses, LINCS's coupling and the force field's system.
  void use_local_system() {
    set_masses();
    lincs_ = std::make_unique<Lincs>(local(), settings_.mdp.lincs_order, settings_.mdp.lincs_iter);
    forces_field_.use_local_system(local(), dd_->home_count());
  }

  void broadcast_state(std::vector<Vec3>& x, std::vector<Vec3>& v) {
    for (auto* a : {&x, &v}) settings_.dd_comm->broadcast(std::span<double>(&(*a)[0][0], 3 * a->size()), 0);
    settings_.dd_comm->broadcast(std::span<double>(&state_.box[0], 3), 0);
  }

  // The potential terms, the pressure's trace and LINCS's deviation summed over the ranks.
  void sum_over_ranks(StepEnergies& e, double& trace, double& rmsd) const {
    const double constraints = static_cast<double>(local().constraints.size());
    std::vector<double> v{e.lj,       e.coulomb_sr,   e.coulomb_recip, e.bond,      e.angle, e.proper_dih,
                          e.rb_dih,   e.improper_dih, e.lj14,          e.coulomb14, trace,   rmsd * rmsd * constraints,
                          constraints};
    dd_->sum(v);
    e.lj = v[0], e.coulomb_sr = v[1], e.coulomb_recip = v[2], e.bond = v[3], e.angle = v[4], e.proper_dih = v[5];
    e.rb_dih = v[6], e.improper_dih = v[7], e.lj14 = v[8], e.coulomb14 = v[9];
    e.sum_potential();
    trace = v[10];
    rmsd = v[12] > 0 ? std::sqrt(v[11] / v[12]) : 0.0;
  }

  double kinetic_energy(const std::vector<Vec3>& v) const {
    if (!dd_) return md::kinetic_energy(system_, v);
    double ke = 0;
    for (std::size_t i = 0; i < v.size(); ++i) ke += 0.5 * local().masses[i] * dot(v[i], v[i]);
    dd_->sum(std::span<double>(&ke, 1));
    return ke;
  }

  void remove_com_velocity(std::vector<Vec3>& v) const {
    if (!dd_) return md::remove_com_velocity(system_, v);
    std::array<double, 4> pm{};  // momentum, mass
    for (std::size_t i = 0; i < v.size(); ++i) {
      const double m = local().masses[i];
      for (int d = 0; d < 3; ++d) pm[d] += m * v[i][d];
      pm[3] += m;
    }
    dd_->sum(pm);
    const Vec3 vcom{pm[0] / pm[3], pm[1] / pm[3], pm[2] / pm[3]};
    for (auto& vi : v) vi -= vcom;
  }

  Mat3 kinetic_tensor(const std::vector<Vec3>& v) const {
    Mat3 t{};
    for (std::size_t i = 0; i < v.size(); ++i) add_outer(t, v[i], v[i], 0.5 * local().masses[i]);
    return t;
  }

  void compute_forces(const std::vector<Vec3>& x, const Vec3& box, StepEnergies& e) {
    if (!dd_) return forces_field_.compute(x, box, forces_, e);
    dd_->exchange_halo(x, x_local_);
    forces_field_.compute(x_local_, box, forces_, e);
    forces_.resize(dd_->home_count());  // the halo's forces belong to their owners, who computed their own
  }

  // A search step: the atoms to their domains' ranks (decomposed), then the pair list.
  void rebuild(std::vector<Vec3>& x, std::vector<Vec3>& v, const Vec3& box, std::int64_t step) {
    if (dd_) {
      dd_->repartition(x, v, box, step);
      use_local_system();
    }
    build_list(x, box);
  }

  // The pair list of the home atoms at x (and the halo at its owners' x).
  void build_list(const std::vector<Vec3>& x, const Vec3& box) {
    if (dd_) {
      dd_->exchange_halo(x, x_local_);
      forces_field_.build_pair_list(x_local_, box);
    } else {
      forces_field_.build_pair_list(x, box);
    }
    list_positions_ = x;
    ++counters_.pair_list_builds;
    const auto& list = forces_field_.pair_list();
    counters_.pairs_in_list = list.pair_count();
    if (dd_) {
      // Home-halo pairs are listed on both of their ranks: half each, so the sum over ranks is the
      // one-rank list's count.
      const int home = dd_->home_count();
      shared_pairs_ = 0;
      for (int k = 0; k < list.offsets()[home]; ++k) shared_pairs_ += list.neighbors()[k] >= home ? 1 : 0;
      counters_.pairs_in_list = static_cast<std::size_t>(list.offsets()[home]) - shared_pairs_;
    }
  }

  // Rank 0's frame in the global atom order (forces too).
  void write_frame(std::int64_t step, double time, const std::vector<Vec3>& x, const std::vector<Vec3>& v) {
    if (!dd_) return settings_.on_frame({step, time, state_.box, x, v, forces_});
    const auto gx = dd_->gather(x), gv = dd_->gather(v), gf = dd_->gather(forces_);
    if (is_root()) settings_.on_frame({step, time, state_.box, gx, gv, gf});
  }

  void write_checkpoint(std::int64_t next_step, const std::vector<Vec3>& x, const std::vector<Vec3>& v,
                        double thermostat_work) {
    const std::string generators = generator_state(rng_, barostat_noise_);
    if (!dd_)
      return settings_.on_checkpoint({next_step, x, v, state_.box, list_positions_, thermostat_work, generators});
    const auto gx = dd_->gather(x), gv = dd_->gather(v), gl = dd_->gather(list_positions_);
    if (is_root()) settings_.on_checkpoint({next_step, gx, gv, state_.box, gl, thermostat_work, generators});
  }

  // The final state in the global order on rank 0, and the counters summed over the ranks.
  void finish_domain_decomposition() {
    state_.positions = dd_->gather(state_.positions);
    state_.velocities = dd_->gather(state_.velocities);
    std::array<double, 2> sums{static_cast<double>(dd_->migrated_atoms()),
                               static_cast<double>(counters_.pairs_in_list) + 0.5 * static_cast<double>(shared_pairs_)};
    dd_->sum(sums);
    counters_.migrated_atoms = static_cast<std::int64_t>(sums[0]);
    counters_.pairs_in_list = static_cast<std::size_t>(std::llround(sums[1]));
    std::array<double, 1> bytes{static_cast<double>(counters_.pme_bytes_sent)};
    dd_->sum(bytes);
    counters_.pme_bytes_sent = static_cast<std::int64_t>(bytes[0]);
    counters_.pme_seconds = dd_->largest_two(counters_.pme_seconds, 0)[0];  // the slowest rank's
  }

  // The list holds every pair within rlist at build time. A pair's distance has since changed by
  // at most the sum of its two atoms' displacements, so the list is still exact for rc while the
  // two largest displacements together stay below the buffer rlist - rc.
  bool buffer_used_up(const std::vector<Vec3>& x, const Vec3& box) const {
    double largest = 0, second = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      Vec3 d = min_image(x[i] - list_positions_[i], box);
      double moved = dot(d, d);
      if (moved > largest) {
        second = largest;
        largest = moved;
      } else if (moved > second) {
        second = moved;
      }
    }
    if (dd_) {
      const auto everywhere = dd_->largest_two(largest, second);
      largest = everywhere[0];
      second = everywhere[1];
    }
    return std::sqrt(largest) + std::sqrt(second) >= settings_.rlist - settings_.cutoff;
  }

  // GROMACS constrains the start configuration (do_constrain_first): positions onto the
  // constraints, and velocities by constraining the positions half a step back.
  void constrain_start(std::vector<Vec3>& x, std::vector<Vec3>& v, const Vec3& box, double dt) {
    std::vector<Vec3> ref = x;
    settle_positions(local(), ref, x, box);
    lincs_->apply(ref, x, box, dt, nullptr);
    std::vector<Vec3> back(x.size());
    for (size_t i = 0; i < x.size(); ++i) back[i] = x[i] - dt * v[i];
    settle_positions(local(), x, back, box);
    lincs_->apply(x, back, box, dt, nullptr);
    for (size_t i = 0; i < x.size(); ++i) v[i] = (1 / dt) * (x[i] - back[i]);
  }

  void check_forces(std::int64_t step) const {
    // With domain decomposition each rank checks its home atoms against its home and halo atoms.
    const std::vector<Vec3>& x = dd_ ? x_local_ : state_.positions;
    const MdSystem& s = local();
    auto global = [&](int i) { return dd_ ? dd_->global_index(i) : i; };
    for (std::size_t i = 0; i < forces_.size(); ++i) {
      double f = norm(forces_[i]);
      if (!(f <= settings_.mdp.max_force)) {
        // Name the closest atom too: huge forces come from overlaps.
        int closest = -1;
        double best = 1e300;
        for (int j = 0; j < static_cast<int>(x.size()); ++j) {
          if (j == static_cast<int>(i) || s.excluded(static_cast<int>(i), j)) continue;
          Vec3 d = min_image(x[j] - x[i], state_.box);
          if (dot(d, d) < best) {
            best = dot(d, d);
            closest = j;
          }
        }
        KILN_FAIL(
            "step {}: the force on atom {} ({}) is {:.4g} kJ/mol/nm, above the limit {:.4g}; its closest "
            "non-excluded atom is {} ({}) at {:.4f} nm. Atoms overlap: fix the coordinates (energy "
            "minimisation) before running MD",
            step, global(static_cast<int>(i)) + 1, s.atom_names[i], f, settings_.mdp.max_force,
            closest >= 0 ? global(closest) + 1 : 0, closest >= 0 ? s.atom_names[closest] : "", std::sqrt(best));
      }
    }
  }

  double vrescale_factor(double ke) {
    const MdpOptions& o = settings_.mdp;
    const int ndf = settings_.degrees_of_freedom;
    if (ke <= 0 || ndf <= 0) return 1.0;
    return vrescale_lambda(ke, 0.5 * o.ref_t * kBoltzmann * ndf, ndf, std::exp(-o.dt / o.tau_t),
                           draw_vrescale_noise(rng_, ndf));
  }

  const MdSystem& system_;
  EngineSettings settings_;
  MdState state_;
  CpuForceField forces_field_;
  std::unique_ptr<Lincs> lincs_;             // remade when a rank's home atoms change
  std::unique_ptr<DomainDecomposition> dd_;  // none on one rank
  std::vector<double> inv_mass_;
  std::vector<Vec3> forces_, list_positions_, x_local_;
  std::size_t shared_pairs_ = 0;  // domain decomposition: listed pairs with a halo atom
  EngineCounters counters_;
  std::mt19937_64 rng_;
  std::normal_distribution<double> barostat_noise_;  // c-rescale's draws (it caches one: checkpointed)
};

}  // namespace

std::unique_ptr<MdEngine> make_cpu_engine(const MdSystem& system, const EngineSettings& settings, MdState initial) {
  return std::make_unique<CpuEngine>(system, settings, std::move(initial));
}

}  // namespace kiln::md
