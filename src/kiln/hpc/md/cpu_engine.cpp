#include "kiln/hpc/md/cpu_engine.h"

#include <fmt/format.h>

#include <cmath>
#include <random>
#include <sstream>

#include "kiln/hpc/md/bonded.h"
#include "kiln/hpc/md/crescale.h"
#include "kiln/hpc/md/lincs.h"
#include "kiln/hpc/md/settle.h"
#include "kiln/hpc/md/units.h"
#include "kiln/hpc/md/velocities.h"
#include "kiln/hpc/md/vrescale.h"
#include "kiln/runtime/error.h"

namespace kiln::md {

CpuForceField::CpuForceField(const MdSystem& system, const EngineSettings& settings)
    : system_(system), settings_(settings), dispersion_(system, settings.mdp.dispcorr, settings.cutoff) {
  if (!settings.reaction_field) pme_ = std::make_unique<Pme>(settings.pme_grid, settings.mdp.pme_order, settings.beta);
}

void CpuForceField::build_pair_list(const std::vector<Vec3>& x, const Vec3& box) {
  list_.build(system_, x, box, settings_.rlist);
}

void CpuForceField::compute(const std::vector<Vec3>& x, const Vec3& box, std::vector<Vec3>& forces, StepEnergies& e) {
  forces.assign(x.size(), Vec3{0, 0, 0});
  auto sr = compute_short_range(
      system_, list_,
      {settings_.cutoff, settings_.beta, settings_.threads, settings_.reaction_field, settings_.k_rf, settings_.c_rf},
      x, box, forces);
  e.lj = sr.lj;
  e.coulomb_sr = sr.coulomb;
  virial_ = sr.virial;
  e.has_recip = pme_ != nullptr;
  e.coulomb_recip = pme_ ? pme_->compute(x, system_.charges, box, forces, &virial_) : 0.0;
  auto b = compute_bonded(system_, x, box, forces);
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
        lincs_(system, settings.mdp.lincs_order, settings.mdp.lincs_iter) {
    inv_mass_.resize(system.atom_count);
    for (int i = 0; i < system.atom_count; ++i) inv_mass_[i] = 1.0 / system.masses[i];
    std::uint64_t seed =
        settings.mdp.ld_seed >= 0 ? static_cast<std::uint64_t>(settings.mdp.ld_seed) : std::random_device{}();
    rng_.seed(seed);
  }

  std::string name() const override { return "CPU (double precision)"; }
  MdState state() const override { return state_; }
  EngineCounters counters() const override { return counters_; }

  void run(const std::function<void(const StepEnergies&)>& on_energies) override {
    const MdpOptions& o = settings_.mdp;
    const double dt = o.dt;
    auto& x = state_.positions;
    auto& v = state_.velocities;
    const Vec3& box = state_.box;
    const bool constrained = !system_.settles.empty() || !lincs_.empty();
    std::int64_t first_step = 0;
    double thermostat_work = 0;
    if (settings_.resume) {
      // Everything as the run that wrote the checkpoint had it before computing this step's forces.
      const EngineCheckpoint& c = *settings_.resume;
      first_step = c.next_step;
      x = c.positions;
      v = c.velocities;
      state_.box = c.box;
      list_positions_ = c.list_positions;
      forces_field_.build_pair_list(list_positions_, box);
      ++counters_.pair_list_builds;
      thermostat_work = c.thermostat_work;
      std::istringstream in(c.generators);
      in >> rng_ >> barostat_noise_;
      KILN_CHECK(!in.fail(), "mdrun: the checkpoint's generator state is unreadable");
    } else {
      if (!o.continuation && constrained) constrain_start(x, v, box, dt);
      if (o.comm_mode == ComMode::Linear) remove_com_velocity(system_, v);
      rebuild(x, box);
    }
    StepEnergies e;
    forces_field_.compute(x, box, forces_, e);
    check_forces(first_step);
    double ke_half_old = kinetic_energy(system_, v);
    Mat3 ke_tensor_old = kinetic_tensor(v);
    std::vector<Vec3> x_new(x.size()), v_new(v.size()), x_unconstrained;
    bool box_scaled = false;
    for (std::int64_t step = first_step; step <= o.nsteps; ++step) {
      if (settings_.on_frame && trajectory_step(o, step))
        settings_.on_frame({step, o.tinit + step * dt, box, x, v, forces_});
      // v(t + dt/2) = lambda v(t - dt/2) + a(t) dt, as GROMACS's leap-frog applies v-rescale:
      // lambda comes from, and scales, the last (constrained) half-step velocities, so the
      // thermostat changed the kinetic energy by exactly (lambda^2 - 1) times theirs.
      double lambda = 1, step_work = 0;
      if (o.tcoupl == Thermostat::VRescale) {
        lambda = vrescale_factor(ke_half_old);
        step_work = (lambda * lambda - 1) * ke_half_old;
      }
      for (int i = 0; i < system_.atom_count; ++i) v_new[i] = lambda * v[i] + (dt * inv_mass_[i]) * forces_[i];
      for (int i = 0; i < system_.atom_count; ++i) x_new[i] = x[i] + dt * v_new[i];
      Mat3 constraint_virial{};
      if (constrained) {
        x_unconstrained = x_new;
        settle_positions(system_, x, x_new, box);
        lincs_.apply(x, x_new, box, dt, &constraint_virial);
        // The velocity correction of both: v = (constrained x(t + dt) - x(t)) / dt.
        for (int i = 0; i < system_.atom_count; ++i) v_new[i] = (1 / dt) * (x_new[i] - x[i]);
        constraint_virial += settle_virial(system_, x, x_unconstrained, x_new, box, dt);
      }
      double ke_half_new = kinetic_energy(system_, v_new);
      const bool couple_pressure = o.pressure_coupling && step % o.crescale.nstpcouple == 0;
      if (step % o.nstenergy == 0 || step == o.nsteps || couple_pressure) {
        e.step = step;
        e.time = o.tinit + step * dt;
        // Leap-frog's kinetic energy at t: the mean of the two half steps around it.
        e.kinetic = 0.5 * (ke_half_old + ke_half_new);
        e.total = e.potential + e.kinetic;
        // This step's scaling changed the half step after t, which is half of the kinetic energy at t.
        e.conserved = e.total - (thermostat_work + 0.5 * step_work);
        e.temperature =
            settings_.degrees_of_freedom > 0 ? 2 * e.kinetic / (settings_.degrees_of_freedom * kBoltzmann) : 0.0;
        Mat3 ke_new = kinetic_tensor(v_new);
        double trace = 0;
        for (int k = 0; k < 3; ++k)
          trace += (ke_tensor_old[k][k] + ke_new[k][k]) + forces_field_.virial()[k][k] + constraint_virial[k][k];
        // Pres. DC (compute() set it for this box) counts, as in GROMACS, for c-rescale below too.
        e.pressure = kPressureFactor * trace / (3 * box[0] * box[1] * box[2]) + e.pres_dc;
        e.constr_rmsd = lincs_.rms_relative_deviation(x_new, box);
        if (o.pressure_coupling) e.set_box_terms(box);
        if (step % o.nstenergy == 0 || step == o.nsteps) on_energies(e);
      }
      if (couple_pressure && step < o.nsteps) {
        // c-rescale from this step's pressure, applied to x(t + dt), v(t + dt/2) and the box.
        const double volume = box[0] * box[1] * box[2];
        const double mu =
            crescale_mu(o.crescale, o.crescale.nstpcouple * dt, e.pressure, volume, o.ref_t, barostat_noise_(rng_));
        for (int i = 0; i < system_.atom_count; ++i) {
          x_new[i] = mu * x_new[i];
          v_new[i] = (1 / mu) * v_new[i];
        }
        for (int d = 0; d < 3; ++d) state_.box[d] *= mu;
        check_box_after_scaling(state_.box, settings_.rlist, step);
        ke_half_new = kinetic_energy(system_, v_new);
        box_scaled = true;
      }
      thermostat_work += step_work;
      if (step == o.nsteps) break;  // the state stays at x(nsteps), v(nsteps - dt/2)
      x.swap(x_new);
      v.swap(v_new);
      ke_half_old = ke_half_new;
      ke_tensor_old = kinetic_tensor(v);
      if (o.comm_mode == ComMode::Linear && (step + 1) % o.nstcomm == 0) remove_com_velocity(system_, v);
      // A scaled box moves every atom: the list is rebuilt (GROMACS keeps it to the next search and
      // sizes the buffer for that; kiln's exact-list check would not see the scaling).
      bool scheduled = (step + 1) % o.nstlist == 0 || box_scaled;
      box_scaled = false;
      if (scheduled || buffer_used_up(x, box)) {
        if (!scheduled) ++counters_.early_rebuilds;
        rebuild(x, box);
      }
      // x and v now hold x(step + 1) and v(step + 1/2) as the next iteration uses them; at the last
      // step that iteration only reports energies, so this is also the final state.
      if (settings_.checkpoint_steps > 0 && settings_.on_checkpoint &&
          ((step + 1) % settings_.checkpoint_steps == 0 || step + 1 == o.nsteps)) {
        std::ostringstream generators;
        generators << rng_ << ' ' << barostat_noise_;
        settings_.on_checkpoint({step + 1, x, v, state_.box, list_positions_, thermostat_work, generators.str()});
      }
      forces_field_.compute(x, box, forces_, e);
      check_forces(step + 1);
    }
  }

 private:
  Mat3 kinetic_tensor(const std::vector<Vec3>& v) const {
    Mat3 t{};
    for (int i = 0; i < system_.atom_count; ++i) add_outer(t, v[i], v[i], 0.5 * system_.masses[i]);
    return t;
  }

  void rebuild(const std::vector<Vec3>& x, const Vec3& box) {
    forces_field_.build_pair_list(x, box);
    list_positions_ = x;
    ++counters_.pair_list_builds;
    counters_.pairs_in_list = forces_field_.pair_list().pair_count();
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
    return std::sqrt(largest) + std::sqrt(second) >= settings_.rlist - settings_.cutoff;
  }

  // GROMACS constrains the start configuration (do_constrain_first): positions onto the
  // constraints, and velocities by constraining the positions half a step back.
  void constrain_start(std::vector<Vec3>& x, std::vector<Vec3>& v, const Vec3& box, double dt) {
    std::vector<Vec3> ref = x;
    settle_positions(system_, ref, x, box);
    lincs_.apply(ref, x, box, dt, nullptr);
    std::vector<Vec3> back(x.size());
    for (size_t i = 0; i < x.size(); ++i) back[i] = x[i] - dt * v[i];
    settle_positions(system_, x, back, box);
    lincs_.apply(x, back, box, dt, nullptr);
    for (size_t i = 0; i < x.size(); ++i) v[i] = (1 / dt) * (x[i] - back[i]);
  }

  void check_forces(std::int64_t step) const {
    for (int i = 0; i < system_.atom_count; ++i) {
      double f = norm(forces_[i]);
      if (!(f <= settings_.mdp.max_force)) {
        // Name the closest atom too: huge forces come from overlaps.
        int closest = -1;
        double best = 1e300;
        for (int j = 0; j < system_.atom_count; ++j) {
          if (j == i || system_.excluded(i, j)) continue;
          Vec3 d = min_image(state_.positions[j] - state_.positions[i], state_.box);
          if (dot(d, d) < best) {
            best = dot(d, d);
            closest = j;
          }
        }
        KILN_FAIL(
            "step {}: the force on atom {} ({}) is {:.4g} kJ/mol/nm, above the limit {:.4g}; its closest "
            "non-excluded atom is {} ({}) at {:.4f} nm. Atoms overlap: fix the coordinates (energy "
            "minimisation) before running MD",
            step, i + 1, system_.atom_names[i], f, settings_.mdp.max_force, closest + 1,
            closest >= 0 ? system_.atom_names[closest] : "", std::sqrt(best));
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
  Lincs lincs_;
  std::vector<double> inv_mass_;
  std::vector<Vec3> forces_, list_positions_;
  EngineCounters counters_;
  std::mt19937_64 rng_;
  std::normal_distribution<double> barostat_noise_;  // c-rescale's draws (it caches one: checkpointed)
};

}  // namespace

std::unique_ptr<MdEngine> make_cpu_engine(const MdSystem& system, const EngineSettings& settings, MdState initial) {
  return std::make_unique<CpuEngine>(system, settings, std::move(initial));
}

}  // namespace kiln::md
