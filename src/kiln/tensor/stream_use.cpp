#include "kiln/tensor/stream_use.h"

#include "kiln/runtime/backend.h"
#include "kiln/runtime/error.h"

namespace kiln {

void record_stream(const Tensor& tensor, const Stream& stream) {
  if (!tensor.defined()) return;
  KILN_CHECK(stream.device == tensor.device(), "record_stream: tensor {} is on {} but the stream is on {}",
             tensor.describe(), tensor.device().str(), stream.device.str());
  // The storage's start is the block the allocator handed out; views share it.
  backend_for(tensor.device()).record_stream(tensor.storage()->data(), stream);
}

}  // namespace kiln
