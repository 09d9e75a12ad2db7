#include "kiln/te/grouped_gemm_args.h"

#include <limits>

#include "kiln/runtime/error.h"

namespace kiln::te {

namespace {

bool same_shape(const GemmGroup& a, const GemmGroup& b) {
  return a.trans_a == b.trans_a && a.trans_b == b.trans_b && a.m == b.m && a.n == b.n && a.k == b.k && a.lda == b.lda &&
         a.ldb == b.ldb && a.ldc == b.ldc;
}

struct Problem {
  GemmGroup shape;  // size unused
  std::int64_t a, b, c, expert;
};

Problem problem_of(GroupedProduct product, std::int64_t e, std::int64_t lo, std::int64_t n, std::int64_t kdim,
                   std::int64_t odim) {
  Problem p;
  p.expert = e;
  switch (product) {
    case GroupedProduct::Forward:
      p.shape = {true, false, odim, n, kdim, kdim, kdim, odim, 0};
      p.a = e * odim * kdim, p.b = lo * kdim, p.c = lo * odim;
      break;
    case GroupedProduct::TransW:
      p.shape = {false, false, odim, n, kdim, odim, kdim, odim, 0};
      p.a = e * kdim * odim, p.b = lo * kdim, p.c = lo * odim;
      break;
    case GroupedProduct::Wgrad:
      p.shape = {false, true, kdim, odim, n, kdim, odim, kdim, 0};
      p.a = lo * kdim, p.b = lo * odim, p.c = e * odim * kdim;
      break;
  }
  return p;
}

}  // namespace

bool GroupedGemmArgs::fits_int32() const {
  constexpr std::int64_t kMax = std::numeric_limits<int>::max();
  for (const GemmGroup& g : groups)
    for (std::int64_t v : {g.m, g.n, g.k, g.lda, g.ldb, g.ldc, g.size})
      if (v > kMax) return false;
  return static_cast<std::int64_t>(groups.size()) <= kMax;
}

GroupedGemmArgs grouped_gemm_args(GroupedProduct product, std::span<const std::int64_t> offsets, std::int64_t rows,
                                  std::int64_t kdim, std::int64_t odim) {
  KILN_CHECK(!offsets.empty(), "grouped_gemm: the expert offsets are empty (expected E + 1 entries)");
  KILN_CHECK(kdim >= 0 && odim >= 0, "grouped_gemm: negative dimensions K {} O {}", kdim, odim);
  const std::int64_t experts = static_cast<std::int64_t>(offsets.size()) - 1;
  KILN_CHECK(offsets[0] >= 0, "grouped_gemm: expert 0 starts at row {} (negative)", offsets[0]);
  for (std::int64_t e = 0; e < experts; ++e) {
    const std::int64_t lo = offsets[static_cast<std::size_t>(e)], hi = offsets[static_cast<std::size_t>(e) + 1];
    KILN_CHECK(lo <= hi, "grouped_gemm: the expert offsets decrease at expert {} ({} then {})", e, lo, hi);
  }
  KILN_CHECK(offsets.back() <= rows, "grouped_gemm: the experts' rows end at {}, past the {} rows of the input",
             offsets.back(), rows);

  GroupedGemmArgs args;
  args.used_rows = offsets.back();
  std::vector<std::vector<Problem>> by_group;  // problems of args.groups[i], in expert order
  for (std::int64_t e = 0; e < experts; ++e) {
    const std::int64_t lo = offsets[static_cast<std::size_t>(e)], n = offsets[static_cast<std::size_t>(e) + 1] - lo;
    if (n == 0) {
      // Forward / TransW: the expert has no output rows. Wgrad: its dw is zeros, which cuBLAS would
      // not write for k = 0 (beta 0 leaves C undefined there), so the caller zeroes it.
      if (product == GroupedProduct::Wgrad) args.empty_experts.push_back(e);
      continue;
    }
    if (kdim == 0 || odim == 0) continue;  // no problems: see the header
    const Problem p = problem_of(product, e, lo, n, kdim, odim);
    std::size_t g = 0;
    while (g < args.groups.size() && !same_shape(args.groups[g], p.shape)) ++g;
    if (g == args.groups.size()) {
      args.groups.push_back(p.shape);
      by_group.emplace_back();
    }
    ++args.groups[g].size;
    by_group[g].push_back(p);
  }
  for (const std::vector<Problem>& ps : by_group) {
    for (const Problem& p : ps) {
      args.a.push_back(p.a);
      args.b.push_back(p.b);
      args.c.push_back(p.c);
      args.expert.push_back(p.expert);
    }
  }
  return args;
}

}  // namespace kiln::te
