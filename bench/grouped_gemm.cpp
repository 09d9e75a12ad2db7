// The experts' grouped GEMM on the GPU (bf16), every path of te/cuda/grouped_gemm_cublas.h against
// one dense GEMM of the same FLOPs (issue 19's "within 10% of one dense GEMM" yardstick), for the
// forward (y = x W_e^T), the data gradient (dx = dy W_e) and the weight gradient (dW_e = dy^T x, the
// reduction over the expert's rows). Impls:
//   auto                 the registered kernel, KILN_GROUPED_GEMM=auto: chunked's forward and data
//                        gradient below 1024 rows per expert, else loop
//   grouped              the registered kernel, KILN_GROUPED_GEMM=grouped: offsets read back, one
//                        cublasGemmGroupedBatchedEx call
//   loop                 the registered kernel as MoE layers call it (KILN_GROUPED_GEMM unset or loop):
//                        read-back, one cuBLASLt GEMM per expert
//   chunked              the registered kernel, KILN_GROUPED_GEMM=chunked: read-back, the forward and
//                        data gradient as a few pointer-array batched GEMMs over blocks of rows
//                        (te/cuda/grouped_gemm_chunked.h), the weight gradient as the loop
//   tc                   the registered kernel, KILN_GROUPED_GEMM=tc: Kiln's tensor-core kernel reading
//                        the offsets on the device (what CUDA graph captures run)
//   grouped_host_counts  the grouped call with the counts already on the host (no read-back)
//   loop_host_counts     the per-expert loop with the counts already on the host
//   dense                one cuBLASLt GEMM of the same m, n, k totals (per pass: x W^T, dy W, dy^T x)
// Shapes (8192 tokens, loads uneven by up to +-30%, deterministic): Mixtral 8 experts top-2 (d_model
// 4096, ffn 14336), DeepSeek-class 64 fine-grained experts top-6 (d_model 2048, ffn 1408), a
// Qwen3-30B-A3B-like 128 experts top-8 (d_model 2048, ffn 768); fc1 of a SwiGLU expert (O = 2 ffn)
// and fc2 (K = ffn). Each product of every path is first checked against loop_host_counts
// on the device; a failed check makes the exit status 1.
// JSON lines: {"bench": "grouped_gemm_check", "config", "pass", "impl", "max_abs_diff", "max_abs_ref", "ok"}
// then {"bench": "grouped_gemm", "config", "experts", "topk", "rows", "k", "o", "pass", "impl", "ms",
// "tflops", "vs_dense"} (vs_dense: ms over the dense GEMM's ms of that pass; 1.10 is the bound).
// Usage: bench_grouped_gemm [config-substring]   (e.g. "deepseek"; default: every config)
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "bench_util.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/kernel_registry.h"
#include "kiln/ops/linalg.h"
#include "kiln/ops/op_kinds.h"
#include "kiln/ops/reduce.h"
#if KILN_WITH_CUDA
#include "kiln/te/cuda/grouped_gemm_cublas.h"
#endif
#include "kiln/te/moe_ops.h"

