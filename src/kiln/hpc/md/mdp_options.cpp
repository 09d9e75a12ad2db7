#include "kiln/hpc/md/mdp_options.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "kiln/hpc/md/text_fields.h"
#include "kiln/runtime/error.h"

namespace kiln::md {

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// GROMACS treats '-' and '_' in option names alike, and option values case-insensitively.
std::string canonical_key(std::string key) {
  std::replace(key.begin(), key.end(), '_', '-');
  return lower(key);
}

struct Context {
  std::string where;  // "<file>:<line>: option 'x'"
  std::string value;
};

double real_value(const Context& c) {
  double v = 0;
  auto [end, ec] = std::from_chars(c.value.data(), c.value.data() + c.value.size(), v);
  KILN_CHECK(ec == std::errc() && end == c.value.data() + c.value.size() && std::isfinite(v),
             "{} = '{}' is not a number", c.where, c.value);
  return v;
}

std::int64_t integer_value(const Context& c) {
  std::int64_t v = 0;
  auto [end, ec] = std::from_chars(c.value.data(), c.value.data() + c.value.size(), v);
  KILN_CHECK(ec == std::errc() && end == c.value.data() + c.value.size(), "{} = '{}' is not an integer", c.where,
             c.value);
  return v;
}

bool yes_no(const Context& c) {
  std::string v = lower(c.value);
  if (v == "yes" || v == "true") return true;
  if (v == "no" || v == "false") return false;
  KILN_FAIL("{} = '{}': expected yes or no", c.where, c.value);
}

// Accepts one of `allowed` (case-insensitive; '-' and '_' alike), names the rest.
std::string choice(const Context& c, std::initializer_list<const char*> allowed,
                   std::initializer_list<const char*> later = {}) {
  std::string v = canonical_key(c.value);
  for (const char* a : allowed)
    if (v == canonical_key(a)) return canonical_key(a);
  for (const char* a : later)
    if (v == canonical_key(a)) KILN_FAIL("{} = '{}' is not supported by kiln mdrun yet", c.where, c.value);
  std::string list;
  for (const char* a : allowed) list += fmt::format("{}{}", list.empty() ? "" : ", ", a);
  KILN_FAIL("{} = '{}': expected {}", c.where, c.value, list);
}

int positive_int(const Context& c) {
  auto v = integer_value(c);
  KILN_CHECK(v > 0 && v <= 1'000'000'000, "{} = {} must be a positive integer", c.where, v);
  return static_cast<int>(v);
}

double positive_real(const Context& c) {
  double v = real_value(c);
  KILN_CHECK(v > 0, "{} = {} must be positive", c.where, v);
  return v;
}

// nstxout and its kin: 0 (none) or every this many steps (the files' step field is 32-bit).
std::int64_t output_interval(const Context& c) {
  const auto v = integer_value(c);
  KILN_CHECK(v >= 0 && v <= 2'147'483'647, "{} = {} must be 0 (no output) or a positive step interval", c.where, v);
  return v;
}

}  // namespace

MdpOptions parse_mdp(const std::string& text, const std::string& name) {
  MdpOptions o;
  o.source = name;
  using Setter = std::function<void(const Context&)>;
  const std::map<std::string, Setter> setters = {
      {"integrator",
       [&](const Context& c) {
         choice(c, {"md"}, {"md-vv", "md-vv-avek", "sd", "bd", "steep", "cg", "l-bfgs", "nm", "tpi"});
       }},
      {"dt", [&](const Context& c) { o.dt = positive_real(c); }},
      {"nsteps",
       [&](const Context& c) {
         o.nsteps = integer_value(c);
         KILN_CHECK(o.nsteps >= 0,
                    "{} = {}: kiln mdrun needs a number of steps >= 0 (-1, run forever, is not "
                    "supported)",
                    c.where, o.nsteps);
       }},
      {"tinit", [&](const Context& c) { o.tinit = real_value(c); }},
      {"cutoff-scheme", [&](const Context& c) { choice(c, {"Verlet"}, {"group"}); }},
      {"nstlist", [&](const Context& c) { o.nstlist = positive_int(c); }},
      {"verlet-buffer-tolerance",
       [&](const Context& c) {
         o.verlet_buffer_tolerance = real_value(c);
         KILN_CHECK(o.verlet_buffer_tolerance > 0 || o.verlet_buffer_tolerance == -1,
                    "{} = {} must be positive, or -1 (use rlist as given)", c.where, o.verlet_buffer_tolerance);
       }},
      {"rlist", [&](const Context& c) { o.rlist = positive_real(c); }},
      {"rcoulomb", [&](const Context& c) { o.rcoulomb = positive_real(c); }},
      {"rvdw", [&](const Context& c) { o.rvdw = positive_real(c); }},
      {"coulombtype",
       [&](const Context& c) {
         o.coulombtype = choice(c, {"PME", "Reaction-Field"}, {"Cut-off", "Ewald", "P3M-AD", "User"}) == "pme"
                             ? CoulombType::Pme
                             : CoulombType::ReactionField;
       }},
      {"coulomb-modifier",
       [&](const Context& c) {
         choice(c, {"Potential-shift", "Potential-shift-Verlet"}, {"None"});
       }},
      {"vdwtype",
       [&](const Context& c) {
         choice(c, {"Cut-off"}, {"PME", "Shift", "Switch", "User"});
       }},
      {"vdw-type",
       [&](const Context& c) {
         choice(c, {"Cut-off"}, {"PME", "Shift", "Switch", "User"});
       }},
      {"vdw-modifier",
       [&](const Context& c) {
         choice(c, {"Potential-shift", "Potential-shift-Verlet"}, {"None", "Force-switch", "Potential-switch"});
       }},
      {"dispcorr",
       [&](const Context& c) {
         const std::string v = choice(c, {"no", "EnerPres", "Ener", "AllEnerPres", "AllEner"});
         o.dispcorr = v == "enerpres"      ? DispCorr::EnerPres
                      : v == "ener"        ? DispCorr::Ener
                      : v == "allenerpres" ? DispCorr::AllEnerPres
                      : v == "allener"     ? DispCorr::AllEner
                                           : DispCorr::No;
       }},
      {"fourierspacing", [&](const Context& c) { o.fourierspacing = positive_real(c); }},
      {"fourier-nx", [&](const Context& c) { o.fourier_n[0] = static_cast<int>(integer_value(c)); }},
      {"fourier-ny", [&](const Context& c) { o.fourier_n[1] = static_cast<int>(integer_value(c)); }},
      {"fourier-nz", [&](const Context& c) { o.fourier_n[2] = static_cast<int>(integer_value(c)); }},
      {"pme-order",
       [&](const Context& c) {
         o.pme_order = positive_int(c);
         KILN_CHECK(o.pme_order >= 3 && o.pme_order <= 12, "{} = {}: GROMACS allows 3 to 12", c.where, o.pme_order);
       }},
      {"ewald-rtol",
       [&](const Context& c) {
         o.ewald_rtol = positive_real(c);
         KILN_CHECK(o.ewald_rtol < 1, "{} = {} must be below 1", c.where, o.ewald_rtol);
       }},
      {"ewald-geometry", [&](const Context& c) { choice(c, {"3d"}, {"3dc"}); }},
      {"epsilon-surface",
       [&](const Context& c) { KILN_CHECK(real_value(c) == 0, "{}: only 0 is supported", c.where); }},
      {"epsilon-rf",
       [&](const Context& c) {
         o.epsilon_rf = real_value(c);
         KILN_CHECK(o.epsilon_rf == 0 || o.epsilon_rf >= 1, "{} = {}: 0 (infinity) or >= 1", c.where, o.epsilon_rf);
       }},
      {"epsilon-r", [&](const Context& c) { KILN_CHECK(real_value(c) == 1, "{}: only 1 is supported", c.where); }},
      {"pbc",
       [&](const Context& c) {
         choice(c, {"xyz"}, {"no", "xy", "screw"});
       }},
      {"tcoupl",
       [&](const Context& c) {
         std::string v = choice(c, {"no", "v-rescale"}, {"berendsen", "nose-hoover", "andersen", "andersen-massive"});
         o.tcoupl = v == "no" ? Thermostat::None : Thermostat::VRescale;
       }},
      {"tc-grps",
       [&](const Context& c) {
         KILN_CHECK(lower(c.value) == "system", "{} = '{}': only one group, System, is supported", c.where, c.value);
       }},
      {"tau-t", [&](const Context& c) { o.tau_t = real_value(c); }},
      {"ref-t", [&](const Context& c) { o.ref_t = positive_real(c); }},
      {"pcoupl",
       [&](const Context& c) {
         o.pressure_coupling =
             choice(c, {"no", "c-rescale"}, {"berendsen", "parrinello-rahman", "mttk"}) == "c-rescale";
       }},
      {"pcoupltype",
       [&](const Context& c) {
         choice(c, {"isotropic"}, {"semiisotropic", "anisotropic", "surface-tension"});
       }},
      {"tau-p", [&](const Context& c) { o.crescale.tau_p = positive_real(c); }},
      {"ref-p", [&](const Context& c) { o.crescale.ref_p = real_value(c); }},
      {"compressibility", [&](const Context& c) { o.crescale.compressibility = positive_real(c); }},
      {"nstpcouple",
       [&](const Context& c) {
         const auto n = integer_value(c);
         KILN_CHECK(n == -1 || n > 0, "{} = {}: expected -1 (GROMACS's default, 10) or a positive step count", c.where,
                    c.value);
         o.crescale.nstpcouple = n == -1 ? 10 : static_cast<int>(n);
       }},
      {"refcoord-scaling",
       [&](const Context& c) {
         choice(c, {"no", "all", "com"});  // only position restraints use it, and kiln has none
       }},
      {"constraints",
       [&](const Context& c) {
         // Water is rigid through [ settles ] whatever this says; h-bonds are constrained by LINCS.
         o.h_bond_constraints = choice(c, {"none", "h-bonds"}, {"all-bonds", "h-angles", "all-angles"}) == "h-bonds";
       }},
      {"constraint-algorithm", [&](const Context& c) { choice(c, {"lincs"}, {"shake"}); }},
      {"lincs-order", [&](const Context& c) { o.lincs_order = positive_int(c); }},
      {"lincs-iter", [&](const Context& c) { o.lincs_iter = positive_int(c); }},
      {"nstenergy", [&](const Context& c) { o.nstenergy = positive_int(c); }},
      {"nstcalcenergy", [&](const Context& c) { o.nstcalcenergy = positive_int(c); }},
      {"nstcomm", [&](const Context& c) { o.nstcomm = positive_int(c); }},
      {"comm-mode",
       [&](const Context& c) {
         o.comm_mode = choice(c, {"Linear", "None"}, {"Angular", "Linear-acceleration-correction"}) == "none"
                           ? ComMode::None
                           : ComMode::Linear;
       }},
      {"comm-grps",
       [&](const Context& c) {
         KILN_CHECK(lower(c.value) == "system", "{} = '{}': only System is supported", c.where, c.value);
       }},
      {"gen-vel", [&](const Context& c) { o.gen_vel = yes_no(c); }},
      {"gen-temp", [&](const Context& c) { o.gen_temp = real_value(c); }},
      {"gen-seed", [&](const Context& c) { o.gen_seed = integer_value(c); }},
      {"ld-seed", [&](const Context& c) { o.ld_seed = integer_value(c); }},
      {"continuation", [&](const Context& c) { o.continuation = yes_no(c); }},
      {"unconstrained-start", [&](const Context& c) { o.continuation = yes_no(c); }},
      {"define",
       [&](const Context& c) {
         std::istringstream in(c.value);
         for (std::string tok; in >> tok;) {
           KILN_CHECK(tok.rfind("-D", 0) == 0 && tok.size() > 2, "{}: '{}' is not -DNAME", c.where, tok);
           o.defines.push_back(tok.substr(2));
         }
       }},
      {"nstxout-compressed", [&](const Context& c) { o.nstxout_compressed = output_interval(c); }},
      {"compressed-x-precision",
       [&](const Context& c) {
         const double p = positive_real(c);
         KILN_CHECK(p <= 1e9, "{} = {}: at most 1e9 (GROMACS's coordinates are 32-bit integers at this scale)", c.where,
                    p);
         o.compressed_x_precision = static_cast<float>(p);
       }},
      {"compressed-x-grps",
       [&](const Context& c) {
         KILN_CHECK(lower(c.value) == "system",
                    "{} = '{}': only System (every atom) is supported; kiln mdrun has no index groups", c.where,
                    c.value);
       }},
      {"nstxout", [&](const Context& c) { o.nstxout = output_interval(c); }},
      {"nstvout", [&](const Context& c) { o.nstvout = output_interval(c); }},
      {"nstfout", [&](const Context& c) { o.nstfout = output_interval(c); }},
  };
  // Output cadences and labels that only GROMACS's own files use: accepted, without effect.
  static const std::set<std::string> ignored = {"title", "nstlog", "include", "cpp", "energygrps", "nstcheckpoint"};
  std::istringstream in(text);
  std::set<std::string> seen;
  int line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (auto semi = line.find(';'); semi != std::string::npos) line.resize(semi);
    std::string t = trim(line);
    if (t.empty()) continue;
    auto eq = t.find('=');
    KILN_CHECK(eq != std::string::npos, "{}:{}: '{}' is not 'option = value'", name, line_no, t);
    std::string key = canonical_key(trim(t.substr(0, eq)));
    std::string value = trim(t.substr(eq + 1));
    KILN_CHECK(!key.empty(), "{}:{}: no option name before '='", name, line_no);
    KILN_CHECK(seen.insert(key).second, "{}:{}: option '{}' is given twice", name, line_no, key);
    if (ignored.count(key)) continue;
    auto it = setters.find(key);
    KILN_CHECK(it != setters.end(),
               "{}:{}: unknown or unsupported option '{}' (docs/mdrun.md lists what kiln mdrun "
               "supports)",
               name, line_no, key);
    if (value.empty()) continue;  // GROMACS: an empty value keeps the default
    it->second(Context{fmt::format("{}:{}: option '{}'", name, line_no, key), value});
  }
  KILN_CHECK(o.tcoupl == Thermostat::None || o.tau_t > 0, "{}: tcoupl = v-rescale needs tau-t > 0", name);
  KILN_CHECK(!o.pressure_coupling || o.crescale.compressibility > 0,
             "{}: pcoupl = c-rescale needs compressibility > 0 (4.5e-5 1/bar for water)", name);
  KILN_CHECK(o.rvdw <= o.rcoulomb + 1e-12 && o.rvdw >= o.rcoulomb - 1e-12,
             "{}: rvdw ({}) must equal rcoulomb ({}) in kiln mdrun (GROMACS's Verlet scheme with PME allows rvdw <= "
             "rcoulomb; not supported yet)",
             name, o.rvdw, o.rcoulomb);
  return o;
}

MdpOptions read_mdp(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  KILN_CHECK(in.good(), "cannot read the run-parameter file '{}'", path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_mdp(ss.str(), path.string());
}

}  // namespace kiln::md
