// te/'s fused kernels on the GPU at Llama-3-8B / GPT-2 shapes (bf16): each kernel timed alone
// through the kernel registry (CUDA events, warm-up, median), with its bytes moved as GB/s and the
// fraction of the H200's 4.8 TB/s; the whole linear_cross_entropy (GEMMs included, forward with
// the gradients) and linear_bias_gelu forward as TFLOP/s. JSON lines; bench/te_fused_torch_peer.py
// prints PyTorch's figures with the same keys.
#include "bench_util.h"
#include "kiln/autograd/functions.h"
#include "kiln/ops/kernel_registry.h"
#include "kiln/te/bias_gelu.h"
#include "kiln/te/fused_norm.h"
#include "kiln/te/fused_ops.h"
#include "kiln/te/gelu_mlp.h"
#include "kiln/te/linear_cross_entropy.h"
#include "kiln/te/rope.h"

namespace {

using namespace kiln;

constexpr double kPeakBytesPerSecond = 4.8e12;  // H200 HBM3e

void emit_bandwidth(const std::string& op, const std::string& shape, double ms, double bytes) {
  const double gbps = bytes / (ms * 1e-3) / 1e9;
  bench::emit({{"bench", "te_fused"},
               {"impl", "kiln"},
               {"op", op},
               {"dtype", "bfloat16"},
               {"shape", shape},
               {"ms", ms},
               {"gbps", gbps},
               {"fraction_of_peak_bw", gbps * 1e9 / kPeakBytesPerSecond}});
}

void emit_flops(const std::string& op, const std::string& shape, double ms, double flops) {
  bench::emit({{"bench", "te_fused"},
               {"impl", "kiln"},
               {"op", op},
               {"dtype", "bfloat16"},
               {"shape", shape},
               {"ms", ms},
               {"tflops", flops / (ms * 1e-3) / 1e12}});
}

Tensor rnd(Shape s, std::uint64_t seed, Device d, double scale = 1) {
  Tensor t = Tensor::randn(std::move(s), seed, DType::F32, d);
  if (scale != 1) t.mul_(scale);
  return t.to(DType::BF16);
}

}  // namespace

