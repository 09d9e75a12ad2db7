// parse_gro on arbitrary text (kiln mdrun's coordinates): a frame, or a kiln::Error naming the file
// and line. What it accepts is written back with format_gro and must read again to the same frame.
#include "fuzz_support.h"
#include "kiln/hpc/md/gro_file.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  kiln::md::GroFrame frame;
  if (!kiln::fuzz::parses("conf.gro", [&] { frame = kiln::md::parse_gro(text, "conf.gro"); })) return 0;
  const std::size_t n = frame.positions.size();
  if (frame.atom_names.size() != n || frame.residue_names.size() != n || frame.residue_numbers.size() != n)
    kiln::fuzz::fail("conf.gro: per-atom fields of different lengths were accepted");
  if (!frame.velocities.empty() && frame.velocities.size() != n)
    kiln::fuzz::fail("conf.gro: velocities for some atoms only were accepted");
  kiln::md::GroFrame again;
  // format_gro writes fixed columns: values too wide for them may be refused on the way back, but
  // never crash, and what reads back has the same atoms.
  if (!kiln::fuzz::parses("formatted.gro",
                          [&] { again = kiln::md::parse_gro(kiln::md::format_gro(frame), "formatted.gro"); }))
    return 0;
  if (again.positions.size() != n) kiln::fuzz::fail("format_gro then parse_gro changed the atom count");
  return 0;
}
