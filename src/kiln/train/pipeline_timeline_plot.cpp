#include "kiln/train/pipeline_timeline_plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "kiln/sim/timeline_plot.h"

namespace kiln::train {

sim::ScheduleResult gather_pipeline_timeline(const dist::Communicator& pipeline,
                                             const std::vector<TimedPipelineAction>& mine, bool dualpipe) {
  // Five numbers per action: kind, micro-batch, chunk, start, end.
  std::vector<double> flat;
  for (const TimedPipelineAction& a : mine)
    flat.insert(flat.end(), {static_cast<double>(a.action.kind), static_cast<double>(a.action.micro_batch),
                             static_cast<double>(a.action.chunk), a.start, a.end});
  const int p = pipeline.size();
  std::vector<double> counts(static_cast<std::size_t>(p));
  const double count = static_cast<double>(flat.size());
  pipeline.all_gather(std::span<const double>(&count, 1), std::span<double>(counts));
  sim::ScheduleResult out;
  if (pipeline.rank() != 0) {
    pipeline.send(std::span<const double>(flat), 0, 1);
    return out;
  }
  std::vector<std::vector<double>> all(static_cast<std::size_t>(p));
  all[0] = flat;
  for (int r = 1; r < p; ++r) {
    all[static_cast<std::size_t>(r)].resize(static_cast<std::size_t>(counts[static_cast<std::size_t>(r)]));
    pipeline.recv(std::span<double>(all[static_cast<std::size_t>(r)]), r, 1);
  }
  double origin = std::numeric_limits<double>::infinity(), busy = 0;
  for (const auto& v : all)
    for (std::size_t i = 0; i + 4 < v.size(); i += 5) origin = std::min(origin, v[i + 3]);
  for (int r = 0; r < p; ++r) {
    const auto& v = all[static_cast<std::size_t>(r)];
    for (std::size_t i = 0; i + 4 < v.size(); i += 5) {
      const auto kind = static_cast<sim::ActionKind>(static_cast<int>(v[i]));
      // DualPipe's chunk is the direction: drawn as the simulator draws DualPipe's passes.
      const int chunk = static_cast<int>(v[i + 2]);
      sim::Pass pass{kind == sim::ActionKind::Forward    ? sim::PassKind::F
                     : kind == sim::ActionKind::Backward ? sim::PassKind::B
                                                         : sim::PassKind::W,
                     r,
                     static_cast<int>(v[i + 1]),
                     dualpipe ? 0 : chunk,
                     dualpipe ? chunk : 0,
                     v[i + 3] - origin,
                     v[i + 4] - origin};
      out.makespan = std::max(out.makespan, pass.end);
      busy += pass.end - pass.start;
      out.passes.push_back(pass);
    }
  }
  out.bubble_fraction = out.makespan > 0 ? 1.0 - busy / (out.makespan * p) : 0.0;
  return out;
}

void draw_pipeline_timeline(const std::filesystem::path& path, const dist::Communicator& pipeline,
                            const std::vector<TimedPipelineAction>& mine, std::int64_t iteration, int chunks,
                            bool write, const std::function<void(const std::string&)>& say, bool dualpipe) {
  const sim::ScheduleResult measured = gather_pipeline_timeline(pipeline, mine, dualpipe);
  if (!write) return;
  // Each kind's mean pass time (what the schedules' theory takes: ZB-H1's bubble depends on W's share).
  double total[3] = {0, 0, 0};
  int count[3] = {0, 0, 0};
  for (const sim::Pass& x : measured.passes) {
    total[static_cast<int>(x.kind)] += x.end - x.start;
    ++count[static_cast<int>(x.kind)];
  }
  auto mean = [&](sim::PassKind k) {
    const int i = static_cast<int>(k);
    return count[i] > 0 ? total[i] / count[i] : 0.0;
  };
  const bool split = count[static_cast<int>(sim::PassKind::W)] > 0;
  sim::write_timeline_png(
      measured, pipeline.size(),
      fmt::format("measured pipeline schedule, iteration {} ({} stages, {})", iteration, pipeline.size(),
                  dualpipe     ? std::string("DualPipe, direction 1 darker")
                  : split      ? std::string("zero-bubble ZB-H1")
                  : chunks > 1 ? fmt::format("interleaved, {} chunks per rank", chunks)
                               : std::string("1F1B")),
      path);
  say(fmt::format(
      "--profile-schedule: wrote {} (iteration {}: {:.1f} ms, idle {:.1f}% of the ranks' time; mean F "
      "{:.3g} s, B {:.3g} s{})",
      path.string(), iteration, measured.makespan * 1e3, 100 * measured.bubble_fraction, mean(sim::PassKind::F),
      mean(sim::PassKind::B), split ? fmt::format(", W {:.3g} s", mean(sim::PassKind::W)) : std::string()));
}

}  // namespace kiln::train
