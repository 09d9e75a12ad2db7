#include "kiln/te/cuda/attention_cudnn.h"

#include <array>
#include <cstdio>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "kiln/ops/cuda/cuda_host.h"
#include "kiln/ops/cuda/cudnn_backend.h"
#include "kiln/runtime/cuda/cuda_context.h"
#include "kiln/runtime/error.h"
#include "kiln/te/cuda/attention_dropout_rng_state.h"

namespace kiln::te::cuda {

using ops::cuda::CudnnDescriptor;

namespace {

using Dims = std::vector<std::int64_t>;

// Unique ids of the tensors the caller passes (the variant pack's keys). Virtual tensors take
// ids from kFirstVirtual on.
enum Uid : std::int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kDO,
  kDQ,
  kDK,
  kDV,
  kSoftmaxSum,  // backward: rowsum(dO * O), float, in the workspace
  kDQAccum,     // backward: dQ accumulated in float, in the workspace
  kScale,       // by-value scalars (host memory at execution)
  kNegInf,
  kOne,
  kKvLen,
  kQLen,
  kSeed,             // dropout: the Philox seed and offset, int64 in the workspace
  kOffset,           //   (write_attention_dropout_rng_state fills them on the stream)
  kDropoutScale,     // dropout: 1 / (1 - p), by value
  kDropoutScaleInv,  // dropout: 1 - p, by value (the backward's softmax_sum)
};
constexpr std::int64_t kFirstVirtual = 100;
constexpr std::int64_t kAlignment = 16;
// cuDNN 9's SDPA takes head dims up to 256 on Hopper and newer, forward and backward (its support
// matrix; MLA's 192 among them), up to 128 for the backward on Ampere / Ada: there its heuristics
// build no plan for a larger one and Auto falls back to Kiln's kernels.
constexpr std::int64_t kMaxHeadDim = 256;
// Offsets of the backward's float buffers inside the workspace are rounded up to this.
constexpr std::int64_t kBufferAlign = 256;

bool debug_enabled() {
  static const bool on = ops::cuda::env_flag("KILN_CUDNN_SDPA_DEBUG");
  return on;
}

const char* type_name(cudnnDataType_t t) {
  switch (t) {
    case CUDNN_DATA_FLOAT: return "float";
    case CUDNN_DATA_HALF: return "half";
    case CUDNN_DATA_BFLOAT16: return "bfloat16";
    case CUDNN_DATA_INT32: return "int32";
    case CUDNN_DATA_INT64: return "int64";
    case CUDNN_DATA_BOOLEAN: return "bool";
    default: return "?";
  }
}

cudnnDataType_t io_type(DType t) {
  KILN_CHECK(t == DType::BF16 || t == DType::F16, "te::attention (cuDNN): dtype {} is not bfloat16 or float16",
             dtype_name(t));
  return t == DType::BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
}

std::string joined(const Dims& v, const char* sep) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + std::to_string(v[i]);
  return s;
}

std::string shape_name(const AttentionParams& p, DType t) {
  std::string name =
      fmt::format("B={} T={} S={} Hq={} Hkv={} D={}{} {} {}", p.batch, p.q_len, p.kv_len, p.q_heads, p.kv_heads,
                  p.head_dim, p.value_dim() != p.head_dim ? fmt::format(" Dv={}", p.value_dim()) : "", dtype_name(t),
                  p.causal ? "causal" : "non-causal");
  if (p.has_dropout()) name += fmt::format(" dropout {}", p.dropout);
  if (p.strided())
    name += fmt::format(" q strides {},{},{} kv strides {},{},{}", p.q_batch_stride(), p.q_token_stride(),
                        p.q_head_stride(), p.kv_batch_stride(), p.kv_token_stride(), p.kv_head_stride());
  return name;
}

// The operations of one cuDNN graph, as cudnn-frontend's composite SDPA nodes lay them out. Owns
// every descriptor (a finalized plan may refer to them, so they live as long as the plan) and
// keeps a readable line per operation for KILN_CUDNN_SDPA_DEBUG and refusals.
class GraphBuilder {
 public:
  explicit GraphBuilder(std::string name) : name_(std::move(name)) {}

