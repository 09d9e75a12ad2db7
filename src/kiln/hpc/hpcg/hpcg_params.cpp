#include "kiln/hpc/hpcg/hpcg_params.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include "kiln/runtime/error.h"

namespace kiln::hpcg {

HpcgParams read_hpcg_dat(const std::string& path, HpcgParams p) {
  std::ifstream in(path);
  KILN_CHECK(in, "hpcg: cannot open {}", path);
  std::string line;
  for (int header = 0; header < 2; ++header)
    KILN_CHECK(static_cast<bool>(std::getline(in, line)), "hpcg: {} ends within its two header lines", path);
  KILN_CHECK(static_cast<bool>(std::getline(in, line)), "hpcg: {} has no line 3 (nx ny nz)", path);
  std::istringstream dims(line);
  KILN_CHECK(static_cast<bool>(dims >> p.nx >> p.ny >> p.nz), "hpcg: {} line 3 is not 'nx ny nz': '{}'", path, line);
  if (std::getline(in, line)) {
    std::istringstream rt(line);
    KILN_CHECK(static_cast<bool>(rt >> p.run_seconds), "hpcg: {} line 4 is not a run time in seconds: '{}'", path,
               line);
    KILN_CHECK(std::isfinite(p.run_seconds) && p.run_seconds >= 0 && p.run_seconds <= kMaxRunSeconds,
               "hpcg: {} line 4: run time {} s is not a number of seconds in [0, {}]", path, p.run_seconds,
               kMaxRunSeconds);
  }
  return p;
}

}  // namespace kiln::hpcg
