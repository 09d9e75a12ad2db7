// Memory bandwidth of elementwise add/mul/relu and a sum reduction on 256 MiB f32 tensors, against
// a device-to-device copy of the same size measured in the same run. GB/s counts bytes read +
// written. Prints JSON lines.
#include "bench_util.h"
#include "kiln/ops/copy.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/kernels.h"
#include "kiln/ops/reduce.h"

int main() {
  using namespace kiln;
  if (!bench::have_cuda()) return 0;
  Device d = Device::cuda(0);
  const std::int64_t n = (256ll << 20) / 4;  // 256 MiB of f32
  const double bytes1 = static_cast<double>(n) * 4;
  Tensor a = Tensor::rand({n}, 1, DType::F32, d), b = Tensor::rand({n}, 2, DType::F32, d);
  Tensor out = Tensor::empty({n}, DType::F32, d);
  // Resolved once: the timings are the kernels'.
  const auto binary_kernel = KILN_KERNEL(d, binary);
  const auto unary_kernel = KILN_KERNEL(d, unary);
  const auto reduce_kernel = KILN_KERNEL(d, reduce);
  double copy_ms = bench::time_ms(
      d, [&] { backend_for(d).copy_on_device(out.data_ptr(), a.data_ptr(), static_cast<std::size_t>(bytes1), 0); });
  double copy_gbps = 2 * bytes1 / copy_ms / 1e6;
  bench::emit({{"bench", "bandwidth"},
               {"op", "copy"},
               {"dtype", "float32"},
               {"shape", std::to_string(n)},
               {"ms", copy_ms},
               {"gbps", copy_gbps},
               {"pct_copy", 100.0}});
  struct Case {
    const char* name;
    double bytes;
    std::function<void()> fn;
  };
  int dims[1] = {0};
  Tensor s = Tensor::empty({1}, DType::F32, d);
  std::vector<Case> cases = {
      {"add", 3 * bytes1, [&] { binary_kernel(ops::BinaryOp::Add, a, b, out); }},
      {"mul", 3 * bytes1, [&] { binary_kernel(ops::BinaryOp::Mul, a, b, out); }},
      {"relu", 2 * bytes1, [&] { unary_kernel(ops::UnaryOp::Relu, a, out, 0); }},
      {"sum", bytes1, [&] { reduce_kernel(ops::ReduceOp::Sum, a, std::span<const int>(dims), s); }},
  };
  for (auto& c : cases) {
    double ms = bench::time_ms(d, c.fn);
    double gbps = c.bytes / ms / 1e6;
    bench::emit({{"bench", "bandwidth"},
                 {"op", c.name},
                 {"dtype", "float32"},
                 {"shape", std::to_string(n)},
                 {"ms", ms},
                 {"gbps", gbps},
                 {"pct_copy", 100.0 * gbps / copy_gbps}});
  }
  // bf16 add (vector path with 8 elements per 16-byte load).
  Tensor ah = ops::to(a, d, DType::BF16), bh = ops::to(b, d, DType::BF16), oh = Tensor::empty({n}, DType::BF16, d);
  double ms = bench::time_ms(d, [&] { binary_kernel(ops::BinaryOp::Add, ah, bh, oh); });
  double gbps = 3 * bytes1 / 2 / ms / 1e6;
  bench::emit({{"bench", "bandwidth"},
               {"op", "add"},
               {"dtype", "bfloat16"},
               {"shape", std::to_string(n)},
               {"ms", ms},
               {"gbps", gbps},
               {"pct_copy", 100.0 * gbps / copy_gbps}});
  // Broadcast add (bias-like: [n/1024, 1024] + [1024]).
  Tensor bias = Tensor::rand({1024}, 3, DType::F32, d);
  Tensor a2 = a.view({n / 1024, 1024});
  Tensor bb = ops::broadcast_to(bias, a2.shape(), "bench");
  Tensor o2 = out.view({n / 1024, 1024});
  ms = bench::time_ms(d, [&] { binary_kernel(ops::BinaryOp::Add, a2, bb, o2); });
  gbps = 2 * bytes1 / ms / 1e6;
  bench::emit({{"bench", "bandwidth"},
               {"op", "add_bias"},
               {"dtype", "float32"},
               {"shape", std::to_string(n)},
               {"ms", ms},
               {"gbps", gbps},
               {"pct_copy", 100.0 * gbps / copy_gbps}});
  return 0;
}
