#include "kiln/tensor/collectives.h"

#include <string>

#include "kiln/runtime/error.h"
#include "kiln/tensor/stream_use.h"

namespace kiln::dist {

namespace {

// Movement (not reduction) may carry bools as bytes.
ElementType movement_type_of(DType dtype) { return dtype == DType::Bool ? ElementType::U8 : element_type_of(dtype); }

BufferView view_of(const Tensor& t, const char* call, const char* name, bool reduction) {
  KILN_CHECK(t.defined(), "{}: {} is an undefined tensor", call, name);
  KILN_CHECK(t.is_contiguous(), "{}: {} ({}) must be contiguous (call .contiguous() first)", call, name, t.describe());
  KILN_CHECK(!reduction || t.dtype() != DType::Bool, "{}: {} ({}): bool tensors cannot be reduced", call, name,
             t.describe());
  return BufferView{t.data_ptr(), static_cast<std::size_t>(t.numel()), movement_type_of(t.dtype()), t.device()};
}

// Work on a stream other than the current one keeps the tensors' memory from reuse until it is done.
void use_on(const Stream& stream, std::initializer_list<const Tensor*> tensors) {
  if (stream.device.is_cpu() || stream == Stream::current(stream.device)) return;
  for (const Tensor* t : tensors)
    if (t->device() == stream.device) record_stream(*t, stream);
}

}  // namespace

ElementType element_type_of(DType dtype) {
  switch (dtype) {
    case DType::F64: return ElementType::F64;
    case DType::F32: return ElementType::F32;
    case DType::BF16: return ElementType::BF16;
    case DType::F16: return ElementType::F16;
    case DType::F8E4M3: return ElementType::F8E4M3;
    case DType::F8E5M2: return ElementType::F8E5M2;
    case DType::I64: return ElementType::I64;
    case DType::I32: return ElementType::I32;
    case DType::U8: return ElementType::U8;
    case DType::Bool: break;
  }
  KILN_FAIL("dist: {} tensors have no collective element type (bool moves as u8)", dtype_name(dtype));
}

BufferView buffer_of(const Tensor& tensor, const char* call, const char* name) {
  return view_of(tensor, call, name, /*reduction=*/false);
}

Work all_reduce(const Communicator& group, const Tensor& tensor, ReduceOp op, const Stream& stream) {
  BufferView data = view_of(tensor, "dist::all_reduce", "tensor", true);
  use_on(stream, {&tensor});
  return all_reduce(group, data, op, stream);
}
Work all_reduce(const Communicator& group, const Tensor& tensor, ReduceOp op) {
  return all_reduce(group, tensor, op, Stream::current(tensor.device()));
}

Work reduce_scatter(const Communicator& group, const Tensor& input, const Tensor& output, ReduceOp op,
                    const Stream& stream) {
  BufferView in = view_of(input, "dist::reduce_scatter", "input", true);
  BufferView out = view_of(output, "dist::reduce_scatter", "output", true);
  use_on(stream, {&input, &output});
  return reduce_scatter(group, in, out, op, stream);
}
Work reduce_scatter(const Communicator& group, const Tensor& input, const Tensor& output, ReduceOp op) {
  return reduce_scatter(group, input, output, op, Stream::current(output.device()));
}

Work all_gather(const Communicator& group, const Tensor& input, const Tensor& output, const Stream& stream) {
  BufferView in = buffer_of(input, "dist::all_gather", "input");
  BufferView out = buffer_of(output, "dist::all_gather", "output");
  use_on(stream, {&input, &output});
  return all_gather(group, in, out, stream);
}
Work all_gather(const Communicator& group, const Tensor& input, const Tensor& output) {
  return all_gather(group, input, output, Stream::current(output.device()));
}

Work all_gather(const Communicator& group, const Tensor& input, const std::vector<Tensor>& outputs,
                const Stream& stream) {
  BufferView in = buffer_of(input, "dist::all_gather", "input");
  std::vector<BufferView> outs;
  for (std::size_t r = 0; r < outputs.size(); ++r) {
    const std::string name = "outputs[" + std::to_string(r) + "]";
    outs.push_back(buffer_of(outputs[r], "dist::all_gather", name.c_str()));
    use_on(stream, {&outputs[r]});
  }
  use_on(stream, {&input});
  return all_gather(group, in, std::span<const BufferView>(outs), stream);
}

Work broadcast(const Communicator& group, const Tensor& tensor, int root, const Stream& stream) {
  BufferView data = buffer_of(tensor, "dist::broadcast", "tensor");
  use_on(stream, {&tensor});
  return broadcast(group, data, root, stream);
}
Work broadcast(const Communicator& group, const Tensor& tensor, int root) {
  return broadcast(group, tensor, root, Stream::current(tensor.device()));
}

Work all_to_all(const Communicator& group, const Tensor& input, std::span<const std::int64_t> input_splits,
                const Tensor& output, std::span<const std::int64_t> output_splits, const Stream& stream) {
  constexpr const char* call = "dist::all_to_all";
  BufferView in = buffer_of(input, call, "input");
  BufferView out = buffer_of(output, call, "output");
  KILN_CHECK(input.dim() >= 1 && output.dim() >= 1, "{}: input ({}) and output ({}) need a dim 0 to split", call,
             input.describe(), output.describe());
  const auto row = [](const Tensor& t) { return t.size(0) == 0 ? 0 : t.numel() / t.size(0); };
  KILN_CHECK(row(input) == row(output) || input.numel() == 0 || output.numel() == 0,
             "{}: a row of input ({}) and of output ({}) must hold the same number of elements", call, input.describe(),
             output.describe());
  std::vector<std::size_t> send, receive;
  for (std::int64_t s : input_splits) {
    KILN_CHECK(s >= 0, "{}: input_splits has a negative entry ({})", call, s);
    send.push_back(static_cast<std::size_t>(s * row(input)));
  }
  for (std::int64_t s : output_splits) {
    KILN_CHECK(s >= 0, "{}: output_splits has a negative entry ({})", call, s);
    receive.push_back(static_cast<std::size_t>(s * row(output)));
  }
  use_on(stream, {&input, &output});
  return all_to_all(group, in, send, out, receive, stream);
}

Work batch_send_recv(const Communicator& group, std::span<const TensorPointToPoint> ops, const Stream& stream) {
  std::vector<PointToPoint> views;
  for (const TensorPointToPoint& op : ops) {
    views.push_back({op.kind, buffer_of(op.tensor, "dist::batch_send_recv", "a tensor"), op.peer, op.tag});
    use_on(stream, {&op.tensor});
  }
  return batch_send_recv(group, std::span<const PointToPoint>(views), stream);
}

}  // namespace kiln::dist
