#pragma once
// GROMACS's trajectory files as kiln mdrun writes them: the compressed .xtc (positions at a
// chosen precision) and the full-precision .trr (positions, velocities and/or forces), both XDR,
// one self-contained frame after another. Frames are encoded to bytes here and appended by
// trajectory_output.h; the readers serve the tests, resuming (which keeps the frames before the
// checkpoint's step) and the benchmarks. Only rectangular boxes are written (kiln's boxes are).
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/hpc/md/vec3.h"
#include "kiln/hpc/md/xtc_coordinates.h"

namespace kiln::md {

struct TrajectoryFrame {
  std::int64_t step = 0;
  double time = 0;                 // ps
  std::array<float, 9> box{};      // row-major box vectors, nm
  float precision = 0;             // .xtc: 1 / the coordinate resolution (0: an uncompressed frame)
  std::vector<FloatVec3> x, v, f;  // nm, nm/ps, kJ/mol/nm; .trr frames may lack any of them
  std::size_t end_offset = 0;      // where the frame ends in its file
};

std::string encode_xtc_frame(std::int64_t step, double time, const Vec3& box, const std::vector<Vec3>& x,
                             float precision);
// nullptr: that field is not in the frame.
std::string encode_trr_frame(std::int64_t step, double time, const Vec3& box, const std::vector<Vec3>* x,
                             const std::vector<Vec3>* v, const std::vector<Vec3>* f);

// Every frame in the file's bytes; a malformed or cut frame is a kiln::Error naming `name` and the offset.
std::vector<TrajectoryFrame> parse_xtc(std::string_view bytes, const std::string& name);
std::vector<TrajectoryFrame> parse_trr(std::string_view bytes, const std::string& name);
std::vector<TrajectoryFrame> read_xtc(const std::string& path);
std::vector<TrajectoryFrame> read_trr(const std::string& path);

// The length of the file's leading whole frames whose step is below `step`: what a run resumed at
// `step` keeps (a frame cut by a crash, and frames from beyond the checkpoint, are dropped).
std::size_t xtc_bytes_before_step(std::string_view bytes, std::int64_t step);
std::size_t trr_bytes_before_step(std::string_view bytes, std::int64_t step);

}  // namespace kiln::md
