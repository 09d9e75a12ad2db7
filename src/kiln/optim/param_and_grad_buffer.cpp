#include "kiln/optim/param_and_grad_buffer.h"

#include <numeric>
#include <unordered_set>

#include "kiln/tensor/grad_mode.h"

namespace kiln::optim {

namespace {

constexpr std::int64_t kParamAlignment = 64;    // elements: 128 bytes of a 16-bit type
constexpr std::int64_t kBucketAlignment = 128;  // elements: 256 bytes of a 16-bit type

std::int64_t round_up(std::int64_t n, std::int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

// fp8: --fp8-param-gather's FP8 weights (their gradients still accumulate in grad_dtype; the
// optimizer keeps their fp32 masters and casts them, te/fp8_primary_weights.h).
bool supported_param_dtype(DType t) {
  return t == DType::F32 || t == DType::BF16 || t == DType::F16 || t == DType::F8E4M3 || t == DType::F8E5M2;
}

}  // namespace

ElementRange GradBucket::shard(int rank, int count) const {
  KILN_CHECK(count >= 1 && rank >= 0 && rank < count, "GradBucket::shard: rank {} of {} is out of range", rank, count);
  KILN_CHECK(range.numel() % count == 0,
             "GradBucket::shard: bucket {} has {} elements, which do not split into {} equal shards (build the "
             "buffers with shard_count = {})",
             index, range.numel(), count, count);
  const std::int64_t size = range.numel() / count;
  return {range.begin + rank * size, range.begin + (rank + 1) * size};
}

Tensor ParamAndGradBuffer::narrow(const Tensor& flat, ElementRange r) {
  KILN_CHECK(flat.dim() == 1 && r.begin >= 0 && r.begin <= r.end && r.end <= flat.numel(),
             "ParamAndGradBuffer::narrow: range [{}, {}) of {}", r.begin, r.end, flat.describe());
  return make_view(flat, {r.numel()}, {1}, flat.storage_offset() + r.begin);
}

ParamAndGradBuffer::ParamAndGradBuffer(const std::vector<Tensor>& params, const GradBufferOptions& options)
    : options_(options) {
  KILN_CHECK(!params.empty(), "ParamAndGradBuffer: no parameters");
  KILN_CHECK(options.grad_dtype == DType::F32 || options.grad_dtype == DType::BF16,
             "ParamAndGradBuffer: grad_dtype must be float32 or bfloat16, got {}", dtype_name(options.grad_dtype));
  KILN_CHECK(options.shard_count >= 1, "ParamAndGradBuffer: shard_count must be at least 1, got {}",
             options.shard_count);
  const Tensor& first = params.front();
  std::unordered_set<const Storage*> storages;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    KILN_CHECK(p.defined(), "ParamAndGradBuffer: parameter {} is undefined", i);
    KILN_CHECK(p.is_leaf() && p.requires_grad(),
               "ParamAndGradBuffer: parameter {} ({}) must be a leaf that requires grad", i, p.describe());
    KILN_CHECK(supported_param_dtype(p.dtype()),
               "ParamAndGradBuffer: parameter {} is {}; parameters must be float32, bfloat16, float16 or fp8", i,
               p.describe());
    KILN_CHECK(p.dtype() == first.dtype() && p.device() == first.device(),
               "ParamAndGradBuffer: parameter {} ({}) differs in dtype or device from parameter 0 ({}); one buffer "
               "holds one dtype on one device",
               i, p.describe(), first.describe());
    KILN_CHECK(p.is_contiguous(), "ParamAndGradBuffer: parameter {} ({}) is not contiguous", i, p.describe());
    KILN_CHECK(storages.insert(p.storage().get()).second,
               "ParamAndGradBuffer: parameter {} ({}) shares its storage with another parameter (listed twice, or a "
               "view of another)",
               i, p.describe());
  }

  // Reverse order: backward produces the last parameters' gradients first, so the first bucket
  // completes first.
  params_.assign(params.rbegin(), params.rend());
  ranges_.resize(params_.size());
  bucket_of_.resize(params_.size());
  const std::int64_t bucket_multiple = std::lcm<std::int64_t>(options.shard_count, kBucketAlignment);
  std::int64_t cursor = 0;
  GradBucket open;
  auto close_bucket = [&](std::int64_t end) {
    open.index = buckets_.size();
    open.range.end = round_up(end, bucket_multiple);
    buckets_.push_back(std::move(open));
    open = GradBucket{};
    open.range.begin = buckets_.back().range.end;
    return buckets_.back().range.end;
  };
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const std::int64_t begin = round_up(cursor, kParamAlignment);
    const std::int64_t end = begin + params_[i].numel();
    ranges_[i] = {begin, end};
    bucket_of_[i] = buckets_.size();
    open.params.push_back(i);
    cursor = end;
    if (options.bucket_size > 0 && end - open.range.begin >= options.bucket_size) cursor = close_bucket(end);
  }
  if (!open.params.empty()) cursor = close_bucket(cursor);

  NoGradGuard no_grad;
  param_data_ = Tensor::zeros({cursor}, first.dtype(), first.device());
  grad_data_ = Tensor::zeros({cursor}, options.grad_dtype, first.device());
  for (GradBucket& b : buckets_) {
    b.param_data = narrow(param_data_, b.range);
    b.grad_data = narrow(grad_data_, b.range);
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    const Strides strides = contiguous_strides(p.shape());
    Tensor data = make_view(param_data_, p.shape(), strides, ranges_[i].begin);
    data.copy_(p);
    Tensor grad = make_view(grad_data_, p.shape(), strides, ranges_[i].begin);
    if (p.grad().defined()) grad.copy_(p.grad());
    // The parameter's own TensorImpl (shared with its module) now points into the buffer.
    TensorImpl* impl = p.impl();
    impl->storage = param_data_.storage();
    impl->offset = ranges_[i].begin;
    impl->strides = strides;
    p.set_grad(grad);
  }
}

std::optional<std::size_t> ParamAndGradBuffer::index_of(const Tensor& param) const {
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (params_[i].is_same(param)) return i;
  return std::nullopt;
}

std::vector<ElementRange> ParamAndGradBuffer::shard_ranges(int rank, int count) const {
  std::vector<ElementRange> out;
  for (const GradBucket& b : buckets_) out.push_back(b.shard(rank, count));
  return out;
}

void ParamAndGradBuffer::zero_grad() {
  NoGradGuard no_grad;
  grad_data_.zero_();
}

void ParamAndGradBuffer::check_views(const char* caller) const {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    KILN_CHECK(p.storage() == param_data_.storage() && p.storage_offset() == ranges_[i].begin,
               "{}: parameter {} ({}) no longer lives in its flat parameter buffer (was it replaced or moved?)", caller,
               i, p.describe());
    const Tensor g = p.grad();
    KILN_CHECK(g.defined() && g.storage() == grad_data_.storage() && g.storage_offset() == ranges_[i].begin &&
                   g.shape() == p.shape(),
               "{}: the gradient of parameter {} ({}) is no longer a view of its flat gradient buffer (zero the "
               "buffers with the flat optimizer's or GradBuffers' zero_grad(), not by dropping .grad)",
               caller, i, p.describe());
  }
}

}  // namespace kiln::optim
