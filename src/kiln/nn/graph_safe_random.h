#pragma once
// Switches every random module of a model to device-side random state, so that a training step
// captured in a CUDA graph draws fresh random numbers at each replay (see Dropout::graph_safe).
// Dropout is the only random module in nn/ today; new ones join here.
#include "kiln/nn/module.h"

namespace kiln::nn {

void set_graph_safe_random(Module& model, bool on = true);
// Brings the host-side offsets up to date from the device counters (before saving them).
void sync_random_offsets_from_device(Module& model);

}  // namespace kiln::nn
