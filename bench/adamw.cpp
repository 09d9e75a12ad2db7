// Fused AdamW over 100M f32 parameters in 100 tensors, through the optimizer's public API
// (optim::AdamW::step(): one multi-tensor launch), the layer PyTorch's peer is called at
// (torch.optim.AdamW(fused=True).step()). Reports ms per step and the effective bandwidth
// (4 tensors read, 3 written). JSON lines.
#include <vector>

#include "bench_util.h"
#include "kiln/optim/optimizer.h"

int main() {
  using namespace kiln;
  if (!bench::have_cuda()) return 0;
  Device d = Device::cuda(0);
  const int kTensors = 100;
  const std::int64_t per = 1'000'000;
  std::vector<Tensor> params;
  for (int i = 0; i < kTensors; ++i) {
    Tensor p = Tensor::randn({per}, 1 + i, DType::F32, d);
    p.set_grad(Tensor::randn({per}, 1000 + i, DType::F32, d));
    params.push_back(p);
  }
  optim::AdamOptions options = optim::AdamW::defaults();
  options.lr = 1e-3;
  optim::AdamW opt(params, options);
  double ms = bench::time_ms(
      d, [&] { opt.step(); }, 3, 20);
  const double bytes = 7.0 * 4 * per * kTensors;
  bench::emit({{"bench", "adamw"},
               {"op", "adamw_fused"},
               {"dtype", "float32"},
               {"shape", "100x1000000"},
               {"ms", ms},
               {"gbps", bytes / ms / 1e6}});
  return 0;
}
