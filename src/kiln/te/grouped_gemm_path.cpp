#include "kiln/te/grouped_gemm_path.h"

#include <cstdlib>
#include <string_view>

#include "kiln/runtime/error.h"

namespace kiln::te {

GroupedGemmPath grouped_gemm_path() {
  const char* v = std::getenv("KILN_GROUPED_GEMM");
  if (v == nullptr || v[0] == '\0') return GroupedGemmPath::Loop;
  const std::string_view s(v);
  if (s == "auto") return GroupedGemmPath::Auto;
  if (s == "grouped") return GroupedGemmPath::Grouped;
  if (s == "loop") return GroupedGemmPath::Loop;
  if (s == "chunked") return GroupedGemmPath::Chunked;
  if (s == "tc") return GroupedGemmPath::Tc;
  KILN_FAIL("KILN_GROUPED_GEMM={}: expected auto, grouped, loop, chunked or tc", s);
}

GroupedGemmPath resolve_grouped_gemm_path(GroupedGemmPath path, std::span<const std::int64_t> offsets) {
  if (path != GroupedGemmPath::Auto) return path;
  std::int64_t active = 0;
  for (std::size_t e = 0; e + 1 < offsets.size(); ++e) active += offsets[e + 1] > offsets[e] ? 1 : 0;
  if (active == 0) return GroupedGemmPath::Loop;
  const std::int64_t rows = offsets.back() - offsets.front();
  return rows < kAutoChunkedRows * active ? GroupedGemmPath::Chunked : GroupedGemmPath::Loop;
}

}  // namespace kiln::te
