// Training-step throughput of the CIFAR-10 models (forward, backward, Adam), data already on the
// device, as the PyTorch peer bench/cifar10_train_step_torch.py measures it. Prints JSON lines:
//   bench_cifar10_train_step [--device cuda] [--steps 200] [--warmup 20] [--cases resnet18:512:cl,...]
//                            [--graph off|on|both] [--profile 1]
// Timing: device events around the timed steps after warm-up; images/s = steps * batch / time.
// On CUDA every case also runs in graph mode ("cuda_graph": true): capturable Adam, graph-safe
// dropout, the warm-up eager, then one captured step replayed for the timed steps.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "kiln/autograd/functions.h"
#include "kiln/models/cifar_models.h"
#include "kiln/nn/graph_safe_random.h"
#include "kiln/optim/optimizer.h"
#include "kiln/runtime/backend.h"
#if KILN_WITH_CUDA
#include <cuda_profiler_api.h>

#include "kiln/runtime/cuda/cuda_graph.h"
#endif
#include "kiln/runtime/event.h"
#include "kiln/tensor/autocast.h"
#include "kiln/tensor/random_generator.h"

using namespace kiln;

namespace {

struct Case {
  std::string model;
  int batch;
  bool bf16;
  bool channels_last;  // the input (hence every activation) stored channels-last, as the PyTorch peer's resnet18
};

// profile: bracket the timed steps with cudaProfilerStart/Stop, so `ncu --profile-from-start off` sees
// those steps' kernels only (not the warm-up's, whose count depends on cuDNN's plan building).
double run_case(const Case& c, Device device, int warmup, int steps, bool graph, bool profile) {
  manual_seed(0);
  auto model = models::make_cifar_model(c.model);
  model->to(device);
  model->train();
  if (graph) nn::set_graph_safe_random(*model);
  optim::AdamOptions ao;
  ao.lr = 1e-3;
  ao.capturable = graph;
  optim::Adam opt(model->parameters(), ao);
  Tensor x = Tensor::randn({c.batch, 3, 32, 32}, 1, DType::F32, device);
  if (c.channels_last) x = to_channels_last(x);
  std::vector<std::int64_t> labels(static_cast<std::size_t>(c.batch));
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<std::int64_t>(i % 10);
  Tensor y = Tensor::from_vector(labels, {c.batch}, device);
  auto step = [&] {
    Tensor logits;
    {
      AutocastGuard autocast(DType::BF16, c.bf16);
      logits = model->forward(x);
    }
    Tensor loss = cross_entropy(logits.to(DType::F32), y);
    opt.zero_grad();
    loss.backward();
    opt.step();
  };
  for (int i = 0; i < std::max(warmup, 2); ++i) step();
#if KILN_WITH_CUDA
  CudaGraph g;
  if (graph) {
    g.capture_begin(device);
    step();
    g.capture_end();
    g.replay();  // the first launch uploads the graph: keep it out of the timing
  }
#endif
  synchronize(device);
#if KILN_WITH_CUDA
  if (profile) cudaProfilerStart();
#endif
  Event start(device), stop(device);
  start.record();
  for (int i = 0; i < steps; ++i) {
#if KILN_WITH_CUDA
    if (graph) {
      g.replay();
      continue;
    }
#endif
    step();
  }
  stop.record();
  double ms = stop.elapsed_ms(start);
#if KILN_WITH_CUDA
  if (profile) cudaProfilerStop();
#else
  (void)profile;
#endif
  return static_cast<double>(steps) * c.batch / (ms / 1000.0);
}

}  // namespace

int main(int argc, char** argv) {
  std::string dev = device_count(DeviceKind::CUDA) > 0 ? "cuda" : "cpu";
  int steps = 200, warmup = 20;
  std::string graphs = "both";  // --graph off|on|both (eager, replayed CUDA graph, or each)
  bool profile = false;         // --profile 1: cudaProfilerStart/Stop around the timed steps
  std::string only;             // --cases resnet18:512:cl,simple_cnn:64 (model:batch[:cl]); default all
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--device"))
      dev = argv[i + 1];
    else if (!std::strcmp(argv[i], "--steps"))
      steps = std::stoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--warmup"))
      warmup = std::stoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--graph"))
      graphs = argv[i + 1];
    else if (!std::strcmp(argv[i], "--profile"))
      profile = std::strcmp(argv[i + 1], "0") != 0;
    else if (!std::strcmp(argv[i], "--cases"))
      only = fmt::format(",{},", argv[i + 1]);
  }
  Device device = Device::parse(dev);
  std::vector<Case> cases{{"simple_cnn", 64, false, false},
                          {"simple_cnn", 512, false, false},
                          {"resnet18", 512, true, false},
                          {"resnet18", 512, true, true}};
  if (device.is_cpu()) cases = {{"simple_cnn", 64, false, false}};
  for (const auto& c : cases) {
    const std::string key = fmt::format(",{}:{}{},", c.model, c.batch, c.channels_last ? ":cl" : "");
    if (!only.empty() && only.find(key) == std::string::npos) continue;
    for (bool graph : {false, true}) {
      if (graph && !device.is_cuda()) continue;
      if ((graph && graphs == "off") || (!graph && graphs == "on")) continue;
      double ips = run_case(c, device, warmup, c.model == "resnet18" ? steps / 4 : steps, graph, profile);
      fmt::print(
          "{{\"bench\": \"cifar10_train_step\", \"impl\": \"kiln\", \"model\": \"{}\", \"batch\": {}, "
          "\"precision\": \"{}\", \"device\": \"{}\", \"channels_last\": {}, \"cuda_graph\": {}, "
          "\"images_per_second\": {:.1f}}}\n",
          c.model, c.batch, c.bf16 ? "bf16" : "fp32", device.str(), c.channels_last, graph, ips);
      std::fflush(stdout);
    }
  }
  return 0;
}
