// CUDA conv2d forward/backward through cuDNN (legacy convolution API). Per device: one cuDNN
// handle. Per (device, dtype, shapes, params): the tensor/filter/convolution descriptors and the
// algorithm of each direction, chosen once by cudnnFind*Ex (benchmarks, like PyTorch's
// cudnn.benchmark=True; it synchronises, so run one eager step before capturing a CUDA graph).
// Workspaces come from the caching allocator. f32 runs in true FP32 (CUDNN_FMA_MATH) unless
// KILN_ALLOW_TF32=1; bf16/f16 use tensor cores with f32 accumulation.
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "kiln/ops/cuda/cuda_host.h"
#include "kiln/ops/cuda/cuda_kernels.h"
#include "kiln/runtime/backend.h"
#include "kiln/runtime/cuda/cuda_context.h"
#include "kiln/runtime/vendor/cudnn.h"

namespace kiln::ops::cuda {

namespace {

cudnnHandle_t cudnn_handle(int index) {
  static cudnnHandle_t handles[64];
  static std::once_flag once[64];
  KILN_CHECK(index >= 0 && index < 64, "conv2d: device index {} out of range", index);
  std::call_once(once[index], [index] {
    DeviceGuard guard(index);
    KILN_CUDNN_CHECK(cudnnCreate(&handles[index]));
  });
  return handles[index];
}

bool conv_allow_tf32() {
  static const bool on = [] {
    const char* v = std::getenv("KILN_ALLOW_TF32");
    return v && v[0] != '\0' && std::strcmp(v, "0") != 0;
  }();
  return on;
}

struct ConvKey {
  int device;
  DType dtype;
  std::int64_t n, c, h, w, k, r, s, oh, ow;
  Conv2dParams p;
  bool operator==(const ConvKey& o) const {
    return device == o.device && dtype == o.dtype && n == o.n && c == o.c && h == o.h && w == o.w && k == o.k &&
           r == o.r && s == o.s && oh == o.oh && ow == o.ow && p.stride_h == o.p.stride_h &&
           p.stride_w == o.p.stride_w && p.pad_h == o.p.pad_h && p.pad_w == o.p.pad_w &&
           p.dilation_h == o.p.dilation_h && p.dilation_w == o.p.dilation_w && p.groups == o.p.groups;
  }
};

struct ConvKeyHash {
  std::size_t operator()(const ConvKey& k) const {
    std::size_t h = static_cast<std::size_t>(k.device) + 0x9e3779b9u * static_cast<std::size_t>(k.dtype);
    auto mix = [&h](std::int64_t v) { h ^= static_cast<std::size_t>(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
    for (std::int64_t v : {k.n, k.c, k.h, k.w, k.k, k.r, k.s, k.oh, k.ow})
      mix(v);
    for (int v : {k.p.stride_h, k.p.stride_w, k.p.pad_h, k.p.pad_w, k.p.dilation_h, k.p.dilation_w, k.p.groups})
      mix(v);
    return h;
  }
};

struct ConvPlan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr, bias = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv_fwd = nullptr, conv_bwd_data = nullptr, conv_bwd_filter = nullptr;
  bool have_fwd = false, have_bwd_data = false, have_bwd_filter = false;
  cudnnConvolutionFwdAlgo_t fwd_algo{};
  cudnnConvolutionBwdDataAlgo_t bwd_data_algo{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter_algo{};
  std::size_t fwd_ws = 0, bwd_data_ws = 0, bwd_filter_ws = 0;
};

cudnnDataType_t cudnn_type(DType t) {
  switch (t) {
    case DType::F32: return CUDNN_DATA_FLOAT;
    case DType::F64: return CUDNN_DATA_DOUBLE;
    case DType::F16: return CUDNN_DATA_HALF;
    case DType::BF16: return CUDNN_DATA_BFLOAT16;
    default: KILN_FAIL("conv2d: dtype {} is not supported on CUDA", dtype_name(t));
  }
}

cudnnConvolutionDescriptor_t make_conv_desc(const ConvKey& key) {
  cudnnConvolutionDescriptor_t d = nullptr;
  KILN_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&d));
  cudnnDataType_t compute = key.dtype == DType::F64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
  KILN_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(d, key.p.pad_h, key.p.pad_w, key.p.stride_h, key.p.stride_w,
                                                   key.p.dilation_h, key.p.dilation_w, CUDNN_CROSS_CORRELATION,
                                                   compute));
  KILN_CUDNN_CHECK(cudnnSetConvolutionGroupCount(d, key.p.groups));
  cudnnMathType_t math = CUDNN_TENSOR_OP_MATH;
  if (key.dtype == DType::F32) math = conv_allow_tf32() ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH;
  if (key.dtype == DType::F64) math = CUDNN_DEFAULT_MATH;
  KILN_CUDNN_CHECK(cudnnSetConvolutionMathType(d, math));
  return d;
}

ConvPlan make_plan(const ConvKey& key) {
  ConvPlan p;
  const cudnnDataType_t t = cudnn_type(key.dtype);
  auto i32 = [](std::int64_t v) { return static_cast<int>(v); };
  KILN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&p.x));
  KILN_CUDNN_CHECK(
      cudnnSetTensor4dDescriptor(p.x, CUDNN_TENSOR_NCHW, t, i32(key.n), i32(key.c), i32(key.h), i32(key.w)));
  KILN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&p.y));
  KILN_CUDNN_CHECK(
      cudnnSetTensor4dDescriptor(p.y, CUDNN_TENSOR_NCHW, t, i32(key.n), i32(key.k), i32(key.oh), i32(key.ow)));
  KILN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&p.bias));
  KILN_CUDNN_CHECK(cudnnSetTensor4dDescriptor(p.bias, CUDNN_TENSOR_NCHW, t, 1, i32(key.k), 1, 1));
  KILN_CUDNN_CHECK(cudnnCreateFilterDescriptor(&p.w));
  KILN_CUDNN_CHECK(cudnnSetFilter4dDescriptor(p.w, t, CUDNN_TENSOR_NCHW, i32(key.k), i32(key.c / key.p.groups),
                                              i32(key.r), i32(key.s)));
  p.conv_fwd = make_conv_desc(key);
  p.conv_bwd_data = make_conv_desc(key);
  p.conv_bwd_filter = make_conv_desc(key);
  return p;
}

