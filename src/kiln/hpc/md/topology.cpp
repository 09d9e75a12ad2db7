#include "kiln/hpc/md/topology.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <numbers>
#include <optional>
#include <set>
#include <sstream>

#include "kiln/runtime/error.h"

namespace kiln::md {

namespace fs = std::filesystem;

std::vector<fs::path> default_include_dirs() {
  std::vector<fs::path> dirs;
  if (const char* lib = std::getenv("GMXLIB"); lib != nullptr && *lib != '\0') {
    std::istringstream in(lib);
    for (std::string d; std::getline(in, d, ':');)
      if (!d.empty()) dirs.emplace_back(d);
  }
  dirs.emplace_back("/usr/share/gromacs/top");
  return dirs;
}

bool MdSystem::excluded(int i, int j) const {
  const auto& e = exclusions[i];
  return std::binary_search(e.begin(), e.end(), j);
}

namespace {

struct Line {
  std::string text;
  std::string where;  // "file:line"
};

std::string trim(std::string_view s) {
  size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string_view::npos) return {};
  size_t e = s.find_last_not_of(" \t\r");
  return std::string(s.substr(b, e - b + 1));
}

std::vector<std::string> split(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string t; in >> t;) out.push_back(t);
  return out;
}

bool identifier_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// The GROMACS topology preprocessor (cpp-like, as grompp's): conditionals, includes and defines.
class Preprocessor {
 public:
  Preprocessor(std::vector<fs::path> include_dirs, const std::vector<std::string>& defines)
      : include_dirs_(std::move(include_dirs)) {
    for (const auto& d : defines) {
      auto eq = d.find('=');
      macros_[d.substr(0, eq)] = eq == std::string::npos ? "" : d.substr(eq + 1);
    }
  }

  std::vector<Line> run(const fs::path& path) {
    process(path, 0);
    return std::move(out_);
  }

 private:
  struct Condition {
    bool active;         // this branch's lines are kept
    bool parent_active;  // the enclosing block's
    bool in_else;
    std::string where;
  };

  std::string substitute(const std::string& text) const {
    if (macros_.empty()) return text;
    std::string out;
    for (size_t i = 0; i < text.size();) {
      if (identifier_char(text[i]) && !std::isdigit(static_cast<unsigned char>(text[i]))) {
        size_t j = i;
        while (j < text.size() && identifier_char(text[j])) ++j;
        std::string word = text.substr(i, j - i);
        auto it = macros_.find(word);
        out += it != macros_.end() ? it->second : word;
        i = j;
      } else {
        out += text[i++];
      }
    }
    return out;
  }