int main() {
  if (!bench::have_cuda()) return 0;
  const Device d = Device::cuda(0);
  const te::FusedOps& k = te::fused_ops();
  const DType bf = DType::BF16;
  const std::int64_t n = 8192, h = 4096;  // B 2 x T 4096 tokens, Llama-3-8B hidden
  const std::string nh = "8192x4096";
  const double e = 2;  // bytes per bf16 element
  {
    const Tensor x = rnd({n, h}, 1, d), r = rnd({n, h}, 2, d), w = rnd({h}, 3, d), b = rnd({h}, 4, d);
    Tensor y = Tensor::empty({n, h}, bf, d), s = Tensor::empty({n, h}, bf, d), dx = Tensor::empty({n, h}, bf, d);
    Tensor mean = Tensor::empty({n}, DType::F32, d), rstd = Tensor::empty({n}, DType::F32, d);
    Tensor dw = Tensor::empty({h}, bf, d), db = Tensor::empty({h}, bf, d);
    const double io = 4.0 * n * h * e;  // two reads and two writes of [n, h]
    emit_bandwidth("add_rms_norm_forward", nh,
                   bench::time_ms(d, [&] { ops::kernel(k.add_rms_norm_forward, d, bf)(x, r, w, 1e-5, y, s, rstd); }),
                   io);
    emit_bandwidth("add_rms_norm_backward", nh,
                   bench::time_ms(d, [&] { ops::kernel(k.add_rms_norm_backward, d, bf)(y, r, s, w, rstd, dx, dw); }),
                   io);
    emit_bandwidth(
        "add_layer_norm_forward", nh,
        bench::time_ms(d, [&] { ops::kernel(k.add_layer_norm_forward, d, bf)(x, r, w, b, 1e-5, y, s, mean, rstd); }),
        io);
    emit_bandwidth(
        "add_layer_norm_backward", nh,
        bench::time_ms(d, [&] { ops::kernel(k.add_layer_norm_backward, d, bf)(y, r, s, w, mean, rstd, dx, dw, db); }),
        io);
  }
  {  // RoPE on the queries of Llama-3-8B: [2, 4096, 32, 128]
    const te::RopeTable table = te::make_rope_table(128, 4096, 500000, true, 8, d);
    const Tensor q = rnd({2, 4096, 32, 128}, 5, d);
    Tensor out = Tensor::empty(q.shape(), bf, d);
    const double io = 2.0 * static_cast<double>(q.numel()) * e;
    emit_bandwidth("apply_rope", "2x4096x32x128",
                   bench::time_ms(d, [&] { ops::kernel(k.apply_rope, d, bf)(q, table.cos, table.sin, 0, false, out); }),
                   io);
  }
  {  // SwiGLU of Llama-3-8B's MLP: [8192, 2 x 14336]
    const std::int64_t f = 14336;
    const Tensor x = rnd({n, 2 * f}, 6, d), g = rnd({n, f}, 7, d);
    Tensor y = Tensor::empty({n, f}, bf, d), dx = Tensor::empty({n, 2 * f}, bf, d);
    const std::string shape = "8192x28672";
    emit_bandwidth("swiglu_forward", shape, bench::time_ms(d, [&] { ops::kernel(k.swiglu_forward, d, bf)(x, y); }),
                   3.0 * n * f * e);
    emit_bandwidth("swiglu_backward", shape,
                   bench::time_ms(d, [&] { ops::kernel(k.swiglu_backward, d, bf)(g, x, dx); }), 5.0 * n * f * e);
  }
  {  // The cross-entropy chunk kernel on one 256 MB chunk of Llama-3 logits (V 128256), in place.
    const std::int64_t v = 128256, rows = (std::int64_t{256} << 20) / (v * 2);
    Tensor logits = rnd({rows, v}, 8, d, 2.0);
    const Tensor labels = Tensor::zeros({rows}, DType::I64, d);
    const Tensor weight = Tensor::full({rows}, 1.0 / static_cast<double>(rows), DType::F32, d);
    Tensor loss = Tensor::empty({rows}, DType::F32, d);
    emit_bandwidth(
        "cross_entropy_chunk", std::to_string(rows) + "x" + std::to_string(v),
        bench::time_ms(d, [&] { ops::kernel(k.cross_entropy_chunk, d, bf)(logits, labels, weight, loss, true); }),
        3.0 * static_cast<double>(rows) * v * e);
    // The whole op, forward and backward: per chunk the logits GEMM, the kernel and both gradient
    // GEMMs (3 GEMMs of 2NVH), then the backward's scaling by the incoming gradient.
    const std::int64_t tokens = 8192;
    Tensor hidden = rnd({tokens, h}, 9, d).requires_grad_(true), w = rnd({v, h}, 10, d, 0.02).requires_grad_(true);
    const Tensor lab = Tensor::zeros({tokens}, DType::I64, d);
    const double ms = bench::time_ms(
        d, [&] { te::linear_cross_entropy(hidden, w, lab, Tensor()).backward(); }, 2, 5);
    emit_flops("linear_cross_entropy_forward_backward", "8192x4096->128256", ms, 3 * 2.0 * tokens * v * h);
  }
  {  // GPT-2 124M fc1: [16 x 1024 tokens, 768] x [3072, 768]^T + b, GELU
    const std::int64_t tokens = 16384, in = 768, out = 3072;
    const Tensor x = rnd({tokens, in}, 11, d), w = rnd({out, in}, 12, d, 0.02), b = rnd({out}, 13, d);
    Tensor y = Tensor::empty({tokens, out}, bf, d), pre = Tensor::empty({tokens, out}, bf, d);
    emit_flops("linear_bias_gelu_forward", "16384x768->3072",
               bench::time_ms(d, [&] { ops::kernel(k.linear_bias_gelu_forward, d, bf)(x, w, b, y, pre); }),
               2.0 * tokens * in * out);
    Tensor dx = Tensor::empty({tokens, in}, bf, d), dw = Tensor::empty({out, in}, bf, d),
           db = Tensor::empty({out}, bf, d);
    emit_flops("linear_bias_gelu_backward", "16384x768->3072",
               bench::time_ms(d, [&] { ops::kernel(k.linear_bias_gelu_backward, d, bf)(y, pre, x, w, dx, dw, db); }),
               4.0 * tokens * in * out);
  }
  {  // GPT-2 124M's whole MLP, forward and backward: both cuBLASLt epilogues (4 GEMMs of 2NKF forward
     // and backward: 2 forward, 4 backward).
    const std::int64_t tokens = 16384, hid = 768, f = 3072;
    std::vector<Tensor> p = {rnd({tokens, hid}, 16, d), rnd({f, hid}, 17, d, 0.02), rnd({f}, 18, d),
                             rnd({hid, f}, 19, d, 0.02), rnd({hid}, 20, d)};
    for (Tensor& t : p) t.requires_grad_(true);
    const Tensor g = rnd({tokens, hid}, 21, d);
    emit_flops("linear_gelu_linear_forward_backward", "16384x768->3072->768",
               bench::time_ms(d, [&] { sum(mul(te::linear_gelu_linear(p[0], p[1], p[2], p[3], p[4]), g)).backward(); }),
               6 * 2.0 * tokens * hid * f);
  }
  return 0;
}
