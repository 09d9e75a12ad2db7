// CPU max/avg/adaptive-avg pooling over contiguous NCHW tensors, one (n, c) plane per task.
#include <cmath>
#include <limits>
#include <vector>

#include "kiln/ops/cpu/accumulate_type.h"
#include "kiln/ops/cpu/cpu_kernels.h"
#include "kiln/ops/cpu/parallel.h"

namespace kiln::ops::cpu {

namespace {

struct Planes {
  std::int64_t count, h, w, oh, ow;
};

Planes planes(const Tensor& x, const Tensor& y) {
  const std::int64_t nd = x.dim();
  return {x.numel() / std::max<std::int64_t>(1, x.shape()[nd - 2] * x.shape()[nd - 1]), x.shape()[nd - 2],
          x.shape()[nd - 1], y.shape()[nd - 2], y.shape()[nd - 1]};
}

// Roughly how many planes make a task worth a thread.
std::int64_t plane_grain(const Planes& s) {
  return std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(1, s.h * s.w));
}

// Adaptive pooling's window [start, end) for output index i: floor(i*in/out), ceil((i+1)*in/out).
inline std::int64_t adaptive_start(std::int64_t i, std::int64_t out, std::int64_t in) { return (i * in) / out; }
inline std::int64_t adaptive_end(std::int64_t i, std::int64_t out, std::int64_t in) {
  return ((i + 1) * in + out - 1) / out;
}

}  // namespace

void max_pool2d_forward(const Tensor& x, const Tensor& y, const Tensor& indices, const Pool2dParams& p) {
  const Planes s = planes(x, y);
  KILN_DISPATCH_FLOATING(x.dtype(), "max_pool2d", [&]<class T>() {
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* yp = static_cast<T*>(y.data_ptr());
    auto* ip = static_cast<std::int64_t*>(indices.data_ptr());
    parallel_for(s.count, plane_grain(s), [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t pl = lo; pl < hi; ++pl) {
        const T* in = xp + pl * s.h * s.w;
        T* out = yp + pl * s.oh * s.ow;
        std::int64_t* idx = ip + pl * s.oh * s.ow;
        for (std::int64_t oy = 0; oy < s.oh; ++oy) {
          const std::int64_t y0 = oy * p.stride_h - p.pad_h;
          const std::int64_t ys = std::max<std::int64_t>(y0, 0), ye = std::min<std::int64_t>(y0 + p.kernel_h, s.h);
          for (std::int64_t ox = 0; ox < s.ow; ++ox) {
            const std::int64_t x0 = ox * p.stride_w - p.pad_w;
            const std::int64_t xs = std::max<std::int64_t>(x0, 0), xe = std::min<std::int64_t>(x0 + p.kernel_w, s.w);
            double best = -std::numeric_limits<double>::infinity();
            std::int64_t best_i = ys * s.w + xs;
            bool found_nan = false;
            for (std::int64_t iy = ys; iy < ye && !found_nan; ++iy) {
              for (std::int64_t ix = xs; ix < xe; ++ix) {
                const double v = static_cast<double>(in[iy * s.w + ix]);
                if (v > best || std::isnan(v)) {  // NaN propagates, as in PyTorch
                  best = v;
                  best_i = iy * s.w + ix;
                  if (std::isnan(v)) {
                    found_nan = true;
                    break;
                  }
                }
              }
            }
            out[oy * s.ow + ox] = in[best_i];
            idx[oy * s.ow + ox] = best_i;
          }
        }
      }
    });
  });
}

