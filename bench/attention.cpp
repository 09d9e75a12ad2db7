// te::attention on the GPU: forward, and forward + backward through the autograd record (what a
// training step runs; the gradients accumulate into .grad as PyTorch's do), at bfloat16 on the
// shapes bench/attention_torch_peer.py gives torch.nn.functional.scaled_dot_product_attention.
// Times are CUDA-event medians after warm-up. FLOPs (FlashAttention's convention): forward
// 4 * B * Hq * T * S * D, halved when causal; backward 2.5x the forward; fwd+bwd 3.5x.
// JSON lines; `bench_attention --quick` runs one small shape (a smoke test). Each shape runs both
// implementations (AttentionOptions::impl): "kiln-cudnn" (cuDNN's fused flash attention, forward
// and backward) and Kiln's own kernels, "kiln-mma" (the mma.sync forward, the default) or
// "kiln-wmma" (KILN_ATTENTION_MMA=0); KILN_ATTENTION_SIMT=1 times the SIMT kernels under the Kiln
// label. A shape cuDNN refuses gives a "kiln-cudnn" row with the refusal under "error". Each
// implementation runs again with the fused attention dropout at p = 0.1 (Megatron's default
// --attention-dropout), "kiln-cudnn-dropout0.1" (cuDNN's generator; when asked for) and
// "<kiln label>-dropout0.1" (Kiln's Philox mask, the CPU's bit for bit): te/attention.h.
#include "kiln/te/attention.h"

#include <cstdlib>
#include <cstring>

#include "bench_util.h"
#include "kiln/autograd/functions.h"
#include "kiln/runtime/error.h"
#include "kiln/tensor/grad_mode.h"

int main(int argc, char** argv) {
  using namespace kiln;
  if (!bench::have_cuda()) return 0;
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const Device d = Device::cuda(0);
  struct Case {
    std::int64_t B, T, Hq, Hkv, D;
    bool causal;
  };
  std::vector<Case> cases = {{8, 2048, 16, 16, 64, true}, {2, 8192, 16, 16, 128, true}, {8, 2048, 16, 4, 64, true},
                             {2, 8192, 16, 4, 128, true}, {8, 2048, 16, 16, 64, false}, {2, 8192, 16, 16, 128, false}};
  if (quick) cases = {{1, 256, 4, 2, 64, true}};
  const DType t = DType::BF16;
  for (const Case& c : cases) {
    Tensor q = Tensor::randn({c.B, c.T, c.Hq, c.D}, 1, t, d);
    Tensor k = Tensor::randn({c.B, c.T, c.Hkv, c.D}, 2, t, d);
    Tensor v = Tensor::randn({c.B, c.T, c.Hkv, c.D}, 3, t, d);
    Tensor dout = Tensor::randn({c.B, c.T, c.Hq, c.D}, 4, t, d);
    const double fwd_flops = 4.0 * c.B * c.Hq * c.T * c.T * c.D * (c.causal ? 0.5 : 1.0);
    const std::string shape = fmt::format("B{} T{} Hq{} Hkv{} D{}", c.B, c.T, c.Hq, c.Hkv, c.D);
    const char* mma = std::getenv("KILN_ATTENTION_MMA");
    const std::string kiln_label = mma != nullptr && mma[0] == '0' ? "kiln-wmma" : "kiln-mma";
    struct Run {
      te::AttentionImpl impl;
      double dropout;
      std::string label;
    };
    for (const Run& run :
         {Run{te::AttentionImpl::Cudnn, 0.0, "kiln-cudnn"}, Run{te::AttentionImpl::Cudnn, 0.1, "kiln-cudnn-dropout0.1"},
          Run{te::AttentionImpl::Kiln, 0.0, kiln_label},
          Run{te::AttentionImpl::Kiln, 0.1, kiln_label + "-dropout0.1"}}) {
      te::AttentionOptions o;
      o.causal = c.causal;
      o.impl = run.impl;
      o.dropout = run.dropout;
      o.dropout_seed = 1234;  // a fixed mask: every timed call draws the same one
      const nlohmann::json common = {
          {"bench", "attention"}, {"impl", run.label}, {"dtype", "bfloat16"}, {"shape", shape}, {"causal", c.causal}};
      double fwd_ms = 0, fwd_bwd_ms = 0;
      try {
        fwd_ms = bench::time_ms(d, [&] {
          NoGradGuard no_grad;
          (void)te::attention(q, k, v, o);
        });
        Tensor qg = q.detach().requires_grad_(true), kg = k.detach().requires_grad_(true),
               vg = v.detach().requires_grad_(true);
        fwd_bwd_ms = bench::time_ms(d, [&] { te::attention(qg, kg, vg, o).backward(dout); });
      } catch (const Error& e) {  // cuDNN refused this shape on this GPU
        nlohmann::json err = common;
        err["error"] = e.what();
        bench::emit(err);
        continue;
      }
      nlohmann::json f = common, fb = common;
      f["pass"] = "fwd";
      f["ms"] = fwd_ms;
      f["tflops"] = fwd_flops / fwd_ms / 1e9;
      fb["pass"] = "fwd_bwd";
      fb["ms"] = fwd_bwd_ms;
      fb["tflops"] = 3.5 * fwd_flops / fwd_bwd_ms / 1e9;
      fb["bwd_tflops"] = fwd_bwd_ms > fwd_ms ? 2.5 * fwd_flops / (fwd_bwd_ms - fwd_ms) / 1e9 : 0.0;
      bench::emit(f);
      bench::emit(fb);
    }
  }
  return 0;
}
