// conv2d forward + backward (grad_x, grad_w) on the ResNet-18 CIFAR shapes at batch 128, through
// Kiln's public op API (ops::conv2d, ops::conv2d_backward: argument checks, output allocation,
// dispatch; no autograd record), the layer PyTorch's peer is called at (torch.nn.functional.conv2d
// under no_grad, aten::convolution_backward). f32 (true FP32 unless KILN_ALLOW_TF32=1; the peer
// sets TF32 off too) and bf16. JSON lines.
#include "bench_util.h"
#include "kiln/ops/conv_pool.h"

int main() {
  using namespace kiln;
  if (!bench::have_cuda()) return 0;
  Device d = Device::cuda(0);
  struct Shape_ {
    int cin, cout, hw, stride;
  };
  const Shape_ shapes[] = {{3, 64, 32, 1},    {64, 64, 32, 1},  {64, 128, 32, 2}, {128, 128, 16, 1},
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
      Tensor gy = Tensor::randn({n, s.cout, oh, oh}, 3, t, d);
      double fwd = bench::time_ms(d, [&] { (void)ops::conv2d(x, w, Tensor(), p); });
      double bwd = bench::time_ms(d, [&] { (void)ops::conv2d_backward(gy, x, w, p, true, true, false); });
      std::string shape = std::to_string(n) + "x" + std::to_string(s.cin) + "x" + std::to_string(s.hw) + "->" +
                          std::to_string(s.cout) + "/s" + std::to_string(s.stride);
      const double flops = 2.0 * n * s.cout * oh * oh * s.cin * 9;
      bench::emit({{"bench", "conv"},
                   {"op", "conv2d_fwd"},
                   {"dtype", std::string(dtype_name(t))},
                   {"shape", shape},
                   {"ms", fwd},
                   {"tflops", flops / fwd / 1e9}});
      bench::emit({{"bench", "conv"},
                   {"op", "conv2d_bwd"},
                   {"dtype", std::string(dtype_name(t))},
                   {"shape", shape},
                   {"ms", bwd},
                   {"tflops", 2 * flops / bwd / 1e9}});
      bench::emit({{"bench", "conv"},
                   {"op", "conv2d_fwd_bwd"},
                   {"dtype", std::string(dtype_name(t))},
                   {"shape", shape},
                   {"ms", fwd + bwd}});
    }
  }
  return 0;
}
