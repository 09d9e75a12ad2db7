// Fused AdamW over 100M f32 parameters in 100 tensors: one multi-tensor launch per step.
// Reports ms per step and the effective bandwidth (4 tensors read, 3 written). JSON lines.
#include <vector>

#include "bench_util.h"
#include "kiln/ops/kernels.h"

int main() {
  using namespace kiln;
  if (!bench::have_cuda()) return 0;
  Device d = Device::cuda(0);
  auto& k = ops::kernels_for(DeviceKind::CUDA);
  const int kTensors = 100;
  const std::int64_t per = 1'000'000;
  std::vector<Tensor> p, g, m, v;
  for (int i = 0; i < kTensors; ++i) {
    p.push_back(Tensor::randn({per}, 1 + i, DType::F32, d));
    g.push_back(Tensor::randn({per}, 1000 + i, DType::F32, d));
    m.push_back(Tensor::zeros({per}, DType::F32, d));
    v.push_back(Tensor::zeros({per}, DType::F32, d));
  }
  ops::AdamParams ap;
  ap.lr = 1e-3;
  ap.weight_decay = 0.01;
  ap.decoupled_weight_decay = true;
  std::int64_t step = 0;
  double ms = bench::time_ms(d, [&] {
    ap.step = ++step;
    k.adam_step(p, g, m, v, {}, ap);
  }, 3, 20);
  const double bytes = 7.0 * 4 * per * kTensors;
  bench::emit({{"bench", "adamw"}, {"op", "adamw_fused"}, {"dtype", "float32"}, {"shape", "100x1000000"},
               {"ms", ms}, {"gbps", bytes / ms / 1e6}});
  return 0;
}
