#pragma once
// The device (NCCL) side of collectives.h, CUDA builds only. Arguments are checked by the
// callers in collectives.cpp; these only enqueue.
#include <cstddef>
#include <span>

#include "kiln/dist/collectives.h"
#include "kiln/dist/communicator_impl.h"

namespace kiln::dist::gpu {

using GroupImpl = CommunicatorAccess::Impl;

Work all_reduce(GroupImpl& group, BufferView data, ReduceOp op, const Stream& stream);
Work reduce_scatter(GroupImpl& group, ConstBufferView input, BufferView output, ReduceOp op, const Stream& stream);
Work all_gather(GroupImpl& group, ConstBufferView input, BufferView output, const Stream& stream);
Work all_gather(GroupImpl& group, ConstBufferView input, std::span<const BufferView> outputs, const Stream& stream);
Work broadcast(GroupImpl& group, BufferView data, int root, const Stream& stream);
Work all_to_all(GroupImpl& group, ConstBufferView input, std::span<const std::size_t> input_splits, BufferView output,
                std::span<const std::size_t> output_splits, const Stream& stream);
Work batch_send_recv(GroupImpl& group, std::span<const PointToPoint> ops, const Stream& stream);

}  // namespace kiln::dist::gpu