#if KILN_WITH_CUDA  // the whole bench times CUDA paths
namespace {

using namespace kiln;

struct Config {
  const char* name;
  std::int64_t experts, topk, k, o;  // x [rows, k], w [E, o, k]
};

// Per-expert rows summing to `rows`, each within +-30% of the mean (deterministic).
std::vector<std::int64_t> uneven_offsets(std::int64_t rows, std::int64_t experts) {
  std::vector<std::int64_t> off(1, 0);
  for (std::int64_t e = 0; e < experts; ++e) {
    const double share = 1.0 + 0.3 * std::sin(1.7 * static_cast<double>(e) + 0.4);
    off.push_back(off.back() + static_cast<std::int64_t>(share * static_cast<double>(rows) / experts));
  }
  off.back() = rows;  // the last expert takes the rounding
  return off;
}

// Sets KILN_GROUPED_GEMM for one scope (te/cuda/grouped_gemm_cublas.h reads it on every call).
class PathScope {
 public:
  explicit PathScope(const char* path) { setenv("KILN_GROUPED_GEMM", path, 1); }
  ~PathScope() { unsetenv("KILN_GROUPED_GEMM"); }
};

double max_abs(const Tensor& t) {
  const Tensor m = ops::reduce(ops::ReduceOp::Max, ops::unary(ops::UnaryOp::Abs, t), {}, false);
  return m.to_vector<double>()[0];
}

bool run(const Config& c, Device d) {
  const std::int64_t tokens = 8192, rows = tokens * c.topk;
  const std::vector<std::int64_t> off = uneven_offsets(rows, c.experts);
  const Tensor offsets = Tensor::from_vector(off, {c.experts + 1}).to(d);
  const Tensor x = Tensor::randn({rows, c.k}, 1, DType::BF16, d);
  const Tensor w = Tensor::randn({c.experts, c.o, c.k}, 2, DType::BF16, d);
  const Tensor dy = Tensor::randn({rows, c.o}, 3, DType::BF16, d);
  Tensor y = Tensor::empty({rows, c.o}, DType::BF16, d), dx = Tensor::empty({rows, c.k}, DType::BF16, d);
  Tensor dw = Tensor::empty(w.shape(), DType::BF16, d);
  const te::MoeOps& ops = te::moe_ops();
  const double flops = 2.0 * static_cast<double>(rows) * static_cast<double>(c.k) * static_cast<double>(c.o);

  struct Pass {
    const char* name;
    Tensor* out;
    std::function<void()> registered, host_grouped, host_loop, dense;
  };
  const Tensor w0 = w.select(0, 0).view({1, c.o, c.k});
  Tensor dw0 = dw.select(0, 0).view({1, c.o, c.k});
  const Tensor x3 = x.view({1, rows, c.k}), dy3 = dy.view({1, rows, c.o});
  Tensor y3 = y.view({1, rows, c.o}), dx3 = dx.view({1, rows, c.k});
  const std::vector<Pass> passes = {
      {"forward", &y, [&] { ops::kernel(ops.grouped_gemm, d, DType::BF16)(x, w, offsets, false, y); },
       [&] { te::cuda::grouped_gemm_host_offsets(x, w, off, false, y, te::GroupedGemmPath::Grouped); },
       [&] { te::cuda::grouped_gemm_host_offsets(x, w, off, false, y, te::GroupedGemmPath::Loop); },
       [&] { ops::gemm_into(x3, w0, y3, false, true, 1, 0); }},
      {"dgrad", &dx, [&] { ops::kernel(ops.grouped_gemm, d, DType::BF16)(dy, w, offsets, true, dx); },
       [&] { te::cuda::grouped_gemm_host_offsets(dy, w, off, true, dx, te::GroupedGemmPath::Grouped); },
       [&] { te::cuda::grouped_gemm_host_offsets(dy, w, off, true, dx, te::GroupedGemmPath::Loop); },
       [&] { ops::gemm_into(dy3, w0, dx3, false, false, 1, 0); }},
      {"wgrad", &dw, [&] { ops::kernel(ops.grouped_gemm_wgrad, d, DType::BF16)(dy, x, offsets, dw); },
       [&] { te::cuda::grouped_gemm_wgrad_host_offsets(dy, x, off, dw, te::GroupedGemmPath::Grouped); },
       [&] { te::cuda::grouped_gemm_wgrad_host_offsets(dy, x, off, dw, te::GroupedGemmPath::Loop); },
       [&] { ops::gemm_into(dy3, x3, dw0, true, false, 1, 0); }},
  };

  bool all_ok = true;
  for (const Pass& p : passes) {
    // The products of the three registered paths against the per-expert cuBLASLt loop, on the device:
    // the largest difference relative to the largest value (bf16 outputs of f32 sums).
    p.host_loop();
    const Tensor ref = p.out->to(DType::F32);
    const double ref_max = max_abs(ref);
    for (const char* path : {"auto", "grouped", "loop", "chunked", "tc"}) {
      {
        PathScope scope(path);
        p.registered();
      }
      const double diff = max_abs(ops::binary(ops::BinaryOp::Sub, p.out->to(DType::F32), ref));
      const bool ok = std::isfinite(diff) && diff <= 2e-2 * ref_max;
      all_ok = all_ok && ok;
      bench::emit({{"bench", "grouped_gemm_check"},
                   {"config", c.name},
                   {"pass", p.name},
                   {"impl", path},
                   {"max_abs_diff", diff},
                   {"max_abs_ref", ref_max},
                   {"ok", ok}});
    }

    std::vector<std::pair<const char*, double>> times;
    const double dense_ms = bench::time_ms(d, p.dense, 5, 20);
    for (const char* path : {"auto", "grouped", "loop", "chunked", "tc"}) {
      PathScope scope(path);
      times.emplace_back(path, bench::time_ms(d, p.registered, 5, 20));
    }
    times.emplace_back("grouped_host_counts", bench::time_ms(d, p.host_grouped, 5, 20));
    times.emplace_back("loop_host_counts", bench::time_ms(d, p.host_loop, 5, 20));
    times.emplace_back("dense", dense_ms);
    for (const auto& [impl, ms] : times) {
      bench::emit({{"bench", "grouped_gemm"},
                   {"config", c.name},
                   {"experts", c.experts},
                   {"topk", c.topk},
                   {"rows", rows},
                   {"k", c.k},
                   {"o", c.o},
                   {"pass", p.name},
                   {"impl", impl},
                   {"ms", ms},
                   {"tflops", flops / ms / 1e9},
                   {"vs_dense", ms / dense_ms}});
    }
  }
  return all_ok;
}

}  // namespace
#endif  // KILN_WITH_CUDA

int main(int argc, char** argv) {
#if !KILN_WITH_CUDA
  (void)argc;
  (void)argv;
  std::fprintf(stderr, "bench_grouped_gemm: built without CUDA (it times the CUDA paths only)\n");
  return 0;
#else
  if (!bench::have_cuda()) return 0;
  const std::string filter = argc > 1 ? argv[1] : "";
  const Device d = Device::cuda(0);
  // fc1 of a SwiGLU expert (o = 2 x ffn) and its fc2 (k = ffn).
  const Config configs[] = {
      {"mixtral_e8_top2_fc1", 8, 2, 4096, 2 * 14336},   {"mixtral_e8_top2_fc2", 8, 2, 14336, 4096},
      {"deepseek_e64_top6_fc1", 64, 6, 2048, 2 * 1408}, {"deepseek_e64_top6_fc2", 64, 6, 1408, 2048},
      {"qwen3_e128_top8_fc1", 128, 8, 2048, 2 * 768},   {"qwen3_e128_top8_fc2", 128, 8, 768, 2048}};
  bool ok = true;
  int ran = 0;
  for (const Config& c : configs) {
    if (!filter.empty() && std::string_view(c.name).find(filter) == std::string_view::npos) continue;
    ok = run(c, d) && ok;
    ++ran;
  }
  if (ran == 0) {
    std::fprintf(stderr, "bench_grouped_gemm: no config matches '%s'\n", filter.c_str());
    return 2;
  }
  return ok ? 0 : 1;
#endif
}