  void process(const fs::path& path, int depth) {
    KILN_CHECK(depth < 32, "{}: #include nested more than 32 deep (an include cycle?)", path.string());
    std::ifstream in(path, std::ios::binary);
    KILN_CHECK(in.good(), "cannot read the topology file '{}'", path.string());
    std::vector<Condition> conditions;
    auto active = [&] { return conditions.empty() || conditions.back().active; };
    int line_no = 0;
    std::string pending;
    for (std::string raw; std::getline(in, raw);) {
      ++line_no;
      if (!raw.empty() && raw.back() == '\r') raw.pop_back();
      // A trailing backslash continues the line.
      if (!raw.empty() && raw.back() == '\\') {
        pending += raw.substr(0, raw.size() - 1) + " ";
        continue;
      }
      std::string line = pending + raw;
      pending.clear();
      std::string where = fmt::format("{}:{}", path.string(), line_no);
      std::string t = trim(line);
      if (!t.empty() && t[0] == '#') {
        auto words = split(t.substr(1));
        KILN_CHECK(!words.empty(), "{}: empty preprocessor directive", where);
        const std::string& d = words[0];
        if (d == "ifdef" || d == "ifndef") {
          KILN_CHECK(words.size() >= 2, "{}: #{} needs a macro name", where, d);
          bool defined = macros_.count(words[1]) > 0;
          bool parent = active();
          conditions.push_back({parent && (d == "ifdef" ? defined : !defined), parent, false, where});
        } else if (d == "else") {
          KILN_CHECK(!conditions.empty() && !conditions.back().in_else, "{}: #else without #ifdef", where);
          auto& c = conditions.back();
          c.active = c.parent_active && !c.active;
          c.in_else = true;
        } else if (d == "endif") {
          KILN_CHECK(!conditions.empty(), "{}: #endif without #ifdef", where);
          conditions.pop_back();
        } else if (!active()) {
          continue;
        } else if (d == "define") {
          KILN_CHECK(words.size() >= 2, "{}: #define needs a name", where);
          std::string rest = trim(t.substr(t.find(words[1]) + words[1].size()));
          if (auto semi = rest.find(';'); semi != std::string::npos) rest = trim(rest.substr(0, semi));
          macros_[words[1]] = rest;
        } else if (d == "undef") {
          KILN_CHECK(words.size() >= 2, "{}: #undef needs a name", where);
          macros_.erase(words[1]);
        } else if (d == "include") {
          auto q1 = t.find_first_of("\"<"), q2 = t.find_last_of("\">");
          KILN_CHECK(q1 != std::string::npos && q2 != std::string::npos && q2 > q1 + 1,
                     "{}: #include needs a file name in quotes", where);
          std::string name = t.substr(q1 + 1, q2 - q1 - 1);
          process(find_include(name, path, where), depth + 1);
        } else {
          KILN_FAIL("{}: unknown preprocessor directive '#{}'", where, d);
        }
        continue;
      }
      if (!active()) continue;
      if (auto semi = line.find(';'); semi != std::string::npos) line.resize(semi);
      line = trim(substitute(line));
      if (!line.empty()) out_.push_back({line, where});
    }
    KILN_CHECK(conditions.empty(), "{}: #ifdef without #endif", conditions.empty() ? "" : conditions.back().where);
  }

  fs::path find_include(const std::string& name, const fs::path& from, const std::string& where) const {
    std::vector<fs::path> tried;
    fs::path local = from.parent_path() / name;
    if (fs::exists(local)) return local;
    tried.push_back(local);
    for (const auto& dir : include_dirs_) {
      fs::path p = dir / name;
      if (fs::exists(p)) return p;
      tried.push_back(p);
    }
    std::string list;
    for (const auto& p : tried) list += fmt::format("{}{}", list.empty() ? "" : ", ", p.string());
    KILN_FAIL("{}: #include \"{}\" not found (looked in {}; install Debian's gromacs-data or set GMXLIB)", where, name,
              list);
  }

  std::vector<fs::path> include_dirs_;
  std::map<std::string, std::string> macros_;
  std::vector<Line> out_;
};

struct AtomType {
  double mass, charge, v, w;
  char ptype;
  std::string where;
};
struct MolAtom {
  std::string type;
  int resnr;
  std::string resname, name;
  double charge, mass;
};
struct MoleculeType {
  std::string name;
  std::string where;
  int nrexcl = 0;
  std::vector<MolAtom> atoms;
  std::vector<HarmonicBond> bonds;
  std::vector<HarmonicAngle> angles;
  std::vector<SettleWater> settles;
  std::vector<std::pair<int, int>> exclusions;
  std::vector<std::string> unsupported;  // "[ dihedrals ] at file:line"
};

double number(const std::string& s, const Line& l, const char* what) {
  double v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  KILN_CHECK(ec == std::errc() && end == s.data() + s.size() && std::isfinite(v), "{}: {} '{}' is not a number",
             l.where, what, s);
  return v;
}

int integer(const std::string& s, const Line& l, const char* what) {
  int v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  KILN_CHECK(ec == std::errc() && end == s.data() + s.size(), "{}: {} '{}' is not an integer", l.where, what, s);
  return v;
}

