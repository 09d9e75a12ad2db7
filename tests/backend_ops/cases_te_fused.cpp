// Cases of te/'s fused op family (te/fused_ops.h): add + RMSNorm / LayerNorm, RoPE, QKV split +
// RoPE, SwiGLU, the cross-entropy chunk of linear_cross_entropy and linear + bias + GELU. The CUDA
// kernels serve
// bf16/f16/f32 only (float64 is the CPU reference path), so the cases skip float64 off the CPU.
// References: tests/te/te_reference.h, float64 from the definitions.
#include "../te/te_reference.h"
#include "harness.h"
#include "kiln/te/bias_gelu.h"
#include "kiln/te/fused_norm.h"
#include "kiln/te/fused_ops.h"
#include "kiln/te/gelu_mlp.h"
#include "kiln/te/linear_cross_entropy.h"
#include "kiln/te/qkv_rope.h"
#include "kiln/te/rope.h"
#include "kiln/te/swiglu.h"

namespace kiln::backend_ops {

namespace cases_te_fused {

OpCase te_case(std::string name, std::vector<std::string> kernels, std::function<std::vector<Tensor>(bool)> inputs,
               std::function<std::vector<Tensor>(const std::vector<Tensor>&)> forward, std::vector<int> grad_inputs,
               std::function<std::vector<Tensor>(const std::vector<Tensor>&)> reference) {
  OpCase c;
  c.name = std::move(name);
  c.kernels = std::move(kernels);
  c.dtypes = {DType::F32, DType::BF16};
  c.inputs = std::move(inputs);
  c.forward = std::move(forward);
  c.grad_inputs = std::move(grad_inputs);
  c.reference = std::move(reference);
  c.f64_on_every_backend = false;
  return c;
}

// RoPE with Llama-3.1 scaling; base 500000 at head_dim 8 puts one frequency in each band
// (high, medium, low) of the scaling.
te::RopeTable small_table(Device d) { return te::make_rope_table(8, 16, 500000, true, 8, d); }

}  // namespace cases_te_fused

void add_te_fused_cases(std::vector<OpCase>& cases) {
  using namespace cases_te_fused;  // this file's helpers (a named namespace: the tests compile in unity batches)
  cases.push_back(te_case(
      "te/add_rms_norm", {te::kAddRmsNormForwardOp, te::kAddRmsNormBackwardOp},
      [](bool large) {
        const Shape s = large ? Shape{4096, 4096} : Shape{3, 5, 48};
        return std::vector<Tensor>{randn(s, 700), randn(s, 701), randn({s.back()}, 702, 0.2, 1.0)};
      },
      [](const std::vector<Tensor>& in) {
        auto [y, sum] = te::add_rms_norm(in[0], in[1], in[2], 1e-5);
        return std::vector<Tensor>{y, sum};
      },
      {0, 1, 2},
      [](const std::vector<Tensor>& in) {
        auto [y, sum] = te_reference::add_norm(in[0], in[1], in[2], Tensor(), 1e-5, true);
        return std::vector<Tensor>{y, sum};
      }));
  cases.push_back(te_case(
      "te/add_layer_norm", {te::kAddLayerNormForwardOp, te::kAddLayerNormBackwardOp},
      [](bool large) {
        const Shape s = large ? Shape{4096, 4096} : Shape{4, 40};
        return std::vector<Tensor>{randn(s, 710, 1.0, 0.5), randn(s, 711), randn({s.back()}, 712, 0.2, 1.0),
                                   randn({s.back()}, 713, 0.3)};
      },
      [](const std::vector<Tensor>& in) {
        auto [y, sum] = te::add_layer_norm(in[0], in[1], in[2], in[3], 1e-5);
        return std::vector<Tensor>{y, sum};
      },
      {0, 1, 2, 3},
      [](const std::vector<Tensor>& in) {
        auto [y, sum] = te_reference::add_norm(in[0], in[1], in[2], in[3], 1e-5, false);
        return std::vector<Tensor>{y, sum};
      }));
  cases.push_back(te_case(
      "te/apply_rope/llama3_offset", {te::kApplyRopeOp},
      [](bool large) {
        return std::vector<Tensor>{randn(large ? Shape{2, 1024, 16, 128} : Shape{2, 5, 3, 8}, 720)};
      },
      [](const std::vector<Tensor>& in) {
        if (in[0].shape()[3] == 8) return std::vector<Tensor>{te::apply_rope(in[0], small_table(in[0].device()), 3)};
        const auto table = te::make_rope_table(128, 1024, 500000, true, 8, in[0].device());
        return std::vector<Tensor>{te::apply_rope(in[0], table, 0)};
      },
      {0},
      [](const std::vector<Tensor>& in) {
        const te::RopeTable table = small_table(Device::cpu());
        return std::vector<Tensor>{te_reference::rope(in[0], table.cos, table.sin, 3)};
      }));
  // Llama-3.2-1B's GQA (4 query heads a group) at head_dim 8 with a 4-channel table (partial
  // rotary) and an offset; large: its whole attention shape, B 2, T 1024.
  cases.push_back(te_case(
      "te/split_qkv_rope/gqa_partial_offset", {te::kSplitQkvRopeForwardOp, te::kSplitQkvRopeBackwardOp},
      [](bool large) {
        return std::vector<Tensor>{randn(large ? Shape{2, 1024, 8, 6 * 64} : Shape{2, 5, 2, 6 * 8}, 725)};
      },
      [](const std::vector<Tensor>& in) {
        const bool small = in[0].shape()[3] == 6 * 8;
        const te::RopeTable table = small ? te::make_rope_table(4, 16, 500000, true, 8, in[0].device())
                                          : te::make_rope_table(64, 1024, 500000, true, 32, in[0].device());
        const te::SplitQkv out = te::split_qkv_rope(in[0], small ? 8 : 64, table, small ? 3 : 0);
        return std::vector<Tensor>{out.q, out.k, out.v};
      },
      {0},
      [](const std::vector<Tensor>& in) {
        const te::RopeTable table = te::make_rope_table(4, 16, 500000, true, 8, Device::cpu());
        const te_reference::SplitQkv out = te_reference::split_qkv_rope(in[0], 8, table.cos, table.sin, 3);
        return std::vector<Tensor>{out.q, out.k, out.v};
      }));
  cases.push_back(te_case(
      "te/swiglu", {te::kSwigluForwardOp, te::kSwigluBackwardOp},
      [](bool large) {
        return std::vector<Tensor>{randn(large ? Shape{4096, 2 * 4096} : Shape{3, 4, 14}, 730, 2.0)};
      },
      [](const std::vector<Tensor>& in) { return std::vector<Tensor>{te::swiglu(in[0])}; }, {0},
      [](const std::vector<Tensor>& in) { return std::vector<Tensor>{te_reference::swiglu(in[0])}; }));
  {
    // Six tokens, one ignored (-100) and one masked out; chunks of two rows (at bf16; fewer
    // bytes per row at wider dtypes give chunks of one row), so the chunk loop runs.
    OpCase c = te_case(
        "te/linear_cross_entropy/chunked_masked", {te::kCrossEntropyChunkOp},
        [](bool large) {
          if (large)
            return std::vector<Tensor>{randn({1024, 512}, 740, 0.5), randn({32000, 512}, 741, 0.05),
                                       rand_index({1024}, 742, 32000), Tensor::ones({1024}, DType::F64)};
          std::vector<std::int64_t> labels = {3, 10, -100, 0, 7, 5};
          return std::vector<Tensor>{randn({6, 8}, 740), randn({11, 8}, 741, 0.5), Tensor::from_vector(labels, {6}),
                                     Tensor::from_vector(std::vector<double>{1, 1, 1, 0, 1, 0.5}, {6})};
        },
        [](const std::vector<Tensor>& in) {
          te::LinearCrossEntropyOptions o;
          o.max_chunk_bytes = in[1].shape()[0] == 11 ? 2 * 11 * 2 : std::int64_t{256} << 20;
          return std::vector<Tensor>{te::linear_cross_entropy(in[0], in[1], in[2], in[3], o)};
        },
        {0, 1},
        [](const std::vector<Tensor>& in) {
          return std::vector<Tensor>{te_reference::linear_cross_entropy(in[0], in[1], in[2], in[3])};
        });
    c.tol_scale = 4;  // bf16 logits and logit gradients between the GEMMs
    cases.push_back(std::move(c));
  }
  // Output width 16: the cuBLASLt epilogue path; width 6 without bias: the fallback (the aux
  // output's leading dimension must be a multiple of 8).
  cases.push_back(te_case(
      "te/linear_bias_gelu/epilogue", {te::kLinearBiasGeluForwardOp, te::kLinearBiasGeluBackwardOp},
      [](bool large) {
        if (large)
          return std::vector<Tensor>{randn({2048, 1024}, 750), randn({2048, 1024}, 751, 0.03), randn({2048}, 752, 0.1)};
        return std::vector<Tensor>{randn({2, 5, 12}, 750), randn({16, 12}, 751, 0.4), randn({16}, 752, 0.5)};
      },
      [](const std::vector<Tensor>& in) { return std::vector<Tensor>{te::linear_bias_gelu(in[0], in[1], in[2])}; },
      {0, 1, 2},
      [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{te_reference::linear_bias_gelu(in[0], in[1], in[2])};
      }));
  cases.push_back(te_case(
      "te/linear_bias_gelu/no_bias_narrow", {te::kLinearBiasGeluForwardOp, te::kLinearBiasGeluBackwardOp},
      [](bool large) {
        return std::vector<Tensor>{randn(large ? Shape{2048, 1022} : Shape{7, 9}, 753),
                                   randn(large ? Shape{1022, 1022} : Shape{6, 9}, 754, 0.4)};
      },
      [](const std::vector<Tensor>& in) { return std::vector<Tensor>{te::linear_bias_gelu(in[0], in[1], Tensor())}; },
      {0, 1},
      [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{te_reference::linear_bias_gelu(in[0], in[1], Tensor())};
      }));
  // GPT-2's MLP: the DGELU_BGRAD epilogue in fc2's data-gradient GEMM (F = 16), and its fallback
  // (F = 6, no biases).
  cases.push_back(te_case(
      "te/linear_gelu_linear/epilogues", {te::kLinearBiasGeluForwardOp, te::kDgeluBgradGemmOp},
      [](bool large) {
        if (large)
          return std::vector<Tensor>{randn({2048, 768}, 760), randn({3072, 768}, 761, 0.03), randn({3072}, 762, 0.1),
                                     randn({768, 3072}, 763, 0.02), randn({768}, 764, 0.1)};
        return std::vector<Tensor>{randn({2, 3, 8}, 760), randn({16, 8}, 761, 0.4), randn({16}, 762, 0.5),
                                   randn({5, 16}, 763, 0.4), randn({5}, 764, 0.5)};
      },
      [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{te::linear_gelu_linear(in[0], in[1], in[2], in[3], in[4])};
      },
      {0, 1, 2, 3, 4},
      [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{te_reference::linear_gelu_linear(in[0], in[1], in[2], in[3], in[4])};
      }));
  cases.push_back(te_case(
      "te/linear_gelu_linear/no_bias_narrow", {te::kLinearBiasGeluForwardOp, te::kDgeluBgradGemmOp},
      [](bool large) {
        return std::vector<Tensor>{randn(large ? Shape{2048, 766} : Shape{7, 5}, 765),
                                   randn(large ? Shape{3062, 766} : Shape{6, 5}, 766, 0.4),
                                   randn(large ? Shape{766, 3062} : Shape{4, 6}, 767, 0.4)};
      },
      [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{te::linear_gelu_linear(in[0], in[1], Tensor(), in[2], Tensor())};
      },
      {0, 1, 2},
      [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{te_reference::linear_gelu_linear(in[0], in[1], Tensor(), in[2], Tensor())};
      }));
}

}  // namespace kiln::backend_ops
