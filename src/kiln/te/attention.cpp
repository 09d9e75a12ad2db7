#include "kiln/te/attention.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include "kiln/autograd/record.h"
#include "kiln/te/attention_kernels.h"
#if KILN_WITH_CUDA
#include "kiln/te/cuda/attention_cudnn.h"
#endif

namespace kiln::te {

using autograd::Grads;
using autograd::SavedTensor;

void register_attention_ops(ops::KernelRegistry& registry) {
  const auto fwd = registry.declare<AttentionForwardKernel>(kAttentionForwardOp);
  const auto bwd = registry.declare<AttentionBackwardKernel>(kAttentionBackwardOp);
  const ops::DTypeSet floating{DType::F64, DType::F32, DType::BF16, DType::F16};
  registry.add(fwd, DeviceKind::CPU, cpu::attention_forward, floating);
  registry.add(bwd, DeviceKind::CPU, cpu::attention_backward, floating);
#if KILN_WITH_CUDA
  registry.add(fwd, DeviceKind::CUDA, cuda::attention_forward, floating);
  registry.add(bwd, DeviceKind::CUDA, cuda::attention_backward, floating);
#endif
}

AttentionOps attention_ops() {
  static const AttentionOps ops = [] {
    // A caller may have registered the family in the process-wide registry already (a layer-wide
    // registration function): registering twice would be refused as a taken slot.
    if (!ops::kernel_registry().has_kernel(kAttentionForwardOp, DeviceKind::CPU, DType::F32))
      register_attention_ops(ops::kernel_registry());
    return AttentionOps{ops::kernel_registry().find<AttentionForwardKernel>(kAttentionForwardOp),
                        ops::kernel_registry().find<AttentionBackwardKernel>(kAttentionBackwardOp)};
  }();
  return ops;
}

namespace {

constexpr const char* kOp = "te::attention";
constexpr std::int64_t kMaxHeadDim = 256;

// Refuses anything the kernels do not take, naming the operand and what is wrong; returns the
// resolved sizes.
AttentionParams check_attention_args(const Tensor& q, const Tensor& k, const Tensor& v,
                                     const AttentionOptions& options) {
  KILN_CHECK(q.defined() && k.defined() && v.defined(), "{}: q, k and v must be defined tensors", kOp);
  for (const auto& [t, name, layout] : {std::tuple{&q, "q", "[B, T, Hq, D]"}, std::tuple{&k, "k", "[B, S, Hkv, D]"},
                                        std::tuple{&v, "v", "[B, S, Hkv, Dv]"}}) {
    KILN_CHECK(t->dim() == 4, "{}: {} must be {}, got {}", kOp, name, layout, t->describe());
    KILN_CHECK(is_floating(t->dtype()) && dtype_size(t->dtype()) >= 2,
               "{}: {} must be float64, float32, bfloat16 or float16, got {}", kOp, name, t->describe());
  }
  KILN_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype(),
             "{}: q, k and v must share a dtype, got q {}, k {}, v {}", kOp, q.describe(), k.describe(), v.describe());
  KILN_CHECK(q.device() == k.device() && q.device() == v.device(),
             "{}: q, k and v must be on one device, got q {}, k {}, v {}", kOp, q.describe(), k.describe(),
             v.describe());
  KILN_CHECK(k.shape()[0] == v.shape()[0] && k.shape()[1] == v.shape()[1] && k.shape()[2] == v.shape()[2],
             "{}: k and v must have the same [B, S, Hkv] (v's head size may differ), got k {} and v {}", kOp,
             k.describe(), v.describe());
  AttentionParams p;
  p.batch = q.shape()[0];
  p.q_len = q.shape()[1];
  p.q_heads = q.shape()[2];
  p.head_dim = q.shape()[3];
  p.kv_len = k.shape()[1];
  p.kv_heads = k.shape()[2];
  KILN_CHECK(k.shape()[0] == p.batch, "{}: q and k have different batch sizes: q {}, k {}", kOp, q.describe(),
             k.describe());
  KILN_CHECK(k.shape()[3] == p.head_dim, "{}: q and k have different head dims (last dimension): q {}, k {}", kOp,
             q.describe(), k.describe());
  KILN_CHECK(p.head_dim >= 1 && p.head_dim <= kMaxHeadDim, "{}: head dim {} of q {} is outside 1..{}", kOp, p.head_dim,
             q.describe(), kMaxHeadDim);
  const std::int64_t dv = v.shape()[3];
  KILN_CHECK(dv >= 1 && dv <= kMaxHeadDim, "{}: head dim {} of v {} is outside 1..{}", kOp, dv, v.describe(),
             kMaxHeadDim);
  p.v_head_dim = dv == p.head_dim ? 0 : dv;
  KILN_CHECK(p.kv_heads >= 1 && p.q_heads % p.kv_heads == 0,
             "{}: the key/value heads ({}, dimension 2 of k {}) must divide the query heads ({}, dimension 2 of q {})",
             kOp, p.kv_heads, k.describe(), p.q_heads, q.describe());
  KILN_CHECK(std::isfinite(options.softmax_scale), "{}: softmax_scale must be finite, got {}", kOp,
             options.softmax_scale);
  p.causal = options.causal;
  p.scale = options.softmax_scale != 0 ? options.softmax_scale : 1.0 / std::sqrt(static_cast<double>(p.head_dim));
  KILN_CHECK(options.dropout >= 0 && options.dropout <= 1, "{}: dropout must be in [0, 1], got {}", kOp,
             options.dropout);
  p.dropout = options.dropout;
  p.dropout_seed = options.dropout_seed;
  p.dropout_offset = options.dropout_offset;
  if (const Tensor& c = options.dropout_offset_counter; c.defined()) {
    KILN_CHECK(c.dtype() == DType::I64 && c.numel() == 1 && c.is_contiguous() && c.device() == q.device(),
               "{}: dropout_offset_counter must be an int64 scalar on {}, got {}", kOp, q.device().str(), c.describe());
    p.dropout_offset_device = static_cast<const std::int64_t*>(c.data_ptr());
  }
  return p;
}

DType lse_dtype(DType t) { return t == DType::F64 ? DType::F64 : DType::F32; }

// t's shape with the last dimension d.
Shape with_head_dim(Shape shape, std::int64_t d) {
  shape.back() = d;
  return shape;
}

// t with zero channels appended to its last dimension up to d (t itself when it has d).
Tensor pad_head(const Tensor& t, std::int64_t d) {
  if (t.size(3) == d) return t;
  Tensor out = Tensor::zeros(with_head_dim(t.shape(), d), t.dtype(), t.device());
  out.narrow(3, 0, t.size(3)).copy_(t);
  return out;
}

// Writes the first `into`'s head-size channels of `wide` into `into` (nothing when they are one).
void keep_head(const Tensor& wide, const Tensor& into) {
  if (wide.data_ptr() == into.data_ptr()) return;
  Tensor dst = into;  // a handle on the same storage
  dst.copy_(wide.narrow(3, 0, into.size(3)));
}

// Kiln's kernels take one head size: with Dv != D they run on operands zero-padded to the larger
// (exact: zero q/k channels add nothing to the scores, the scale stays the one resolved from D, and
// zero v channels give zero output columns), and the real channels of the results are kept. cuDNN
// takes Dv != D as it is.
bool pads_heads(const AttentionParams& p) { return p.value_dim() != p.head_dim && p.impl != AttentionImpl::Cudnn; }
AttentionParams padded_params(const AttentionParams& p) {
  AttentionParams w = p;
  w.head_dim = std::max(p.head_dim, p.value_dim());
  w.v_head_dim = 0;
  return w;
}
Tensor wide_like(const Tensor& t, std::int64_t d) {
  return t.size(3) == d ? t : Tensor::empty(with_head_dim(t.shape(), d), t.dtype(), t.device());
}

void run_forward_kernel(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        const AttentionParams& p) {
  const auto& kernel = ops::kernel(attention_ops().forward, q.device(), q.dtype());
  if (!pads_heads(p)) return kernel(q, k, v, out, lse, p);
  const AttentionParams w = padded_params(p);
  const Tensor out_w = wide_like(out, w.head_dim);
  kernel(pad_head(q, w.head_dim), pad_head(k, w.head_dim), pad_head(v, w.head_dim), out_w, lse, w);
  keep_head(out_w, out);
}

void run_backward_kernel(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                         const Tensor& lse, const Tensor& gq, const Tensor& gk, const Tensor& gv,
                         const AttentionParams& p) {
  const auto& kernel = ops::kernel(attention_ops().backward, q.device(), q.dtype());
  if (!pads_heads(p)) return kernel(grad_out, q, k, v, out, lse, gq, gk, gv, p);
  const AttentionParams w = padded_params(p);
  const std::int64_t d = w.head_dim;
  const Tensor gq_w = wide_like(gq, d), gk_w = wide_like(gk, d), gv_w = wide_like(gv, d);
  kernel(pad_head(grad_out, d), pad_head(q, d), pad_head(k, d), pad_head(v, d), pad_head(out, d), lse, gq_w, gk_w, gv_w,
         w);
  keep_head(gq_w, gq);
  keep_head(gk_w, gk);
  keep_head(gv_w, gv);
}

// ---- which implementation runs (AttentionImpl) ----------------------------------------------------

struct ImplRequest {
  AttentionImpl impl;
  bool forced;  // asked for by the options or the environment: a refusal is an error
};

// The options' choice, else KILN_ATTENTION_IMPL's (read on every call: tests and benchmarks switch it).
ImplRequest requested_impl(const AttentionOptions& o) {
  if (o.impl != AttentionImpl::Auto) return {o.impl, true};
  const char* env = std::getenv("KILN_ATTENTION_IMPL");
  if (env == nullptr || env[0] == '\0' || std::strcmp(env, "auto") == 0) return {AttentionImpl::Auto, false};
  if (std::strcmp(env, "kiln") == 0) return {AttentionImpl::Kiln, true};
  if (std::strcmp(env, "cudnn") == 0) return {AttentionImpl::Cudnn, true};
  KILN_FAIL("{}: KILN_ATTENTION_IMPL must be kiln, cudnn or auto, got '{}'", kOp, env);
}

// Says once per distinct reason (which includes the shape) that cuDNN refused and Kiln's kernels run.
void warn_fallback_once(const std::string& reason) {
  static std::mutex mutex;
  static std::set<std::string> said;
  std::lock_guard<std::mutex> lock(mutex);
  if (said.insert(reason).second)
    std::fprintf(stderr, "kiln: te::attention runs Kiln's kernels instead of cuDNN's: %s\n", reason.c_str());
}

enum class Direction { Forward, Backward };

// The implementation that runs `direction` of this call: cuDNN when asked for or Auto and cuDNN
// builds a plan for it; Kiln's otherwise. `all`: the tensors the direction touches.
AttentionImpl choose_impl(Direction direction, const Tensor& q, const AttentionParams& p, AttentionImpl want,
                          bool forced, std::initializer_list<const Tensor*> all) {
  if (want == AttentionImpl::Kiln) return AttentionImpl::Kiln;
  // Auto keeps attention dropout on Kiln's kernels, whose Philox mask is the CPU's bit for bit;
  // cuDNN's fused dropout (its own generator's mask) runs when it is asked for. It becomes Auto's
  // choice once its run on a GPU is measured (docs/llm.md, "Attention dropout").
  if (p.has_dropout() && want != AttentionImpl::Cudnn) return AttentionImpl::Kiln;
  if (!q.device().is_cuda()) {
    KILN_CHECK(!(want == AttentionImpl::Cudnn && forced),
               "{}: the cuDNN implementation was asked for (KILN_ATTENTION_IMPL=cudnn or AttentionOptions::impl) "
               "but the tensors are on {}",
               kOp, q.device().str());
    return AttentionImpl::Kiln;
  }
#if KILN_WITH_CUDA
  const std::string why = cuda::cudnn_attention_ineligible(q, p, all);
  if (!why.empty()) {
    KILN_CHECK(!forced, "{}: the cuDNN implementation was asked for but cannot take q {}: {}", kOp, q.describe(), why);
    return AttentionImpl::Kiln;
  }
  // Unforced, only calls over a whole sequence (T == S: training, a prompt's prefill) go to cuDNN:
  // generation with a KV cache (T = 1, S growing by one per token) would build a plan per step.
  if (!forced && p.q_len != p.kv_len) return AttentionImpl::Kiln;
  const auto dir = direction == Direction::Forward ? cuda::CudnnAttentionDirection::Forward
                                                   : cuda::CudnnAttentionDirection::Backward;
  std::optional<std::string> refused = cuda::cudnn_attention_prepare(dir, q, p);
  // With dropout the backward must draw the forward's mask, so it must run the forward's
  // implementation: the forward goes to cuDNN only when the backward's plan builds too.
  if (!refused && p.has_dropout() && direction == Direction::Forward)
    refused = cuda::cudnn_attention_prepare(cuda::CudnnAttentionDirection::Backward, q, p);
  if (refused) {
    KILN_CHECK(!forced, "{}: the cuDNN implementation was asked for but cuDNN refused: {}", kOp, *refused);
    warn_fallback_once(*refused);
    return AttentionImpl::Kiln;
  }
  return AttentionImpl::Cudnn;
#else
  (void)direction, (void)p, (void)all;
  KILN_CHECK(!forced, "{}: the cuDNN implementation was asked for but Kiln was built without CUDA", kOp);
  return AttentionImpl::Kiln;
#endif
}

// Runs `kernel` (which reads p.impl); when an unforced cuDNN plan fails to execute, says so once and
// runs Kiln's kernels instead (p.impl then records that, for the backward).
template <class Kernel>
void run_with_fallback(AttentionParams& p, Kernel&& kernel) {
  if (p.impl != AttentionImpl::Cudnn || p.impl_forced) {
    kernel();
    return;
  }
  try {
    kernel();
  } catch (const Error& e) {
    warn_fallback_once(e.what());
    p.impl = AttentionImpl::Kiln;
    kernel();
  }
}

Tensor contiguous(const Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

// Records q's and k/v's strides in p when cuDNN may read them in place: views of one packed qkv
// projection (GPT-2's, Megatron's grouped layout with one query head per group) have a dense last
// dimension and k and v share their strides. False (p untouched) when they are all contiguous
// anyway, or cannot go to cuDNN as they are.
bool take_strides(const Tensor& q, const Tensor& k, const Tensor& v, AttentionParams& p, const ImplRequest& want) {
  if (want.impl == AttentionImpl::Kiln || !q.device().is_cuda()) return false;
  if (q.dtype() != DType::BF16 && q.dtype() != DType::F16) return false;
  if (q.is_contiguous() && k.is_contiguous() && v.is_contiguous()) return false;
  if (k.shape() != v.shape()) return false;  // MLA's value head size: V is laid out on its own
  if (q.strides()[3] != 1 || k.strides()[3] != 1 || v.strides()[3] != 1 || k.strides() != v.strides()) return false;
  for (int i = 0; i < 3; ++i) {
    p.q_stride[i] = q.strides()[i];
    p.kv_stride[i] = k.strides()[i];
  }
  return true;
}

// Gradient buffers laid out as q, k and v are: views with their strides into one fresh buffer per
// storage they share. A packed qkv projection so gets a packed gradient, which the split that made
// q, k and v passes up without a copy.
std::array<Tensor, 3> like_packed(const Tensor& q, const Tensor& k, const Tensor& v) {
  const std::array<const Tensor*, 3> in{&q, &k, &v};
  std::array<Tensor, 3> out;
  auto span = [](const Tensor& t) {
    std::int64_t last = 0;
    for (int d = 0; d < t.dim(); ++d) last += (t.shape()[d] - 1) * t.strides()[d];
    return last + 1;
  };
  for (std::size_t i = 0; i < 3; ++i) {
    if (out[i].defined()) continue;
    std::int64_t lo = in[i]->storage_offset(), hi = lo + span(*in[i]);
    for (std::size_t j = i + 1; j < 3; ++j)
      if (in[j]->storage() == in[i]->storage()) {
        lo = std::min(lo, in[j]->storage_offset());
        hi = std::max(hi, in[j]->storage_offset() + span(*in[j]));
      }
    const Tensor buffer = Tensor::empty({hi - lo}, q.dtype(), q.device());
    for (std::size_t j = i; j < 3; ++j)
      if (j == i || in[j]->storage() == in[i]->storage())
        out[j] = make_view(buffer, in[j]->shape(), in[j]->strides(), in[j]->storage_offset() - lo);
  }
  return out;
}

// Runs the forward with p.impl resolved from `want` (recorded in the returned params, so that the
// backward can run the same implementation). q, k and v may be strided when p says so (take_strides);
// wherever cuDNN does not take them so, they run as contiguous copies and p's strides are cleared.
std::pair<Tensor, Tensor> forward_checked(const Tensor& q, const Tensor& k, const Tensor& v, AttentionParams& p,
                                          const ImplRequest& want) {
  Tensor out = Tensor::empty(with_head_dim(q.shape(), p.value_dim()), q.dtype(), q.device());
  Tensor lse = Tensor::empty({p.batch, p.q_heads, p.q_len}, lse_dtype(q.dtype()), q.device());
  if (out.numel() == 0) {
    p = p.dense();
    p.impl = AttentionImpl::Kiln;
    return {out, lse};
  }
  p.impl_forced = want.forced;
  Tensor qr = q, kr = k, vr = v;
  auto densify = [&] {
    p = p.dense();
    qr = contiguous(q), kr = contiguous(k), vr = contiguous(v);
  };
  if (!p.strided()) densify();
  p.impl = choose_impl(Direction::Forward, qr, p, want.impl, want.forced, {&qr, &kr, &vr, &out, &lse});
  if (p.strided() && p.impl != AttentionImpl::Cudnn) {
    densify();
    p.impl = choose_impl(Direction::Forward, qr, p, want.impl, want.forced, {&qr, &kr, &vr, &out, &lse});
  }
  run_with_fallback(p, [&] {
    if (p.impl != AttentionImpl::Cudnn && p.strided()) densify();  // cuDNN failed to run: Kiln's kernels
    run_forward_kernel(qr, kr, vr, out, lse, p);
  });
  return {out, lse};
}

// Runs the backward with the implementation `p.impl` names (the forward's), or Kiln's when cuDNN
// refuses the backward graph and nothing forced cuDNN: both read the same lse (natural-log
// logsumexp of the scaled scores, [B, Hq, T] float32). With p's strides (the forward read q, k and v
// in place), cuDNN writes the gradients with the same strides (like_packed); otherwise dense.
std::vector<Tensor> backward_checked(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                                     const Tensor& out, const Tensor& lse, AttentionParams p) {
  if (q.numel() == 0 || k.numel() == 0) {  // nothing attends: every gradient is zero
    return {Tensor::zeros(q.shape(), q.dtype(), q.device()), Tensor::zeros(k.shape(), k.dtype(), k.device()),
            Tensor::zeros(v.shape(), v.dtype(), v.device())};
  }
  // With dropout the mask is the forward implementation's own: a cuDNN forward's backward runs on
  // cuDNN or fails, never on Kiln's kernels (they would draw another mask).
  if (p.has_dropout() && p.impl == AttentionImpl::Cudnn) p.impl_forced = true;
  const AttentionImpl asked = p.impl;
  if (p.strided()) {
    auto [gq, gk, gv] = like_packed(q, k, v);
    p.impl = choose_impl(Direction::Backward, q, p, p.impl, p.impl_forced,
                         {&grad_out, &q, &k, &v, &out, &lse, &gq, &gk, &gv});
    bool done = false;
    if (p.impl == AttentionImpl::Cudnn) {
      run_with_fallback(p, [&] {
        if (p.impl != AttentionImpl::Cudnn) return;  // cuDNN failed to run: the dense path below
        run_backward_kernel(grad_out, q, k, v, out, lse, gq, gk, gv, p);
        done = true;
      });
    }
    if (done) return {gq, gk, gv};
    p = p.dense();
    p.impl = asked;
  }
  const Tensor qc = contiguous(q), kc = contiguous(k), vc = contiguous(v);
  Tensor gq = Tensor::empty(q.shape(), q.dtype(), q.device());
  Tensor gk = Tensor::empty(k.shape(), k.dtype(), k.device());
  Tensor gv = Tensor::empty(v.shape(), v.dtype(), v.device());
  p.impl = choose_impl(Direction::Backward, qc, p, p.impl, p.impl_forced,
                       {&grad_out, &qc, &kc, &vc, &out, &lse, &gq, &gk, &gv});
  run_with_fallback(p, [&] { run_backward_kernel(grad_out, qc, kc, vc, out, lse, gq, gk, gv, p); });
  return {gq, gk, gv};
}

}  // namespace

std::pair<Tensor, Tensor> attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                            const AttentionOptions& options) {
  AttentionParams p = check_attention_args(q, k, v, options);
  return forward_checked(contiguous(q), contiguous(k), contiguous(v), p, requested_impl(options));
}

