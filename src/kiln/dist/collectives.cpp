// collectives.h: the checks every call makes, the cross-rank validation, and the host (MPI)
// path; device buffers go on to collectives_device.cpp.
#include "kiln/dist/collectives.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/dist/communicator_impl.h"
#include "kiln/dist/mpi_check.h"
#include "kiln/dist/work_state.h"
#include "kiln/runtime/error.h"
// The reduced-precision floats' bit layouts and conversions. A dependency-free leaf header that
// lives in tensor/ today; it belongs in runtime/ (dist may not use tensor/), and moves there once
// the FP8 work on it has landed.
#include "kiln/runtime/scalar_types.h"
#if KILN_WITH_CUDA
#include "kiln/dist/collectives_device.h"
#endif

namespace kiln::dist {

std::string describe(const ConstBufferView& b) {
  return fmt::format("{} x {} on {}", b.count, element_type_name(b.type), b.device.str());
}

PointToPoint PointToPoint::send(ConstBufferView data, int peer, int tag) {
  // The buffer is only read: the const is dropped to share one field with receives.
  return {Kind::Send, BufferView{const_cast<void*>(data.data), data.count, data.type, data.device}, peer, tag};
}

PointToPoint PointToPoint::recv(BufferView data, int peer, int tag) { return {Kind::Recv, data, peer, tag}; }

namespace {

std::atomic<bool>& validation_flag() {
  static std::atomic<bool> flag{[] {
    const char* v = std::getenv("KILN_DIST_VALIDATE");
    return v != nullptr && std::string_view(v) != "0" && !std::string_view(v).empty();
  }()};
  return flag;
}

// ---- checks on this rank's arguments --------------------------------------------------------

void check_buffer(const char* call, const ConstBufferView& b, std::string_view name) {
  KILN_CHECK(b.count == 0 || b.data != nullptr, "{}: {} ({}) has no memory (null data)", call, name, describe(b));
  KILN_CHECK(b.device.is_cpu() || b.device.is_cuda(), "{}: {} is on {}, which dist does not serve", call, name,
             b.device.str());
}

void check_stream(const char* call, const Stream& stream, const ConstBufferView& b, std::string_view name) {
  KILN_CHECK(stream.device == b.device, "{}: {} is on {} but the stream is on {}: name a stream of the buffers' device",
             call, name, b.device.str(), stream.device.str());
}

void check_alike(const char* call, const ConstBufferView& a, std::string_view a_name, const ConstBufferView& b,
                 std::string_view b_name) {
  KILN_CHECK(a.type == b.type, "{}: {} is {} but {} is {}: both must have one element type", call, a_name,
             element_type_name(a.type), b_name, element_type_name(b.type));
  KILN_CHECK(a.device == b.device, "{}: {} is on {} but {} is on {}: both must be on one device", call, a_name,
             a.device.str(), b_name, b.device.str());
}

void check_rank(const char* call, int rank, std::string_view what, const Communicator& group) {
  KILN_CHECK(rank >= 0 && rank < group.size(), "{}: {} {} is not a rank of the group (size {})", call, what, rank,
             group.size());
}

#if !KILN_WITH_CUDA
[[noreturn]] void no_cuda(const char* call) {
  KILN_FAIL("{}: the buffers are on a CUDA device, but this build of Kiln has no CUDA", call);
}
#endif

// ---- cross-rank validation ------------------------------------------------------------------

// What every rank of a call must agree on (fixed size: gathered as bytes).
struct Signature {
  char call[32] = {};
  std::int32_t type = 0;
  std::int32_t op = 0;
  std::int32_t root = 0;
  std::int32_t device_kind = 0;
  std::uint64_t count = 0;
};

void validate_across(const Communicator& group, const char* call, ElementType type, std::size_t count, int op = 0,
                     int root = 0, DeviceKind device = DeviceKind::CPU) {
  Signature mine;
  std::strncpy(mine.call, call, sizeof(mine.call) - 1);
  mine.type = static_cast<std::int32_t>(type);
  mine.op = op;
  mine.root = root;
  mine.device_kind = static_cast<std::int32_t>(device);
  mine.count = count;
  std::vector<Signature> all(static_cast<std::size_t>(group.size()));
  const auto comm = reinterpret_cast<MPI_Comm>(group.native_handle());
  KILN_MPI_CHECK(MPI_Allgather(&mine, sizeof(Signature), MPI_BYTE, all.data(), sizeof(Signature), MPI_BYTE, comm));
  // Every rank compares every rank with rank 0, so all of them refuse alike (none is left waiting).
  const Signature& first = all[0];
  for (int r = 1; r < group.size(); ++r) {
    const Signature& s = all[static_cast<std::size_t>(r)];
    KILN_CHECK(std::strncmp(s.call, first.call, sizeof(s.call)) == 0,
               "{}: ranks disagree on the call: rank 0 makes {} but rank {} makes {}", call, first.call, r, s.call);
    KILN_CHECK(s.type == first.type, "{}: ranks disagree on the element type: rank 0 passes {} but rank {} passes {}",
               call, element_type_name(static_cast<ElementType>(first.type)), r,
               element_type_name(static_cast<ElementType>(s.type)));
    KILN_CHECK(s.count == first.count,
               "{}: ranks disagree on the count: rank 0 passes {} elements but rank {} passes {}", call, first.count, r,
               s.count);
    KILN_CHECK(s.op == first.op, "{}: ranks disagree on the reduction: rank 0 passes {} but rank {} passes {}", call,
               reduce_op_name(static_cast<ReduceOp>(first.op)), r, reduce_op_name(static_cast<ReduceOp>(s.op)));
    KILN_CHECK(s.root == first.root, "{}: ranks disagree on the root: rank 0 passes {} but rank {} passes {}", call,
               first.root, r, s.root);
    KILN_CHECK(s.device_kind == first.device_kind,
               "{}: ranks disagree on where the buffers are: rank 0 passes {} buffers but rank {} passes {}", call,
               device_kind_name(static_cast<DeviceKind>(first.device_kind)), r,
               device_kind_name(static_cast<DeviceKind>(s.device_kind)));
  }
}

// all_to_all: rank a's input_splits[b] must be rank b's output_splits[a], for every pair.
void validate_splits(const Communicator& group, const char* call, std::span<const std::size_t> input_splits,
                     std::span<const std::size_t> output_splits) {
  const auto n = static_cast<std::size_t>(group.size());
  std::vector<std::uint64_t> mine(2 * n), all(2 * n * n);
  for (std::size_t r = 0; r < n; ++r) {
    mine[r] = input_splits[r];
    mine[n + r] = output_splits[r];
  }
  const auto comm = reinterpret_cast<MPI_Comm>(group.native_handle());
  KILN_MPI_CHECK(MPI_Allgather(mine.data(), static_cast<int>(2 * n), MPI_UINT64_T, all.data(), static_cast<int>(2 * n),
                               MPI_UINT64_T, comm));
  for (std::size_t a = 0; a < n; ++a)
    for (std::size_t b = 0; b < n; ++b) {
      const std::uint64_t sends = all[a * 2 * n + b], receives = all[b * 2 * n + n + a];
      KILN_CHECK(sends == receives,
                 "{}: rank {} sends {} elements to rank {} (input_splits[{}]) but rank {} expects {} from it "
                 "(output_splits[{}])",
                 call, a, sends, b, b, b, receives, a);
    }
}

// ---- host reductions of reduced-precision floats (in f32) ------------------------------------

template <class T>
void widen(const void* src, std::size_t n, float* dst) {
  const T* s = static_cast<const T*>(src);
  for (std::size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
}
template <class T>
void narrow(const float* src, std::size_t n, void* dst) {
  T* d = static_cast<T*>(dst);
  for (std::size_t i = 0; i < n; ++i) d[i] = T(src[i]);
}

void to_f32(const void* src, ElementType type, std::size_t n, float* dst) {
  switch (type) {
    case ElementType::BF16: return widen<BFloat16>(src, n, dst);
    case ElementType::F16: return widen<Half>(src, n, dst);
    case ElementType::F8E4M3: return widen<Float8E4M3>(src, n, dst);
    case ElementType::F8E5M2: return widen<Float8E5M2>(src, n, dst);
    default: KILN_FAIL("dist: {} is not reduced through f32", element_type_name(type));
  }
}

void from_f32(const float* src, ElementType type, std::size_t n, void* dst) {
  switch (type) {
    case ElementType::BF16: return narrow<BFloat16>(src, n, dst);
    case ElementType::F16: return narrow<Half>(src, n, dst);
    case ElementType::F8E4M3: return narrow<Float8E4M3>(src, n, dst);
    case ElementType::F8E5M2: return narrow<Float8E5M2>(src, n, dst);
    default: KILN_FAIL("dist: {} is not reduced through f32", element_type_name(type));
  }
}

template <class T>
void divide_as(void* data, std::size_t n, int by) {
  T* d = static_cast<T*>(data);
  for (std::size_t i = 0; i < n; ++i) d[i] = static_cast<T>(d[i] / static_cast<T>(by));
}

// Avg's division, on a buffer in its MPI reduction type (f32 for the reduced-precision floats).
void divide(void* data, ElementType type, std::size_t n, int by) {
  switch (type) {
    case ElementType::F64: return divide_as<double>(data, n, by);
    case ElementType::I64: return divide_as<std::int64_t>(data, n, by);
    case ElementType::I32: return divide_as<std::int32_t>(data, n, by);
    case ElementType::U8: return divide_as<std::uint8_t>(data, n, by);
    default: return divide_as<float>(data, n, by);  // f32 and the reduced-precision floats' f32 copies
  }
}

// A host reduction's buffers as MPI reduces them: the reduced-precision floats through f32 copies.
struct HostReduction {
  Work::State& state;
  ElementType type;
  bool widened = false;
  MPI_Datatype mpi = MPI_BYTE;

  HostReduction(Work::State& s, ElementType t) : state(s), type(t), widened(is_reduced_precision(t)) {
    mpi = widened ? MPI_FLOAT : mpi_movement_type(t);
  }
  // What MPI reads for `src` (an f32 copy when widened).
  const void* input(const void* src, std::size_t n) {
    if (!widened) return src;
    auto* f = reinterpret_cast<float*>(state.scratch_bytes(n * sizeof(float)));
    to_f32(src, type, n, f);
    return f;
  }
  // Where MPI writes the result for `dst`; after the transfer, finish() moves it to `dst`.
  void* output(void* dst, std::size_t n, bool copy_in) {
    if (!widened) return dst;
    auto* f = reinterpret_cast<float*>(state.scratch_bytes(n * sizeof(float)));
    if (copy_in) to_f32(dst, type, n, f);
    return f;
  }
  void finish(void* result, void* dst, std::size_t n, ReduceOp op, int group_size) {
    const ElementType t = type;
    const bool w = widened;
    state.finish.push_back([=] {
      if (op == ReduceOp::Avg) divide(result, w ? ElementType::F32 : t, n, group_size);
      if (w) from_f32(static_cast<const float*>(result), t, n, dst);
    });
  }
};

std::unique_ptr<Work::State> host_state() {
  auto s = std::make_unique<Work::State>();
  s->device = Device::cpu();
  return s;
}

MPI_Comm comm_of(const Communicator& group) { return CommunicatorAccess::impl(group).comm; }

}  // namespace

void set_validation(bool on) { validation_flag().store(on); }
bool validation_enabled() { return validation_flag().load(); }

Work all_reduce(const Communicator& group, BufferView data, ReduceOp op, const Stream& stream) {
  constexpr const char* call = "dist::all_reduce";
  check_buffer(call, data, "data");
  check_stream(call, stream, data, "data");
  if (validation_enabled())
    validate_across(group, call, data.type, data.count, static_cast<int>(op), 0, data.device.kind);
  if (data.device.is_cuda()) {
#if KILN_WITH_CUDA
    return gpu::all_reduce(CommunicatorAccess::impl(group), data, op, stream);
#else
    no_cuda(call);
#endif
  }
  auto s = host_state();
  HostReduction r(*s, data.type);
  void* buffer = r.output(data.data, data.count, /*copy_in=*/true);
  MPI_Request request = MPI_REQUEST_NULL;
  KILN_MPI_CHECK(
      MPI_Iallreduce(MPI_IN_PLACE, buffer, checked_count(data.count), r.mpi, mpi_op(op), comm_of(group), &request));
  s->requests.push_back(request);
  r.finish(buffer, data.data, data.count, op, group.size());
  return Work(std::move(s));
}

Work reduce_scatter(const Communicator& group, ConstBufferView input, BufferView output, ReduceOp op,
                    const Stream& stream) {
  constexpr const char* call = "dist::reduce_scatter";
  check_buffer(call, input, "input");
  check_buffer(call, output, "output");
  check_alike(call, input, "input", output, "output");
  check_stream(call, stream, output, "output");
  KILN_CHECK(input.count == output.count * static_cast<std::size_t>(group.size()),
             "{}: input ({}) must hold group size ({}) x output count ({}) = {} elements", call, describe(input),
             group.size(), output.count, output.count * static_cast<std::size_t>(group.size()));
  if (validation_enabled())
    validate_across(group, call, output.type, output.count, static_cast<int>(op), 0, output.device.kind);
  if (output.device.is_cuda()) {
#if KILN_WITH_CUDA
    return gpu::reduce_scatter(CommunicatorAccess::impl(group), input, output, op, stream);
#else
    no_cuda(call);
#endif
  }
  auto s = host_state();
  HostReduction r(*s, output.type);
  const void* in = r.input(input.data, input.count);
  void* out = r.output(output.data, output.count, /*copy_in=*/false);
  MPI_Request request = MPI_REQUEST_NULL;
  KILN_MPI_CHECK(
      MPI_Ireduce_scatter_block(in, out, checked_count(output.count), r.mpi, mpi_op(op), comm_of(group), &request));
  s->requests.push_back(request);
  r.finish(out, output.data, output.count, op, group.size());
  return Work(std::move(s));
}

Work all_gather(const Communicator& group, ConstBufferView input, BufferView output, const Stream& stream) {
  constexpr const char* call = "dist::all_gather";
  check_buffer(call, input, "input");
  check_buffer(call, output, "output");
  check_alike(call, input, "input", output, "output");
  check_stream(call, stream, output, "output");
  KILN_CHECK(output.count == input.count * static_cast<std::size_t>(group.size()),
             "{}: output ({}) must hold group size ({}) x input count ({}) = {} elements", call, describe(output),
             group.size(), input.count, input.count * static_cast<std::size_t>(group.size()));
  if (validation_enabled()) validate_across(group, call, input.type, input.count, 0, 0, input.device.kind);
  if (output.device.is_cuda()) {
#if KILN_WITH_CUDA
    return gpu::all_gather(CommunicatorAccess::impl(group), input, output, stream);
#else
    no_cuda(call);
#endif
  }
  auto s = host_state();
  // In place when the input is this rank's block of the output (a flat buffer's shard).
  const bool in_place =
      input.data == static_cast<const std::byte*>(output.data) + static_cast<std::size_t>(group.rank()) * input.bytes();
  const MPI_Datatype type = mpi_movement_type(input.type);
  MPI_Request request = MPI_REQUEST_NULL;
  KILN_MPI_CHECK(MPI_Iallgather(in_place ? MPI_IN_PLACE : input.data, checked_count(input.count), type, output.data,
                                checked_count(input.count), type, comm_of(group), &request));
  s->requests.push_back(request);
  return Work(std::move(s));
}

Work all_gather(const Communicator& group, ConstBufferView input, std::span<const BufferView> outputs,
                const Stream& stream) {
  constexpr const char* call = "dist::all_gather";
  check_buffer(call, input, "input");
  check_stream(call, stream, input, "input");
  KILN_CHECK(outputs.size() == static_cast<std::size_t>(group.size()),
             "{}: {} output buffers for a group of {}: one per rank", call, outputs.size(), group.size());
  for (std::size_t r = 0; r < outputs.size(); ++r) {
    const std::string name = fmt::format("outputs[{}]", r);
    check_buffer(call, outputs[r], name);
    check_alike(call, input, "input", outputs[r], name);
    KILN_CHECK(outputs[r].count == input.count, "{}: {} ({}) must hold input's {} elements", call, name,
               describe(outputs[r]), input.count);
  }
  if (validation_enabled()) validate_across(group, call, input.type, input.count, 0, 0, input.device.kind);
  if (input.device.is_cuda()) {
#if KILN_WITH_CUDA
    return gpu::all_gather(CommunicatorAccess::impl(group), input, outputs, stream);
#else
    no_cuda(call);
#endif
  }
  auto s = host_state();
  const std::size_t bytes = input.bytes();
  std::byte* gathered = s->scratch_bytes(bytes * outputs.size());
  const MPI_Datatype type = mpi_movement_type(input.type);
  MPI_Request request = MPI_REQUEST_NULL;
  KILN_MPI_CHECK(MPI_Iallgather(input.data, checked_count(input.count), type, gathered, checked_count(input.count),
                                type, comm_of(group), &request));
  s->requests.push_back(request);
  std::vector<void*> targets;
  for (const BufferView& out : outputs) targets.push_back(out.data);
  s->finish.push_back([gathered, bytes, targets] {
    for (std::size_t r = 0; r < targets.size(); ++r)
      if (bytes > 0) std::memcpy(targets[r], gathered + r * bytes, bytes);
  });
  return Work(std::move(s));
}

Work broadcast(const Communicator& group, BufferView data, int root, const Stream& stream) {
  constexpr const char* call = "dist::broadcast";
  check_buffer(call, data, "data");
  check_stream(call, stream, data, "data");
  check_rank(call, root, "root", group);
  if (validation_enabled()) validate_across(group, call, data.type, data.count, 0, root, data.device.kind);
  if (data.device.is_cuda()) {
#if KILN_WITH_CUDA
    return gpu::broadcast(CommunicatorAccess::impl(group), data, root, stream);
#else
    no_cuda(call);
#endif
  }
  auto s = host_state();
  MPI_Request request = MPI_REQUEST_NULL;
  KILN_MPI_CHECK(
      MPI_Ibcast(data.data, checked_count(data.count), mpi_movement_type(data.type), root, comm_of(group), &request));
  s->requests.push_back(request);
  return Work(std::move(s));
}

Work all_to_all(const Communicator& group, ConstBufferView input, std::span<const std::size_t> input_splits,
                BufferView output, std::span<const std::size_t> output_splits, const Stream& stream) {
  constexpr const char* call = "dist::all_to_all";
  check_buffer(call, input, "input");
  check_buffer(call, output, "output");
  check_alike(call, input, "input", output, "output");
  check_stream(call, stream, output, "output");
  const auto n = static_cast<std::size_t>(group.size());
  KILN_CHECK(input_splits.size() == n && output_splits.size() == n,
             "{}: {} input_splits and {} output_splits for a group of {}: one per rank each", call, input_splits.size(),
             output_splits.size(), n);
  const std::size_t sent = std::accumulate(input_splits.begin(), input_splits.end(), std::size_t{0});
  const std::size_t received = std::accumulate(output_splits.begin(), output_splits.end(), std::size_t{0});
  KILN_CHECK(sent == input.count, "{}: input_splits add up to {} elements but input is {}", call, sent,
             describe(input));
  KILN_CHECK(received == output.count, "{}: output_splits add up to {} elements but output is {}", call, received,
             describe(output));
  if (validation_enabled()) {
    validate_across(group, call, input.type, 0, 0, 0, input.device.kind);
    validate_splits(group, call, input_splits, output_splits);
  }
  if (output.device.is_cuda()) {
#if KILN_WITH_CUDA
    return gpu::all_to_all(CommunicatorAccess::impl(group), input, input_splits, output, output_splits, stream);
#else
    no_cuda(call);
#endif
  }
  auto s = host_state();
  std::vector<int> send_counts(n), send_displs(n), recv_counts(n), recv_displs(n);
  std::size_t send_at = 0, recv_at = 0;
  for (std::size_t r = 0; r < n; ++r) {
    send_counts[r] = checked_count(input_splits[r]);
    send_displs[r] = checked_count(send_at);
    recv_counts[r] = checked_count(output_splits[r]);
    recv_displs[r] = checked_count(recv_at);
    send_at += input_splits[r];
    recv_at += output_splits[r];
  }
  const MPI_Datatype type = mpi_movement_type(input.type);
  MPI_Request request = MPI_REQUEST_NULL;
  KILN_MPI_CHECK(MPI_Ialltoallv(input.data, s->ints(std::move(send_counts)), s->ints(std::move(send_displs)), type,
                                output.data, s->ints(std::move(recv_counts)), s->ints(std::move(recv_displs)), type,
                                comm_of(group), &request));
  s->requests.push_back(request);
  return Work(std::move(s));
}

Work batch_send_recv(const Communicator& group, std::span<const PointToPoint> ops, const Stream& stream) {
  constexpr const char* call = "dist::batch_send_recv";
  if (ops.empty()) return Work();
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const PointToPoint& op = ops[i];
    const bool sends = op.kind == PointToPoint::Kind::Send;
    const std::string name = fmt::format("ops[{}] (a {} of {} {} rank {})", i, sends ? "send" : "receive",
                                         describe(op.buffer), sends ? "to" : "from", op.peer);
    check_buffer(call, op.buffer, name);
    check_stream(call, stream, op.buffer, name);
    check_rank(call, op.peer, fmt::format("{}'s peer", name), group);
    KILN_CHECK(op.buffer.device == ops[0].buffer.device, "{}: {} is on {} but ops[0] is on {}: one device per batch",
               call, name, op.buffer.device.str(), ops[0].buffer.device.str());
  }
  if (ops[0].buffer.device.is_cuda()) {
#if KILN_WITH_CUDA
    return gpu::batch_send_recv(CommunicatorAccess::impl(group), ops, stream);
#else
    no_cuda(call);
#endif
  }
  auto s = host_state();
  const MPI_Comm comm = comm_of(group);
  for (const PointToPoint& op : ops) {
    MPI_Request request = MPI_REQUEST_NULL;
    const BufferView& b = op.buffer;
    if (op.kind == PointToPoint::Kind::Send)
      KILN_MPI_CHECK(
          MPI_Isend(b.data, checked_count(b.count), mpi_movement_type(b.type), op.peer, op.tag, comm, &request));
    else
      KILN_MPI_CHECK(
          MPI_Irecv(b.data, checked_count(b.count), mpi_movement_type(b.type), op.peer, op.tag, comm, &request));
    s->requests.push_back(request);
  }
  return Work(std::move(s));
}

}  // namespace kiln::dist
