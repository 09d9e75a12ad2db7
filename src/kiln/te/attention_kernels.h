#pragma once
// The kernels of attention_forward / attention_backward, one pair per backend (te/cpu/, te/cuda/),
// registered by register_attention_ops() (te/attention.h), whose types they have.
#include "kiln/te/attention_params.h"
#include "kiln/tensor/tensor.h"

namespace kiln::te {

namespace cpu {
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                       const AttentionParams& p);
void attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v,
                        const AttentionParams& p);
}  // namespace cpu
#if KILN_WITH_CUDA
namespace cuda {
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                       const AttentionParams& p);
void attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v,
                        const AttentionParams& p);
}  // namespace cuda
#endif

}  // namespace kiln::te
