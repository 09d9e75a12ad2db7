#include "kiln/ops/cuda/cudnn_conv_graph.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <vector>

#include "kiln/ops/cuda/cuda_host.h"
#include "kiln/ops/cuda/cudnn_backend.h"
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

CudnnDescriptor make_tensor(std::int64_t uid, cudnnDataType_t type, const ConvTensorLayout& l) {
  CudnnDescriptor d(CUDNN_BACKEND_TENSOR_DESCRIPTOR, fmt::format("conv2d tensor {}", uid == kUidX   ? "x"
                                                                                     : uid == kUidW ? "w"
                                                                                                    : "y"));
  d.set(KILN_CUDNN_ATTR(CUDNN_ATTR_TENSOR_DATA_TYPE), CUDNN_TYPE_DATA_TYPE, 1, &type);
  d.set(KILN_CUDNN_ATTR(CUDNN_ATTR_TENSOR_DIMENSIONS), CUDNN_TYPE_INT64, 4, l.dims);
  d.set(KILN_CUDNN_ATTR(CUDNN_ATTR_TENSOR_STRIDES), CUDNN_TYPE_INT64, 4, l.strides);
  d.set(KILN_CUDNN_ATTR(CUDNN_ATTR_TENSOR_UNIQUE_ID), CUDNN_TYPE_INT64, 1, &uid);
  d.set(KILN_CUDNN_ATTR(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT), CUDNN_TYPE_INT64, 1, &l.alignment);
  d.finalize();
  return d;
}

CudnnDescriptor make_convolution(DType dtype, const ConvGeometry& g) {
  CudnnDescriptor d(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, "conv2d convolution");
  const cudnnDataType_t compute = dtype == DType::F64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const std::int64_t spatial_dims = 2;
  d.set(KILN_CUDNN_ATTR(CUDNN_ATTR_CONVOLUTION_COMP_TYPE), CUDNN_TYPE_DATA_TYPE, 1, &compute);
  d.set(KILN_CUDNN_ATTR(CUDNN_ATTR_CONVOLUTION_CONV_MODE), CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
  d.set(KILN_CUDNN_ATTR(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS), CUDNN_TYPE_INT64, 1, &spatial_dims);
  d.set(KILN_CUDNN_ATTR(CUDNN_ATTR_CONVOLUTION_DILATIONS), CUDNN_TYPE_INT64, 2, g.dilation);
  d.set(KILN_CUDNN_ATTR(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES), CUDNN_TYPE_INT64, 2, g.stride);
  d.set(KILN_CUDNN_ATTR(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS), CUDNN_TYPE_INT64, 2, g.pad);
  d.set(KILN_CUDNN_ATTR(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS), CUDNN_TYPE_INT64, 2, g.pad);
  d.finalize();
  return d;
}

CudnnDescriptor make_operation(ConvDirection dir, DType dtype, const CudnnDescriptor& x, const CudnnDescriptor& w,
                               const CudnnDescriptor& y, const CudnnDescriptor& conv) {
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
  CudnnDescriptor op(n.type, "conv2d operation");
  op.set_descriptor(n.x, "the x operand attribute", x.get());
  op.set_descriptor(n.w, "the w operand attribute", w.get());
  op.set_descriptor(n.y, "the y operand attribute", y.get());
  op.set_descriptor(n.conv, "the convolution attribute", conv.get());
  // The scaling factors' type follows the compute type: double for f64, float otherwise.
  if (dtype == DType::F64) {
    const double one = 1.0, zero = 0.0;
    op.set(n.alpha, "alpha", CUDNN_TYPE_DOUBLE, 1, &one);
    op.set(n.beta, "beta", CUDNN_TYPE_DOUBLE, 1, &zero);
  } else {
    const float one = 1.0f, zero = 0.0f;
    op.set(n.alpha, "alpha", CUDNN_TYPE_FLOAT, 1, &one);
    op.set(n.beta, "beta", CUDNN_TYPE_FLOAT, 1, &zero);
  }
  op.finalize();
  return op;
}

// Whether an engine's numerics are ones Kiln promises: f32 in true FP32 (no TF32 tensor cores)
// unless allowed, inputs never down-converted, reductions never in reduced precision.
bool numerics_allowed(cudnnBackendDescriptor_t config, DType dtype) {
  if (!engine_of(config)) return false;
  for (cudnnBackendNumericalNote_t note : engine_numerical_notes(config)) {
    if (note == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS) return false;
    if (note == CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION) return false;
    if (note == CUDNN_NUMERICAL_NOTE_TENSOR_CORE && dtype == DType::F32 && !allow_tf32()) return false;
  }
  return true;
}

cudnnStatus_t run_plan(cudnnHandle_t handle, cudnnBackendDescriptor_t plan, const ConvBuffers& b, void* workspace) {
  CudnnDescriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, "conv2d variant pack");
  const std::int64_t uids[3] = {kUidX, kUidW, kUidY};
  void* ptrs[3] = {b.x, b.w, b.y};
  pack.set(KILN_CUDNN_ATTR(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS), CUDNN_TYPE_INT64, 3, uids);
  pack.set(KILN_CUDNN_ATTR(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS), CUDNN_TYPE_VOID_PTR, 3, ptrs);
  pack.set(KILN_CUDNN_ATTR(CUDNN_ATTR_VARIANT_PACK_WORKSPACE), CUDNN_TYPE_VOID_PTR, 1, &workspace);
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
  CudnnDescriptor tx = make_tensor(kUidX, type, x);
  CudnnDescriptor tw = make_tensor(kUidW, type, w);
  CudnnDescriptor ty = make_tensor(kUidY, type, y);
  CudnnDescriptor conv = make_convolution(dtype, geometry);
  CudnnDescriptor op = make_operation(direction, dtype, tx, tw, ty, conv);

  CudnnDescriptor graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "conv2d graph");
  const cudnnBackendDescriptor_t ops[1] = {op.get()};
  graph.set(KILN_CUDNN_ATTR(CUDNN_ATTR_OPERATIONGRAPH_OPS), CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, ops);
  graph.set(KILN_CUDNN_ATTR(CUDNN_ATTR_OPERATIONGRAPH_HANDLE), CUDNN_TYPE_HANDLE, 1, &handle);
  if (graph.try_finalize() != CUDNN_STATUS_SUCCESS) return nullptr;

  std::vector<CudnnDescriptor> configs = engine_configs(graph, CUDNN_HEUR_MODE_A);
  if (configs.empty()) configs = engine_configs(graph, CUDNN_HEUR_MODE_FALLBACK);

  cudaStream_t stream = nullptr;
  KILN_CUDNN_CHECK(cudnnGetStream(handle, &stream));
  std::unique_ptr<CudnnConvGraph> best;
  float best_ms = 0.0f;
  std::size_t best_config = 0;
  int tried = 0;
  for (std::size_t i = 0; i < configs.size(); ++i) {
    CudnnDescriptor& config = configs[i];
    if (tried == kMaxCandidates) break;
    if (!numerics_allowed(config.get(), dtype)) continue;
    CudnnDescriptor plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "conv2d plan");
    plan.set(KILN_CUDNN_ATTR(CUDNN_ATTR_EXECUTION_PLAN_HANDLE), CUDNN_TYPE_HANDLE, 1, &handle);
    plan.set_descriptor(KILN_CUDNN_ATTR(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG), config.get());
    if (plan.try_finalize() != CUDNN_STATUS_SUCCESS) continue;
    const std::int64_t workspace = plan_workspace_bytes(plan);
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
    for (CudnnDescriptor* d : {&tx, &tw, &ty, &conv, &op, &graph, &configs[best_config]})
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
