// One transformer layer's forward + backward on the GPU, bf16 against each FP8 recipe (delayed,
// tensorwise, blockwise; hybrid format), with TransformerEngine's ops (--transformer-impl
// transformer_engine), at the GPT-2 124M shape (768 hidden, 12 heads, LayerNorm + GELU, T 1024,
// micro-batch 16), the GPT-3 1.3B shape (2048 hidden, 16 heads, T 2048, micro-batch 8) and a
// Llama-style 1.3B layer (RMSNorm + SwiGLU, no biases) whose SwiGLU writes fc2's FP8 input. Each
// figure is the median of CUDA-event-timed iterations (forward, backward, one in-place "optimizer"
// update of the weights so the FP8 weight casts are redone each iteration as in training, dropout
// off). JSON lines: {"bench": "fp8_layer", "shape", "mode", "ms", "speedup_vs_bf16"}.
//   bench_fp8_layer [iterations]          (default 20)
//   bench_fp8_layer --smoke               one iteration of each mode at a tiny shape on the CPU
//                                         (checks the harness, times nothing meaningful)
#include <chrono>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "bench_util.h"
#include "kiln/autograd/functions.h"
#include "kiln/models/transformer_layer.h"
#include "kiln/models/transformer_spec.h"
#include "kiln/tensor/grad_mode.h"

namespace {

using namespace kiln;

struct LayerShape {
  const char* name;
  std::int64_t hidden, heads, ffn, seq, batch;
  bool llama;
};

models::GptConfig config_of(const LayerShape& s) {
  models::GptConfig c;
  c.num_layers = 1;
  c.hidden_size = s.hidden;
  c.num_attention_heads = s.heads;
  c.ffn_hidden_size = s.ffn;
  c.seq_length = s.seq;
  c.vocab_size = 50304;
  c.attention_dropout = 0;
  c.hidden_dropout = 0;
  if (s.llama) {
    c.normalization = models::Normalization::RMSNorm;
    c.swiglu = true;
    c.add_bias_linear = false;
    c.position_embedding_type = models::PositionEmbedding::None;
  }
  return c;
}

double time_layer(const LayerShape& s, const te::Fp8Recipe* recipe, int iterations, Device d) {
  const models::GptConfig config = config_of(s);
  models::LayerContext ctx;
  ctx.ops = &models::te_core_ops();
  ctx.fp8 = recipe;
  Generator seeds(1234);
  models::TransformerLayer layer(models::gpt_layer_spec(config), 1, seeds, ctx);
  std::uint64_t seed = 1;
  for (auto& [name, p] : layer.named_parameters()) {
    NoGradGuard no_grad;
    if (p.dim() == 2) p.copy_(Tensor::randn(p.shape(), seed++) * 0.02);
  }
  layer.to(d, DType::BF16);
  const Tensor x = Tensor::randn({s.batch, s.seq, s.hidden}, 7, DType::BF16, d).requires_grad_(true);
  const Tensor g = Tensor::randn({s.batch, s.seq, s.hidden}, 8, DType::BF16, d);
  const models::PositionContext positions;
  auto step = [&] {
    const Tensor y = layer.forward(x, positions);
    y.backward(g);
    NoGradGuard no_grad;
    for (auto& [name, p] : layer.named_parameters())  // the optimizer's in-place write (bumps the version)
      if (p.grad().defined()) p.add_(p.grad(), -1e-6);
    layer.zero_grad();
  };
  if (d.is_cuda()) return bench::time_ms(d, step, 3, iterations);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) step();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / iterations;
}

}  // namespace

int main(int argc, char** argv) {
  const bool smoke = argc > 1 && std::string(argv[1]) == "--smoke";
  if (!smoke && !bench::have_cuda()) return 0;
  const Device d = smoke ? Device::cpu() : Device::cuda(0);
  const int iterations = smoke ? 1 : (argc > 1 ? std::atoi(argv[1]) : 20);
  KILN_CHECK(iterations >= 1, "bench_fp8_layer: iterations must be a positive integer, got '{}'", argv[1]);
  std::vector<LayerShape> shapes = {{"gpt2-124m", 768, 12, 3072, 1024, 16, false},
                                    {"gpt-1.3b", 2048, 16, 8192, 2048, 8, false},
                                    {"llama-1.3b", 2048, 16, 5632, 2048, 8, true}};
  if (smoke) shapes = {{"smoke-gpt2", 64, 4, 128, 16, 2, false}, {"smoke-llama", 64, 4, 96, 16, 2, true}};
  for (const LayerShape& s : shapes) {
    const double bf16 = time_layer(s, nullptr, iterations, d);
    bench::emit({{"bench", "fp8_layer"}, {"shape", s.name}, {"mode", "bf16"}, {"ms", bf16}, {"speedup_vs_bf16", 1.0}});
    for (auto r : {te::Fp8ScalingRecipe::Delayed, te::Fp8ScalingRecipe::Tensorwise, te::Fp8ScalingRecipe::Blockwise}) {
      te::Fp8Recipe recipe;
      recipe.format = te::Fp8Format::Hybrid;
      recipe.recipe = r;
      try {
        const double ms = time_layer(s, &recipe, iterations, d);
        bench::emit({{"bench", "fp8_layer"},
                     {"shape", s.name},
                     {"mode", "fp8-hybrid-" + std::string(te::to_string(r))},
                     {"ms", ms},
                     {"speedup_vs_bf16", bf16 / ms}});
      } catch (const Error& e) {  // reported, not hidden
        bench::emit({{"bench", "fp8_layer"}, {"shape", s.name}, {"mode", te::to_string(r)}, {"error", e.what()}});
      }
    }
  }
  return 0;
}