class TopologyParser {
 public:
  MdSystem parse(const std::vector<Line>& lines) {
    std::string section;
    for (const Line& l : lines) {
      if (l.text.front() == '[') {
        auto close = l.text.find(']');
        KILN_CHECK(close != std::string::npos, "{}: section header '{}' has no ']'", l.where, l.text);
        section = trim(l.text.substr(1, close - 1));
        section_where_ = l.where;
        on_section(section, l);
        continue;
      }
      KILN_CHECK(!section.empty(), "{}: '{}' before any [ section ]", l.where, l.text);
      auto f = split(l.text);
      if (section == "defaults")
        parse_defaults(f, l);
      else if (section == "atomtypes")
        parse_atomtype(f, l);
      else if (section == "nonbond_params")
        parse_nonbond_param(f, l);
      else if (section == "moleculetype")
        parse_moleculetype(f, l);
      else if (section == "atoms")
        parse_atom(f, l);
      else if (section == "bonds")
        parse_bond(f, l);
      else if (section == "angles")
        parse_angle(f, l);
      else if (section == "settles")
        parse_settle(f, l);
      else if (section == "exclusions")
        parse_exclusion(f, l);
      else if (section == "system")
        system_name_ += (system_name_.empty() ? "" : " ") + l.text;
      else if (section == "molecules")
        parse_molecules(f, l);
      // Parameter tables of the force field (for bonded terms looked up by type): water needs none.
    }
    KILN_CHECK(have_defaults_, "topology: no [ defaults ] section (include a force field's forcefield.itp)");
    KILN_CHECK(!molecules_.empty(), "topology: [ molecules ] lists no molecules");
    return build();
  }

 private:
  void on_section(const std::string& s, const Line& l) {
    static const std::set<std::string> molecule_sections = {"atoms", "bonds", "angles", "settles", "exclusions"};
    static const std::set<std::string> unsupported = {"pairs",
                                                      "dihedrals",
                                                      "constraints",
                                                      "position_restraints",
                                                      "cmap",
                                                      "virtual_sites2",
                                                      "virtual_sites3",
                                                      "virtual_sites4",
                                                      "virtual_sitesn",
                                                      "dihedral_restraints",
                                                      "distance_restraints",
                                                      "orientation_restraints",
                                                      "angle_restraints",
                                                      "angle_restraints_z",
                                                      "pairs_nb",
                                                      "polarization",
                                                      "thole_polarization",
                                                      "water_polarization"};
    static const std::set<std::string> tables = {
        "bondtypes", "constrainttypes",        "angletypes", "dihedraltypes", "pairtypes",
        "cmaptypes", "implicit_genborn_params"};
    static const std::set<std::string> global = {"defaults",     "atomtypes", "nonbond_params",
                                                 "moleculetype", "system",    "molecules"};
    if (molecule_sections.count(s)) {
      KILN_CHECK(!moltypes_.empty(), "{}: [ {} ] outside a [ moleculetype ]", l.where, s);
      return;
    }
    if (unsupported.count(s)) {
      KILN_CHECK(!moltypes_.empty(), "{}: [ {} ] outside a [ moleculetype ]", l.where, s);
      moltypes_.back().unsupported.push_back(fmt::format("[ {} ] at {}", s, l.where));
      return;
    }
    KILN_CHECK(tables.count(s) || global.count(s), "{}: unknown topology section [ {} ]", l.where, s);
  }

  void parse_defaults(const std::vector<std::string>& f, const Line& l) {
    KILN_CHECK(!have_defaults_, "{}: a second [ defaults ] line (one force field per topology)", l.where);
    KILN_CHECK(f.size() >= 2, "{}: [ defaults ] needs 'nbfunc comb-rule [gen-pairs fudgeLJ fudgeQQ]'", l.where);
    int nbfunc = integer(f[0], l, "nbfunc");
    KILN_CHECK(nbfunc == 1, "{}: nbfunc {} (Buckingham) is not supported; only 1 (Lennard-Jones)", l.where, nbfunc);
    comb_rule_ = integer(f[1], l, "comb-rule");
    KILN_CHECK(comb_rule_ >= 1 && comb_rule_ <= 3, "{}: comb-rule {} must be 1, 2 or 3", l.where, comb_rule_);
    have_defaults_ = true;
  }