void max_pool2d_backward(const Tensor& grad_y, const Tensor& indices, const Tensor& grad_x, const Pool2dParams& p) {
  const Planes s = planes(grad_x, grad_y);
  KILN_DISPATCH_FLOATING(grad_x.dtype(), "max_pool2d_backward", [&]<class T>() {
    using A = acc_t<T>;
    const T* gy = static_cast<const T*>(grad_y.data_ptr());
    T* gx = static_cast<T*>(grad_x.data_ptr());
    const auto* ip = static_cast<const std::int64_t*>(indices.data_ptr());
    parallel_for(s.count, plane_grain(s), [&](std::int64_t lo, std::int64_t hi) {
      std::vector<A> acc(static_cast<std::size_t>(s.h * s.w));
      for (std::int64_t pl = lo; pl < hi; ++pl) {
        std::fill(acc.begin(), acc.end(), A(0));
        const T* g = gy + pl * s.oh * s.ow;
        const std::int64_t* idx = ip + pl * s.oh * s.ow;
        for (std::int64_t i = 0; i < s.oh * s.ow; ++i) acc[idx[i]] += static_cast<A>(g[i]);
        T* out = gx + pl * s.h * s.w;
        for (std::int64_t i = 0; i < s.h * s.w; ++i) out[i] = from_acc<T>(acc[i]);
      }
    });
  });
}

void avg_pool2d_forward(const Tensor& x, const Tensor& y, const Pool2dParams& p) {
  const Planes s = planes(x, y);
  KILN_DISPATCH_FLOATING(x.dtype(), "avg_pool2d", [&]<class T>() {
    using A = acc_t<T>;
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* yp = static_cast<T*>(y.data_ptr());
    parallel_for(s.count, plane_grain(s), [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t pl = lo; pl < hi; ++pl) {
        const T* in = xp + pl * s.h * s.w;
        T* out = yp + pl * s.oh * s.ow;
        for (std::int64_t oy = 0; oy < s.oh; ++oy) {
          const std::int64_t y0 = oy * p.stride_h - p.pad_h;
          const std::int64_t ys = std::max<std::int64_t>(y0, 0), ye = std::min<std::int64_t>(y0 + p.kernel_h, s.h);
          for (std::int64_t ox = 0; ox < s.ow; ++ox) {
            const std::int64_t x0 = ox * p.stride_w - p.pad_w;
            const std::int64_t xs = std::max<std::int64_t>(x0, 0), xe = std::min<std::int64_t>(x0 + p.kernel_w, s.w);
            A sum = 0;
            for (std::int64_t iy = ys; iy < ye; ++iy)
              for (std::int64_t ix = xs; ix < xe; ++ix) sum += static_cast<A>(in[iy * s.w + ix]);
            const std::int64_t count = p.count_include_pad
                                           ? (std::min<std::int64_t>(y0 + p.kernel_h, s.h + p.pad_h) - y0) *
                                                 (std::min<std::int64_t>(x0 + p.kernel_w, s.w + p.pad_w) - x0)
                                           : (ye - ys) * (xe - xs);
            out[oy * s.ow + ox] = from_acc<T>(sum / static_cast<A>(std::max<std::int64_t>(count, 1)));
          }
        }
      }
    });
  });
}

void avg_pool2d_backward(const Tensor& grad_y, const Tensor& grad_x, const Pool2dParams& p) {
  const Planes s = planes(grad_x, grad_y);
  KILN_DISPATCH_FLOATING(grad_x.dtype(), "avg_pool2d_backward", [&]<class T>() {
    using A = acc_t<T>;
    const T* gy = static_cast<const T*>(grad_y.data_ptr());
    T* gx = static_cast<T*>(grad_x.data_ptr());
    parallel_for(s.count, plane_grain(s), [&](std::int64_t lo, std::int64_t hi) {
      std::vector<A> acc(static_cast<std::size_t>(s.h * s.w));
      for (std::int64_t pl = lo; pl < hi; ++pl) {
        std::fill(acc.begin(), acc.end(), A(0));
        const T* g = gy + pl * s.oh * s.ow;
        for (std::int64_t oy = 0; oy < s.oh; ++oy) {
          const std::int64_t y0 = oy * p.stride_h - p.pad_h;
          const std::int64_t ys = std::max<std::int64_t>(y0, 0), ye = std::min<std::int64_t>(y0 + p.kernel_h, s.h);
          for (std::int64_t ox = 0; ox < s.ow; ++ox) {
            const std::int64_t x0 = ox * p.stride_w - p.pad_w;
            const std::int64_t xs = std::max<std::int64_t>(x0, 0), xe = std::min<std::int64_t>(x0 + p.kernel_w, s.w);
            const std::int64_t count = p.count_include_pad
                                           ? (std::min<std::int64_t>(y0 + p.kernel_h, s.h + p.pad_h) - y0) *
                                                 (std::min<std::int64_t>(x0 + p.kernel_w, s.w + p.pad_w) - x0)
                                           : (ye - ys) * (xe - xs);
            const A share = static_cast<A>(g[oy * s.ow + ox]) / static_cast<A>(std::max<std::int64_t>(count, 1));
            for (std::int64_t iy = ys; iy < ye; ++iy)
              for (std::int64_t ix = xs; ix < xe; ++ix) acc[iy * s.w + ix] += share;
          }
        }
        T* out = gx + pl * s.h * s.w;
        for (std::int64_t i = 0; i < s.h * s.w; ++i) out[i] = from_acc<T>(acc[i]);
      }
    });
  });
}

