// parse_mdp on arbitrary text (kiln mdrun's run parameters): options, or a kiln::Error naming the
// file, the line and the option.
#include "fuzz_support.h"
#include "kiln/hpc/md/mdp_options.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  kiln::fuzz::parses("run.mdp", [&] { (void)kiln::md::parse_mdp(text, "run.mdp"); });
  return 0;
}
