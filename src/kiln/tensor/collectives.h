#pragma once
// dist's collectives (dist/collectives.h) on Tensors. dist sits below tensor/ and takes typed
// buffer views; this maps a Tensor's DType onto dist's ElementType, checks the tensors are
// contiguous, and, when the stream is not the tensors' device's current one, record_streams them
// so that freeing them on the current stream cannot hand their memory out while the collective
// still uses it. The calls without a stream use the device's current stream.
//
// Tensors must be contiguous; bool tensors move as u8 and are refused by the reductions.
#include <cstdint>
#include <span>
#include <vector>

#include "kiln/dist/collectives.h"
#include "kiln/tensor/tensor.h"

namespace kiln::dist {

ElementType element_type_of(DType dtype);  // throws for Bool
// A contiguous tensor's memory as a view; `call` and `name` are for the messages.
BufferView buffer_of(const Tensor& tensor, const char* call, const char* name);

Work all_reduce(const Communicator& group, const Tensor& tensor, ReduceOp op, const Stream& stream);
Work all_reduce(const Communicator& group, const Tensor& tensor, ReduceOp op = ReduceOp::Sum);

// output holds input.numel() / group size elements (any shape).
Work reduce_scatter(const Communicator& group, const Tensor& input, const Tensor& output, ReduceOp op,
                    const Stream& stream);
Work reduce_scatter(const Communicator& group, const Tensor& input, const Tensor& output, ReduceOp op = ReduceOp::Sum);

// Into a flat tensor of group size x input.numel() elements, or one tensor per rank.
Work all_gather(const Communicator& group, const Tensor& input, const Tensor& output, const Stream& stream);
Work all_gather(const Communicator& group, const Tensor& input, const Tensor& output);
Work all_gather(const Communicator& group, const Tensor& input, const std::vector<Tensor>& outputs,
                const Stream& stream);

Work broadcast(const Communicator& group, const Tensor& tensor, int root, const Stream& stream);
Work broadcast(const Communicator& group, const Tensor& tensor, int root);

// Splits count rows of dim 0, as PyTorch's all_to_all_single: this rank sends input rows
// [sum(input_splits[:r]), +input_splits[r]) to rank r.
Work all_to_all(const Communicator& group, const Tensor& input, std::span<const std::int64_t> input_splits,
                const Tensor& output, std::span<const std::int64_t> output_splits, const Stream& stream);

struct TensorPointToPoint {
  PointToPoint::Kind kind;
  Tensor tensor;
  int peer = 0;
  int tag = 0;
  static TensorPointToPoint send(const Tensor& t, int peer, int tag = 0) {
    return {PointToPoint::Kind::Send, t, peer, tag};
  }
  static TensorPointToPoint recv(const Tensor& t, int peer, int tag = 0) {
    return {PointToPoint::Kind::Recv, t, peer, tag};
  }
};
Work batch_send_recv(const Communicator& group, std::span<const TensorPointToPoint> ops, const Stream& stream);

}  // namespace kiln::dist
