// NCCL behind collectives.h for device buffers: each call is enqueued on the caller's stream after
// that stream has caught up with the device's current stream; its Work's event follows it there.
#include "kiln/dist/collectives_device.h"

#include "kiln/dist/work_state.h"
#include "kiln/runtime/cuda/cuda_context.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/event.h"

namespace kiln::dist::gpu {

namespace {

// A started device call: on the device, its stream ordered after the current stream's work.
class DeviceCall {
 public:
  DeviceCall(GroupImpl& group, Device device, const Stream& stream, const char* call, bool collective = true)
      : guard_(device.index), device_(device), stream_(stream.handle ? stream : Stream::compute(device)) {
    KILN_CHECK(group.nccl || collective,
               "{} on device buffers (cuda:{}) before this group has NCCL: every rank must first call "
               "use_device() or a collective on device buffers",
               call, device.index);
    channel_ = &group.nccl_on(device.index, call);
    const Stream current = Stream::current(device);
    if (current != stream_) {
      Event inputs_ready(device, /*timing=*/false);
      inputs_ready.record(current);
      inputs_ready.wait(stream_);
    }
  }
  ncclComm_t comm() const { return channel_->comm(); }
  cudaStream_t stream() const { return static_cast<cudaStream_t>(stream_.handle); }
  // The Work of the calls enqueued so far.
  Work finish() {
    auto state = std::make_unique<Work::State>();
    state->device = device_;
    state->event.emplace(device_, /*timing=*/false);
    state->event->record(stream_);
    return Work(std::move(state));
  }

 private:
  DeviceGuard guard_;
  Device device_;
  Stream stream_;
  NcclChannel* channel_ = nullptr;
};

const std::byte* at(const void* base, std::size_t elements, ElementType type) {
  return static_cast<const std::byte*>(base) + elements * element_size(type);
}
std::byte* at(void* base, std::size_t elements, ElementType type) {
  return static_cast<std::byte*>(base) + elements * element_size(type);
}

// The NCCL operation of `op` in `group`. In a group of one rank an average is the sum: NCCL runs
// that case through ncclLaunchOneRank (src/device/onerank.cu), whose host-side switch guards its fp8
// cases with __CUDA_ARCH__ >= 900, which host code never defines, so an fp8 ncclAvg there returns
// ncclInvalidArgument without a warning (seen with NCCL 2.28.9 on the H200: every other op and
// dtype passed). Sum gives the same result without that path.
ncclRedOp_t group_op(const GroupImpl& group, ReduceOp op) {
  return group.size == 1 && op == ReduceOp::Avg ? ncclSum : nccl_op(op);
}

}  // namespace

Work all_reduce(GroupImpl& group, BufferView data, ReduceOp op, const Stream& stream) {
  DeviceCall c(group, data.device, stream, "dist::all_reduce");
  KILN_NCCL_CHECK(ncclAllReduce(data.data, data.data, data.count, nccl_reduce_type(data.type, "dist::all_reduce"),
                                group_op(group, op), c.comm(), c.stream()));
  return c.finish();
}

Work reduce_scatter(GroupImpl& group, ConstBufferView input, BufferView output, ReduceOp op, const Stream& stream) {
  DeviceCall c(group, output.device, stream, "dist::reduce_scatter");
  KILN_NCCL_CHECK(ncclReduceScatter(input.data, output.data, output.count,
                                    nccl_reduce_type(output.type, "dist::reduce_scatter"), group_op(group, op),
                                    c.comm(), c.stream()));
  return c.finish();
}

Work all_gather(GroupImpl& group, ConstBufferView input, BufferView output, const Stream& stream) {
  DeviceCall c(group, output.device, stream, "dist::all_gather");
  // NCCL is in place when input is this rank's block of output, as the call allows.
  KILN_NCCL_CHECK(ncclAllGather(input.data, output.data, input.count, nccl_type(input.type), c.comm(), c.stream()));
  return c.finish();
}

Work all_gather(GroupImpl& group, ConstBufferView input, std::span<const BufferView> outputs, const Stream& stream) {
  DeviceCall c(group, input.device, stream, "dist::all_gather");
  // One broadcast per rank, grouped: rank r's input lands in every rank's outputs[r].
  KILN_NCCL_CHECK(ncclGroupStart());
  for (int r = 0; r < group.size; ++r) {
    const BufferView& out = outputs[static_cast<std::size_t>(r)];
    KILN_NCCL_CHECK(ncclBroadcast(r == group.rank ? input.data : nullptr, out.data, input.count, nccl_type(input.type),
                                  r, c.comm(), c.stream()));
  }
  KILN_NCCL_CHECK(ncclGroupEnd());
  return c.finish();
}

Work broadcast(GroupImpl& group, BufferView data, int root, const Stream& stream) {
  DeviceCall c(group, data.device, stream, "dist::broadcast");
  KILN_NCCL_CHECK(ncclBroadcast(data.data, data.data, data.count, nccl_type(data.type), root, c.comm(), c.stream()));
  return c.finish();
}

Work all_to_all(GroupImpl& group, ConstBufferView input, std::span<const std::size_t> input_splits, BufferView output,
                std::span<const std::size_t> output_splits, const Stream& stream) {
  DeviceCall c(group, output.device, stream, "dist::all_to_all");
  const ncclDataType_t type = nccl_type(input.type);
  KILN_NCCL_CHECK(ncclGroupStart());
  std::size_t sent = 0, received = 0;
  for (int r = 0; r < group.size; ++r) {
    const std::size_t out = input_splits[static_cast<std::size_t>(r)];
    const std::size_t in = output_splits[static_cast<std::size_t>(r)];
    if (out > 0) KILN_NCCL_CHECK(ncclSend(at(input.data, sent, input.type), out, type, r, c.comm(), c.stream()));
    if (in > 0) KILN_NCCL_CHECK(ncclRecv(at(output.data, received, output.type), in, type, r, c.comm(), c.stream()));
    sent += out;
    received += in;
  }
  KILN_NCCL_CHECK(ncclGroupEnd());
  return c.finish();
}

Work batch_send_recv(GroupImpl& group, std::span<const PointToPoint> ops, const Stream& stream) {
  DeviceCall c(group, ops.front().buffer.device, stream, "dist::batch_send_recv", /*collective=*/false);
  KILN_NCCL_CHECK(ncclGroupStart());
  for (const PointToPoint& op : ops) {
    const BufferView& b = op.buffer;
    if (op.kind == PointToPoint::Kind::Send)
      KILN_NCCL_CHECK(ncclSend(b.data, b.count, nccl_type(b.type), op.peer, c.comm(), c.stream()));
    else
      KILN_NCCL_CHECK(ncclRecv(b.data, b.count, nccl_type(b.type), op.peer, c.comm(), c.stream()));
  }
  KILN_NCCL_CHECK(ncclGroupEnd());
  return c.finish();
}

}  // namespace kiln::dist::gpu