  // A tensor of the variant pack: [b, h, s, d] dims with Kiln's strides.
  cudnnBackendDescriptor_t io(const std::string& name, std::int64_t uid, cudnnDataType_t t, Dims dims, Dims strides) {
    return tensor(name, uid, t, std::move(dims), std::move(strides), false, false);
  }
  cudnnBackendDescriptor_t virt(const std::string& name, cudnnDataType_t t, Dims dims, Dims strides) {
    return tensor(name, next_virtual_++, t, std::move(dims), std::move(strides), true, false);
  }
  // A scalar passed by value at execution: [1, 1, 1, 1] (a pointwise operation's operands must
  // have the same number of dimensions: cuDNN refuses a one-dimensional scalar beside a 4-D tensor).
  cudnnBackendDescriptor_t scalar(const std::string& name, std::int64_t uid, cudnnDataType_t t) {
    return tensor(name, uid, t, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
  }

  // y = mode(x[, b[, t]]) computed in `prec`; axis for GEN_INDEX (and the index arithmetic that
  // cudnn-frontend tags with one).
  void pointwise(const std::string& name, cudnnPointwiseMode_t mode, cudnnDataType_t prec, cudnnBackendDescriptor_t x,
                 cudnnBackendDescriptor_t y, cudnnBackendDescriptor_t b = nullptr, cudnnBackendDescriptor_t t = nullptr,
                 std::int64_t axis = -1) {
    CudnnDescriptor& pw = keep_aux(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise descriptor of " + name);
    pw.set(KILN_CUDNN_ATTR(CUDNN_ATTR_POINTWISE_MODE), CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    pw.set(KILN_CUDNN_ATTR(CUDNN_ATTR_POINTWISE_MATH_PREC), CUDNN_TYPE_DATA_TYPE, 1, &prec);
    if (axis >= 0) pw.set(KILN_CUDNN_ATTR(CUDNN_ATTR_POINTWISE_AXIS), CUDNN_TYPE_INT64, 1, &axis);
    pw.finalize();
    CudnnDescriptor& op = keep_op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "pointwise operation " + name);
    op.set_descriptor(KILN_CUDNN_ATTR(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR), pw.get());
    op.set_descriptor(KILN_CUDNN_ATTR(CUDNN_ATTR_OPERATION_POINTWISE_XDESC), x);
    if (b) op.set_descriptor(KILN_CUDNN_ATTR(CUDNN_ATTR_OPERATION_POINTWISE_BDESC), b);
    if (t) op.set_descriptor(KILN_CUDNN_ATTR(CUDNN_ATTR_OPERATION_POINTWISE_TDESC), t);
    op.set_descriptor(KILN_CUDNN_ATTR(CUDNN_ATTR_OPERATION_POINTWISE_YDESC), y);
    op.finalize();
    std::string line = fmt::format("pointwise {} (mode {}, {}{}): x={}", name, static_cast<int>(mode), type_name(prec),
                                   axis >= 0 ? fmt::format(", axis {}", axis) : "", describe(x));
    if (b) line += " b=" + describe(b);
    if (t) line += " t=" + describe(t);
    log_.push_back(line + " -> " + describe(y));
  }

  void reduction(const std::string& name, cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x,
                 cudnnBackendDescriptor_t y) {
    CudnnDescriptor& red = keep_aux(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "reduction descriptor of " + name);
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    red.set(KILN_CUDNN_ATTR(CUDNN_ATTR_REDUCTION_COMP_TYPE), CUDNN_TYPE_DATA_TYPE, 1, &comp);
    red.set(KILN_CUDNN_ATTR(CUDNN_ATTR_REDUCTION_OPERATOR), CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
    red.finalize();
    CudnnDescriptor& op = keep_op(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "reduction operation " + name);
    op.set_descriptor(KILN_CUDNN_ATTR(CUDNN_ATTR_OPERATION_REDUCTION_DESC), red.get());
    op.set_descriptor(KILN_CUDNN_ATTR(CUDNN_ATTR_OPERATION_REDUCTION_XDESC), x);
    op.set_descriptor(KILN_CUDNN_ATTR(CUDNN_ATTR_OPERATION_REDUCTION_YDESC), y);
    op.finalize();
    log_.push_back(fmt::format("reduction {} ({}): x={} -> {}", name, mode == CUDNN_REDUCE_TENSOR_MAX ? "max" : "add",
                               describe(x), describe(y)));
  }

  // c = a b over the last two dimensions, batched over the first two (b's heads may divide a's:
  // grouped-query attention), accumulated in float.
  void matmul(const std::string& name, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
              cudnnBackendDescriptor_t c) {
    CudnnDescriptor& mm = keep_aux(CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul descriptor of " + name);
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    mm.set(KILN_CUDNN_ATTR(CUDNN_ATTR_MATMUL_COMP_TYPE), CUDNN_TYPE_DATA_TYPE, 1, &comp);
    mm.finalize();
    CudnnDescriptor& op = keep_op(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "matmul operation " + name);
    op.set_descriptor(KILN_CUDNN_ATTR(CUDNN_ATTR_OPERATION_MATMUL_ADESC), a);
    op.set_descriptor(KILN_CUDNN_ATTR(CUDNN_ATTR_OPERATION_MATMUL_BDESC), b);
    op.set_descriptor(KILN_CUDNN_ATTR(CUDNN_ATTR_OPERATION_MATMUL_CDESC), c);
    op.set_descriptor(KILN_CUDNN_ATTR(CUDNN_ATTR_OPERATION_MATMUL_DESC), mm.get());
    op.finalize();
    log_.push_back(fmt::format("matmul {}: a={} b={} -> {}", name, describe(a), describe(b), describe(c)));
  }

  // y: x's elements with other dims/strides (here: a transposed view).
  void reshape(const std::string& name, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    CudnnDescriptor& op = keep_op(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "reshape operation " + name);
    op.set_descriptor(KILN_CUDNN_ATTR(CUDNN_ATTR_OPERATION_RESHAPE_XDESC), x);
    op.set_descriptor(KILN_CUDNN_ATTR(CUDNN_ATTR_OPERATION_RESHAPE_YDESC), y);
    op.finalize();
    log_.push_back(fmt::format("reshape {}: x={} -> {}", name, describe(x), describe(y)));
  }

  // y = Bernoulli(keep) draws (1 kept, 0 dropped) from cuDNN's Philox generator at the seed and
  // offset tensors' values: the dropout mask of cudnn-frontend's SDPA nodes.
  void rng(const std::string& name, double keep, cudnnBackendDescriptor_t seed, cudnnBackendDescriptor_t offset,
           cudnnBackendDescriptor_t y) {
    CudnnDescriptor& desc = keep_aux(CUDNN_BACKEND_RNG_DESCRIPTOR, "rng descriptor of " + name);
    const cudnnRngDistribution_t bernoulli = CUDNN_RNG_DISTRIBUTION_BERNOULLI;
    desc.set(KILN_CUDNN_ATTR(CUDNN_ATTR_RNG_DISTRIBUTION), CUDNN_TYPE_RNG_DISTRIBUTION, 1, &bernoulli);
    desc.set(KILN_CUDNN_ATTR(CUDNN_ATTR_RNG_BERNOULLI_DIST_PROBABILITY), CUDNN_TYPE_DOUBLE, 1, &keep);
    desc.finalize();
    CudnnDescriptor& op = keep_op(CUDNN_BACKEND_OPERATION_RNG_DESCRIPTOR, "rng operation " + name);
    op.set_descriptor(KILN_CUDNN_ATTR(CUDNN_ATTR_OPERATION_RNG_YDESC), y);
    op.set_descriptor(KILN_CUDNN_ATTR(CUDNN_ATTR_OPERATION_RNG_DESC), desc.get());
    op.set_descriptor(KILN_CUDNN_ATTR(CUDNN_ATTR_OPERATION_RNG_SEED), seed);
    op.set_descriptor(KILN_CUDNN_ATTR(CUDNN_ATTR_OPERATION_RNG_OFFSET_DESC), offset);
    op.finalize();
    log_.push_back(fmt::format("rng {} (bernoulli, keep {}): seed={} offset={} -> {}", name, keep, describe(seed),
                               describe(offset), describe(y)));
  }

  // The operation graph over every operation added, finalized. Returns cuDNN's refusal, if any.
  std::optional<std::string> finalize_graph(cudnnHandle_t handle) {
    graph_ = std::make_unique<CudnnDescriptor>(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, name_);
    std::vector<cudnnBackendDescriptor_t> raw;
    for (const CudnnDescriptor& op : ops_) raw.push_back(op.get());
    graph_->set(KILN_CUDNN_ATTR(CUDNN_ATTR_OPERATIONGRAPH_OPS), CUDNN_TYPE_BACKEND_DESCRIPTOR,
                static_cast<std::int64_t>(raw.size()), raw.data());
    graph_->set(KILN_CUDNN_ATTR(CUDNN_ATTR_OPERATIONGRAPH_HANDLE), CUDNN_TYPE_HANDLE, 1, &handle);
    const cudnnStatus_t st = graph_->try_finalize();
    if (st != CUDNN_STATUS_SUCCESS)
      return fmt::format("finalizing the operation graph failed: {}", ops::cuda::cudnn_status_detail(st));
    return std::nullopt;
  }

  const CudnnDescriptor& graph() const { return *graph_; }
  const std::string& name() const { return name_; }
  std::string ops_listing() const {
    std::string s;
    for (std::size_t i = 0; i < log_.size(); ++i) s += fmt::format("  [{}] {}\n", i, log_[i]);
    return s;
  }
  // Hands every descriptor over (the plan keeps them alive).
  void move_into(std::vector<std::unique_ptr<CudnnDescriptor>>& out) {
    for (std::deque<CudnnDescriptor>* d : {&tensors_, &aux_, &ops_})
      for (CudnnDescriptor& x : *d) out.push_back(std::make_unique<CudnnDescriptor>(std::move(x)));
    if (graph_) out.push_back(std::move(graph_));
  }

 private:
  cudnnBackendDescriptor_t tensor(const std::string& name, std::int64_t uid, cudnnDataType_t t, Dims dims, Dims strides,
                                  bool is_virtual, bool by_value) {
    CudnnDescriptor& d = tensors_.emplace_back(CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor " + name + " of " + name_);
    const std::int64_t rank = static_cast<std::int64_t>(dims.size());
    d.set(KILN_CUDNN_ATTR(CUDNN_ATTR_TENSOR_DATA_TYPE), CUDNN_TYPE_DATA_TYPE, 1, &t);
    d.set(KILN_CUDNN_ATTR(CUDNN_ATTR_TENSOR_DIMENSIONS), CUDNN_TYPE_INT64, rank, dims.data());
    d.set(KILN_CUDNN_ATTR(CUDNN_ATTR_TENSOR_STRIDES), CUDNN_TYPE_INT64, rank, strides.data());
    d.set(KILN_CUDNN_ATTR(CUDNN_ATTR_TENSOR_UNIQUE_ID), CUDNN_TYPE_INT64, 1, &uid);
    d.set(KILN_CUDNN_ATTR(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT), CUDNN_TYPE_INT64, 1, &kAlignment);
    if (is_virtual) {
      const bool yes = true;
      d.set(KILN_CUDNN_ATTR(CUDNN_ATTR_TENSOR_IS_VIRTUAL), CUDNN_TYPE_BOOLEAN, 1, &yes);
    }
    if (by_value) {
      const bool yes = true;
      d.set(KILN_CUDNN_ATTR(CUDNN_ATTR_TENSOR_IS_BY_VALUE), CUDNN_TYPE_BOOLEAN, 1, &yes);
    }
    d.finalize();
    names_[d.get()] =
        fmt::format("{}#{}[{}]/[{}] {}{}", name, uid, joined(dims, "x"), joined(strides, ","), type_name(t),
                    is_virtual ? " virtual"
                    : by_value ? " by-value"
                               : "");
    return d.get();
  }
  std::string describe(cudnnBackendDescriptor_t t) const {
    auto it = names_.find(t);
    return it == names_.end() ? "?" : it->second;
  }
  CudnnDescriptor& keep_aux(cudnnBackendDescriptorType_t type, std::string what) {
    return aux_.emplace_back(type, std::move(what));
  }
  CudnnDescriptor& keep_op(cudnnBackendDescriptorType_t type, std::string what) {
    return ops_.emplace_back(type, std::move(what));
  }

  std::string name_;
  std::deque<CudnnDescriptor> tensors_, aux_, ops_;  // deque: stable addresses
  std::unique_ptr<CudnnDescriptor> graph_;
  std::map<cudnnBackendDescriptor_t, std::string> names_;
  std::vector<std::string> log_;
  std::int64_t next_virtual_ = kFirstVirtual;
};

// The tensors' shapes as the graph sees them: [b, h, s, d] dims over Kiln's [B, s, H, D] memory.
// Q, K (and dQ, dK) have head size D; V, O (and dV, dO) Dv (MLA's 128 against D = 192).
struct Layout {
  std::int64_t B, T, S, Hq, Hkv, D, Dv;
  explicit Layout(const AttentionParams& p)
      : B(p.batch),
        T(p.q_len),
        S(p.kv_len),
        Hq(p.q_heads),
        Hkv(p.kv_heads),
        D(p.head_dim),
        Dv(p.value_dim()),
        strided(p.strided()),
        qb(p.q_batch_stride()),
        qt(p.q_token_stride()),
        qh(p.q_head_stride()),
        kvb(p.kv_batch_stride()),
        kvt(p.kv_token_stride()),
        kvh(p.kv_head_stride()) {}
  // Q, K, V (and their gradients) take the caller's strides when it gave some (views of a packed
  // qkv projection; V then shares K's, and Dv == D); O and dO are contiguous.
  bool strided;
  std::int64_t qb, qt, qh, kvb, kvt, kvh;
  // [b, h, s, d] dims over Kiln's [B, s, h, d] memory, and the transpose [b, h, d, s].
  Dims dims(std::int64_t h, std::int64_t s, std::int64_t d) const { return {B, h, s, d}; }
  Dims strides(std::int64_t h, std::int64_t s, std::int64_t d) const { return {s * h * d, d, h * d, 1}; }
  Dims t_dims(std::int64_t h, std::int64_t s, std::int64_t d) const { return {B, h, d, s}; }
  Dims t_strides(std::int64_t h, std::int64_t s, std::int64_t d) const { return {s * h * d, d, 1, h * d}; }
  Dims q_dims() const { return dims(Hq, T, D); }
  Dims q_strides() const { return {qb, qh, qt, 1}; }
  Dims kv_dims() const { return dims(Hkv, S, D); }
  Dims kv_strides() const { return {kvb, kvh, kvt, 1}; }
  Dims kvt_dims() const { return t_dims(Hkv, S, D); }  // K transposed
  Dims kvt_strides() const { return {kvb, kvh, 1, kvt}; }
  Dims o_dims() const { return dims(Hq, T, Dv); }
  Dims o_strides() const { return strides(Hq, T, Dv); }
  Dims v_dims() const { return dims(Hkv, S, Dv); }
  Dims v_strides() const { return strided ? kv_strides() : strides(Hkv, S, Dv); }
  Dims vt_dims() const { return t_dims(Hkv, S, Dv); }  // V transposed
  Dims vt_strides() const { return strided ? kvt_strides() : t_strides(Hkv, S, Dv); }
  Dims score_dims() const { return {B, Hq, T, S}; }
  Dims score_strides() const { return {Hq * T * S, T * S, S, 1}; }
  // The scores transposed ([b, h, s, t]) as the dV / dK matmuls read them.
  Dims score_t_dims() const { return {B, Hq, S, T}; }
  Dims score_t_strides() const { return {Hq * T * S, T * S, 1, S}; }
  Dims row_dims() const { return {B, Hq, T, 1}; }
  Dims row_strides() const { return {Hq * T, T, 1, 1}; }
};

// scores with the keys above the causal diagonal replaced by -inf (cudnn-frontend's diagonal band
// mask, right bound 0): row (+ S - T when bottom-right aligned) >= col keeps the score.
cudnnBackendDescriptor_t causal_mask(GraphBuilder& g, const Layout& l, cudnnBackendDescriptor_t scores) {
  cudnnBackendDescriptor_t row = g.virt("row_index", CUDNN_DATA_INT32, l.score_dims(), l.score_strides());
  g.pointwise("gen_row_index", CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, scores, row, nullptr, nullptr, 2);
  cudnnBackendDescriptor_t col = g.virt("col_index", CUDNN_DATA_INT32, l.score_dims(), l.score_strides());
  g.pointwise("gen_col_index", CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, scores, col, nullptr, nullptr, 3);
  if (l.T != l.S) {  // Kiln aligns the diagonal bottom-right (a KV cache's new queries are the last T)
    cudnnBackendDescriptor_t kv_len = g.scalar("kv_len", kKvLen, CUDNN_DATA_INT32);
    cudnnBackendDescriptor_t row_plus = g.virt("row+skv", CUDNN_DATA_INT32, l.score_dims(), l.score_strides());
    g.pointwise("row+skv", CUDNN_POINTWISE_ADD, CUDNN_DATA_INT32, row, row_plus, kv_len, nullptr, 3);
    cudnnBackendDescriptor_t q_len = g.scalar("q_len", kQLen, CUDNN_DATA_INT32);
    cudnnBackendDescriptor_t row_shift = g.virt("row+skv-sq", CUDNN_DATA_INT32, l.score_dims(), l.score_strides());
    g.pointwise("row+skv-sq", CUDNN_POINTWISE_SUB, CUDNN_DATA_INT32, row_plus, row_shift, q_len, nullptr, 3);
    row = row_shift;
  }
  cudnnBackendDescriptor_t keep = g.virt("row>=col", CUDNN_DATA_BOOLEAN, l.score_dims(), l.score_strides());
  g.pointwise("row>=col", CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, keep, col);
  cudnnBackendDescriptor_t neg_inf = g.scalar("neg_inf", kNegInf, CUDNN_DATA_FLOAT);
  cudnnBackendDescriptor_t masked = g.virt("masked_scores", CUDNN_DATA_FLOAT, l.score_dims(), l.score_strides());
  g.pointwise("binary_select", CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, scores, masked, neg_inf, keep);
  return masked;
}

// Attention dropout as cudnn-frontend lowers it: a Bernoulli(1 - p) mask of the [B, Hq, T, S]
// probabilities from cuDNN's generator at the (seed, offset) tensors. The forward multiplies the
// probabilities by it and by 1 / (1 - p); the backward draws the same mask (same seed, offset and
// shape) for P and for dP. Returns the mask (float, virtual).
cudnnBackendDescriptor_t dropout_mask(GraphBuilder& g, const Layout& l, const AttentionParams& p) {
  cudnnBackendDescriptor_t seed = g.io("Seed", kSeed, CUDNN_DATA_INT64, {1, 1, 1, 1}, {1, 1, 1, 1});
  cudnnBackendDescriptor_t offset = g.io("Offset", kOffset, CUDNN_DATA_INT64, {1, 1, 1, 1}, {1, 1, 1, 1});
  cudnnBackendDescriptor_t mask = g.virt("dropout_mask", CUDNN_DATA_FLOAT, l.score_dims(), l.score_strides());
  g.rng("rng", 1.0 - p.dropout, seed, offset, mask);
  return mask;
}

// x * mask * 1 / (1 - p) (`scale`), the product in `type`: the dropped probabilities, as the two
// multiplies cudnn-frontend's lowering names `mask_op` and `scale_op`.
cudnnBackendDescriptor_t dropped(GraphBuilder& g, const Layout& l, cudnnBackendDescriptor_t x,
                                 cudnnBackendDescriptor_t mask, cudnnBackendDescriptor_t scale, cudnnDataType_t type,
                                 const std::string& mask_op, const std::string& scale_op) {
  cudnnBackendDescriptor_t masked = g.virt("P*mask", CUDNN_DATA_FLOAT, l.score_dims(), l.score_strides());
  g.pointwise(mask_op, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, x, masked, mask);
  cudnnBackendDescriptor_t out = g.virt("P_dropped", type, l.score_dims(), l.score_strides());
  g.pointwise(scale_op, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, masked, out, scale);
  return out;
}

void build_forward_graph(GraphBuilder& g, const AttentionParams& p, cudnnDataType_t t) {
  const Layout l(p);
  const cudnnDataType_t f = CUDNN_DATA_FLOAT;
  cudnnBackendDescriptor_t q = g.io("Q", kQ, t, l.q_dims(), l.q_strides());
  cudnnBackendDescriptor_t kt = g.io("K(as Kt)", kK, t, l.kvt_dims(), l.kvt_strides());
  cudnnBackendDescriptor_t v = g.io("V", kV, t, l.v_dims(), l.v_strides());
  cudnnBackendDescriptor_t o = g.io("O", kO, t, l.o_dims(), l.o_strides());
  cudnnBackendDescriptor_t stats = g.io("Stats", kStats, f, l.row_dims(), l.row_strides());
  cudnnBackendDescriptor_t scale = g.scalar("attn_scale", kScale, f);

  cudnnBackendDescriptor_t s = g.virt("S", f, l.score_dims(), l.score_strides());
  g.matmul("bmm1 Q.Kt", q, kt, s);
  cudnnBackendDescriptor_t scaled = g.virt("S*scale", f, l.score_dims(), l.score_strides());
  g.pointwise("attn_scale", CUDNN_POINTWISE_MUL, f, s, scaled, scale);
  if (p.causal) scaled = causal_mask(g, l, scaled);
  // softmax with stats (cudnn-frontend's composite softmax node)
  cudnnBackendDescriptor_t mx = g.virt("Max", f, l.row_dims(), l.row_strides());
  g.reduction("max", CUDNN_REDUCE_TENSOR_MAX, scaled, mx);
  cudnnBackendDescriptor_t sub = g.virt("sub_M", f, l.score_dims(), l.score_strides());
  g.pointwise("sub", CUDNN_POINTWISE_SUB, f, scaled, sub, mx);
  cudnnBackendDescriptor_t ex = g.virt("exp_sub_M", f, l.score_dims(), l.score_strides());
  g.pointwise("exp", CUDNN_POINTWISE_EXP, f, sub, ex);
  cudnnBackendDescriptor_t sum = g.virt("SumExp", f, l.row_dims(), l.row_strides());
  g.reduction("sum", CUDNN_REDUCE_TENSOR_ADD, ex, sum);
  cudnnBackendDescriptor_t lg = g.virt("log_SumExp", f, l.row_dims(), l.row_strides());
  g.pointwise("log", CUDNN_POINTWISE_LOG, f, sum, lg);
  g.pointwise("add (stats)", CUDNN_POINTWISE_ADD, f, mx, stats, lg);
  // The second matmul's A operand in the inputs' type (cuDNN requires the I/O type there): P, or
  // with dropout the dropped P (P itself then float).
  cudnnBackendDescriptor_t pr = g.virt("P", p.has_dropout() ? f : t, l.score_dims(), l.score_strides());
  g.pointwise("div", CUDNN_POINTWISE_DIV, f, ex, pr, sum);
  if (p.has_dropout()) {
    cudnnBackendDescriptor_t mask = dropout_mask(g, l, p);
    cudnnBackendDescriptor_t dropout_scale = g.scalar("dropout_scale", kDropoutScale, f);
    pr = dropped(g, l, pr, mask, dropout_scale, t, "dropout_mask_mul", "dropout_scale");
  }
  g.matmul("bmm2 P.V", pr, v, o);
}

// grad = a b for a key/value gradient (dV = Pt dO, dK = dSt Q) of head size d: with grouped-query
// heads the product has a row per query head ([b, Hq, S, d] in the I/O type) and a reduction sums
// each group into its key/value head, as cudnn-frontend lowers it.
void key_value_gradient(GraphBuilder& g, const Layout& l, cudnnDataType_t t, const std::string& product,
                        const std::string& grad_name, std::int64_t d, cudnnBackendDescriptor_t a,
                        cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t grad) {
  if (l.Hq == l.Hkv) {
    g.matmul("matmul_" + product, a, b, grad);
    return;
  }
  cudnnBackendDescriptor_t full =
      g.virt(grad_name + "_fullhead", t, {l.B, l.Hq, l.S, d}, {l.Hq * l.S * d, l.S * d, d, 1});
  g.matmul("matmul_" + product, a, b, full);
  g.reduction("red_" + grad_name + "_head", CUDNN_REDUCE_TENSOR_ADD, full, grad);
}

void build_backward_graph(GraphBuilder& g, const AttentionParams& p, cudnnDataType_t t) {
  const Layout l(p);
  const cudnnDataType_t f = CUDNN_DATA_FLOAT;
  cudnnBackendDescriptor_t q = g.io("Q", kQ, t, l.q_dims(), l.q_strides());
  cudnnBackendDescriptor_t kt = g.io("K(as Kt)", kK, t, l.kvt_dims(), l.kvt_strides());
  cudnnBackendDescriptor_t vt = g.io("V(as Vt)", kV, t, l.vt_dims(), l.vt_strides());
  cudnnBackendDescriptor_t o = g.io("O", kO, t, l.o_dims(), l.o_strides());
  cudnnBackendDescriptor_t d_o = g.io("dO", kDO, t, l.o_dims(), l.o_strides());
  cudnnBackendDescriptor_t stats = g.io("Stats", kStats, f, l.row_dims(), l.row_strides());
  cudnnBackendDescriptor_t dq = g.io("dQ", kDQ, t, l.q_dims(), l.q_strides());
  cudnnBackendDescriptor_t dk = g.io("dK", kDK, t, l.kv_dims(), l.kv_strides());
  cudnnBackendDescriptor_t dv = g.io("dV", kDV, t, l.v_dims(), l.v_strides());
  cudnnBackendDescriptor_t scale = g.scalar("attn_scale", kScale, f);
  // softmax_sum's factor: 1, or 1 - p with dropout (dS below is scaled by 1 / (1 - p) as a whole)
  cudnnBackendDescriptor_t one =
      p.has_dropout() ? g.scalar("dropout_scale_inv", kDropoutScaleInv, f) : g.scalar("one", kOne, f);
  cudnnBackendDescriptor_t mask = p.has_dropout() ? dropout_mask(g, l, p) : nullptr;
  cudnnBackendDescriptor_t dropout_scale = p.has_dropout() ? g.scalar("dropout_scale", kDropoutScale, f) : nullptr;

  // softmax_sum = rowsum(dO * O) (cudnn-frontend gives the product these strides; it is virtual)
  cudnnBackendDescriptor_t d_o_o = g.virt("dO*O", f, l.o_dims(), {l.Hq * l.T * l.Dv, l.T * l.Dv, l.Hq * l.Dv, 1});
  g.pointwise("mul_dO_O", CUDNN_POINTWISE_MUL, f, d_o, d_o_o, o);
  cudnnBackendDescriptor_t row_sum = g.virt("rowsum(dO*O)", f, l.row_dims(), l.row_strides());
  g.reduction("reduce_dO_o", CUDNN_REDUCE_TENSOR_ADD, d_o_o, row_sum);
  cudnnBackendDescriptor_t softmax_sum = g.io("softmax_sum", kSoftmaxSum, f, l.row_dims(), l.row_strides());
  g.pointwise("scale_dropout_inv", CUDNN_POINTWISE_MUL, f, row_sum, softmax_sum, one);

  // P = exp(Q Kt * scale [masked] - stats); dV = Pt dO
  cudnnBackendDescriptor_t s = g.virt("S", f, l.score_dims(), l.score_strides());
  g.matmul("matmul_Q_KT", q, kt, s);
  cudnnBackendDescriptor_t scaled = g.virt("S*scale", f, l.score_dims(), l.score_strides());
  g.pointwise("mul_s_attn_scale", CUDNN_POINTWISE_MUL, f, s, scaled, scale);
  cudnnBackendDescriptor_t centred = g.virt("S-stats", f, l.score_dims(), l.score_strides());
  g.pointwise("sub_s_m", CUDNN_POINTWISE_SUB, f, scaled, centred, stats);
  if (p.causal) centred = causal_mask(g, l, centred);
  cudnnBackendDescriptor_t pr = g.virt("P", f, l.score_dims(), l.score_strides());
  g.pointwise("exp_s", CUDNN_POINTWISE_EXP, f, centred, pr);
  // dV = (P * mask / (1 - p))t dO with dropout
  cudnnBackendDescriptor_t p_for_dv =
      mask ? dropped(g, l, pr, mask, dropout_scale, f, "mul_p_dropout_mask", "mul_p_dropout_scale") : pr;
  cudnnBackendDescriptor_t pt = g.virt("Pt", t, l.score_t_dims(), l.score_t_strides());
  g.reshape("reshape_p", p_for_dv, pt);
  key_value_gradient(g, l, t, "pT_dO", "dV", l.Dv, pt, d_o, dv);

  // dS = (dO Vt - softmax_sum) * P * scale; dK = dSt Q
  cudnnBackendDescriptor_t dp = g.virt("dP", f, l.score_dims(), l.score_strides());
  g.matmul("matmul_dO_VT", d_o, vt, dp);
  if (mask) {  // dP * mask; (dP * mask - softmax_sum (1 - p)) P / (1 - p) = P (dP mask / (1 - p) - rowsum(dO O))
    cudnnBackendDescriptor_t dp_masked = g.virt("dP*mask", f, l.score_dims(), l.score_strides());
    g.pointwise("dP_dropout_mask", CUDNN_POINTWISE_MUL, f, dp, dp_masked, mask);
    dp = dp_masked;
  }
  cudnnBackendDescriptor_t dp_centred = g.virt("dP-softmax_sum", f, l.score_dims(), l.score_strides());
  g.pointwise("sub_dP_softmax_sum", CUDNN_POINTWISE_SUB, f, dp, dp_centred, softmax_sum);
  cudnnBackendDescriptor_t ds_unscaled = g.virt("dS_unscaled", f, l.score_dims(), l.score_strides());
  g.pointwise("mul_dP_exp_s", CUDNN_POINTWISE_MUL, f, dp_centred, ds_unscaled, pr);
  if (mask) {
    cudnnBackendDescriptor_t ds_dropout = g.virt("dS_dropout_scaled", f, l.score_dims(), l.score_strides());
    g.pointwise("mul_dS_dropout_scale", CUDNN_POINTWISE_MUL, f, ds_unscaled, ds_dropout, dropout_scale);
    ds_unscaled = ds_dropout;
  }
  cudnnBackendDescriptor_t ds = g.virt("dS", f, l.score_dims(), l.score_strides());
  g.pointwise("mul_dS_attn_scale", CUDNN_POINTWISE_MUL, f, ds_unscaled, ds, scale);
  cudnnBackendDescriptor_t dst = g.virt("dSt", t, l.score_t_dims(), l.score_t_strides());
  g.reshape("reshape_dS", ds, dst);
  key_value_gradient(g, l, t, "dST_Q", "dK", l.D, dst, q, dk);

  // dQ = dS K, accumulated in float, then converted
  // cudnn-frontend leaves this view's type to the graph's intermediate type (float), unlike the
  // reshapes of P and dS, which it sets to the I/O type; the engine's pattern is built on that.
  cudnnBackendDescriptor_t k = g.virt("K", f, l.kv_dims(), l.kv_strides());
  g.reshape("reshape_k", kt, k);
  cudnnBackendDescriptor_t dq_accum = g.io("dQ_accum", kDQAccum, f, l.q_dims(), {l.Hq * l.T * l.D, l.T * l.D, l.D, 1});
  g.matmul("matmul_dS_K", ds, k, dq_accum);
  g.pointwise("identity_dQ", CUDNN_POINTWISE_IDENTITY, f, dq_accum, dq);
}

// A finalized execution plan with everything it was built from, or cuDNN's refusal.
struct Plan {
  std::string refusal;  // non-empty: no plan
  std::vector<std::unique_ptr<CudnnDescriptor>> keep;
  std::unique_ptr<CudnnDescriptor> plan;
  std::int64_t workspace = 0;  // cuDNN's, bytes
  std::int64_t engine = -1;
  // The backward's float buffers, placed after cuDNN's workspace (offsets in bytes; 0: none).
  std::int64_t softmax_sum_offset = 0, dq_accum_offset = 0, total_workspace = 0;
  // With dropout: the generator's seed and offset (two int64), after the rest.
  std::int64_t rng_state_offset = -1;
};

// Picks the first engine configuration (heuristics mode A, then the fallback list) whose plan
// finalizes; the runtime-fusion engine that serves these graphs compiles its kernel here.
void choose_engine(GraphBuilder& g, cudnnHandle_t handle, Plan& out) {
  std::vector<CudnnDescriptor> configs = ops::cuda::engine_configs(g.graph(), CUDNN_HEUR_MODE_A);
  if (configs.empty()) configs = ops::cuda::engine_configs(g.graph(), CUDNN_HEUR_MODE_FALLBACK);
  if (configs.empty()) {
    out.refusal = fmt::format("the heuristics proposed no engine for the graph ({})",
                              ops::cuda::cudnn_status_detail(CUDNN_STATUS_NOT_SUPPORTED));
    return;
  }
  std::string tried;
  for (std::size_t i = 0; i < configs.size(); ++i) {
    auto plan =
        std::make_unique<CudnnDescriptor>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "execution plan of " + g.name());
    plan->set(KILN_CUDNN_ATTR(CUDNN_ATTR_EXECUTION_PLAN_HANDLE), CUDNN_TYPE_HANDLE, 1, &handle);
    plan->set_descriptor(KILN_CUDNN_ATTR(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG), configs[i].get());
    const cudnnStatus_t st = plan->try_finalize();
    const std::int64_t engine = ops::cuda::engine_global_index(configs[i].get());
    if (st != CUDNN_STATUS_SUCCESS) {
      tried += fmt::format("; engine {} (config {}): {}", engine, i, ops::cuda::cudnn_status_detail(st));
      continue;
    }
    out.workspace = ops::cuda::plan_workspace_bytes(*plan);
    out.engine = engine;
    out.plan = std::move(plan);
    out.keep.push_back(std::make_unique<CudnnDescriptor>(std::move(configs[i])));
    if (debug_enabled()) {
      std::string notes;
      for (cudnnBackendNumericalNote_t n : ops::cuda::engine_numerical_notes(out.keep.back()->get()))
        notes += fmt::format(" {}", static_cast<int>(n));
      std::fprintf(
          stderr, "[kiln cudnn sdpa] %s: engine %lld (config %zu of %zu), workspace %lld bytes, numerical notes:%s%s\n",
          g.name().c_str(), static_cast<long long>(engine), i, configs.size(), static_cast<long long>(out.workspace),
          notes.empty() ? " none" : notes.c_str(),
          tried.empty() ? "" : fmt::format(" (refused before it{})", tried).c_str());
    }
    return;
  }
  out.refusal = fmt::format("no engine configuration finalized ({} tried{})", configs.size(), tried);
}

std::int64_t round_up(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }

std::shared_ptr<const Plan> build_plan(CudnnAttentionDirection dir, int device, DType dtype, const AttentionParams& p) {
  auto plan = std::make_shared<Plan>();
  const bool backward = dir == CudnnAttentionDirection::Backward;
  GraphBuilder g(fmt::format("cuDNN SDPA {} graph ({})", backward ? "backward" : "forward", shape_name(p, dtype)));
  cudnnHandle_t handle = ops::cuda::cudnn_handle(device);
  KILN_CUDNN_CHECK(cudnnSetStream(handle, cuda_stream(device)));
  try {
    if (backward)
      build_backward_graph(g, p, io_type(dtype));
    else
      build_forward_graph(g, p, io_type(dtype));
    if (std::optional<std::string> refused = g.finalize_graph(handle))
      plan->refusal = *refused;
    else
      choose_engine(g, handle, *plan);
  } catch (const Error& e) {
    // A descriptor cuDNN would not take while the graph was being described: a refusal of this
    // graph too (the message names the descriptor and the attribute).
    plan->refusal = e.what();
  }
  if (debug_enabled())
    std::fprintf(stderr, "[kiln cudnn sdpa] %s, %s:\n%s", g.name().c_str(),
                 plan->refusal.empty() ? "built" : ("refused: " + plan->refusal).c_str(), g.ops_listing().c_str());
  if (!plan->refusal.empty()) {
    plan->refusal = fmt::format("{}: {}", g.name(), plan->refusal);
    return plan;
  }
  std::int64_t total = round_up(plan->workspace, kBufferAlign);
  if (backward) {
    plan->softmax_sum_offset = total;
    total += round_up(p.batch * p.q_heads * p.q_len * std::int64_t{sizeof(float)}, kBufferAlign);
    plan->dq_accum_offset = total;
    total += round_up(p.batch * p.q_heads * p.q_len * p.head_dim * std::int64_t{sizeof(float)}, kBufferAlign);
  }
  if (p.has_dropout()) {
    plan->rng_state_offset = total;
    total += kBufferAlign;
  }
  plan->total_workspace = total;
  g.move_into(plan->keep);
  return plan;
}

using Strides6 = std::array<std::int64_t, 6>;  // q's and k/v's batch, token and head strides
// The dropout probability is part of the key: the generator's Bernoulli probability is an
// attribute of the plan (seed and offset are tensors, read when it runs).
using Key = std::tuple<int, int, int, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                       std::int64_t, std::int64_t, bool, Strides6, double>;

struct Cache {
  std::mutex mutex;
  std::map<Key, std::shared_ptr<const Plan>> plans;
};
Cache& cache() {
  // Never destroyed: the plans hold cuDNN descriptors, which must not be released after cuDNN and
  // the CUDA context have been torn down at exit.
  static Cache* c = new Cache();
  return *c;
}

std::shared_ptr<const Plan> plan_for(CudnnAttentionDirection dir, int device, DType dtype, const AttentionParams& p) {
  const Key key{device,
                static_cast<int>(dir),
                static_cast<int>(dtype),
                p.batch,
                p.q_len,
                p.kv_len,
                p.q_heads,
                p.kv_heads,
                p.head_dim,
                p.value_dim(),
                p.causal,
                Strides6{p.q_batch_stride(), p.q_token_stride(), p.q_head_stride(), p.kv_batch_stride(),
                         p.kv_token_stride(), p.kv_head_stride()},
                p.dropout};
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  auto it = c.plans.find(key);
  if (it != c.plans.end()) return it->second;
  DeviceGuard guard(device);
  std::shared_ptr<const Plan> plan = build_plan(dir, device, dtype, p);
  c.plans.emplace(key, plan);
  return plan;
}

bool aligned(const Tensor& t) { return reinterpret_cast<std::uintptr_t>(t.data_ptr()) % kAlignment == 0; }

// The by-value scalars of a graph, alive for the duration of one execution.
struct Scalars {
  float scale, neg_inf, one = 1.0f, dropout_scale, dropout_scale_inv;
  std::int32_t kv_len, q_len;
  explicit Scalars(const AttentionParams& p)
      : scale(static_cast<float>(p.scale)),
        // cuDNN before 9.1 wanted the lowest finite float as the mask value (cudnn-frontend does the same)
        neg_inf(cudnnGetVersion() < 90100 ? std::numeric_limits<float>::lowest()
                                          : -std::numeric_limits<float>::infinity()),
        // cudnn-frontend's values: 1 / (1 - p) and 1 - p, each rounded to float
        dropout_scale(static_cast<float>(1.0 / (1.0 - p.dropout))),
        dropout_scale_inv(static_cast<float>(1.0 - p.dropout)),
        kv_len(static_cast<std::int32_t>(p.kv_len)),
        q_len(static_cast<std::int32_t>(p.q_len)) {}
};

void execute(const Plan& plan, int device, std::vector<std::int64_t> uids, std::vector<void*> ptrs,
             const AttentionParams& p, bool backward) {
  DeviceGuard guard(device);
  cudnnHandle_t handle = ops::cuda::cudnn_handle(device);
  cudaStream_t stream = cuda_stream(device);
  KILN_CUDNN_CHECK(cudnnSetStream(handle, stream));
  Scalars sc(p);
  uids.push_back(kScale);
  ptrs.push_back(&sc.scale);
  if (backward && !p.has_dropout()) {
    uids.push_back(kOne);
    ptrs.push_back(&sc.one);
  }
  if (p.causal) {
    uids.push_back(kNegInf);
    ptrs.push_back(&sc.neg_inf);
    if (p.q_len != p.kv_len) {
      uids.insert(uids.end(), {kKvLen, kQLen});
      ptrs.insert(ptrs.end(), {&sc.kv_len, &sc.q_len});
    }
  }
  ops::cuda::Scratch ws(static_cast<std::size_t>(plan.total_workspace), device);
  auto* base = static_cast<char*>(ws.ptr());
  if (backward) {
    uids.insert(uids.end(), {kSoftmaxSum, kDQAccum});
    ptrs.insert(ptrs.end(), {base + plan.softmax_sum_offset, base + plan.dq_accum_offset});
    // cuDNN before 9.6 left zeroing the float dQ accumulator to the caller (cudnn-frontend does it)
    if (cudnnGetVersion() < 90600)
      KILN_CUDA_CHECK(cudaMemsetAsync(base + plan.dq_accum_offset, 0,
                                      static_cast<std::size_t>(plan.total_workspace - plan.dq_accum_offset), stream));
  }
  if (p.has_dropout()) {
    auto* state = reinterpret_cast<std::int64_t*>(base + plan.rng_state_offset);
    write_attention_dropout_rng_state(state, p.dropout_seed, p.dropout_offset, p.dropout_offset_device, stream);
    uids.insert(uids.end(), {kSeed, kOffset, kDropoutScale});
    ptrs.insert(ptrs.end(), {state, state + 1, &sc.dropout_scale});
    if (backward) {
      uids.push_back(kDropoutScaleInv);
      ptrs.push_back(&sc.dropout_scale_inv);
    }
  }
  void* workspace = plan.workspace > 0 ? ws.ptr() : nullptr;
  CudnnDescriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, "variant pack of the cuDNN SDPA plan");
  pack.set(KILN_CUDNN_ATTR(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS), CUDNN_TYPE_INT64,
           static_cast<std::int64_t>(uids.size()), uids.data());
  pack.set(KILN_CUDNN_ATTR(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS), CUDNN_TYPE_VOID_PTR,
           static_cast<std::int64_t>(ptrs.size()), ptrs.data());
  pack.set(KILN_CUDNN_ATTR(CUDNN_ATTR_VARIANT_PACK_WORKSPACE), CUDNN_TYPE_VOID_PTR, 1, &workspace);
  pack.finalize();
  const cudnnStatus_t st = cudnnBackendExecute(handle, plan.plan->get(), pack.get());
  KILN_CHECK(st == CUDNN_STATUS_SUCCESS, "te::attention: executing the cuDNN SDPA {} plan (engine {}) failed: {}",
             backward ? "backward" : "forward", plan.engine, ops::cuda::cudnn_status_detail(st));
}

const Plan& ready_plan(CudnnAttentionDirection dir, const Tensor& q, const AttentionParams& p,
                       std::shared_ptr<const Plan>& hold) {
  hold = plan_for(dir, q.device().index, q.dtype(), p);
  KILN_CHECK(hold->refusal.empty(), "te::attention: cuDNN refused the call: {}", hold->refusal);
  return *hold;
}

}  // namespace

std::string cudnn_attention_ineligible(const Tensor& q, const AttentionParams& p,
                                       std::initializer_list<const Tensor*> all) {
  if (!q.device().is_cuda()) return fmt::format("tensors on {}, not CUDA", q.device().str());
  // Dropout draws cuDNN's own mask (its generator, not Kiln's Philox stream: see te/attention.h).
  // cudnn-frontend's support surface: no dropout of every probability (its scale would be infinite),
  // and no dropout with a bottom-right aligned causal mask.
  if (p.dropout >= 1) return "attention dropout of probability 1 (cuDNN's dropout scale 1 / (1 - p) is infinite)";
  if (p.has_dropout() && p.causal && p.q_len != p.kv_len)
    return fmt::format(
        "attention dropout with a causal mask over {} queries and {} keys (cuDNN's dropout takes no "
        "bottom-right aligned causal mask)",
        p.q_len, p.kv_len);
  if (q.dtype() != DType::BF16 && q.dtype() != DType::F16)
    return fmt::format("dtype {} (cuDNN's fused attention takes bfloat16 and float16)", dtype_name(q.dtype()));
  for (const std::int64_t d : {p.head_dim, p.value_dim()})
    if (d % 8 != 0 || d > kMaxHeadDim)
      return fmt::format("head dim {} (Kiln sends multiples of 8 up to {} to cuDNN)", d, kMaxHeadDim);
  if (p.causal && p.q_len > p.kv_len)
    return fmt::format(
        "causal with more queries ({}) than keys ({}): the first rows see no key and Kiln gives them "
        "zero output",
        p.q_len, p.kv_len);
  for (const Tensor* t : all)
    if (!aligned(*t)) return "a data pointer that is not 16-byte aligned";
  // The engines read rows with 16-byte vector (TMA) loads: every stride a multiple of 8 elements.
  for (const std::int64_t stride : {p.q_batch_stride(), p.q_token_stride(), p.q_head_stride(), p.kv_batch_stride(),
                                    p.kv_token_stride(), p.kv_head_stride()})
    if (stride % 8 != 0) return fmt::format("a q/k/v stride of {} elements (not a multiple of 8)", stride);
  if (p.q_len > std::numeric_limits<std::int32_t>::max() || p.kv_len > std::numeric_limits<std::int32_t>::max())
    return "sequence lengths beyond int32 (the causal mask's index arithmetic)";
  return {};
}

std::optional<std::string> cudnn_attention_prepare(CudnnAttentionDirection direction, const Tensor& q,
                                                   const AttentionParams& p) {
  std::shared_ptr<const Plan> plan = plan_for(direction, q.device().index, q.dtype(), p);
  if (!plan->refusal.empty()) return plan->refusal;
  return std::nullopt;
}

void cudnn_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                             const AttentionParams& p) {
  std::shared_ptr<const Plan> hold;
  const Plan& plan = ready_plan(CudnnAttentionDirection::Forward, q, p, hold);
  execute(plan, q.device().index, {kQ, kK, kV, kO, kStats},
          {q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr()}, p, false);
}

void cudnn_attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& out, const Tensor& lse, const Tensor& grad_q, const Tensor& grad_k,
                              const Tensor& grad_v, const AttentionParams& p) {
  std::shared_ptr<const Plan> hold;
  const Plan& plan = ready_plan(CudnnAttentionDirection::Backward, q, p, hold);
  execute(plan, q.device().index, {kQ, kK, kV, kO, kDO, kStats, kDQ, kDK, kDV},
          {q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), grad_out.data_ptr(), lse.data_ptr(),
           grad_q.data_ptr(), grad_k.data_ptr(), grad_v.data_ptr()},
          p, true);
}

std::string cudnn_attention_describe(CudnnAttentionDirection direction, DType dtype, const AttentionParams& p) {
  const bool backward = direction == CudnnAttentionDirection::Backward;
  GraphBuilder g(fmt::format("cuDNN SDPA {} graph ({})", backward ? "backward" : "forward", shape_name(p, dtype)));
  if (backward)
    build_backward_graph(g, p, io_type(dtype));
  else
    build_forward_graph(g, p, io_type(dtype));
  return g.ops_listing();
}

std::size_t cudnn_attention_plans_built() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.plans.size();
}

}  // namespace kiln::te::cuda
