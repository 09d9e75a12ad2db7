#pragma once
// A pipeline schedule as a PNG: one row per device, forward passes blue, backward orange, weight
// gradients green, micro-batch numbers on the bars (cairo, through io/'s canvas).
#include <filesystem>
#include <string>

#include "kiln/sim/pipeline_schedule.h"

namespace kiln::sim {

void write_timeline_png(const ScheduleResult& schedule, int devices, const std::string& title,
                        const std::filesystem::path& path);

}  // namespace kiln::sim
