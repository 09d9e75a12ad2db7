// parse_xtc and parse_trr on arbitrary bytes (kiln's trajectory reader, used on resume and by the
// benchmarks): frames, or a kiln::Error naming the file and offset, never a read past the input.
// What a reader accepts has one coordinate per atom, and the resume cut never exceeds the file.
#include "fuzz_support.h"
#include "kiln/hpc/md/trajectory_files.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  std::vector<kiln::md::TrajectoryFrame> frames;
  if (kiln::fuzz::parses("traj.xtc", [&] { frames = kiln::md::parse_xtc(bytes, "traj.xtc"); }))
    for (const auto& f : frames)
      if (f.end_offset > size || !f.v.empty()) kiln::fuzz::fail("traj.xtc: a frame past the input was accepted");
  if (kiln::fuzz::parses("traj.trr", [&] { frames = kiln::md::parse_trr(bytes, "traj.trr"); }))
    for (const auto& f : frames)
      if ((!f.v.empty() && !f.x.empty() && f.v.size() != f.x.size()) || f.end_offset > size)
        kiln::fuzz::fail("traj.trr: fields of different atom counts were accepted");
  if (kiln::md::xtc_bytes_before_step(bytes, 1 << 30) > size || kiln::md::trr_bytes_before_step(bytes, 5) > size)
    kiln::fuzz::fail("the resume cut is longer than the file");
  return 0;
}
