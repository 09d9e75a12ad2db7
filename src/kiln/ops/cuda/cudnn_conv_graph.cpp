#include "kiln/ops/cuda/cudnn_conv_graph.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <vector>

#include "kiln/ops/cuda/cuda_host.h"
#include "kiln/runtime/error.h"

namespace kiln::ops::cuda {

namespace {

// Unique ids of the three tensors in every graph and variant pack.
constexpr std::int64_t kUidX = 1, kUidW = 2, kUidY = 3;
// Engine configurations tried per convolution: the heuristics' best first; the tail rarely wins
// and finalizing a runtime-compiled engine can take a second.
constexpr int kMaxCandidates = 16;
// A faster engine that needs more workspace than this is not worth the memory it takes from training.
constexpr std::int64_t kMaxWorkspace = std::int64_t{1} << 30;

// Owns one backend descriptor.
class Descriptor {
 public:
  explicit Descriptor(cudnnBackendDescriptorType_t type) { KILN_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &d_)); }
  ~Descriptor() {
    if (d_) cudnnBackendDestroyDescriptor(d_);
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  Descriptor(Descriptor&& o) noexcept : d_(o.d_) { o.d_ = nullptr; }
  Descriptor& operator=(Descriptor&& o) noexcept {
    if (this != &o) {
      if (d_) cudnnBackendDestroyDescriptor(d_);
      d_ = o.d_;
      o.d_ = nullptr;
    }
    return *this;
  }
  cudnnBackendDescriptor_t get() const { return d_; }
  cudnnBackendDescriptor_t release() {
    cudnnBackendDescriptor_t d = d_;
    d_ = nullptr;
    return d;
  }
  template <class T>
  void set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, std::int64_t count, const T* values) {
    KILN_CUDNN_CHECK(cudnnBackendSetAttribute(d_, name, type, count, values));
  }
  void set_descriptor(cudnnBackendAttributeName_t name, cudnnBackendDescriptor_t value) {
    set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value);
  }
  void finalize() { KILN_CUDNN_CHECK(cudnnBackendFinalize(d_)); }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

Descriptor make_tensor(std::int64_t uid, cudnnDataType_t type, const ConvTensorLayout& l) {
  Descriptor d(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  d.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
  d.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, l.dims);
  d.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, l.strides);
  d.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
  d.set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &l.alignment);
  d.finalize();
  return d;
}

Descriptor make_convolution(DType dtype, const ConvGeometry& g) {
  Descriptor d(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  const cudnnDataType_t compute = dtype == DType::F64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const std::int64_t spatial_dims = 2;
  d.set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute);
  d.set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
  d.set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &spatial_dims);
  d.set(CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, g.dilation);
  d.set(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, g.stride);
  d.set(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, g.pad);
  d.set(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, g.pad);
  d.finalize();
  return d;
}

Descriptor make_operation(ConvDirection dir, DType dtype, const Descriptor& x, const Descriptor& w, const Descriptor& y,
                          const Descriptor& conv) {
  struct Names {
    cudnnBackendDescriptorType_t type;
    cudnnBackendAttributeName_t x, w, y, conv, alpha, beta;
  };
  const Names n = [dir] {
    switch (dir) {
      case ConvDirection::Forward:
        return Names{CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
                     CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
                     CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
                     CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
                     CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
                     CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
                     CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA};
      case ConvDirection::BackwardData:
        return Names{CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
                     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
                     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
                     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
                     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
                     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
                     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA};
      case ConvDirection::BackwardFilter:
      default:
        return Names{CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
                     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
                     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
                     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
                     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
                     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
                     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA};
    }
  }();
  Descriptor op(n.type);
  op.set_descriptor(n.x, x.get());
  op.set_descriptor(n.w, w.get());
  op.set_descriptor(n.y, y.get());
  op.set_descriptor(n.conv, conv.get());
  // The scaling factors' type follows the compute type: double for f64, float otherwise.
  if (dtype == DType::F64) {
    const double one = 1.0, zero = 0.0;
    op.set(n.alpha, CUDNN_TYPE_DOUBLE, 1, &one);
    op.set(n.beta, CUDNN_TYPE_DOUBLE, 1, &zero);
  } else {
    const float one = 1.0f, zero = 0.0f;
    op.set(n.alpha, CUDNN_TYPE_FLOAT, 1, &one);
    op.set(n.beta, CUDNN_TYPE_FLOAT, 1, &zero);
  }
  op.finalize();
  return op;
}

