// CPU optimizer kernels: Adam/AdamW and SGD over many parameters in one call (optionally reading
// reduced-precision gradients and writing the model's bf16/f16 copy of fp32 master weights in the
// same pass), and the sum of squares behind clip-by-global-norm. The update order follows PyTorch's single-tensor
// (foreach=False) implementations so results match torch.optim to rounding.
#include <cmath>
#include <type_traits>

#include "kiln/ops/cpu/cpu_kernels.h"

namespace kiln::ops::cpu {

namespace {

// Parameters and their state share one floating dtype: f32 (the contract) or f64 (references).
template <class Fn>
void dispatch_param(const Tensor& p, const char* op, Fn&& fn) {
  switch (p.dtype()) {
    case DType::F32: fn.template operator()<float>(); break;
    case DType::F64: fn.template operator()<double>(); break;
    default: KILN_FAIL("{}: parameters must be float32 or float64, got {}", op, p.describe());
  }
}

// Gradients: the parameter's type, or bf16/f16 (accumulated in reduced precision).
template <class T, class Fn>
void dispatch_grad(const Tensor& p, const Tensor& g, const char* op, Fn&& fn) {
  if (g.dtype() == p.dtype()) return fn.template operator()<T>();
  switch (g.dtype()) {
    case DType::BF16: fn.template operator()<BFloat16>(); break;
    case DType::F16: fn.template operator()<Half>(); break;
    default:
      KILN_FAIL("{}: gradient {} must have the parameter's dtype or be bfloat16/float16 (parameter {})", op,
                g.describe(), p.describe());
  }
}

// The model's copy of an updated master weight: none (void), or bf16/f16/f32.
template <class Fn>
void dispatch_model(const Tensor* m, const char* op, Fn&& fn) {
  if (m == nullptr) return fn.template operator()<void>();
  switch (m->dtype()) {
    case DType::BF16: fn.template operator()<BFloat16>(); break;
    case DType::F16: fn.template operator()<Half>(); break;
    case DType::F32: fn.template operator()<float>(); break;
    default: KILN_FAIL("{}: model parameter {} must be bfloat16, float16 or float32", op, m->describe());
  }
}

void check_like(const char* op, const Tensor& p, const Tensor& t, const char* name) {
  KILN_CHECK(t.defined() && t.dtype() == p.dtype() && t.numel() == p.numel() && t.is_contiguous(),
             "{}: {} {} does not match parameter {} (same dtype, size, contiguous)", op, name,
             t.defined() ? t.describe() : "undefined", p.describe());
}

// Same size and contiguous, any dtype (the dispatchers check the dtype).
void check_sized(const char* op, const Tensor& p, const Tensor& t, const char* name) {
  KILN_CHECK(t.defined() && t.numel() == p.numel() && t.is_contiguous(),
             "{}: {} {} does not match parameter {} (same size, contiguous)", op, name,
             t.defined() ? t.describe() : "undefined", p.describe());
}

template <class T, class G>
T grad_value(G g) {
  if constexpr (std::is_same_v<T, G>)
    return g;
  else
    return static_cast<T>(static_cast<float>(g));
}

template <class O, class T>
void store_model(O* out, std::int64_t i, T w) {
  if constexpr (!std::is_void_v<O>) {
    if constexpr (std::is_same_v<O, float>)
      out[i] = static_cast<float>(w);
    else
      out[i] = O(static_cast<float>(w));
  }
}

void check_model_list(const char* op, std::span<const Tensor> params, std::span<const Tensor> model_params) {
  KILN_CHECK(model_params.empty() || model_params.size() == params.size(),
             "{}: {} params but {} model params (expected none or one per param)", op, params.size(),
             model_params.size());
}

}  // namespace

void adam_step(std::span<const Tensor> params, std::span<const Tensor> grads, std::span<const Tensor> exp_avg,
               std::span<const Tensor> exp_avg_sq, std::span<const Tensor> model_params, const AdamParams& hp) {
  KILN_CHECK(grads.size() == params.size() && exp_avg.size() == params.size() && exp_avg_sq.size() == params.size(),
             "adam_step: {} params, {} grads, {} exp_avg, {} exp_avg_sq", params.size(), grads.size(), exp_avg.size(),
             exp_avg_sq.size());
  check_model_list("adam_step", params, model_params);
  // Capturable mode: lr and step come from (CPU) memory written by the optimizer; same math.
  const double lr = hp.lr_ptr ? *hp.lr_ptr : hp.lr;
  const double step = hp.step_ptr ? *hp.step_ptr : static_cast<double>(hp.step);
  KILN_CHECK(step >= 1, "adam_step: step must be >= 1 (1-based), got {}", step);
  for (std::size_t t = 0; t < params.size(); ++t) {
    const Tensor& p = params[t];
    KILN_CHECK(p.is_contiguous(), "adam_step: parameter {} is not contiguous", p.describe());
    check_sized("adam_step", p, grads[t], "grad");
    check_like("adam_step", p, exp_avg[t], "exp_avg");
    check_like("adam_step", p, exp_avg_sq[t], "exp_avg_sq");
    const Tensor* model = model_params.empty() ? nullptr : &model_params[t];
    if (model) check_sized("adam_step", p, *model, "model parameter");
    dispatch_param(p, "adam_step", [&]<class T>() {
      dispatch_grad<T>(p, grads[t], "adam_step", [&]<class G>() {
        dispatch_model(model, "adam_step", [&]<class O>() {
          T* w = p.data<T>();
          const G* g = static_cast<const G*>(grads[t].data_ptr());
          T* m = exp_avg[t].data<T>();
          T* v = exp_avg_sq[t].data<T>();
          O* out = model ? static_cast<O*>(model->data_ptr()) : nullptr;
          const T b1 = static_cast<T>(hp.beta1), b2 = static_cast<T>(hp.beta2);
          const T eps = static_cast<T>(hp.eps), wd = static_cast<T>(hp.weight_decay);
          // 1 - beta from the double (T(1) - b2 in float is 1.3e-5 off for beta2 = 0.999).
          const T omb1 = static_cast<T>(1.0 - hp.beta1), omb2 = static_cast<T>(1.0 - hp.beta2);
          // Bias corrections in double, then rounded, as PyTorch computes them on Python floats.
          const double bc1 = 1.0 - std::pow(hp.beta1, step);
          const double bc2 = 1.0 - std::pow(hp.beta2, step);
          const T step_size = static_cast<T>(lr / bc1);
          const T bc2_sqrt = static_cast<T>(std::sqrt(bc2));
          const T decay = static_cast<T>(1.0 - lr * hp.weight_decay);
          // The clip coefficient (a float32 scalar), multiplied in the gradient's precision (float
          // for 16-bit gradients): for f32 and f64 gradients the very product a scaling pass stores.
          const bool scaled = hp.grad_scale_ptr != nullptr;
          const float grad_scale = scaled ? *hp.grad_scale_ptr : 1.f;
          const std::int64_t n = p.numel();
          for (std::int64_t i = 0; i < n; ++i) {
            T gi;
            if (!scaled)
              gi = grad_value<T>(g[i]);
            else if constexpr (std::is_same_v<G, double>)
              gi = static_cast<T>(g[i] * static_cast<double>(grad_scale));
            else
              gi = static_cast<T>(static_cast<float>(g[i]) * grad_scale);
            if (hp.weight_decay != 0) {
              if (hp.decoupled_weight_decay)
                w[i] = w[i] * decay;
              else
                gi = gi + wd * w[i];
            }
            m[i] = m[i] * b1 + omb1 * gi;
            v[i] = v[i] * b2 + omb2 * gi * gi;
            const T denom = std::sqrt(v[i]) / bc2_sqrt + eps;
            w[i] = w[i] - step_size * (m[i] / denom);
            store_model(out, i, w[i]);
          }
        });
      });
    });
  }
}

void sgd_step(std::span<const Tensor> params, std::span<const Tensor> grads, std::span<const Tensor> momentum_buffers,
              std::span<const Tensor> model_params, const SgdParams& hp) {
  const bool use_momentum = hp.momentum != 0;
  KILN_CHECK(grads.size() == params.size(), "sgd_step: {} params but {} grads", params.size(), grads.size());
  KILN_CHECK(!use_momentum || momentum_buffers.size() == params.size(),
             "sgd_step: momentum {} needs one buffer per parameter ({} params, {} buffers)", hp.momentum, params.size(),
             momentum_buffers.size());
  check_model_list("sgd_step", params, model_params);
  for (std::size_t t = 0; t < params.size(); ++t) {
    const Tensor& p = params[t];
    KILN_CHECK(p.is_contiguous(), "sgd_step: parameter {} is not contiguous", p.describe());
    check_sized("sgd_step", p, grads[t], "grad");
    if (use_momentum) check_like("sgd_step", p, momentum_buffers[t], "momentum buffer");
    const Tensor* model = model_params.empty() ? nullptr : &model_params[t];
    if (model) check_sized("sgd_step", p, *model, "model parameter");
    dispatch_param(p, "sgd_step", [&]<class T>() {
      dispatch_grad<T>(p, grads[t], "sgd_step", [&]<class G>() {
        dispatch_model(model, "sgd_step", [&]<class O>() {
          T* w = p.data<T>();
          const G* g = static_cast<const G*>(grads[t].data_ptr());
          T* buf = use_momentum ? momentum_buffers[t].data<T>() : nullptr;
          O* out = model ? static_cast<O*>(model->data_ptr()) : nullptr;
          const T lr = static_cast<T>(hp.lr_ptr ? *hp.lr_ptr : hp.lr), mom = static_cast<T>(hp.momentum),
                  wd = static_cast<T>(hp.weight_decay);
          const T damp = static_cast<T>(1.0 - hp.dampening);
          const std::int64_t n = p.numel();
          for (std::int64_t i = 0; i < n; ++i) {
            T d = grad_value<T>(g[i]);
            if (hp.weight_decay != 0) d = d + wd * w[i];
            if (use_momentum) {
              buf[i] = hp.first_step ? d : buf[i] * mom + damp * d;
              d = hp.nesterov ? d + mom * buf[i] : buf[i];
            }
            w[i] = w[i] - lr * d;
            store_model(out, i, w[i]);
          }
        });
      });
    });
  }
}

void sum_of_squares(std::span<const Tensor> tensors, const Tensor& out) {
  KILN_CHECK(out.numel() == 1 && (out.dtype() == DType::F32 || out.dtype() == DType::F64),
             "sum_of_squares: out must be a one-element float32/float64 tensor, got {}", out.describe());
  double total = 0;
  for (const Tensor& t : tensors) {
    KILN_CHECK(t.is_contiguous(), "sum_of_squares: {} is not contiguous", t.describe());
    KILN_DISPATCH_FLOATING(t.dtype(), "sum_of_squares", [&]<class T>() {
      const T* x = t.data<T>();
      double s = 0;
      for (std::int64_t i = 0; i < t.numel(); ++i) {
        const double v = static_cast<double>(static_cast<float>(x[i]));
        s += v * v;
      }
      total += s;
    });
  }
  if (out.dtype() == DType::F32)
    *out.data<float>() = static_cast<float>(total);
  else
    *out.data<double>() = total;
}

}  // namespace kiln::ops::cpu
