#include "kiln/hpc/md/trajectory_files.h"

#include <climits>
#include <cmath>
#include <fstream>
#include <functional>
#include <sstream>

#include "kiln/runtime/error.h"

namespace kiln::md {

namespace {

constexpr std::int32_t kXtcMagic = 1995;
constexpr std::int32_t kTrrMagic = 1993;
constexpr std::string_view kTrrVersion = "GMX_trn_file";

std::int32_t step_field(std::int64_t step) {
  KILN_CHECK(step >= 0 && step <= INT_MAX, "trajectory: step {} does not fit the files' 32-bit step field", step);
  return static_cast<std::int32_t>(step);
}

std::vector<FloatVec3> to_float(const std::vector<Vec3>& v) {
  std::vector<FloatVec3> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i)
    out[i] = {static_cast<float>(v[i][0]), static_cast<float>(v[i][1]), static_cast<float>(v[i][2])};
  return out;
}

void put_box(XdrWriter& out, const Vec3& box) {
  for (int row = 0; row < 3; ++row)
    for (int col = 0; col < 3; ++col) out.put_float(row == col ? static_cast<float>(box[row]) : 0.0f);
}

std::array<float, 9> get_box(XdrReader& in) {
  std::array<float, 9> box{};
  for (float& b : box) b = in.get_float();
  return box;
}

// One frame's header check: the atom count must fit what is left of the file (3 floats each at least
// for trr fields; the xtc coordinate reader checks its own).
std::int32_t atom_count(XdrReader& in) {
  const std::int32_t natoms = in.get_int();
  KILN_CHECK(natoms >= 0, "{}: atom count {} before byte {} is negative", in.name(), natoms, in.offset());
  return natoms;
}

TrajectoryFrame read_xtc_frame(XdrReader& in) {
  const std::size_t start = in.offset();
  const std::int32_t magic = in.get_int();
  KILN_CHECK(magic == kXtcMagic, "{}: byte {} starts no xtc frame (magic {}, expected {})", in.name(), start, magic,
             kXtcMagic);
  TrajectoryFrame f;
  const std::int32_t natoms = atom_count(in);
  f.step = in.get_int();
  f.time = in.get_float();
  f.box = get_box(in);
  f.x = read_xtc_coordinates(in, natoms, f.precision);
  f.end_offset = in.offset();
  return f;
}

std::vector<FloatVec3> get_vectors(XdrReader& in, std::int32_t natoms, std::int32_t bytes, bool doubles) {
  const std::int64_t real_size = doubles ? 8 : 4;
  KILN_CHECK(bytes == 0 || bytes == std::int64_t{natoms} * 3 * real_size,
             "{}: a {}-byte vector block for {} atoms before byte {}", in.name(), bytes, natoms, in.offset());
  KILN_CHECK(static_cast<std::size_t>(bytes) <= in.remaining(), "{}: truncated at byte {}: {} more bytes expected",
             in.name(), in.offset(), bytes);
  std::vector<FloatVec3> out(bytes == 0 ? 0 : static_cast<std::size_t>(natoms));
  for (auto& a : out)
    for (float& c : a) c = doubles ? static_cast<float>(in.get_double()) : in.get_float();
  return out;
}

TrajectoryFrame read_trr_frame(XdrReader& in) {
  const std::size_t start = in.offset();
  const std::int32_t magic = in.get_int();
  KILN_CHECK(magic == kTrrMagic, "{}: byte {} starts no trr frame (magic {}, expected {})", in.name(), start, magic,
             kTrrMagic);
  const std::int32_t version_length = in.get_int();
  const std::int32_t string_length = in.get_int();
  KILN_CHECK(version_length == static_cast<std::int32_t>(kTrrVersion.size()) + 1 &&
                 string_length == static_cast<std::int32_t>(kTrrVersion.size()) &&
                 in.get_opaque(kTrrVersion.size()) == kTrrVersion,
             "{}: the trr frame at byte {} has no '{}' version string", in.name(), start, kTrrVersion);
  // ir, e, box, vir, pres, top, sym, x, v, f sizes in bytes, then natoms, step, nre, t, lambda.
  std::array<std::int32_t, 10> sizes{};
  for (auto& s : sizes) {
    s = in.get_int();
    KILN_CHECK(s >= 0, "{}: negative block size {} in the trr frame at byte {}", in.name(), s, start);
  }
  const auto [ir, e, box, vir, pres, top, sym, xs, vs, fs] = sizes;
  KILN_CHECK(ir == 0 && e == 0 && top == 0 && sym == 0, "{}: the trr frame at byte {} has blocks kiln does not read",
             in.name(), start);
  const std::int32_t natoms = atom_count(in);
  const std::int64_t vector_bytes = xs ? xs : vs ? vs : fs;
  const bool doubles = box ? box == 72 : natoms > 0 && vector_bytes == std::int64_t{natoms} * 24;
  KILN_CHECK(box == 0 || box == 36 || box == 72, "{}: box block of {} bytes in the trr frame at byte {}", in.name(),
             box, start);
  TrajectoryFrame f;
  f.step = in.get_int();
  in.get_int();  // nre
  auto get_real = [&] { return doubles ? in.get_double() : static_cast<double>(in.get_float()); };
  f.time = get_real();
  get_real();  // lambda
  if (box)
    for (float& b : f.box) b = doubles ? static_cast<float>(in.get_double()) : in.get_float();
  for (std::int32_t skipped : {vir, pres}) {
    KILN_CHECK(static_cast<std::size_t>(skipped) <= in.remaining(), "{}: truncated trr frame at byte {}", in.name(),
               start);
    in.get_opaque(static_cast<std::size_t>(skipped));
  }
  f.x = get_vectors(in, natoms, xs, doubles);
  f.v = get_vectors(in, natoms, vs, doubles);
  f.f = get_vectors(in, natoms, fs, doubles);
  f.end_offset = in.offset();
  return f;
}

std::vector<TrajectoryFrame> parse_frames(std::string_view bytes, const std::string& name,
                                          TrajectoryFrame (*read_frame)(XdrReader&)) {
  XdrReader in(bytes, name);
  std::vector<TrajectoryFrame> frames;
  while (!in.at_end()) frames.push_back(read_frame(in));
  return frames;
}

std::size_t bytes_before_step(std::string_view bytes, std::int64_t step, TrajectoryFrame (*read_frame)(XdrReader&)) {
  XdrReader in(bytes, "trajectory");
  std::size_t kept = 0;
  try {
    while (!in.at_end()) {
      const TrajectoryFrame f = read_frame(in);
      if (f.step >= step) break;
      kept = f.end_offset;
    }
  } catch (const Error&) {
    // A frame cut by a crash (or damaged): everything from it on is dropped.
  }
  return kept;
}

std::string read_whole_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  KILN_CHECK(in.good(), "cannot read the trajectory '{}'", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

std::string encode_xtc_frame(std::int64_t step, double time, const Vec3& box, const std::vector<Vec3>& x,
                             float precision) {
  XdrWriter out;
  out.put_int(kXtcMagic);
  out.put_int(static_cast<std::int32_t>(x.size()));
  out.put_int(step_field(step));
  out.put_float(static_cast<float>(time));
  put_box(out, box);
  write_xtc_coordinates(out, to_float(x), precision);
  return out.take();
}

std::string encode_trr_frame(std::int64_t step, double time, const Vec3& box, const std::vector<Vec3>* x,
                             const std::vector<Vec3>* v, const std::vector<Vec3>* f) {
  const std::vector<Vec3>* any = x ? x : v ? v : f;
  KILN_CHECK(any != nullptr, "trr: a frame needs positions, velocities or forces");
  const auto natoms = static_cast<std::int32_t>(any->size());
  auto block = [&](const std::vector<Vec3>* p) { return p ? natoms * 3 * 4 : 0; };
  XdrWriter out;
  out.put_int(kTrrMagic);
  out.put_int(static_cast<std::int32_t>(kTrrVersion.size()) + 1);  // GROMACS counts the terminating NUL
  out.put_int(static_cast<std::int32_t>(kTrrVersion.size()));
  out.put_opaque(kTrrVersion);
  for (std::int32_t s : {0, 0, 9 * 4, 0, 0, 0, 0, block(x), block(v), block(f)}) out.put_int(s);
  out.put_int(natoms);
  out.put_int(step_field(step));
  out.put_int(0);  // nre
  out.put_float(static_cast<float>(time));
  out.put_float(0.0f);  // lambda
  put_box(out, box);
  for (const std::vector<Vec3>* p : {x, v, f}) {
    if (!p) continue;
    KILN_CHECK(static_cast<std::int32_t>(p->size()) == natoms, "trr: {} vectors in a frame of {} atoms", p->size(),
               natoms);
    for (const Vec3& a : *p)
      for (double c : a) out.put_float(static_cast<float>(c));
  }
  return out.take();
}

std::vector<TrajectoryFrame> parse_xtc(std::string_view bytes, const std::string& name) {
  return parse_frames(bytes, name, read_xtc_frame);
}
std::vector<TrajectoryFrame> parse_trr(std::string_view bytes, const std::string& name) {
  return parse_frames(bytes, name, read_trr_frame);
}
std::vector<TrajectoryFrame> read_xtc(const std::string& path) { return parse_xtc(read_whole_file(path), path); }
std::vector<TrajectoryFrame> read_trr(const std::string& path) { return parse_trr(read_whole_file(path), path); }

std::size_t xtc_bytes_before_step(std::string_view bytes, std::int64_t step) {
  return bytes_before_step(bytes, step, read_xtc_frame);
}
std::size_t trr_bytes_before_step(std::string_view bytes, std::int64_t step) {
  return bytes_before_step(bytes, step, read_trr_frame);
}

}  // namespace kiln::md
