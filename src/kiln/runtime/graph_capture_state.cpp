#include "kiln/runtime/graph_capture_state.h"

namespace kiln {

namespace {
// Per thread, as the capture mode CudaGraph uses (cudaStreamCaptureModeThreadLocal).
thread_local bool capturing = false;
}  // namespace

bool graph_capture_active() { return capturing; }
void set_graph_capture_active(bool active) { capturing = active; }

}  // namespace kiln
