#pragma once
// Whether this thread is capturing a CUDA graph (CudaGraph sets it between capture_begin and
// capture_end). Code above the runtime checks it to refuse, with a clear message, work that a
// graph would freeze wrongly: a host value written into device memory during capture is baked
// into the graph and rewritten at every replay, which is silently wrong (e.g. a learning rate).
namespace kiln {

bool graph_capture_active();
void set_graph_capture_active(bool active);

}  // namespace kiln
