// conv2d forward + backward (grad_x, grad_w) on the ResNet-18 CIFAR shapes at batch 128, through
// the CUDA kernel table (cuDNN). f32 (true FP32 unless KILN_ALLOW_TF32=1) and bf16. JSON lines.
#include "bench_util.h"
#include "kiln/ops/kernels.h"

int main() {
  using namespace kiln;
  if (!bench::have_cuda()) return 0;
  Device d = Device::cuda(0);
  auto& k = ops::kernels_for(DeviceKind::CUDA);
  struct Shape_ {
    int cin, cout, hw, stride;
  };
  const Shape_ shapes[] = {{3, 64, 32, 1},   {64, 64, 32, 1},   {64, 128, 32, 2}, {128, 128, 16, 1},
                           {128, 256, 16, 2}, {256, 256, 8, 1}, {256, 512, 8, 2}, {512, 512, 4, 1}};
  const std::int64_t n = 128;
  for (DType t : {DType::F32, DType::BF16}) {
    for (const auto& s : shapes) {
      ops::Conv2dParams p;
      p.stride_h = p.stride_w = s.stride;
      p.pad_h = p.pad_w = 1;
      const std::int64_t oh = (s.hw + 2 - 3) / s.stride + 1;
      Tensor x = Tensor::randn({n, s.cin, s.hw, s.hw}, 1, t, d);
      Tensor w = Tensor::randn({s.cout, s.cin, 3, 3}, 2, t, d);
      Tensor y = Tensor::empty({n, s.cout, oh, oh}, t, d);
      Tensor gy = Tensor::randn(y.shape(), 3, t, d);
      Tensor gx = Tensor::empty(x.shape(), t, d), gw = Tensor::empty(w.shape(), t, d);
      double fwd = bench::time_ms(d, [&] { k.conv2d_forward(x, w, Tensor(), y, p); });
      double bwd = bench::time_ms(d, [&] { k.conv2d_backward(gy, x, w, gx, gw, Tensor(), p); });
      std::string shape = std::to_string(n) + "x" + std::to_string(s.cin) + "x" + std::to_string(s.hw) + "->" +
                          std::to_string(s.cout) + "/s" + std::to_string(s.stride);
      const double flops = 2.0 * n * s.cout * oh * oh * s.cin * 9;
      bench::emit({{"bench", "conv"}, {"op", "conv2d_fwd"}, {"dtype", std::string(dtype_name(t))}, {"shape", shape},
                   {"ms", fwd}, {"tflops", flops / fwd / 1e9}});
      bench::emit({{"bench", "conv"}, {"op", "conv2d_bwd"}, {"dtype", std::string(dtype_name(t))}, {"shape", shape},
                   {"ms", bwd}, {"tflops", 2 * flops / bwd / 1e9}});
      bench::emit({{"bench", "conv"}, {"op", "conv2d_fwd_bwd"}, {"dtype", std::string(dtype_name(t))},
                   {"shape", shape}, {"ms", fwd + bwd}});
    }
  }
  return 0;
}
