// CUDA conv2d forward/backward through cuDNN, NCHW or channels-last (NHWC in memory). Per device:
// one cuDNN handle. Per (device, dtype, layout, shapes, params) and direction, on first use, two
// candidates are timed on the caller's buffers and the faster one is kept for good:
// - a cuDNN graph (backend API) with the fastest of the heuristics' engines (cudnn_conv_graph.h);
//   it reaches cuDNN 9's newer engines: on the H200 its bf16 kernels were 1.3-3.5x faster than the
//   legacy API's on the ResNet-18 CIFAR shapes;
// - the legacy API's algorithm from cudnnFind*Ex, which still wins some f32 shapes.
// The search synchronises, so run one eager step before capturing a CUDA graph. KILN_CUDNN_LEGACY=1
// keeps to the legacy API (for comparison); a buffer less than 16-byte aligned also takes it.
// Workspaces come from the caching allocator. f32 runs in true FP32 (CUDNN_FMA_MATH) unless
// KILN_ALLOW_TF32=1; bf16/f16 use tensor cores with f32 accumulation.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "kiln/ops/copy.h"
#include "kiln/ops/cuda/cuda_host.h"
#include "kiln/ops/cuda/cuda_kernels.h"
#include "kiln/ops/cuda/cudnn_backend.h"
#include "kiln/ops/cuda/cudnn_conv_graph.h"
#include "kiln/ops/memory_format.h"
#include "kiln/runtime/backend.h"
#include "kiln/runtime/cuda/cuda_context.h"
#include "kiln/runtime/hash_mix.h"
#include "kiln/runtime/vendor/cudnn.h"

namespace kiln::ops::cuda {

namespace {

bool force_legacy() {
  static const bool on = env_flag("KILN_CUDNN_LEGACY");
  return on;
}

struct ConvKey {
  int device;
  DType dtype;
  bool nhwc;
  std::int64_t n, c, h, w, k, r, s, oh, ow;
  Conv2dParams p;
  bool operator==(const ConvKey& o) const {
    return device == o.device && dtype == o.dtype && nhwc == o.nhwc && n == o.n && c == o.c && h == o.h && w == o.w &&
           k == o.k && r == o.r && s == o.s && oh == o.oh && ow == o.ow && p.stride_h == o.p.stride_h &&
           p.stride_w == o.p.stride_w && p.pad_h == o.p.pad_h && p.pad_w == o.p.pad_w &&
           p.dilation_h == o.p.dilation_h && p.dilation_w == o.p.dilation_w && p.groups == o.p.groups;
  }
};

struct ConvKeyHash {
  std::size_t operator()(const ConvKey& k) const {
    std::size_t h =
        static_cast<std::size_t>(k.device) + 0x9e3779b9u * static_cast<std::size_t>(k.dtype) + (k.nhwc ? 0x51u : 0u);
    auto mix = [&h](std::int64_t v) { hash_mix(h, static_cast<std::uint64_t>(v)); };
    for (std::int64_t v : {k.n, k.c, k.h, k.w, k.k, k.r, k.s, k.oh, k.ow}) mix(v);
    for (int v : {k.p.stride_h, k.p.stride_w, k.p.pad_h, k.p.pad_w, k.p.dilation_h, k.p.dilation_w, k.p.groups}) mix(v);
    return h;
  }
};

enum class Impl : std::uint8_t { Undecided, Graph, Legacy };
constexpr int kForward = static_cast<int>(ConvDirection::Forward);
constexpr int kBackwardData = static_cast<int>(ConvDirection::BackwardData);
constexpr int kBackwardFilter = static_cast<int>(ConvDirection::BackwardFilter);

struct ConvPlan {
  // Legacy API: descriptors, and the algorithm of each direction, found once.
  cudnnTensorDescriptor_t x = nullptr, y = nullptr, bias = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv[3] = {nullptr, nullptr, nullptr};
  bool found[3] = {false, false, false};
  int algo[3] = {0, 0, 0};
  std::size_t workspace[3] = {0, 0, 0};
  float legacy_ms[3] = {0, 0, 0};
  // Graph API: the plan of each direction (null when no engine runs it); which of the two runs.
  std::unique_ptr<CudnnConvGraph> graph[3];
  Impl impl[3] = {Impl::Undecided, Impl::Undecided, Impl::Undecided};
};

cudnnConvolutionDescriptor_t make_conv_desc(const ConvKey& key) {
  cudnnConvolutionDescriptor_t d = nullptr;
  KILN_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&d));
  cudnnDataType_t compute = key.dtype == DType::F64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
  KILN_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(d, key.p.pad_h, key.p.pad_w, key.p.stride_h, key.p.stride_w,
                                                   key.p.dilation_h, key.p.dilation_w, CUDNN_CROSS_CORRELATION,
                                                   compute));
  KILN_CUDNN_CHECK(cudnnSetConvolutionGroupCount(d, key.p.groups));
  cudnnMathType_t math = CUDNN_TENSOR_OP_MATH;
  if (key.dtype == DType::F32) math = allow_tf32() ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH;
  if (key.dtype == DType::F64) math = CUDNN_DEFAULT_MATH;
  KILN_CUDNN_CHECK(cudnnSetConvolutionMathType(d, math));
  return d;
}

