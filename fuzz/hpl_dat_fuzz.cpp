// parse_hpl_dat on arbitrary text: Parameters, or a kiln::Error naming the file. What it accepts
// expands into runs whose variant codes can be printed.
#include "fuzz_support.h"
#include "kiln/hpc/hpl/hpl_params.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  kiln::hpl::Parameters p;
  if (!kiln::fuzz::parses("HPL.dat", [&] { p = kiln::hpl::parse_hpl_dat(text, "HPL.dat"); })) return 0;
  if (p.ps.size() != p.qs.size()) kiln::fuzz::fail("HPL.dat: as many Ps as Qs were not read");
  // Every list is at most 20 long, so a sweep can be 20^5 * 6 * 3 * 3 * 2 runs: expand the small ones.
  std::size_t runs = p.ps.size();
  for (std::size_t n : {p.ns.size(), p.nbs.size(), p.depths.size(), p.bcasts.size(), p.rfacts.size(), p.pfacts.size(),
                        p.nbmins.size(), p.ndivs.size()})
    runs *= n;
  if (runs == 0) kiln::fuzz::fail("HPL.dat was accepted with an empty list");
  if (runs > 4096) return 0;
  auto expanded = kiln::hpl::expand_runs(p);
  if (expanded.size() != runs) kiln::fuzz::fail("expand_runs made the wrong number of runs");
  for (const auto& run : expanded) {
    if (kiln::hpl::variant_code(run).find('?') != std::string::npos)
      kiln::fuzz::fail("HPL.dat gave a run with an unknown factorization");
  }
  return 0;
}
