#include "kiln/te/grouped_gemm_path.h"

#include <cstdlib>
#include <string_view>

#include "kiln/runtime/error.h"

namespace kiln::te {

GroupedGemmPath grouped_gemm_path() {
  const char* v = std::getenv("KILN_GROUPED_GEMM");
  if (v == nullptr || v[0] == '\0') return GroupedGemmPath::Auto;
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
  // Any expert with rows but fewer than the threshold makes the loop launch a GEMM too small to fill
  // the GPU; the chunked launches batch those, and still run the large experts' rows in 1024-row
  // blocks. An average would hide them: a routing early in training sends most tokens to a few
  // experts and a few tokens to many.
  for (std::size_t e = 0; e + 1 < offsets.size(); ++e) {
    const std::int64_t rows = offsets[e + 1] - offsets[e];
    if (rows > 0 && rows < kAutoChunkedRows) return GroupedGemmPath::Chunked;
  }
  return GroupedGemmPath::Loop;
}

}  // namespace kiln::te