ConvPlan make_plan(const ConvKey& key) {
  ConvPlan p;
  const cudnnDataType_t t = cudnn_data_type(key.dtype);
  const cudnnTensorFormat_t f = key.nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  auto i32 = [](std::int64_t v) { return static_cast<int>(v); };
  KILN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&p.x));
  KILN_CUDNN_CHECK(cudnnSetTensor4dDescriptor(p.x, f, t, i32(key.n), i32(key.c), i32(key.h), i32(key.w)));
  KILN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&p.y));
  KILN_CUDNN_CHECK(cudnnSetTensor4dDescriptor(p.y, f, t, i32(key.n), i32(key.k), i32(key.oh), i32(key.ow)));
  KILN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&p.bias));
  KILN_CUDNN_CHECK(cudnnSetTensor4dDescriptor(p.bias, f, t, 1, i32(key.k), 1, 1));
  KILN_CUDNN_CHECK(cudnnCreateFilterDescriptor(&p.w));
  KILN_CUDNN_CHECK(
      cudnnSetFilter4dDescriptor(p.w, t, f, i32(key.k), i32(key.c / key.p.groups), i32(key.r), i32(key.s)));
  for (auto& c : p.conv) c = make_conv_desc(key);
  return p;
}

// Workspace for the legacy algorithm search: as much as is reasonable, shrinking when memory is short.
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
  const bool nhwc = is_channels_last_only(x);
  return ConvKey{x.device().index,
                 x.dtype(),
                 nhwc,
                 x.shape()[0],
                 x.shape()[1],
                 x.shape()[2],
                 x.shape()[3],
                 w.shape()[0],
                 w.shape()[2],
                 w.shape()[3],
                 y.shape()[2],
                 y.shape()[3],
                 p};
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

// The legacy API's search for one direction: the fastest algorithm that succeeds, its workspace,
// math type and time.
template <class Perf>
void take_best(ConvPlan& plan, int dir, const Perf* perf, int found, const char* what, const ConvKey& key) {
  int best = -1;
  for (int i = 0; i < found && best < 0; ++i)
    if (perf[i].status == CUDNN_STATUS_SUCCESS) best = i;
  KILN_CHECK(best >= 0, "conv2d: cuDNN found no {} algorithm for input [{}, {}, {}, {}] and weight [{}, {}, {}, {}]",
             what, key.n, key.c, key.h, key.w, key.k, key.c / key.p.groups, key.r, key.s);
  plan.algo[dir] = static_cast<int>(perf[best].algo);
  plan.workspace[dir] = perf[best].memory;
  plan.legacy_ms[dir] = perf[best].time;
  KILN_CUDNN_CHECK(cudnnSetConvolutionMathType(plan.conv[dir], perf[best].mathType));
  plan.found[dir] = true;
}

