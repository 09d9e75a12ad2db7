// te/grouped_gemm_args.h on the CPU: the arguments of the cuBLAS grouped call, run here by a
// reference column-major GEMM with cuBLAS's conventions (op, leading dimensions, per-problem
// pointers in group-major order), must give the CPU kernels' products (forward, data gradient,
// weight gradient) with an empty expert and unused tail rows; every output element of the experts'
// rows is written exactly once; equal shapes share a group; bad offsets are refused.
#include "kiln/te/grouped_gemm_args.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "kiln/ops/kernel_registry.h"
#include "kiln/runtime/error.h"
#include "kiln/te/grouped_gemm_path.h"
#include "kiln/te/moe_ops.h"
#include "te_test_util.h"

namespace kiln::te {
namespace grouped_gemm_args_test {

// C = op(A) op(B) per problem, column-major, as cublasGemmGroupedBatchedEx defines it (alpha 1,
// beta 0). writes[i] counts the writes of C's element i.
void run_column_major(const GroupedGemmArgs& args, const std::vector<double>& a, const std::vector<double>& b,
                      std::vector<double>& c, std::vector<int>& writes) {
  std::size_t idx = 0;
  for (const GemmGroup& g : args.groups) {
    for (std::int64_t j = 0; j < g.size; ++j, ++idx) {
      const double* pa = a.data() + args.a[idx];
      const double* pb = b.data() + args.b[idx];
      const std::int64_t c0 = args.c[idx];
      for (std::int64_t col = 0; col < g.n; ++col) {
        for (std::int64_t row = 0; row < g.m; ++row) {
          double s = 0;
          for (std::int64_t l = 0; l < g.k; ++l) {
            const double av = g.trans_a ? pa[l + row * g.lda] : pa[row + l * g.lda];
            const double bv = g.trans_b ? pb[col + l * g.ldb] : pb[l + col * g.ldb];
            s += av * bv;
          }
          const std::int64_t at = c0 + row + col * g.ldc;
          ASSERT_GE(at, 0);
          ASSERT_LT(static_cast<std::size_t>(at), c.size());
          c[static_cast<std::size_t>(at)] = s;
          ++writes[static_cast<std::size_t>(at)];
        }
      }
    }
  }
  EXPECT_EQ(idx, args.problems());
}

struct Case {
  std::vector<std::int64_t> offsets;
  std::int64_t rows, kdim, odim;
};

Tensor offsets_tensor(const Case& c) {
  return Tensor::from_vector(c.offsets, {static_cast<std::int64_t>(c.offsets.size())});
}

// The forward (trans_w false) or data-gradient (true) product through the arguments, with the tail
// rows zeroed as the CUDA caller does, against te::cpu::grouped_gemm.
void check_forward(const Case& c, bool trans_w) {
  SCOPED_TRACE(trans_w ? "TransW" : "Forward");
  const std::int64_t experts = static_cast<std::int64_t>(c.offsets.size()) - 1;
  const Tensor x = te_test::randn({c.rows, c.kdim}, 1);
  const Tensor w =
      trans_w ? te_test::randn({experts, c.kdim, c.odim}, 2) : te_test::randn({experts, c.odim, c.kdim}, 2);
  Tensor want = Tensor::empty({c.rows, c.odim}, DType::F64);
  ops::kernel(moe_ops().grouped_gemm, Device::cpu(), DType::F64)(x, w, offsets_tensor(c), trans_w, want);

  const GroupedGemmArgs args =
      grouped_gemm_args(trans_w ? GroupedProduct::TransW : GroupedProduct::Forward, c.offsets, c.rows, c.kdim, c.odim);
  std::vector<double> y(static_cast<std::size_t>(c.rows * c.odim), std::numeric_limits<double>::quiet_NaN());
  std::vector<int> writes(y.size(), 0);
  run_column_major(args, w.to_vector<double>(), x.to_vector<double>(), y, writes);
  for (std::int64_t i = args.used_rows * c.odim; i < c.rows * c.odim; ++i) y[static_cast<std::size_t>(i)] = 0;
  for (std::int64_t i = 0; i < args.used_rows * c.odim; ++i)
    ASSERT_EQ(writes[static_cast<std::size_t>(i)], 1) << "output element " << i;
  EXPECT_LE(te_test::rel_error(Tensor::from_vector(y, {c.rows, c.odim}), want), 1e-12);
}

void check_wgrad(const Case& c) {
  SCOPED_TRACE("Wgrad");
  const std::int64_t experts = static_cast<std::int64_t>(c.offsets.size()) - 1;
  const Tensor dy = te_test::randn({c.rows, c.odim}, 3);
  const Tensor x = te_test::randn({c.rows, c.kdim}, 4);
  Tensor want = Tensor::empty({experts, c.odim, c.kdim}, DType::F64);
  ops::kernel(moe_ops().grouped_gemm_wgrad, Device::cpu(), DType::F64)(dy, x, offsets_tensor(c), want);

  const GroupedGemmArgs args = grouped_gemm_args(GroupedProduct::Wgrad, c.offsets, c.rows, c.kdim, c.odim);
  std::vector<double> dw(static_cast<std::size_t>(experts * c.odim * c.kdim), std::numeric_limits<double>::quiet_NaN());
  std::vector<int> writes(dw.size(), 0);
  run_column_major(args, x.to_vector<double>(), dy.to_vector<double>(), dw, writes);
  const std::int64_t per_expert = c.odim * c.kdim;
  for (std::int64_t e : args.empty_experts)
    for (std::int64_t i = 0; i < per_expert; ++i) dw[static_cast<std::size_t>(e * per_expert + i)] = 0;
  for (std::size_t i = 0; i < dw.size(); ++i) {
    const std::int64_t e = static_cast<std::int64_t>(i) / per_expert;
    const bool empty = c.offsets[static_cast<std::size_t>(e)] == c.offsets[static_cast<std::size_t>(e) + 1];
    ASSERT_EQ(writes[i], empty ? 0 : 1) << "dw element " << i;
  }
  EXPECT_LE(te_test::rel_error(Tensor::from_vector(dw, {experts, c.odim, c.kdim}), want), 1e-12);
}

TEST(GroupedGemmArgs, RunByAColumnMajorGemmTheyGiveTheCpuKernelsProducts) {
  // Experts of 3, 0, 3 and 4 rows, then 2 unused rows; K and O unequal so a swapped role shows.
  const Case uneven{{0, 3, 3, 6, 10}, 12, 5, 7};
  check_forward(uneven, false);
  check_forward(uneven, true);
  check_wgrad(uneven);
  // The first and the last expert empty, no tail rows.
  const Case ends_empty{{0, 0, 2, 9, 9}, 9, 4, 3};
  check_forward(ends_empty, false);
  check_forward(ends_empty, true);
  check_wgrad(ends_empty);
}

TEST(GroupedGemmArgs, EqualShapesShareAGroupInExpertOrder) {
  const GroupedGemmArgs fwd =
      grouped_gemm_args(GroupedProduct::Forward, std::vector<std::int64_t>{0, 3, 3, 6, 10}, 12, 5, 7);
  ASSERT_EQ(fwd.groups.size(), 2u);  // n = 3 (experts 0 and 2) and n = 4 (expert 3); expert 1 has no rows
  EXPECT_EQ(fwd.groups[0].n, 3);
  EXPECT_EQ(fwd.groups[0].size, 2);
  EXPECT_EQ(fwd.groups[1].n, 4);
  EXPECT_EQ(fwd.groups[1].size, 1);
  EXPECT_EQ(fwd.expert, (std::vector<std::int64_t>{0, 2, 3}));
  EXPECT_TRUE(fwd.empty_experts.empty());
  EXPECT_EQ(fwd.used_rows, 10);
  EXPECT_TRUE(fwd.fits_int32());

  const GroupedGemmArgs wgrad =
      grouped_gemm_args(GroupedProduct::Wgrad, std::vector<std::int64_t>{0, 3, 3, 6, 10}, 12, 5, 7);
  ASSERT_EQ(wgrad.groups.size(), 2u);
  EXPECT_EQ(wgrad.groups[0].k, 3);
  EXPECT_EQ(wgrad.empty_experts, (std::vector<std::int64_t>{1}));

  // Capacity padding: every expert has the same rows, one group.
  const GroupedGemmArgs padded =
      grouped_gemm_args(GroupedProduct::TransW, std::vector<std::int64_t>{0, 4, 8, 12, 16}, 16, 8, 8);
  ASSERT_EQ(padded.groups.size(), 1u);
  EXPECT_EQ(padded.groups[0].size, 4);
}

TEST(GroupedGemmArgs, BadOffsetsAreRefusedAndHugeDimensionsDoNotFitInt32) {
  auto message = [](std::vector<std::int64_t> off, std::int64_t rows) {
    try {
      grouped_gemm_args(GroupedProduct::Forward, off, rows, 4, 4);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({0, 5, 3, 8}, 8).find("decrease at expert 1"), std::string::npos) << message({0, 5, 3, 8}, 8);
  EXPECT_NE(message({0, 5, 13}, 12).find("past the 12 rows"), std::string::npos) << message({0, 5, 13}, 12);
  EXPECT_NE(message({-1, 5}, 12).find("negative"), std::string::npos) << message({-1, 5}, 12);
  EXPECT_NE(message({}, 12).find("empty"), std::string::npos);
  const std::int64_t huge = std::int64_t{3} << 30;  // 3 Gi rows in one expert: past int32
  EXPECT_FALSE(grouped_gemm_args(GroupedProduct::Forward, std::vector<std::int64_t>{0, huge}, huge, 1, 1).fits_int32());
}

// KILN_GROUPED_GEMM picks the CUDA path; a value it does not know is refused naming the variable.
TEST(GroupedGemmPath, ReadFromTheEnvironmentOnEveryCall) {
  const char* before = std::getenv("KILN_GROUPED_GEMM");
  const std::string saved = before ? before : "";
  unsetenv("KILN_GROUPED_GEMM");
  EXPECT_EQ(grouped_gemm_path(), GroupedGemmPath::Auto);
  setenv("KILN_GROUPED_GEMM", "", 1);
  EXPECT_EQ(grouped_gemm_path(), GroupedGemmPath::Auto);
  setenv("KILN_GROUPED_GEMM", "auto", 1);
  EXPECT_EQ(grouped_gemm_path(), GroupedGemmPath::Auto);
  setenv("KILN_GROUPED_GEMM", "grouped", 1);
  EXPECT_EQ(grouped_gemm_path(), GroupedGemmPath::Grouped);
  setenv("KILN_GROUPED_GEMM", "loop", 1);
  EXPECT_EQ(grouped_gemm_path(), GroupedGemmPath::Loop);
  setenv("KILN_GROUPED_GEMM", "chunked", 1);
  EXPECT_EQ(grouped_gemm_path(), GroupedGemmPath::Chunked);
  setenv("KILN_GROUPED_GEMM", "tc", 1);
  EXPECT_EQ(grouped_gemm_path(), GroupedGemmPath::Tc);
  setenv("KILN_GROUPED_GEMM", "cutlass", 1);
  std::string message = "no error";
  try {
    grouped_gemm_path();
  } catch (const Error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("KILN_GROUPED_GEMM=cutlass: expected auto, grouped, loop, chunked or tc"), std::string::npos)
      << message;
  if (before) {
    setenv("KILN_GROUPED_GEMM", saved.c_str(), 1);
  } else {
    unsetenv("KILN_GROUPED_GEMM");
  }
}

// Auto takes the chunked launches for many small experts and the loop for few large ones; the
// empty experts do not count towards the average, and the other paths stay what they are.
TEST(GroupedGemmPath, AutoChoosesByRowsPerExpert) {
  using P = GroupedGemmPath;
  const std::vector<std::int64_t> small = {0, 500, 500, 1100, 1600};    // 3 experts with rows, 533 each
  const std::vector<std::int64_t> large = {0, 2048, 2048, 4096, 6200};  // 3 with rows, 2067 each
  const std::vector<std::int64_t> edge = {0, 1024, 2048};               // exactly the threshold
  // One expert with 3000 rows and two with 100: the average (1067) is above the threshold, but two
  // of the loop's GEMMs would be small.
  const std::vector<std::int64_t> skewed = {0, 3000, 3000, 3100, 3200};
  EXPECT_EQ(resolve_grouped_gemm_path(P::Auto, small), P::Chunked);
  EXPECT_EQ(resolve_grouped_gemm_path(P::Auto, skewed), P::Chunked);
  EXPECT_EQ(resolve_grouped_gemm_path(P::Auto, large), P::Loop);
  EXPECT_EQ(resolve_grouped_gemm_path(P::Auto, edge), P::Loop);
  EXPECT_EQ(resolve_grouped_gemm_path(P::Auto, std::vector<std::int64_t>{0, 0, 0}), P::Loop);
  for (P p : {P::Grouped, P::Loop, P::Chunked, P::Tc}) EXPECT_EQ(resolve_grouped_gemm_path(p, small), p);
}

}  // namespace grouped_gemm_args_test
}  // namespace kiln::te
