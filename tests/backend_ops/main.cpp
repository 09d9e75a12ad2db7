// test_backend_ops: the harness as a CTest test (GoogleTest: coverage, eval, grad) and as a tool:
//
//   test_backend_ops --mode eval|grad|perf|list [--op NAME] [--backend cpu|cuda] [--verbose]
//
// Without --mode it runs as a GoogleTest binary (gtest flags apply). This main replaces
// gtest_main's: the linker takes an archive's main only when none is defined.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "harness.h"
#include "kiln/ops/kernel_registry.h"

namespace kiln::backend_ops {
namespace {

void expect_clean(const char* mode, const Report& r) {
  print_report(mode, r);
  EXPECT_EQ(r.failures, 0) << r.failures << " failed checks in --mode " << mode << " (listed above)";
  EXPECT_GT(r.cases_run, 0);
}

TEST(BackendOps, EveryRegisteredKernelHasACase) {
  Coverage c = coverage();
  print_coverage(c);
  EXPECT_TRUE(c.uncovered.empty()) << c.uncovered.size()
                                   << " registered kernels have no case: add one to tests/backend_ops/cases_*.cpp";
  EXPECT_TRUE(c.unknown.empty()) << "cases name ops the registry does not have";
  EXPECT_GT(c.kernels_per_backend["cpu"], 40);
}

TEST(BackendOps, EvalMatchesTheFloat64Reference) { expect_clean("eval", run_eval({})); }

TEST(BackendOps, GradientsMatchFiniteDifferences) { expect_clean("grad", run_grad({})); }

// The harness itself: a case that computes the wrong thing, or at float32 where float64 is due,
// must fail (so a passing run means something).
TEST(BackendOps, ComparisonCatchesAFloat32KernelInAFloat64Case) {
  OpCase c;
  c.name = "self_test/f32_inside";
  c.kernels = {"unary"};
  c.dtypes = {};
  c.inputs = [](bool) { return std::vector<Tensor>{randn({64}, 1)}; };
  c.forward = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{in[0].to(DType::F32).to(in[0].dtype())};  // rounds through float32
  };
  c.reference = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0]}; };
  // The CPU's float64 run of this case must miss the reference.
  Options cpu_only;
  cpu_only.backend = "cpu";
  Report r = run_eval(cpu_only, {c});
  EXPECT_GT(r.failures, 0) << "a float32 round trip passed as float64";
}

}  // namespace
}  // namespace kiln::backend_ops

int main(int argc, char** argv) {
  using namespace kiln::backend_ops;
  std::string mode;
  Options o;
  for (int i = 1; i < argc; ++i) {
    auto value = [&](const char* flag) -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "test_backend_ops: %s needs a value\n", flag);
        std::exit(2);
      }
      return argv[++i];
    };
    if (std::strcmp(argv[i], "--mode") == 0) {
      mode = value("--mode");
    } else if (std::strcmp(argv[i], "--op") == 0) {
      o.op = value("--op");
    } else if (std::strcmp(argv[i], "--backend") == 0) {
      o.backend = value("--backend");
    } else if (std::strcmp(argv[i], "--verbose") == 0) {
      o.verbose = true;
    } else if (!mode.empty() || std::strncmp(argv[i], "--gtest", 7) != 0) {
      std::fprintf(stderr,
                   "test_backend_ops: unknown argument '%s'\n"
                   "usage: test_backend_ops --mode eval|grad|perf|list [--op NAME] [--backend cpu|cuda]\n"
                   "       test_backend_ops [--gtest_* flags]   (the CTest suite)\n",
                   argv[i]);
      return 2;
    }
  }
  if (mode.empty()) {
    ::testing::InitGoogleTest(&argc, argv);
    return RUN_ALL_TESTS();
  }
  try {
    if (o.backend == "cuda" && backends(o).empty()) {
      std::fprintf(stderr, "test_backend_ops: --backend cuda, but no CUDA device is present\n");
      return 1;
    }
    if (!o.op.empty() && !kiln::ops::kernel_registry().find_id(o.op)) {
      (void)all_cases();  // registers the op families outside the core
      if (!kiln::ops::kernel_registry().find_id(o.op)) {
        std::fprintf(stderr, "test_backend_ops: --op '%s' is not a registered op\n", o.op.c_str());
        return 2;
      }
    }
    Coverage c = coverage();
    print_coverage(c);
    if (mode == "list") {
      for (const auto& k : kiln::ops::kernel_registry().kernels())
        std::printf("%s %s %s\n", k.op.c_str(), kiln::device_kind_name(k.device),
                    k.dtype ? std::string(kiln::dtype_name(*k.dtype)).c_str() : "every-dtype");
      for (const auto& cs : all_cases()) std::printf("case %s\n", cs.name.c_str());
      return c.uncovered.empty() && c.unknown.empty() ? 0 : 1;
    }
    Report r;
    if (mode == "eval") {
      r = run_eval(o);
    } else if (mode == "grad") {
      r = run_grad(o);
    } else if (mode == "perf") {
      r = run_perf(o);
    } else {
      std::fprintf(stderr, "test_backend_ops: unknown mode '%s' (expected eval, grad, perf or list)\n", mode.c_str());
      return 2;
    }
    print_report(mode.c_str(), r);
    const bool ok = r.failures == 0 && c.uncovered.empty() && c.unknown.empty() && r.cases_run > 0;
    if (r.cases_run == 0) std::fprintf(stderr, "test_backend_ops: no case runs op '%s'\n", o.op.c_str());
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "test_backend_ops: %s\n", e.what());
    return 1;
  }
}