std::vector<Tensor> attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                                       const Tensor& out, const Tensor& lse, const AttentionOptions& options) {
  const AttentionParams p = check_attention_args(q, k, v, options);
  const Shape out_shape = with_head_dim(q.shape(), p.value_dim());
  KILN_CHECK(grad_out.defined() && grad_out.shape() == out_shape && grad_out.dtype() == q.dtype() &&
                 grad_out.device() == q.device(),
             "{} backward: grad_out must match q {} with v's head size ({}), got {}", kOp, q.describe(),
             shape_str(out_shape), grad_out.defined() ? grad_out.describe() : "an undefined tensor");
  KILN_CHECK(out.defined() && out.shape() == out_shape && out.dtype() == q.dtype() && out.device() == q.device(),
             "{} backward: out must match q {} with v's head size ({}), got {}", kOp, q.describe(),
             shape_str(out_shape), out.defined() ? out.describe() : "an undefined tensor");
  const Shape lse_shape{p.batch, p.q_heads, p.q_len};
  KILN_CHECK(
      lse.defined() && lse.shape() == lse_shape && lse.dtype() == lse_dtype(q.dtype()) && lse.device() == q.device(),
      "{} backward: lse must be {} {} on {}, got {}", kOp, dtype_name(lse_dtype(q.dtype())), shape_str(lse_shape),
      q.device().str(), lse.defined() ? lse.describe() : "an undefined tensor");
  // The raw backward may follow a forward of either implementation (the lse is the same): Auto
  // picks for this call alone.
  AttentionParams pb = p;
  const ImplRequest want = requested_impl(options);
  pb.impl = want.impl;
  pb.impl_forced = want.forced;
  return backward_checked(contiguous(grad_out), contiguous(q), contiguous(k), contiguous(v), contiguous(out),
                          contiguous(lse), pb);
}

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options) {
  AttentionParams p = check_attention_args(q, k, v, options);
  const ImplRequest want = requested_impl(options);
  const bool in_place = take_strides(q, k, v, p, want);
  const Tensor qc = in_place ? q : contiguous(q), kc = in_place ? k : contiguous(k), vc = in_place ? v : contiguous(v);
  auto [out, lse] = forward_checked(qc, kc, vc, p, want);
  if (autograd::needs_grad({q, k, v})) {
    autograd::record("AttentionBackward", {q, k, v}, {&out},
                     [sq = SavedTensor(qc.detach()), sk = SavedTensor(kc.detach()), sv = SavedTensor(vc.detach()),
                      so = SavedTensor(out.detach()), lse = lse, p,
                      // p.dropout_offset_device points into it: the backward's mask reads the same counter.
                      counter = options.dropout_offset_counter](const Grads& g) -> Grads {
                       (void)counter;
                       if (!g[0].defined()) return {Tensor(), Tensor(), Tensor()};
                       const Tensor& qs = sq.get(kOp);
                       // The kernels take the gradient in the inputs' dtype.
                       const Tensor go = g[0].dtype() == qs.dtype() ? g[0] : g[0].to(qs.dtype());
                       return backward_checked(contiguous(go), qs, sk.get(kOp), sv.get(kOp), so.get(kOp), lse, p);
                     });
  }
  return out;
}

}  // namespace kiln::te