// Workspace for the algorithm search: as much as is reasonable, shrinking when memory is short.
struct SearchWorkspace {
  void* ptr = nullptr;
  std::size_t bytes = 0;
  int index;
  explicit SearchWorkspace(int idx) : index(idx) {
    for (std::size_t b = std::size_t{1} << 30; b >= (std::size_t{1} << 22); b >>= 1) {
      try {
        ptr = backend_for(Device::cuda(index)).allocate(b, index);
        bytes = b;
        return;
      } catch (const Error&) {
      }
    }
  }
  ~SearchWorkspace() {
    if (ptr) backend_for(Device::cuda(index)).deallocate(ptr, index);
  }
};

ConvKey make_key(const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dParams& p) {
  return ConvKey{x.device().index, x.dtype(),   x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3], w.shape()[0],
                 w.shape()[2],     w.shape()[3], y.shape()[2], y.shape()[3], p};
}

std::mutex& plans_mutex() {
  static std::mutex m;
  return m;
}

ConvPlan& plan_for(const ConvKey& key) {
  static std::unordered_map<ConvKey, ConvPlan, ConvKeyHash> plans;
  std::lock_guard<std::mutex> lock(plans_mutex());
  auto it = plans.find(key);
  if (it == plans.end()) it = plans.emplace(key, make_plan(key)).first;
  return it->second;  // nodes are stable; plans are never erased
}

void set_math(cudnnConvolutionDescriptor_t d, cudnnMathType_t m) { KILN_CUDNN_CHECK(cudnnSetConvolutionMathType(d, m)); }

const void* one(DType t) {
  static const float f1 = 1.0f;
  static const double d1 = 1.0;
  return t == DType::F64 ? static_cast<const void*>(&d1) : static_cast<const void*>(&f1);
}
const void* zero(DType t) {
  static const float f0 = 0.0f;
  static const double d0 = 0.0;
  return t == DType::F64 ? static_cast<const void*>(&d0) : static_cast<const void*>(&f0);
}

}  // namespace