void adaptive_avg_pool2d_forward(const Tensor& x, const Tensor& y) {
  const Planes s = planes(x, y);
  KILN_DISPATCH_FLOATING(x.dtype(), "adaptive_avg_pool2d", [&]<class T>() {
    using A = acc_t<T>;
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* yp = static_cast<T*>(y.data_ptr());
    parallel_for(s.count, plane_grain(s), [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t pl = lo; pl < hi; ++pl) {
        const T* in = xp + pl * s.h * s.w;
        T* out = yp + pl * s.oh * s.ow;
        for (std::int64_t oy = 0; oy < s.oh; ++oy) {
          const std::int64_t ys = adaptive_start(oy, s.oh, s.h), ye = adaptive_end(oy, s.oh, s.h);
          for (std::int64_t ox = 0; ox < s.ow; ++ox) {
            const std::int64_t xs = adaptive_start(ox, s.ow, s.w), xe = adaptive_end(ox, s.ow, s.w);
            A sum = 0;
            for (std::int64_t iy = ys; iy < ye; ++iy)
              for (std::int64_t ix = xs; ix < xe; ++ix) sum += static_cast<A>(in[iy * s.w + ix]);
            out[oy * s.ow + ox] = from_acc<T>(sum / static_cast<A>((ye - ys) * (xe - xs)));
          }
        }
      }
    });
  });
}

void adaptive_avg_pool2d_backward(const Tensor& grad_y, const Tensor& grad_x) {
  const Planes s = planes(grad_x, grad_y);
  KILN_DISPATCH_FLOATING(grad_x.dtype(), "adaptive_avg_pool2d_backward", [&]<class T>() {
    using A = acc_t<T>;
    const T* gy = static_cast<const T*>(grad_y.data_ptr());
    T* gx = static_cast<T*>(grad_x.data_ptr());
    parallel_for(s.count, plane_grain(s), [&](std::int64_t lo, std::int64_t hi) {
      std::vector<A> acc(static_cast<std::size_t>(s.h * s.w));
      for (std::int64_t pl = lo; pl < hi; ++pl) {
        std::fill(acc.begin(), acc.end(), A(0));
        const T* g = gy + pl * s.oh * s.ow;
        for (std::int64_t oy = 0; oy < s.oh; ++oy) {
          const std::int64_t ys = adaptive_start(oy, s.oh, s.h), ye = adaptive_end(oy, s.oh, s.h);
          for (std::int64_t ox = 0; ox < s.ow; ++ox) {
            const std::int64_t xs = adaptive_start(ox, s.ow, s.w), xe = adaptive_end(ox, s.ow, s.w);
            const A share = static_cast<A>(g[oy * s.ow + ox]) / static_cast<A>((ye - ys) * (xe - xs));
            for (std::int64_t iy = ys; iy < ye; ++iy)
              for (std::int64_t ix = xs; ix < xe; ++ix) acc[iy * s.w + ix] += share;
          }
        }
        T* out = gx + pl * s.h * s.w;
        for (std::int64_t i = 0; i < s.h * s.w; ++i) out[i] = from_acc<T>(acc[i]);
      }
    });
  });
}

}  // namespace kiln::ops::cpu
