#include "kiln/hpc/md/gro_file.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <fstream>
#include <sstream>

#include "kiln/hpc/md/atomic_write.h"
#include "kiln/hpc/md/text_fields.h"
#include "kiln/runtime/error.h"

namespace kiln::md {

namespace {

double parse_real(std::string_view field, const std::string& where, const char* what) {
  std::string t = trim(field);
  double v = 0;
  auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  KILN_CHECK(!t.empty() && ec == std::errc() && end == t.data() + t.size() && std::isfinite(v),
             "{}: {} '{}' is not a number", where, what, t);
  return v;
}

long parse_integer(std::string_view field, const std::string& where, const char* what) {
  std::string t = trim(field);
  long v = 0;
  auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  KILN_CHECK(!t.empty() && ec == std::errc() && end == t.data() + t.size(), "{}: {} '{}' is not an integer", where,
             what, t);
  return v;
}

}  // namespace

GroFrame parse_gro(const std::string& text, const std::string& name) {
  std::vector<std::string> lines;
  {
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      lines.push_back(std::move(line));
    }
  }
  GroFrame f;
  KILN_CHECK(lines.size() >= 2, "{}: a .gro file needs a title line and an atom-count line", name);
  f.title = lines[0];
  long n = parse_integer(lines[1], fmt::format("{}:2", name), "atom count");
  KILN_CHECK(n > 0, "{}:2: atom count {} must be positive", name, n);
  // Compared as lines.size() - 3 >= n, not lines.size() >= n + 3: a count near LONG_MAX must not
  // overflow (found by the gro fuzzer).
  KILN_CHECK(static_cast<long>(lines.size()) - 3 >= n,
             "{}: the atom count (line 2) says {} atoms, but the file has {} "
             "lines, not the {} atom lines and the box line after the title and the count",
             name, n, lines.size(), n);
  // GROMACS reads the coordinate precision from the first atom line: the distance between the
  // first two decimal points after column 20 is the field width (8 for the standard %8.3f).
  const std::string& first = lines[2];
  size_t p1 = first.find('.', 20), p2 = p1 == std::string::npos ? p1 : first.find('.', p1 + 1);
  KILN_CHECK(p1 != std::string::npos && p2 != std::string::npos,
             "{}:3: no coordinates with decimal points after "
             "column 20 (the .gro atom line is 'resnr resname atomname atomnr x y z' in fixed columns)",
             name);
  const size_t width = p2 - p1;
  KILN_CHECK(width >= 4 && width <= 20, "{}:3: cannot tell the coordinate field width", name);
  f.residue_numbers.resize(n);
  f.residue_names.resize(n);
  f.atom_names.resize(n);
  f.positions.resize(n);
  bool has_velocities = first.size() >= 20 + 6 * width && trim(first.substr(20 + 3 * width)).size() > 0;
  if (has_velocities) f.velocities.resize(n);
  for (long i = 0; i < n; ++i) {
    const std::string& l = lines[i + 2];
    std::string where = fmt::format("{}:{}", name, i + 3);
    KILN_CHECK(l.size() >= 20 + 3 * width,
               "{}: atom line has {} characters, fewer than the {} that residue, atom and "
               "x y z need",
               where, l.size(), 20 + 3 * width);
    f.residue_numbers[i] = static_cast<int>(parse_integer(l.substr(0, 5), where, "residue number"));
    f.residue_names[i] = trim(l.substr(5, 5));
    f.atom_names[i] = trim(l.substr(10, 5));
    KILN_CHECK(!f.atom_names[i].empty(), "{}: the atom name (columns 11-15) is empty", where);
    static const char* axes[] = {"x", "y", "z"};
    for (int k = 0; k < 3; ++k) f.positions[i][k] = parse_real(l.substr(20 + k * width, width), where, axes[k]);
    if (has_velocities) {
      static const char* vaxes[] = {"vx", "vy", "vz"};
      KILN_CHECK(l.size() >= 20 + 6 * width, "{}: the first atom line has velocities but this one does not", where);
      for (int k = 0; k < 3; ++k)
        f.velocities[i][k] = parse_real(l.substr(20 + (3 + k) * width, width), where, vaxes[k]);
    }
  }
  std::string where = fmt::format("{}:{}", name, n + 3);
  std::istringstream box(lines[n + 2]);
  std::vector<double> b;
  for (std::string tok; box >> tok;) b.push_back(parse_real(tok, where, "box value"));
  KILN_CHECK(b.size() == 3 || b.size() == 9, "{}: the box line has {} values; expected 3 (rectangular) or 9", where,
             b.size());
  if (b.size() == 9)
    for (int k = 3; k < 9; ++k)
      KILN_CHECK(b[k] == 0.0, "{}: triclinic boxes are not supported yet (off-diagonal box value {} is not 0)", where,
                 b[k]);
  for (int k = 0; k < 3; ++k) {
    KILN_CHECK(b[k] > 0, "{}: box length {} must be positive", where, b[k]);
    f.box[k] = b[k];
  }
  for (size_t extra = n + 3; extra < lines.size(); ++extra)
    KILN_CHECK(trim(lines[extra]).empty(), "{}:{}: text after the box line (is the atom count on line 2 right?)", name,
               extra + 1);
  return f;
}

GroFrame read_gro(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  KILN_CHECK(in.good(), "cannot read the coordinate file '{}'", path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_gro(ss.str(), path.string());
}

std::string format_gro(const GroFrame& f) {
  std::string out = f.title + "\n" + fmt::format("{:5d}\n", f.positions.size());
  for (size_t i = 0; i < f.positions.size(); ++i) {
    const Vec3& x = f.positions[i];
    out +=
        fmt::format("{:5d}{:<5s}{:>5s}{:5d}{:8.3f}{:8.3f}{:8.3f}", f.residue_numbers[i] % 100000,
                    f.residue_names[i].substr(0, 5), f.atom_names[i].substr(0, 5), (i + 1) % 100000, x[0], x[1], x[2]);
    if (!f.velocities.empty()) {
      const Vec3& v = f.velocities[i];
      out += fmt::format("{:8.4f}{:8.4f}{:8.4f}", v[0], v[1], v[2]);
    }
    out += '\n';
  }
  out += fmt::format("{:10.5f}{:10.5f}{:10.5f}\n", f.box[0], f.box[1], f.box[2]);
  return out;
}

void write_gro(const std::filesystem::path& path, const GroFrame& frame) {
  write_file_atomically(path, format_gro(frame));
}

}  // namespace kiln::md
