#pragma once
// Contiguous, bucketed parameter and gradient storage for one parameter dtype, in the manner of
// Megatron-core's _ParamAndGradBuffer. Each parameter's values move into one flat `param_data`
// tensor and its .grad becomes a view of one flat `grad_data` tensor (f32, or bf16 by choice),
// so backward accumulates gradients in place (micro-batches add up without copies), a whole
// bucket is reduced with one collective, and a distributed optimizer updates a shard of the
// flat buffers and all-gathers the parameters back.
//
// Layout: parameters in reverse order (the order backward produces their gradients), each
// starting at a multiple of 64 elements (128-byte aligned for 16-bit types). A bucket closes once
// it holds at least `bucket_size` elements; its end is padded to a multiple of
// lcm(shard_count, 128), so a reduce-scatter over shard_count ranks splits it into equal,
// aligned shards (GradBucket::shard). Padding holds zeros and is never a parameter.
//
// A collective takes a bucket as (grad_data.data_ptr(), numel, dtype) or the 1-D view
// GradBucket::grad_data; nothing here depends on the communicator.
#include <cstdint>
#include <optional>
#include <vector>

#include "kiln/tensor/tensor.h"

namespace kiln::optim {

struct GradBufferOptions {
  DType grad_dtype = DType::F32;          // what gradients accumulate in: F32 or BF16
  std::int64_t bucket_size = 40'000'000;  // elements (Megatron's default); <= 0: one bucket per buffer
  int shard_count = 1;                    // data-parallel ranks a bucket must split evenly over
};

// [begin, end) in elements of a flat buffer.
struct ElementRange {
  std::int64_t begin = 0, end = 0;
  std::int64_t numel() const { return end - begin; }
  bool operator==(const ElementRange&) const = default;
};

struct GradBucket {
  std::size_t index = 0;
  ElementRange range;               // padded; a multiple of lcm(shard_count, 128) elements long
  std::vector<std::size_t> params;  // indices into ParamAndGradBuffer::params(), layout order
  Tensor grad_data;                 // 1-D views of the buffers over `range`
  Tensor param_data;
  // Rank `rank` of `count`'s equal part of the bucket (the reduce-scatter output, the shard a
  // distributed optimizer updates). count must divide the bucket's length.
  ElementRange shard(int rank, int count) const;
};

class ParamAndGradBuffer {
 public:
  // `params`: leaves that require grad, contiguous, of one floating dtype (f32, bf16, f16) and
  // one device, each its own storage. Their values move into the buffer; an existing .grad is
  // copied into the gradient view.
  ParamAndGradBuffer(const std::vector<Tensor>& params, const GradBufferOptions& options);
  ParamAndGradBuffer(const ParamAndGradBuffer&) = delete;
  ParamAndGradBuffer& operator=(const ParamAndGradBuffer&) = delete;

  DType param_dtype() const { return param_data_.dtype(); }
  DType grad_dtype() const { return grad_data_.dtype(); }
  Device device() const { return param_data_.device(); }
  std::int64_t numel() const { return param_data_.numel(); }
  const Tensor& param_data() const { return param_data_; }  // flat, 1-D
  const Tensor& grad_data() const { return grad_data_; }
  const GradBufferOptions& options() const { return options_; }

  const std::vector<Tensor>& params() const { return params_; }  // layout order
  ElementRange range_of(std::size_t i) const { return ranges_.at(i); }
  std::size_t bucket_of(std::size_t i) const { return bucket_of_.at(i); }
  std::optional<std::size_t> index_of(const Tensor& param) const;
  const std::vector<GradBucket>& buckets() const { return buckets_; }

  // The shard of every bucket that rank `rank` of `count` owns, in bucket order.
  std::vector<ElementRange> shard_ranges(int rank, int count) const;
  // Zeroes the gradient buffer (padding included).
  void zero_grad();
  // Whether parameter i's data and .grad are still views of the buffers (a parameter re-created,
  // moved to another device, or zero_grad(set_to_none) would detach them). Names the first one
  // that is not, with `caller`, in an error.
  void check_views(const char* caller) const;

  // A 1-D view of `flat` (param_data or grad_data, or a tensor laid out like them) over `r`.
  static Tensor narrow(const Tensor& flat, ElementRange r);

 private:
  GradBufferOptions options_;
  std::vector<Tensor> params_;
  std::vector<ElementRange> ranges_;
  std::vector<std::size_t> bucket_of_;
  std::vector<GradBucket> buckets_;
  Tensor param_data_, grad_data_;
};

}  // namespace kiln::optim