void legacy_find(ConvPlan& plan, int dir, cudnnHandle_t h, const ConvKey& key, const ConvBuffers& b) {
  SearchWorkspace ws(key.device);
  int found = 0;
  if (dir == kForward) {
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    KILN_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(h, plan.x, b.x, plan.w, b.w, plan.conv[dir], plan.y, b.y,
                                                            CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &found, perf, ws.ptr,
                                                            ws.bytes));
    take_best(plan, dir, perf, found, "forward", key);
  } else if (dir == kBackwardData) {
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    KILN_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(h, plan.w, b.w, plan.y, b.y, plan.conv[dir], plan.x,
                                                                 b.x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &found,
                                                                 perf, ws.ptr, ws.bytes));
    take_best(plan, dir, perf, found, "backward-data", key);
  } else {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    KILN_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(h, plan.x, b.x, plan.y, b.y, plan.conv[dir], plan.w,
                                                                   b.w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &found,
                                                                   perf, ws.ptr, ws.bytes));
    take_best(plan, dir, perf, found, "backward-filter", key);
  }
}

void legacy_run(ConvPlan& plan, int dir, cudnnHandle_t h, const ConvKey& key, const ConvBuffers& b) {
  if (!plan.found[dir]) legacy_find(plan, dir, h, key, b);
  Scratch ws(plan.workspace[dir], key.device);
  const DType t = key.dtype;
  if (dir == kForward) {
    KILN_CUDNN_CHECK(cudnnConvolutionForward(h, one(t), plan.x, b.x, plan.w, b.w, plan.conv[dir],
                                             static_cast<cudnnConvolutionFwdAlgo_t>(plan.algo[dir]), ws.ptr(),
                                             plan.workspace[dir], zero(t), plan.y, b.y));
  } else if (dir == kBackwardData) {
    KILN_CUDNN_CHECK(cudnnConvolutionBackwardData(h, one(t), plan.w, b.w, plan.y, b.y, plan.conv[dir],
                                                  static_cast<cudnnConvolutionBwdDataAlgo_t>(plan.algo[dir]), ws.ptr(),
                                                  plan.workspace[dir], zero(t), plan.x, b.x));
  } else {
    KILN_CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, one(t), plan.x, b.x, plan.y, b.y, plan.conv[dir],
                                                    static_cast<cudnnConvolutionBwdFilterAlgo_t>(plan.algo[dir]),
                                                    ws.ptr(), plan.workspace[dir], zero(t), plan.w, b.w));
  }
}

// The graph API's view of the three tensors: dims in NCHW order, strides of the layout.
ConvTensorLayout layout(bool nhwc, std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w) {
  if (nhwc) return ConvTensorLayout{{n, c, h, w}, {h * w * c, 1, w * c, c}, 16};
  return ConvTensorLayout{{n, c, h, w}, {c * h * w, h * w, w, 1}, 16};
}

bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

// Runs one direction of the convolution. On the first call for a key, builds and times the
// graph plan and the legacy algorithm, and keeps the faster.
void run_direction(ConvPlan& plan, int dir, cudnnHandle_t h, const ConvKey& key, const ConvBuffers& b) {
  const bool graph_ok = !force_legacy() && aligned16(b.x) && aligned16(b.w) && aligned16(b.y);
  if (plan.impl[dir] == Impl::Undecided) {
    if (graph_ok) {
      const ConvGeometry g{
          {key.p.pad_h, key.p.pad_w}, {key.p.stride_h, key.p.stride_w}, {key.p.dilation_h, key.p.dilation_w}};
      plan.graph[dir] = CudnnConvGraph::build(h, key.device, static_cast<ConvDirection>(dir), key.dtype,
                                              layout(key.nhwc, key.n, key.c, key.h, key.w),
                                              layout(key.nhwc, key.k, key.c / key.p.groups, key.r, key.s),
                                              layout(key.nhwc, key.n, key.k, key.oh, key.ow), g, b);
    }
    legacy_find(plan, dir, h, key, b);
    const bool graph_faster = plan.graph[dir] && plan.graph[dir]->time_ms() <= plan.legacy_ms[dir];
    plan.impl[dir] = graph_faster ? Impl::Graph : Impl::Legacy;
  }
  if (plan.impl[dir] == Impl::Graph && graph_ok)
    plan.graph[dir]->execute(h, key.device, b);
  else
    legacy_run(plan, dir, h, key, b);
}

