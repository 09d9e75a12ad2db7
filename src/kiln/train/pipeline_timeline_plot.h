#pragma once
// The pipeline schedule as it ran: every pipeline rank's measured actions of one step gathered to
// the group's rank 0, as a sim::ScheduleResult (the simulator's form: the same PNG drawing and the
// same idle fraction), and `kiln pretrain-gpt --profile-schedule PATH.png`'s drawing of it.
// The ranks' clocks are the steady clock of their machine: the timeline lines up when the ranks
// share one machine (on several, each rank's row is right but the rows may be offset).
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "kiln/dist/communicator.h"
#include "kiln/sim/pipeline_schedule.h"
#include "kiln/train/pipeline_executor.h"

namespace kiln::train {

// Collective over `pipeline`: on its rank 0 the passes of every rank (device = pipeline rank, times
// from the earliest start), the makespan and the idle fraction 1 - busy / (makespan x ranks); on the
// others an empty result.
sim::ScheduleResult gather_pipeline_timeline(const dist::Communicator& pipeline,
                                             const std::vector<TimedPipelineAction>& mine, bool dualpipe = false);

// Collective over `pipeline`: gathers the timeline and, where `write` (the run's rank 0), writes the
// PNG to `path` (atomically) and says so through `say`. `dualpipe`: the actions' chunk is the
// direction (drawn as DualPipe's, the second direction darker).
void draw_pipeline_timeline(const std::filesystem::path& path, const dist::Communicator& pipeline,
                            const std::vector<TimedPipelineAction>& mine, std::int64_t iteration, int chunks,
                            bool write, const std::function<void(const std::string&)>& say, bool dualpipe = false);

}  // namespace kiln::train