// The engine an engine configuration runs (an owned copy of its descriptor); null on failure.
std::optional<Descriptor> engine_of(cudnnBackendDescriptor_t config) {
  Descriptor engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  cudnnBackendDescriptor_t e = engine.get();
  std::int64_t n = 0;
  if (cudnnBackendGetAttribute(config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &e) !=
      CUDNN_STATUS_SUCCESS)
    return std::nullopt;
  return engine;
}

// Whether an engine's numerics are ones Kiln promises: f32 in true FP32 (no TF32 tensor cores)
// unless allowed, inputs never down-converted, reductions never in reduced precision.
bool numerics_allowed(cudnnBackendDescriptor_t config, DType dtype) {
  std::optional<Descriptor> engine = engine_of(config);
  if (!engine) return false;
  cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  std::int64_t count = 0;
  if (cudnnBackendGetAttribute(engine->get(), CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                               CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &count, notes) != CUDNN_STATUS_SUCCESS)
    return false;
  for (std::int64_t i = 0; i < count; ++i) {
    if (notes[i] == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS) return false;
    if (notes[i] == CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION) return false;
    if (notes[i] == CUDNN_NUMERICAL_NOTE_TENSOR_CORE && dtype == DType::F32 && !allow_tf32()) return false;
  }
  return true;
}

std::int64_t engine_global_index(cudnnBackendDescriptor_t config) {
  std::int64_t n = 0, index = -1;
  if (std::optional<Descriptor> engine = engine_of(config))
    cudnnBackendGetAttribute(engine->get(), CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &index);
  return index;
}

// The engine configurations the heuristics propose for the graph, best first.
std::vector<Descriptor> engine_configs(const Descriptor& graph, cudnnBackendHeurMode_t mode) {
  std::vector<Descriptor> configs;
  Descriptor heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  heur.set_descriptor(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph.get());
  heur.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  if (cudnnBackendFinalize(heur.get()) != CUDNN_STATUS_SUCCESS) return configs;
  std::int64_t count = 0;
  if (cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                               nullptr) != CUDNN_STATUS_SUCCESS ||
      count <= 0)
    return configs;
  for (std::int64_t i = 0; i < count; ++i) configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
  std::vector<cudnnBackendDescriptor_t> raw;
  for (auto& c : configs) raw.push_back(c.get());
  std::int64_t returned = 0;
  if (cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count,
                               &returned, raw.data()) != CUDNN_STATUS_SUCCESS)
    return {};
  const auto keep = static_cast<std::size_t>(std::max<std::int64_t>(0, std::min(returned, count)));
  configs.erase(configs.begin() + static_cast<std::ptrdiff_t>(keep), configs.end());
  return configs;
}

cudnnStatus_t run_plan(cudnnHandle_t handle, cudnnBackendDescriptor_t plan, const ConvBuffers& b, void* workspace) {
  Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  const std::int64_t uids[3] = {kUidX, kUidW, kUidY};
  void* ptrs[3] = {b.x, b.w, b.y};
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids);
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, ptrs);
  pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  pack.finalize();
  return cudnnBackendExecute(handle, plan, pack.get());
}

// Median time of three runs after a warm-up, in ms; negative if the plan fails to run.
float time_plan(cudnnHandle_t handle, cudaStream_t stream, cudnnBackendDescriptor_t plan, const ConvBuffers& b,
                void* workspace) {
  if (run_plan(handle, plan, b, workspace) != CUDNN_STATUS_SUCCESS) return -1.0f;
  cudaEvent_t start = nullptr, stop = nullptr;
  KILN_CUDA_CHECK(cudaEventCreate(&start));
  KILN_CUDA_CHECK(cudaEventCreate(&stop));
  float ms[3] = {-1.0f, -1.0f, -1.0f};
  bool ok = true;
  for (float& m : ms) {
    KILN_CUDA_CHECK(cudaEventRecord(start, stream));
    ok = ok && run_plan(handle, plan, b, workspace) == CUDNN_STATUS_SUCCESS;
    KILN_CUDA_CHECK(cudaEventRecord(stop, stream));
    KILN_CUDA_CHECK(cudaEventSynchronize(stop));
    KILN_CUDA_CHECK(cudaEventElapsedTime(&m, start, stop));
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (!ok) return -1.0f;
  std::sort(ms, ms + 3);
  return ms[1];
}

}  // namespace

