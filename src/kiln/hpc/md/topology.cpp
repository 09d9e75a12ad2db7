#include "kiln/hpc/md/topology.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <numbers>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>

#include "kiln/hpc/md/text_fields.h"
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

std::vector<std::string> split(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string t; in >> t;) out.push_back(t);
  return out;
}

bool identifier_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

bool is_integer(const std::string& s) {
  int v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && end == s.data() + s.size();
}

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
  std::string bond_type;  // the name [ bondtypes ], [ angletypes ] and [ dihedraltypes ] use
  double mass, charge, v, w;
  char ptype;
  std::string where;
};
// Which GROMACS interaction a [ dihedrals ] function number feeds: 1 and 9 are both proper
// dihedrals (and look each other's [ dihedraltypes ] up), 4 periodic impropers, 3 RB.
enum class DihedralKind { Proper, PeriodicImproper, RyckaertBellemans };
// A [ dihedraltypes ] line: four bond types ("X" a wildcard) and the parameters of its function.
struct DihedralType {
  std::array<std::string, 4> types;
  DihedralKind kind;
  std::vector<double> params;  // phi_s k n, or C0..C5
  std::string where;
};
struct MolDihedral {
  std::array<int, 4> atoms;
  int func;
  std::vector<double> params;  // empty: from [ dihedraltypes ]
  std::string where;
};
struct MolPair {
  int i, j;
  std::optional<std::pair<double, double>> vw;  // given on the line (comb-rule units)
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
  std::vector<MolDihedral> dihedrals;
  std::vector<MolPair> pairs;
  // Resolved at [ molecules ]:
  std::vector<PeriodicDihedral> proper, periodic_improper;
  std::vector<RbDihedral> rb;
  bool resolved = false;
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
      // Text before the first section is ignored, as grompp does (amber's forcefield.itp opens
      // with a banner of asterisks).
      if (section.empty()) continue;
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
      else if (section == "dihedrals")
        parse_dihedral(f, l);
      else if (section == "pairs")
        parse_pair(f, l);
      else if (section == "bondtypes")
        parse_bondtype(f, l);
      else if (section == "angletypes")
        parse_angletype(f, l);
      else if (section == "dihedraltypes")
        parse_dihedraltype(f, l);
      else if (section == "pairtypes")
        parse_pairtype(f, l);
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
    static const std::set<std::string> molecule_sections = {"atoms", "bonds",     "angles",    "settles",
                                                            "pairs", "dihedrals", "exclusions"};
    static const std::set<std::string> unsupported = {"constraints",
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
    if (f.size() >= 3) {
      std::string g = f[2];
      std::transform(g.begin(), g.end(), g.begin(), [](unsigned char c) { return std::tolower(c); });
      KILN_CHECK(g == "yes" || g == "no", "{}: gen-pairs '{}' must be yes or no", l.where, f[2]);
      gen_pairs_ = g == "yes";
    }
    if (f.size() >= 4) fudge_lj_ = number(f[3], l, "fudgeLJ");
    if (f.size() >= 5) fudge_qq_ = number(f[4], l, "fudgeQQ");
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
    // name bond_type at.num ..., name bond_type ... or name at.num ...: a bond type is not a number.
    std::string bond_type = n >= 8 || (n == 7 && !is_integer(f[1])) ? f[1] : f[0];
    atomtypes_[f[0]] = {bond_type,
                        number(f[n - 5], l, "mass"),
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
    KILN_CHECK(f.size() >= 2, "{}: [ bonds ] needs 'ai aj [funct [b0 kb]]'", l.where);
    int func = f.size() >= 3 ? integer(f[2], l, "funct") : 1;  // grompp's default: function 1
    KILN_CHECK(func == 1, "{}: bond function {} is not supported (only 1, harmonic)", l.where, func);
    int i = atom_index(f[0], l), j = atom_index(f[1], l);
    if (f.size() >= 5) {
      moltypes_.back().bonds.push_back({i, j, number(f[3], l, "b0"), number(f[4], l, "kb")});
      return;
    }
    auto [a, b] = std::minmax(bond_type(i), bond_type(j));
    auto it = bondtypes_.find({a, b});
    KILN_CHECK(it != bondtypes_.end(), "{}: no [ bondtypes ] entry for bond types {}-{} (function 1)", l.where, a, b);
    moltypes_.back().bonds.push_back({i, j, it->second.first, it->second.second});
  }

  void parse_angle(const std::vector<std::string>& f, const Line& l) {
    KILN_CHECK(f.size() >= 3, "{}: [ angles ] needs 'ai aj ak [funct [theta0 k]]'", l.where);
    int func = f.size() >= 4 ? integer(f[3], l, "funct") : 1;
    KILN_CHECK(func == 1, "{}: angle function {} is not supported (only 1, harmonic)", l.where, func);
    int i = atom_index(f[0], l), j = atom_index(f[1], l), k = atom_index(f[2], l);
    double theta0 = 0, kth = 0;
    if (f.size() >= 6) {
      theta0 = number(f[4], l, "theta0");
      kth = number(f[5], l, "k");
    } else {
      auto key = angle_key(bond_type(i), bond_type(j), bond_type(k));
      auto it = angletypes_.find(key);
      KILN_CHECK(it != angletypes_.end(), "{}: no [ angletypes ] entry for bond types {}-{}-{} (function 1)", l.where,
                 key[0], key[1], key[2]);
      std::tie(theta0, kth) = it->second;
    }
    moltypes_.back().angles.push_back({i, j, k, theta0 * std::numbers::pi / 180.0, kth});
  }

  const std::string& bond_type(int atom) const { return atomtypes_.at(moltypes_.back().atoms[atom].type).bond_type; }
  static std::array<std::string, 3> angle_key(const std::string& a, const std::string& b, const std::string& c) {
    return a <= c ? std::array<std::string, 3>{a, b, c} : std::array<std::string, 3>{c, b, a};
  }

  void parse_bondtype(const std::vector<std::string>& f, const Line& l) {
    KILN_CHECK(f.size() >= 3, "{}: [ bondtypes ] needs 'bi bj func params'", l.where);
    if (integer(f[2], l, "func") != 1) return;  // only harmonic bonds are looked up
    KILN_CHECK(f.size() >= 5, "{}: [ bondtypes ] function 1 needs 'bi bj 1 b0 kb'", l.where);
    auto [a, b] = std::minmax(f[0], f[1]);
    bondtypes_[{a, b}] = {number(f[3], l, "b0"), number(f[4], l, "kb")};
  }

  void parse_angletype(const std::vector<std::string>& f, const Line& l) {
    KILN_CHECK(f.size() >= 4, "{}: [ angletypes ] needs 'bi bj bk func params'", l.where);
    if (integer(f[3], l, "func") != 1) return;  // only harmonic angles are looked up
    KILN_CHECK(f.size() >= 6, "{}: [ angletypes ] function 1 needs 'bi bj bk 1 theta0 k'", l.where);
    angletypes_[angle_key(f[0], f[1], f[2])] = {number(f[4], l, "theta0"), number(f[5], l, "k")};
  }

  static std::optional<DihedralKind> dihedral_kind(int func) {
    if (func == 1 || func == 9) return DihedralKind::Proper;
    if (func == 4) return DihedralKind::PeriodicImproper;
    if (func == 3) return DihedralKind::RyckaertBellemans;
    return std::nullopt;
  }

  static std::vector<double> dihedral_params(const std::vector<std::string>& f, size_t first, int func, const Line& l) {
    size_t want = func == 3 ? 6 : 3;
    KILN_CHECK(f.size() >= first + want, "{}: dihedral function {} needs {} parameters ({})", l.where, func, want,
               func == 3 ? "C0 C1 C2 C3 C4 C5" : "phi_s k n");
    std::vector<double> p;
    for (size_t c = 0; c < want; ++c) p.push_back(number(f[first + c], l, "dihedral parameter"));
    if (func != 3) KILN_CHECK(p[2] == std::round(p[2]), "{}: multiplicity {} is not an integer", l.where, p[2]);
    return p;
  }

  // ai aj ak al func params, or (GROMACS's older form) two bond types: aj ak of a proper, ai al
  // of function 2, the others wildcards.
  void parse_dihedraltype(const std::vector<std::string>& f, const Line& l) {
    KILN_CHECK(f.size() >= 3, "{}: [ dihedraltypes ] needs 'bi bj bk bl func params'", l.where);
    bool two = is_integer(f[2]);
    KILN_CHECK(two || f.size() >= 5, "{}: [ dihedraltypes ] needs 'bi bj bk bl func params'", l.where);
    int func = integer(two ? f[2] : f[4], l, "func");
    auto kind = dihedral_kind(func);
    if (!kind) return;  // a function kiln cannot use is only an error when a molecule looks it up
    DihedralType t;
    t.types =
        two ? std::array<std::string, 4>{"X", f[0], f[1], "X"} : std::array<std::string, 4>{f[0], f[1], f[2], f[3]};
    t.kind = *kind;
    t.params = dihedral_params(f, two ? 3 : 5, func, l);
    t.where = l.where;
    dihedraltypes_.push_back(std::move(t));
  }

  // As grompp: the first entry with the most non-wildcard matches (forwards or backwards); for
  // function 9 also the entries with the same types on the lines right after it.
  std::vector<const DihedralType*> find_dihedraltypes(const std::array<std::string, 4>& b, DihedralKind kind,
                                                      bool multiple) const {
    auto matches = [&](const DihedralType& t) {
      int best = -1;
      for (bool reverse : {false, true}) {
        int count = 0;
        bool ok = true;
        for (int c = 0; c < 4 && ok; ++c) {
          const std::string& want = t.types[c];
          if (want == "X") continue;
          ok = want == b[reverse ? 3 - c : c];
          ++count;
        }
        if (ok) best = std::max(best, count);
      }
      return best;
    };
    int best = -1;
    size_t at = 0;
    for (size_t k = 0; k < dihedraltypes_.size(); ++k) {
      if (dihedraltypes_[k].kind != kind) continue;
      int m = matches(dihedraltypes_[k]);
      if (m > best) {
        best = m;
        at = k;
      }
    }
    std::vector<const DihedralType*> found;
    if (best < 0) return found;
    found.push_back(&dihedraltypes_[at]);
    for (size_t k = at + 1; multiple && k < dihedraltypes_.size() && dihedraltypes_[k].kind == kind &&
                            dihedraltypes_[k].types == dihedraltypes_[at].types;
         ++k)
      found.push_back(&dihedraltypes_[k]);
    return found;
  }

  void parse_dihedral(const std::vector<std::string>& f, const Line& l) {
    KILN_CHECK(f.size() >= 4, "{}: [ dihedrals ] needs 'ai aj ak al [funct [params]]'", l.where);
    MolDihedral d;
    for (int c = 0; c < 4; ++c) d.atoms[c] = atom_index(f[c], l);
    d.func = f.size() >= 5 ? integer(f[4], l, "funct") : 1;
    KILN_CHECK(dihedral_kind(d.func).has_value(),
               "{}: dihedral function {} is not supported (1, 9 proper, 4 periodic improper, 3 Ryckaert-Bellemans)",
               l.where, d.func);
    if (f.size() > 5) d.params = dihedral_params(f, 5, d.func, l);
    d.where = l.where;
    moltypes_.back().dihedrals.push_back(std::move(d));
  }

  void parse_pairtype(const std::vector<std::string>& f, const Line& l) {
    KILN_CHECK(f.size() >= 5, "{}: [ pairtypes ] needs 'ti tj func V W'", l.where);
    KILN_CHECK(integer(f[2], l, "func") == 1, "{}: [ pairtypes ] function must be 1", l.where);
    auto [a, b] = std::minmax(f[0], f[1]);
    pairtypes_[{a, b}] = {number(f[3], l, "V"), number(f[4], l, "W")};
  }

  void parse_pair(const std::vector<std::string>& f, const Line& l) {
    KILN_CHECK(f.size() >= 2, "{}: [ pairs ] needs 'ai aj [funct [V W]]'", l.where);
    MolPair p{atom_index(f[0], l), atom_index(f[1], l), std::nullopt, l.where};
    if (f.size() >= 3)
      KILN_CHECK(integer(f[2], l, "funct") == 1, "{}: pair function {} is not supported (only 1)", l.where, f[2]);
    if (f.size() >= 5) p.vw = std::pair{number(f[3], l, "V"), number(f[4], l, "W")};
    moltypes_.back().pairs.push_back(p);
  }

  // Resolves a molecule's [ dihedrals ] against [ dihedraltypes ] (which may come after it in the
  // file, as in grompp, so at [ molecules ] time).
  void resolve_dihedrals(MoleculeType& m) {
    for (const auto& d : m.dihedrals) {
      DihedralKind kind = *dihedral_kind(d.func);
      std::vector<std::vector<double>> terms;
      if (!d.params.empty()) {
        terms.push_back(d.params);
      } else {
        std::array<std::string, 4> b;
        for (int c = 0; c < 4; ++c) b[c] = atomtypes_.at(m.atoms[d.atoms[c]].type).bond_type;
        auto found = find_dihedraltypes(b, kind, d.func == 9);
        KILN_CHECK(!found.empty(), "{}: no [ dihedraltypes ] entry for bond types {}-{}-{}-{} (function {})", d.where,
                   b[0], b[1], b[2], b[3], d.func);
        for (const auto* t : found) terms.push_back(t->params);
      }
      auto [i, j, k, l] = d.atoms;
      for (const auto& p : terms) {
        if (kind == DihedralKind::RyckaertBellemans) {
          m.rb.push_back({i, j, k, l, {p[0], p[1], p[2], p[3], p[4], p[5]}});
        } else {
          PeriodicDihedral pd{i, j, k, l, p[0] * std::numbers::pi / 180.0, p[1], static_cast<int>(p[2])};
          (kind == DihedralKind::Proper ? m.proper : m.periodic_improper).push_back(pd);
        }
      }
    }
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
    if (!it->resolved) {
      resolve_dihedrals(*it);
      it->resolved = true;
    }
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
      // 1-4 parameters: the line's, else [ pairtypes ] (by atom type), else with gen-pairs the
      // combination rule scaled by fudgeLJ; charges always scaled by fudgeQQ.
      std::vector<Pair14> pairs;
      for (const auto& p : m.pairs) {
        const std::string& ta = m.atoms[p.i].type;
        const std::string& tb = m.atoms[p.j].type;
        double c6 = 0, c12 = 0;
        if (p.vw) {
          std::tie(c6, c12) = to_c6_c12(p.vw->first, p.vw->second);
        } else if (auto pt = pairtypes_.find(std::minmax(ta, tb)); pt != pairtypes_.end()) {
          std::tie(c6, c12) = to_c6_c12(pt->second.first, pt->second.second);
        } else {
          KILN_CHECK(gen_pairs_, "{}: no [ pairtypes ] entry for atom types {}-{} and gen-pairs is no", p.where, ta,
                     tb);
          int a = type_index.at(ta), b = type_index.at(tb);
          c6 = fudge_lj_ * s.c6[a * nt + b];
          c12 = fudge_lj_ * s.c12[a * nt + b];
        }
        pairs.push_back({p.i, p.j, c6, c12, fudge_qq_ * m.atoms[p.i].charge * m.atoms[p.j].charge});
      }
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
        auto shift = [base](PeriodicDihedral d) {
          return PeriodicDihedral{d.i + base, d.j + base, d.k + base, d.l + base, d.phi_s, d.k_phi, d.n};
        };
        for (const auto& d : m.proper) s.proper_dihedrals.push_back(shift(d));
        for (const auto& d : m.periodic_improper) s.periodic_impropers.push_back(shift(d));
        for (auto d : m.rb) {
          d.i += base;
          d.j += base;
          d.k += base;
          d.l += base;
          s.rb_dihedrals.push_back(d);
        }
        for (auto p : pairs) s.pairs.push_back({p.i + base, p.j + base, p.c6, p.c12, p.qq});
        s.atom_count += static_cast<int>(m.atoms.size());
      }
    }
    return s;
  }

  bool have_defaults_ = false;
  int comb_rule_ = 1;
  bool gen_pairs_ = false;
  double fudge_lj_ = 1, fudge_qq_ = 1;
  std::map<std::pair<std::string, std::string>, std::pair<double, double>> bondtypes_, pairtypes_;
  std::map<std::array<std::string, 3>, std::pair<double, double>> angletypes_;
  std::vector<DihedralType> dihedraltypes_;
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
