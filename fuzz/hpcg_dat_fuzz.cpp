// read_hpcg_dat on arbitrary bytes: parameters, or a kiln::Error naming the file.
#include "fuzz_support.h"
#include "kiln/hpc/hpcg/hpcg_params.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string path = kiln::fuzz::scratch_path("hpcg.dat").string();
  kiln::fuzz::write_file(path, {data, size});
  kiln::fuzz::parses(path, [&] { kiln::hpcg::read_hpcg_dat(path); });
  return 0;
}