cudnnDataType_t cudnn_data_type(DType t) {
  switch (t) {
    case DType::F32: return CUDNN_DATA_FLOAT;
    case DType::F64: return CUDNN_DATA_DOUBLE;
    case DType::F16: return CUDNN_DATA_HALF;
    case DType::BF16: return CUDNN_DATA_BFLOAT16;
    default: KILN_FAIL("conv2d: dtype {} is not supported on CUDA", dtype_name(t));
  }
}

std::unique_ptr<CudnnConvGraph> CudnnConvGraph::build(cudnnHandle_t handle, int device_index, ConvDirection direction,
                                                      DType dtype, const ConvTensorLayout& x, const ConvTensorLayout& w,
                                                      const ConvTensorLayout& y, const ConvGeometry& geometry,
                                                      const ConvBuffers& buffers) {
  const cudnnDataType_t type = cudnn_data_type(dtype);
  Descriptor tx = make_tensor(kUidX, type, x);
  Descriptor tw = make_tensor(kUidW, type, w);
  Descriptor ty = make_tensor(kUidY, type, y);
  Descriptor conv = make_convolution(dtype, geometry);
  Descriptor op = make_operation(direction, dtype, tx, tw, ty, conv);

  Descriptor graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  const cudnnBackendDescriptor_t ops[1] = {op.get()};
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, ops);
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  if (cudnnBackendFinalize(graph.get()) != CUDNN_STATUS_SUCCESS) return nullptr;

  std::vector<Descriptor> configs = engine_configs(graph, CUDNN_HEUR_MODE_A);
  if (configs.empty()) configs = engine_configs(graph, CUDNN_HEUR_MODE_FALLBACK);

  cudaStream_t stream = nullptr;
  KILN_CUDNN_CHECK(cudnnGetStream(handle, &stream));
  std::unique_ptr<CudnnConvGraph> best;
  float best_ms = 0.0f;
  std::size_t best_config = 0;
  int tried = 0;
  for (std::size_t i = 0; i < configs.size(); ++i) {
    Descriptor& config = configs[i];
    if (tried == kMaxCandidates) break;
    if (!numerics_allowed(config.get(), dtype)) continue;
    Descriptor plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    plan.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    plan.set_descriptor(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config.get());
    if (cudnnBackendFinalize(plan.get()) != CUDNN_STATUS_SUCCESS) continue;
    std::int64_t workspace = 0, n = 0;
    KILN_CUDNN_CHECK(cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                                              &n, &workspace));
    if (workspace < 0 || workspace > kMaxWorkspace) continue;
    ++tried;
    float ms = -1.0f;
    try {
      Scratch ws(static_cast<std::size_t>(workspace), device_index);
      ms = time_plan(handle, stream, plan.get(), buffers, ws.ptr());
    } catch (const Error&) {
      continue;  // the workspace did not fit in memory: another engine may need less
    }
    if (ms < 0.0f) continue;
    if (!best || ms < best_ms) {
      if (!best) best.reset(new CudnnConvGraph());
      if (best->plan_) cudnnBackendDestroyDescriptor(best->plan_);
      best->plan_ = plan.release();
      best->workspace_ = static_cast<std::size_t>(workspace);
      best->engine_ = engine_global_index(config.get());
      best_config = i;
      best_ms = ms;
      best->time_ms_ = ms;
    }
  }
  // The plan may refer to the descriptors it was built from (cudnn-frontend keeps them alive
  // too): they live as long as the plan.
  if (best)
    for (Descriptor* d : {&tx, &tw, &ty, &conv, &op, &graph, &configs[best_config]})
      best->keep_.push_back(d->release());
  return best;
}

CudnnConvGraph::~CudnnConvGraph() {
  if (plan_) cudnnBackendDestroyDescriptor(plan_);
  for (cudnnBackendDescriptor_t d : keep_) cudnnBackendDestroyDescriptor(d);
}

void CudnnConvGraph::execute(cudnnHandle_t handle, int device_index, const ConvBuffers& buffers) const {
  Scratch ws(workspace_, device_index);
  KILN_CUDNN_CHECK(run_plan(handle, plan_, buffers, ws.ptr()));
}

}  // namespace kiln::ops::cuda
