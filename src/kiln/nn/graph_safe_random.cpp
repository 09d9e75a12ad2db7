#include "kiln/nn/graph_safe_random.h"

#include "kiln/nn/layers.h"

namespace kiln::nn {

namespace {
template <class Fn>
void for_each_dropout(Module& model, Fn&& fn) {
  fn(dynamic_cast<Dropout*>(&model));  // the root (named_modules lists it only when shared)
  for (const auto& [name, m] : model.named_modules())
    if (m && m.get() != &model) fn(dynamic_cast<Dropout*>(m.get()));
}
}  // namespace

void set_graph_safe_random(Module& model, bool on) {
  for_each_dropout(model, [&](Dropout* d) {
    if (d) d->graph_safe = on;
  });
}

void sync_random_offsets_from_device(Module& model) {
  for_each_dropout(model, [&](Dropout* d) {
    if (d) d->sync_offset_from_device();
  });
}

}  // namespace kiln::nn
