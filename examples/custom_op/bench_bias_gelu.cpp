// Times the fused bias_gelu op of one extension build against the unfused built-ins
// (kiln::gelu(kiln::add(x, b))), forward and forward+backward. Run it once per extension build
// (default flags, -O3) to compare the builds; bench/gpu_extension.sh does that.
//   bench_bias_gelu --extension <library> [--label NAME] [--device cpu|cuda] [--rows R] [--cols C]
//                   [--iters N] [--repeats K]
// Prints one JSON object per case: median milliseconds per call over K repeats of N calls, timed
// with kiln::Event on the device's stream, and the effective bandwidth.
#include <kiln/autograd/functions.h>
#include <kiln/extension/load_extension.h>
#include <kiln/runtime/backend.h>
#include <kiln/runtime/event.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace {

using kiln::Device;
using kiln::DType;
using kiln::Tensor;

struct Options {
  std::string extension, label = "default", device = "cpu";
  std::int64_t rows = 0, cols = 0;
  int iters = 0, repeats = 5;
};

double median_ms(Device device, int iters, int repeats, const std::function<void()>& step) {
  for (int i = 0; i < 3; ++i) step();  // warm-up (and the caching allocator's first allocations)
  kiln::synchronize(device);
  std::vector<double> ms;
  for (int r = 0; r < repeats; ++r) {
    kiln::Event start(device), stop(device);
    start.record();
    for (int i = 0; i < iters; ++i) step();
    stop.record();
    stop.synchronize();
    ms.push_back(stop.elapsed_ms(start) / iters);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_bias_gelu: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--extension")
      o.extension = next();
    else if (a == "--label")
      o.label = next();
    else if (a == "--device")
      o.device = next();
    else if (a == "--rows")
      o.rows = std::stoll(next());
    else if (a == "--cols")
      o.cols = std::stoll(next());
    else if (a == "--iters")
      o.iters = std::stoi(next());
    else if (a == "--repeats")
      o.repeats = std::stoi(next());
    else {
      std::fprintf(stderr, "bench_bias_gelu: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (o.extension.empty()) {
    std::fprintf(stderr, "usage: bench_bias_gelu --extension <library> [--label NAME] [--device cpu|cuda] ...\n");
    return 2;
  }
  try {
    const Device device = Device::parse(o.device);
    const bool gpu = !device.is_cpu();
    if (o.rows == 0) o.rows = gpu ? 16384 : 512;
    if (o.cols == 0) o.cols = gpu ? 8192 : 1024;
    if (o.iters == 0) o.iters = gpu ? 50 : 5;
    kiln::load_extension(o.extension);

    Tensor x = Tensor::randn({o.rows, o.cols}, 1, DType::F32).to(device);
    Tensor b = Tensor::randn({o.cols}, 2, DType::F32).to(device);
    Tensor gy = Tensor::randn({o.rows, o.cols}, 3, DType::F32).to(device);
    Tensor xg = x.detach().requires_grad_(), bg = b.detach().requires_grad_();
    // Fresh gradients each step: accumulating into old ones would time an extra add.
    auto clear_grads = [&] {
      xg.set_grad(Tensor());
      bg.set_grad(Tensor());
    };
    const double n = static_cast<double>(o.rows * o.cols) * 4;  // bytes of one [rows, cols] f32 tensor

    struct Case {
      const char* name;
      double bytes;  // the least traffic the fused op needs; the same figure for the unfused one
      std::function<void()> step;
    };
    std::vector<Case> cases = {
        {"fused_forward", 2 * n,
         [&] {
           kiln::call_op("bias_gelu", {x, b});
         }},
        {"unfused_forward", 2 * n, [&] { kiln::gelu(kiln::add(x, b)); }},
        {"fused_forward_backward", 5 * n,
         [&] {
           clear_grads();
           kiln::call_op("bias_gelu", {xg, bg})[0].backward(gy);
         }},
        {"unfused_forward_backward", 5 * n,
         [&] {
           clear_grads();
           kiln::gelu(kiln::add(xg, bg)).backward(gy);
         }},
    };
    for (const auto& c : cases) {
      std::string result;
      try {
        double ms = median_ms(device, o.iters, o.repeats, c.step);
        result = "\"ms\": " + std::to_string(ms) + ", \"GB_per_s\": " + std::to_string(c.bytes / (ms * 1e6));
      } catch (const kiln::Error& e) {  // e.g. a built-in op without a kernel on this device yet
        std::string msg = e.what();
        std::replace(msg.begin(), msg.end(), '"', '\'');
        result = "\"error\": \"" + msg + "\"";
      }
      std::printf(
          "{\"bench\": \"bias_gelu\", \"case\": \"%s\", \"extension\": \"%s\", \"device\": \"%s\", "
          "\"rows\": %lld, \"cols\": %lld, \"dtype\": \"float32\", \"iters\": %d, \"repeats\": %d, %s}\n",
          c.name, o.label.c_str(), device.str().c_str(), static_cast<long long>(o.rows), static_cast<long long>(o.cols),
          o.iters, o.repeats, result.c_str());
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_bias_gelu: %s\n", e.what());
    return 1;
  }
  return 0;
}