  // name [bond_type] [at.num] mass charge ptype V W: the last five columns are fixed, the optional
  // ones in front differ between force fields.
  void parse_atomtype(const std::vector<std::string>& f, const Line& l) {
    KILN_CHECK(f.size() >= 6, "{}: [ atomtypes ] needs at least 'name mass charge ptype V W'", l.where);
    size_t n = f.size();
    const std::string& ptype = f[n - 3];
    KILN_CHECK(ptype == "A" || ptype == "S" || ptype == "D" || ptype == "V",
               "{}: [ atomtypes ] particle type '{}' (third column from the end) must be A, S, V or D", l.where, ptype);
    atomtypes_[f[0]] = {number(f[n - 5], l, "mass"),
                        number(f[n - 4], l, "charge"),
                        number(f[n - 2], l, "V"),
                        number(f[n - 1], l, "W"),
                        ptype[0],
                        l.where};
  }

  void parse_nonbond_param(const std::vector<std::string>& f, const Line& l) {
    KILN_CHECK(f.size() >= 5, "{}: [ nonbond_params ] needs 'type_i type_j func V W'", l.where);
    KILN_CHECK(integer(f[2], l, "func") == 1, "{}: [ nonbond_params ] func must be 1 (Lennard-Jones)", l.where);
    auto key = std::minmax(f[0], f[1]);
    nonbond_params_[{key.first, key.second}] = {number(f[3], l, "V"), number(f[4], l, "W")};
  }

  void parse_moleculetype(const std::vector<std::string>& f, const Line& l) {
    KILN_CHECK(f.size() >= 2, "{}: [ moleculetype ] needs 'name nrexcl'", l.where);
    for (const auto& m : moltypes_)
      KILN_CHECK(m.name != f[0], "{}: molecule type '{}' is defined twice (first at {})", l.where, f[0], m.where);
    MoleculeType m;
    m.name = f[0];
    m.where = l.where;
    m.nrexcl = integer(f[1], l, "nrexcl");
    KILN_CHECK(m.nrexcl >= 0, "{}: nrexcl {} must be >= 0", l.where, m.nrexcl);
    moltypes_.push_back(std::move(m));
  }

  // nr type resnr residue atom cgnr charge [mass]: charge and mass default to the atom type's.
  void parse_atom(const std::vector<std::string>& f, const Line& l) {
    auto& m = moltypes_.back();
    KILN_CHECK(f.size() >= 5, "{}: [ atoms ] needs at least 'nr type resnr residue atom'", l.where);
    int nr = integer(f[0], l, "atom number");
    KILN_CHECK(nr == static_cast<int>(m.atoms.size()) + 1, "{}: atom number {} should be {} (atoms in order from 1)",
               l.where, nr, m.atoms.size() + 1);
    auto it = atomtypes_.find(f[1]);
    KILN_CHECK(it != atomtypes_.end(), "{}: atom type '{}' is not in [ atomtypes ]", l.where, f[1]);
    KILN_CHECK(it->second.ptype == 'A',
               "{}: atom type '{}' has particle type {} ({}); shells and virtual sites are "
               "not supported",
               l.where, f[1], it->second.ptype, it->second.where);
    MolAtom a{f[1], integer(f[2], l, "residue number"), f[3], f[4], it->second.charge, it->second.mass};
    if (f.size() >= 7) a.charge = number(f[6], l, "charge");
    if (f.size() >= 8) a.mass = number(f[7], l, "mass");
    KILN_CHECK(a.mass > 0, "{}: atom {} has mass {}; massless particles (virtual sites) are not supported", l.where, nr,
               a.mass);
    m.atoms.push_back(a);
  }

  int atom_index(const std::string& s, const Line& l) {
    int i = integer(s, l, "atom number");
    int n = static_cast<int>(moltypes_.back().atoms.size());
    KILN_CHECK(i >= 1 && i <= n, "{}: atom number {} is not in [ atoms ] (1 to {})", l.where, i, n);
    return i - 1;
  }

  void parse_bond(const std::vector<std::string>& f, const Line& l) {
    KILN_CHECK(f.size() >= 3, "{}: [ bonds ] needs 'ai aj funct [b0 kb]'", l.where);
    int func = integer(f[2], l, "funct");
    KILN_CHECK(func == 1, "{}: bond function {} is not supported (only 1, harmonic)", l.where, func);
    KILN_CHECK(f.size() >= 5, "{}: bond parameters from [ bondtypes ] are not supported yet: give b0 and kb", l.where);
    moltypes_.back().bonds.push_back(
        {atom_index(f[0], l), atom_index(f[1], l), number(f[3], l, "b0"), number(f[4], l, "kb")});
  }

