#pragma once
// The collectives training uses, over a group (a Communicator: a ProcessGroups member or any
// split of the world). Each is enqueued on the stream the caller names and returns a Work (work.h)
// at once: NCCL for device buffers, MPI's non-blocking calls for host buffers (the stream is then
// the CPU's), so every distributed code path also runs under `mpirun` on CPUs.
//
// Every rank of the group makes the same calls in the same order, with the same counts and types
// (and roots, ops, splits that match). Each call checks what it can see on its own rank (the
// buffers' sizes, types and devices against each other and the stream) and refuses bad input
// naming the call and the operands. With validation on (set_validation(true), or the environment
// variable KILN_DIST_VALIDATE=1) each collective first all-gathers its arguments over MPI and
// refuses, on every rank alike, calls that disagree across ranks; that check blocks the host, so it
// is a debugging mode.
//
// Element types: f64, f32, bf16, f16, f8 e4m3/e5m2, i64, i32, u8. On the host, reductions of the
// 16- and 8-bit floats run in f32 and are rounded back once at the end (on the GPU NCCL reduces
// them itself). Avg divides the sum by the group's size (truncating for integers).
//
// Device work on a stream other than the device's current one first waits (on the device) for the
// current stream's work so far, so inputs made there are ready. The buffers are raw memory: a
// caller that frees them on another stream must record_stream them (tensor/collectives.h does).
#include <cstddef>
#include <span>

#include "kiln/dist/buffer_view.h"
#include "kiln/dist/communicator.h"
#include "kiln/dist/work.h"
#include "kiln/runtime/stream.h"

namespace kiln::dist {

// In place: every rank ends with op over all ranks' `data`.
Work all_reduce(const Communicator& group, BufferView data, ReduceOp op, const Stream& stream);

// `input` holds group.size() blocks of output.count elements; rank r gets op over all ranks' block r.
Work reduce_scatter(const Communicator& group, ConstBufferView input, BufferView output, ReduceOp op,
                    const Stream& stream);

// Into one flat buffer: output holds group.size() blocks of input.count elements, block r from rank r.
Work all_gather(const Communicator& group, ConstBufferView input, BufferView output, const Stream& stream);
// Into one buffer per rank: outputs[r] (input.count elements each) gets rank r's input.
Work all_gather(const Communicator& group, ConstBufferView input, std::span<const BufferView> outputs,
                const Stream& stream);

// In place: every rank ends with `root`'s data (root is a rank of the group).
Work broadcast(const Communicator& group, BufferView data, int root, const Stream& stream);

// Uneven all-to-all: this rank sends input_splits[r] elements to rank r (consecutive blocks of
// input) and receives output_splits[r] from rank r (consecutive blocks of output). Rank a's
// input_splits[b] must equal rank b's output_splits[a].
Work all_to_all(const Communicator& group, ConstBufferView input, std::span<const std::size_t> input_splits,
                BufferView output, std::span<const std::size_t> output_splits, const Stream& stream);

// Grouped point-to-point (a pipeline's sends and receives): all start together, so a send and a
// receive between two ranks in one batch cannot wait for each other. Messages between two ranks
// match in the order they are posted (the tag, where given, must agree too; NCCL has no tags).
struct PointToPoint {
  enum class Kind : std::uint8_t { Send, Recv };
  Kind kind = Kind::Send;
  BufferView buffer;  // read for a send (never written)
  int peer = 0;       // a rank of the group
  int tag = 0;

  static PointToPoint send(ConstBufferView data, int peer, int tag = 0);
  static PointToPoint recv(BufferView data, int peer, int tag = 0);
};
Work batch_send_recv(const Communicator& group, std::span<const PointToPoint> ops, const Stream& stream);

// Cross-rank argument checks (see above). Starts from KILN_DIST_VALIDATE.
void set_validation(bool on);
bool validation_enabled();

}  // namespace kiln::dist
