#pragma once
// record_stream for tensors: the tensor's memory is used by work on `stream` too (see
// Backend::record_stream), so the caching allocator does not hand it out again, once the tensor is
// freed, before `stream` has passed that point. Call it when a tensor made on one stream is read or
// written by work queued on another (a collective on a side stream, a copy stream's prefetch).
#include "kiln/runtime/stream.h"
#include "kiln/tensor/tensor.h"

namespace kiln {

void record_stream(const Tensor& tensor, const Stream& stream);

}  // namespace kiln
