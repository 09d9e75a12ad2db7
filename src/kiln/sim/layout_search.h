#pragma once
// Every layout of `devices` devices for a model and global batch: TP (within a node), PP, VPP, CP,
// EP, DP, micro-batch size, recompute, the distributed optimizer, FP8; each predicted, the ones
// that fit ranked by tokens/s, the others kept with their reasons.
#include <vector>

#include "kiln/sim/simulator.h"

namespace kiln::sim {

struct SearchOptions {
  int devices = 1;
  std::int64_t global_batch_size = 1;
  bool bf16 = true;
  bool gradient_accumulation_fusion = true;  // Layout::gradient_accumulation_fusion
  bool allow_fp8 = true;
  ScheduleKind schedule = ScheduleKind::OneF1B;  // for PP > 1 (interleaved where VPP > 1)
  PredictOptions predict;
};

struct SearchResult {
  std::vector<Prediction> ranked;    // fits, fastest first
  std::vector<Prediction> rejected;  // with Prediction::invalid
};

SearchResult search_layouts(const ModelSpec& model, const SystemSpec& system, const CalibrationTable* calibration,
                            const SearchOptions& options);

}  // namespace kiln::sim
