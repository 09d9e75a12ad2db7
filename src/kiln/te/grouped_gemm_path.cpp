#include "kiln/te/grouped_gemm_path.h"

#include <cstdlib>
#include <string_view>

#include "kiln/runtime/error.h"

namespace kiln::te {

GroupedGemmPath grouped_gemm_path() {
  const char* v = std::getenv("KILN_GROUPED_GEMM");
  // The loop stays the default until the grouped cuBLAS call has been measured on a GPU (docs/llm.md).
  if (v == nullptr || v[0] == '\0') return GroupedGemmPath::Loop;
  const std::string_view s(v);
  if (s == "grouped") return GroupedGemmPath::Grouped;
  if (s == "loop") return GroupedGemmPath::Loop;
  if (s == "tc") return GroupedGemmPath::Tc;
  KILN_FAIL("KILN_GROUPED_GEMM={}: expected grouped, loop or tc", s);
}

}  // namespace kiln::te