  void parse_angle(const std::vector<std::string>& f, const Line& l) {
    KILN_CHECK(f.size() >= 4, "{}: [ angles ] needs 'ai aj ak funct [theta0 k]'", l.where);
    int func = integer(f[3], l, "funct");
    KILN_CHECK(func == 1, "{}: angle function {} is not supported (only 1, harmonic)", l.where, func);
    KILN_CHECK(f.size() >= 6, "{}: angle parameters from [ angletypes ] are not supported yet: give theta0 and k",
               l.where);
    moltypes_.back().angles.push_back({atom_index(f[0], l), atom_index(f[1], l), atom_index(f[2], l),
                                       number(f[4], l, "theta0") * std::numbers::pi / 180.0, number(f[5], l, "k")});
  }

  void parse_settle(const std::vector<std::string>& f, const Line& l) {
    KILN_CHECK(f.size() >= 4, "{}: [ settles ] needs 'OW funct doh dhh'", l.where);
    int o = atom_index(f[0], l);
    KILN_CHECK(o + 2 < static_cast<int>(moltypes_.back().atoms.size()),
               "{}: [ settles ] needs the two hydrogens right after the oxygen", l.where);
    double doh = number(f[2], l, "doh"), dhh = number(f[3], l, "dhh");
    KILN_CHECK(doh > 0 && dhh > 0 && dhh < 2 * doh, "{}: settle distances doh {} dhh {} are not a triangle", l.where,
               doh, dhh);
    const auto& atoms = moltypes_.back().atoms;
    // SETTLE's analytic solution assumes two hydrogens of equal mass.
    KILN_CHECK(atoms[o + 1].mass == atoms[o + 2].mass,
               "{}: [ settles ] needs equal masses for atoms {} and {} (they are {} and {})", l.where, o + 2, o + 3,
               atoms[o + 1].mass, atoms[o + 2].mass);
    moltypes_.back().settles.push_back({o, doh, dhh});
  }

  void parse_exclusion(const std::vector<std::string>& f, const Line& l) {
    int i = atom_index(f[0], l);
    for (size_t k = 1; k < f.size(); ++k) moltypes_.back().exclusions.push_back({i, atom_index(f[k], l)});
  }

  void parse_molecules(const std::vector<std::string>& f, const Line& l) {
    KILN_CHECK(f.size() == 2, "{}: [ molecules ] needs 'name count'", l.where);
    int count = integer(f[1], l, "molecule count");
    KILN_CHECK(count >= 0, "{}: molecule count {} is negative", l.where, count);
    auto it = std::find_if(moltypes_.begin(), moltypes_.end(), [&](const auto& m) { return m.name == f[0]; });
    KILN_CHECK(it != moltypes_.end(), "{}: molecule type '{}' is not defined", l.where, f[0]);
    KILN_CHECK(it->unsupported.empty(), "{}: molecule type '{}' uses {}, which kiln mdrun does not support yet",
               l.where, f[0], it->unsupported.front());
    molecules_.push_back({static_cast<int>(it - moltypes_.begin()), count});
  }

  // Pairs up to nrexcl bonds apart (bonds and settles count as bonds), plus [ exclusions ].
  static std::vector<std::set<int>> molecule_exclusions(const MoleculeType& m) {
    int n = static_cast<int>(m.atoms.size());
    std::vector<std::vector<int>> graph(n);
    auto link = [&](int a, int b) {
      graph[a].push_back(b);
      graph[b].push_back(a);
    };
    for (const auto& b : m.bonds) link(b.i, b.j);
    for (const auto& s : m.settles) {
      link(s.o, s.o + 1);
      link(s.o, s.o + 2);
    }
    std::vector<std::set<int>> ex(n);
    for (int a = 0; a < n; ++a) {
      std::vector<int> dist(n, -1);
      std::vector<int> frontier{a};
      dist[a] = 0;
      for (int d = 1; d <= m.nrexcl && !frontier.empty(); ++d) {
        std::vector<int> next;
        for (int u : frontier)
          for (int v : graph[u])
            if (dist[v] < 0) {
              dist[v] = d;
              next.push_back(v);
              ex[a].insert(v);
            }
        frontier = std::move(next);
      }
    }
    for (auto [i, j] : m.exclusions) {
      if (i == j) continue;
      ex[i].insert(j);
      ex[j].insert(i);
    }
    return ex;
  }

