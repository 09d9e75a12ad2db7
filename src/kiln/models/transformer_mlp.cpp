#include "kiln/models/transformer_mlp.h"

#include "kiln/autograd/functions.h"
#include "kiln/te/swiglu.h"

namespace kiln::models {

Mlp::Mlp(const MlpSpec& spec, const LayerContext& context) : Module("MLP"), spec(spec), context_(context) {
  const std::int64_t fc1_rows =
      spec.activation == MlpActivation::SwiGLU ? 2 * spec.ffn_hidden_size : spec.ffn_hidden_size;
  // SwiGLU: the gate and up halves are split alike, so each rank's fc1 output is its gate | its up.
  const int blocks = spec.activation == MlpActivation::SwiGLU ? 2 : 1;
  linear_fc1 =
      register_module("linear_fc1", std::make_shared<ParallelLinear>(ParallelLinearKind::Column, spec.hidden_size,
                                                                     fc1_rows, spec.bias, context, blocks));
  linear_fc2 =
      register_module("linear_fc2", std::make_shared<ParallelLinear>(ParallelLinearKind::Row, spec.ffn_hidden_size,
                                                                     spec.hidden_size, spec.bias, context));
}

Tensor Mlp::forward(const Tensor& x, const Fp8Tensor* fc1_cast, bool fuse_fp8) {
  const CoreOps& ops = *context_.ops;
  // One rank, no FP8: the implementation's fused MLP when it has one (its backward forms the GELU
  // derivative inside fc2's data-gradient GEMM instead of a pass over the [N, F] activations).
  if (spec.activation != MlpActivation::SwiGLU && ops.linear_gelu_linear && !linear_fc1->is_fp8() &&
      !linear_fc2->is_fp8() && linear_fc1->tensor_parallel_size == 1 && linear_fc2->tensor_parallel_size == 1)
    return ops.linear_gelu_linear(x, linear_fc1->weight, linear_fc1->bias, linear_fc2->weight, linear_fc2->bias);
  if (spec.activation == MlpActivation::SwiGLU && fuse_fp8 && linear_fc2->takes_fp8_input()) {
    // SwiGLU -> fc2's FP8 input in one kernel: the bf16 activation is never written.
    const Tensor fc1 = fc1_cast ? linear_fc1->forward(x, *fc1_cast) : linear_fc1->forward(x);
    const std::int64_t f = fc1.shape().back() / 2, rows = f ? fc1.numel() / (2 * f) : 0;
    const Fp8Tensor h8 = linear_fc2->fp8_input_cast(rows, fc1.device());
    return linear_fc2->forward(te::swiglu_fp8(fc1, h8), h8);
  }
  if (fc1_cast) {
    const Tensor fc1 = linear_fc1->forward(x, *fc1_cast);
    const Tensor h =
        spec.activation == MlpActivation::SwiGLU ? ops.swiglu(fc1) : gelu(fc1, /*tanh_approximation=*/true);
    return linear_fc2->forward(h);
  }
  // An FP8 fc1 runs its own GEMM, so the GeLU follows it instead of being fused into a bf16 GEMM.
  // fc1's bias + GeLU fusion takes the gathered input; with --tp-comm-overlap the gather runs
  // inside fc1's overlapped GEMMs, so the GeLU follows them.
  Tensor h = spec.activation == MlpActivation::SwiGLU ? ops.swiglu(linear_fc1->forward(x))
             : linear_fc1->is_fp8() || linear_fc1->tp_comm_overlap
                 ? gelu(linear_fc1->forward(x), /*tanh_approximation=*/true)
                 : ops.linear_bias_gelu(linear_fc1->parallel_input(x), linear_fc1->weight, linear_fc1->bias);
  return linear_fc2->forward(h);
}

}  // namespace kiln::models