// cuDNN 9 has no float64 NHWC backward-data algorithm (seen on the H200 with cuDNN 9.19): a
// float64 channels-last convolution runs on NCHW copies. float64 is the checking dtype, not a fast
// path, so the copies cost nothing that matters.
bool nchw_detour(const Tensor& x) { return x.dtype() == DType::F64 && is_channels_last_only(x); }

Tensor nchw_like(const Tensor& t) { return t.defined() ? Tensor::empty(t.shape(), t.dtype(), t.device()) : Tensor(); }

}  // namespace

void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y, const Conv2dParams& p) {
  if (nchw_detour(x)) {
    const Tensor yc = nchw_like(y);
    conv2d_forward(ops::contiguous(x), ops::contiguous(w), bias, yc, p);
    ops::copy_into(y, yc);
    return;
  }
  const int index = x.device().index;
  DeviceGuard guard(index);
  cudnnHandle_t h = cudnn_handle(index);
  KILN_CUDNN_CHECK(cudnnSetStream(h, cuda_stream(index)));
  const ConvKey key = make_key(x, w, y, p);
  ConvPlan& plan = plan_for(key);
  run_direction(plan, kForward, h, key, {x.data_ptr(), w.data_ptr(), y.data_ptr()});
  if (bias.defined())
    KILN_CUDNN_CHECK(
        cudnnAddTensor(h, one(x.dtype()), plan.bias, bias.data_ptr(), one(x.dtype()), plan.y, y.data_ptr()));
}

void conv2d_backward(const Tensor& grad_y, const Tensor& x, const Tensor& w, const Tensor& grad_x, const Tensor& grad_w,
                     const Tensor& grad_b, const Conv2dParams& p) {
  if (nchw_detour(x)) {
    const Tensor gx = nchw_like(grad_x), gw = nchw_like(grad_w);
    conv2d_backward(ops::contiguous(grad_y), ops::contiguous(x), ops::contiguous(w), gx, gw, grad_b, p);
    if (gx.defined()) ops::copy_into(grad_x, gx);
    if (gw.defined()) ops::copy_into(grad_w, gw);
    return;
  }
  const int index = x.device().index;
  DeviceGuard guard(index);
  cudnnHandle_t h = cudnn_handle(index);
  KILN_CUDNN_CHECK(cudnnSetStream(h, cuda_stream(index)));
  const ConvKey key = make_key(x, w, grad_y, p);
  ConvPlan& plan = plan_for(key);
  if (grad_x.defined())
    run_direction(plan, kBackwardData, h, key, {grad_x.data_ptr(), w.data_ptr(), grad_y.data_ptr()});
  if (grad_w.defined())
    run_direction(plan, kBackwardFilter, h, key, {x.data_ptr(), grad_w.data_ptr(), grad_y.data_ptr()});
  // Kiln's own per-channel sum: cudnnConvolutionBackwardBias returns NOT_SUPPORTED for some
  // dtypes (seen on the H200 with cuDNN 9), and one reduction kernel serves every dtype.
  // Channels-last grad_y is an [N*H*W, K] matrix: the same per-channel sum over a [N*H*W, K, 1, 1] view.
  if (grad_b.defined())
    conv_bias_grad(key.nhwc ? make_view(grad_y, Shape{key.n * key.oh * key.ow, key.k, 1, 1}, Strides{key.k, 1, 1, 1},
                                        grad_y.storage_offset())
                            : grad_y,
                   grad_b);
}

}  // namespace kiln::ops::cuda