  MdSystem build() {
    MdSystem s;
    s.name = system_name_;
    std::map<std::string, int> type_index;
    std::vector<std::string> type_names;
    for (const auto& [mi, count] : molecules_)
      for (const auto& a : moltypes_[mi].atoms)
        if (type_index.emplace(a.type, static_cast<int>(type_names.size())).second) type_names.push_back(a.type);
    int nt = static_cast<int>(type_names.size());
    s.type_count = nt;
    s.c6.assign(nt * nt, 0.0);
    s.c12.assign(nt * nt, 0.0);
    auto to_c6_c12 = [&](double v, double w) -> std::pair<double, double> {
      if (comb_rule_ == 1) return {v, w};
      double s6 = std::pow(v, 6);  // sigma, epsilon
      return {4 * w * s6, 4 * w * s6 * s6};
    };
    for (int a = 0; a < nt; ++a)
      for (int b = 0; b < nt; ++b) {
        const AtomType& ta = atomtypes_.at(type_names[a]);
        const AtomType& tb = atomtypes_.at(type_names[b]);
        double v, w;
        auto key = std::minmax(type_names[a], type_names[b]);
        if (auto it = nonbond_params_.find({key.first, key.second}); it != nonbond_params_.end()) {
          v = it->second.first;
          w = it->second.second;
        } else if (comb_rule_ == 2) {
          v = 0.5 * (ta.v + tb.v);
          w = std::sqrt(ta.w * tb.w);
        } else {
          v = std::sqrt(ta.v * tb.v);
          w = std::sqrt(ta.w * tb.w);
        }
        auto [c6, c12] = to_c6_c12(v, w);
        s.c6[a * nt + b] = c6;
        s.c12[a * nt + b] = c12;
      }
    for (const auto& [mi, count] : molecules_) {
      const MoleculeType& m = moltypes_[mi];
      auto ex = molecule_exclusions(m);
      for (int c = 0; c < count; ++c) {
        int base = s.atom_count;
        for (size_t k = 0; k < m.atoms.size(); ++k) {
          const MolAtom& a = m.atoms[k];
          s.charges.push_back(a.charge);
          s.masses.push_back(a.mass);
          s.types.push_back(type_index.at(a.type));
          s.atom_names.push_back(a.name);
          s.residue_names.push_back(a.resname);
          s.residue_numbers.push_back(a.resnr);
          std::vector<int> e;
          for (int j : ex[k]) e.push_back(base + j);
          s.exclusions.push_back(std::move(e));
        }
        for (auto b : m.bonds) s.bonds.push_back({b.i + base, b.j + base, b.b0, b.kb});
        for (auto a : m.angles) s.angles.push_back({a.i + base, a.j + base, a.k + base, a.theta0, a.kth});
        for (auto w : m.settles) s.settles.push_back({w.o + base, w.d_oh, w.d_hh});
        s.atom_count += static_cast<int>(m.atoms.size());
      }
    }
    return s;
  }

  bool have_defaults_ = false;
  int comb_rule_ = 1;
  std::string section_where_;
  std::map<std::string, AtomType> atomtypes_;
  std::map<std::pair<std::string, std::string>, std::pair<double, double>> nonbond_params_;
  std::vector<MoleculeType> moltypes_;
  std::vector<std::pair<int, int>> molecules_;
  std::string system_name_;
};

}  // namespace

MdSystem read_topology(const fs::path& path, const TopologyOptions& options) {
  Preprocessor pp(options.include_dirs, options.defines);
  auto lines = pp.run(path);
  return TopologyParser().parse(lines);
}

}  // namespace kiln::md