void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y, const Conv2dParams& p) {
  const int index = x.device().index;
  DeviceGuard guard(index);
  cudnnHandle_t h = cudnn_handle(index);
  KILN_CUDNN_CHECK(cudnnSetStream(h, cuda_stream(index)));
  ConvKey key = make_key(x, w, y, p);
  ConvPlan& plan = plan_for(key);
  if (!plan.have_fwd) {
    SearchWorkspace ws(index);
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int found = 0;
    KILN_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(h, plan.x, x.data_ptr(), plan.w, w.data_ptr(),
                                                            plan.conv_fwd, plan.y, y.data_ptr(),
                                                            CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &found, perf, ws.ptr,
                                                            ws.bytes));
    int best = -1;
    for (int i = 0; i < found && best < 0; ++i)
      if (perf[i].status == CUDNN_STATUS_SUCCESS) best = i;
    KILN_CHECK(best >= 0, "conv2d: cuDNN found no forward algorithm for x {} w {}", x.describe(), w.describe());
    plan.fwd_algo = perf[best].algo;
    plan.fwd_ws = perf[best].memory;
    set_math(plan.conv_fwd, perf[best].mathType);
    plan.have_fwd = true;
  }
  Scratch ws(plan.fwd_ws, index);
  KILN_CUDNN_CHECK(cudnnConvolutionForward(h, one(x.dtype()), plan.x, x.data_ptr(), plan.w, w.data_ptr(),
                                           plan.conv_fwd, plan.fwd_algo, ws.ptr(), plan.fwd_ws, zero(x.dtype()),
                                           plan.y, y.data_ptr()));
  if (bias.defined())
    KILN_CUDNN_CHECK(
        cudnnAddTensor(h, one(x.dtype()), plan.bias, bias.data_ptr(), one(x.dtype()), plan.y, y.data_ptr()));
}

void conv2d_backward(const Tensor& grad_y, const Tensor& x, const Tensor& w, const Tensor& grad_x,
                     const Tensor& grad_w, const Tensor& grad_b, const Conv2dParams& p) {
  const int index = x.device().index;
  DeviceGuard guard(index);
  cudnnHandle_t h = cudnn_handle(index);
  KILN_CUDNN_CHECK(cudnnSetStream(h, cuda_stream(index)));
  ConvKey key = make_key(x, w, grad_y, p);
  ConvPlan& plan = plan_for(key);
  const DType t = x.dtype();
  if (grad_x.defined()) {
    if (!plan.have_bwd_data) {
      SearchWorkspace ws(index);
      cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
      int found = 0;
      KILN_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(
          h, plan.w, w.data_ptr(), plan.y, grad_y.data_ptr(), plan.conv_bwd_data, plan.x, grad_x.data_ptr(),
          CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &found, perf, ws.ptr, ws.bytes));
      int best = -1;
      for (int i = 0; i < found && best < 0; ++i)
        if (perf[i].status == CUDNN_STATUS_SUCCESS) best = i;
      KILN_CHECK(best >= 0, "conv2d backward: cuDNN found no data algorithm for x {} w {}", x.describe(),
                 w.describe());
      plan.bwd_data_algo = perf[best].algo;
      plan.bwd_data_ws = perf[best].memory;
      set_math(plan.conv_bwd_data, perf[best].mathType);
      plan.have_bwd_data = true;
    }
    Scratch ws(plan.bwd_data_ws, index);
    KILN_CUDNN_CHECK(cudnnConvolutionBackwardData(h, one(t), plan.w, w.data_ptr(), plan.y, grad_y.data_ptr(),
                                                  plan.conv_bwd_data, plan.bwd_data_algo, ws.ptr(), plan.bwd_data_ws,
                                                  zero(t), plan.x, grad_x.data_ptr()));
  }
  if (grad_w.defined()) {
    if (!plan.have_bwd_filter) {
      SearchWorkspace ws(index);
      cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
      int found = 0;
      KILN_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(
          h, plan.x, x.data_ptr(), plan.y, grad_y.data_ptr(), plan.conv_bwd_filter, plan.w, grad_w.data_ptr(),
          CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &found, perf, ws.ptr, ws.bytes));
      int best = -1;
      for (int i = 0; i < found && best < 0; ++i)
        if (perf[i].status == CUDNN_STATUS_SUCCESS) best = i;
      KILN_CHECK(best >= 0, "conv2d backward: cuDNN found no filter algorithm for x {} w {}", x.describe(),
                 w.describe());
      plan.bwd_filter_algo = perf[best].algo;
      plan.bwd_filter_ws = perf[best].memory;
      set_math(plan.conv_bwd_filter, perf[best].mathType);
      plan.have_bwd_filter = true;
    }
    Scratch ws(plan.bwd_filter_ws, index);
    KILN_CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, one(t), plan.x, x.data_ptr(), plan.y, grad_y.data_ptr(),
                                                    plan.conv_bwd_filter, plan.bwd_filter_algo, ws.ptr(),
                                                    plan.bwd_filter_ws, zero(t), plan.w, grad_w.data_ptr()));
  }
  // Kiln's own per-channel sum: cudnnConvolutionBackwardBias returns NOT_SUPPORTED for some
  // dtypes (seen on the H200 with cuDNN 9), and one reduction kernel serves every dtype.
  if (grad_b.defined()) conv_bias_grad(grad_y, grad_b);
}

}  // namespace kiln::ops::cuda
