#pragma once
// GROMACS's compressed coordinates (the body of an .xtc frame, "xdr3dfcoord"): positions are
// rounded to integers at `precision` (1000: 0.001 nm), stored relative to their minimum in the
// fewest bits their range needs, and runs of atoms close to the previous one (a water's hydrogens
// after its oxygen) as small differences, with an adaptive size for those differences. Frames of
// 9 atoms or fewer are stored as plain floats. Written from the published format description;
// kiln's output is byte for byte what gmx trjconv writes for the same coordinates.
#include <array>
#include <vector>

#include "kiln/hpc/md/xdr.h"

namespace kiln::md {

using FloatVec3 = std::array<float, 3>;

// Appends the atom count, then the coordinates. Errors (a coordinate too large for 32-bit
// integers at this precision) name the atom.
void write_xtc_coordinates(XdrWriter& out, const std::vector<FloatVec3>& x, float precision);

// Reads what write_xtc_coordinates wrote for `natoms` atoms (checked against the stored count);
// `precision` receives the stored precision (0 for an uncompressed frame). Malformed data is a
// kiln::Error naming the reader's file and offset, never a read past the buffer.
std::vector<FloatVec3> read_xtc_coordinates(XdrReader& in, int natoms, float& precision);

}  // namespace kiln::md
