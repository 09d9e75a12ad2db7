#include "kiln/train/moe_training.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "kiln/models/moe_aux_loss.h"
#include "kiln/runtime/error.h"

namespace kiln::train {

std::vector<std::pair<std::int64_t, std::shared_ptr<models::TopKRouter>>> moe_routers(const nn::Module& model) {
  std::vector<std::pair<std::int64_t, std::shared_ptr<models::TopKRouter>>> out;
  for (const auto& [name, m] : model.named_modules()) {
    auto router = std::dynamic_pointer_cast<models::TopKRouter>(m);
    if (!router) continue;
    std::int64_t layer = static_cast<std::int64_t>(out.size());
    const std::string key = "layers.";
    if (const auto at = name.find(key); at != std::string::npos) layer = std::stoll(name.substr(at + key.size()));
    out.emplace_back(layer, router);
  }
  return out;
}

models::RouterStats reduce_router_stats(models::RouterStats s, const dist::Communicator& group) {
  if (group.size() == 1) return s;
  // The counts and forwards in one integer exchange, the two losses in a double one.
  std::vector<std::int64_t> counts = s.tokens;
  counts.insert(counts.end(), s.dropped.begin(), s.dropped.end());
  counts.push_back(s.forwards);
  group.all_reduce<std::int64_t>(counts);
  const std::size_t e = s.tokens.size();
  std::copy(counts.begin(), counts.begin() + static_cast<std::ptrdiff_t>(e), s.tokens.begin());
  std::copy(counts.begin() + static_cast<std::ptrdiff_t>(e), counts.begin() + static_cast<std::ptrdiff_t>(2 * e),
            s.dropped.begin());
  s.forwards = counts.back();
  std::vector<double> losses = {s.load_balancing_loss, s.z_loss};
  group.all_reduce<double>(losses);
  s.load_balancing_loss = losses[0];
  s.z_loss = losses[1];
  return s;
}

std::vector<std::pair<std::int64_t, models::RouterStats>> gather_router_stats(
    const std::vector<std::pair<std::int64_t, models::RouterStats>>& mine, const MoePipeline& pipeline) {
  // Each layer's numbers at its slot of fixed-size arrays, zeros elsewhere, summed over the stages
  // (each layer lives on one stage): one integer exchange (tokens, dropped, forwards) and one double
  // one (the two losses).
  const std::size_t layers = pipeline.moe_layers.size(), e = static_cast<std::size_t>(pipeline.num_experts);
  const std::size_t row = 2 * e + 1;
  std::vector<std::int64_t> counts(layers * row, 0);
  std::vector<double> losses(layers * 2, 0.0);
  for (const auto& [layer, s] : mine) {
    const auto at = std::find(pipeline.moe_layers.begin(), pipeline.moe_layers.end(), layer);
    KILN_CHECK(at != pipeline.moe_layers.end() && s.tokens.size() == e && s.dropped.size() == e,
               "MoE statistics: layer {} with {} experts is not one of the model's MoE layers of {} experts", layer,
               s.tokens.size(), e);
    const std::size_t slot = static_cast<std::size_t>(at - pipeline.moe_layers.begin());
    std::copy(s.tokens.begin(), s.tokens.end(), counts.begin() + static_cast<std::ptrdiff_t>(slot * row));
    std::copy(s.dropped.begin(), s.dropped.end(), counts.begin() + static_cast<std::ptrdiff_t>(slot * row + e));
    counts[slot * row + 2 * e] = s.forwards;
    losses[slot * 2] = s.load_balancing_loss;
    losses[slot * 2 + 1] = s.z_loss;
  }
  pipeline.group.all_reduce<std::int64_t>(counts);
  pipeline.group.all_reduce<double>(losses);
  std::vector<std::pair<std::int64_t, models::RouterStats>> out;
  for (std::size_t slot = 0; slot < layers; ++slot) {
    models::RouterStats s;
    const auto first = counts.begin() + static_cast<std::ptrdiff_t>(slot * row);
    s.tokens.assign(first, first + static_cast<std::ptrdiff_t>(e));
    s.dropped.assign(first + static_cast<std::ptrdiff_t>(e), first + static_cast<std::ptrdiff_t>(2 * e));
    s.forwards = counts[slot * row + 2 * e];
    s.load_balancing_loss = losses[slot * 2];
    s.z_loss = losses[slot * 2 + 1];
    out.emplace_back(pipeline.moe_layers[slot], std::move(s));
  }
  return out;
}

void attach_moe_training(LanguageModelHandle& handle, const nn::Module& model, std::int64_t micro_batches,
                         std::optional<dist::Communicator> data_parallel, std::optional<MoePipeline> pipeline) {
  auto routers = moe_routers(model);
  // In layer order: DualPipe's pair of ranks hold the same layers (stage r's and stage p - 1 - r's,
  // registered in the other order on the other rank), and their bias updates meet layer by layer.
  std::stable_sort(routers.begin(), routers.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::optional<dist::Communicator> pair = pipeline ? pipeline->dualpipe_pair : std::nullopt;
  if (pipeline && (pipeline->group.size() == 1 || pipeline->moe_layers.empty())) pipeline.reset();
  // A stage without MoE layers still joins its pipeline group's exchange of the statistics.
  if (routers.empty() && !pipeline) return;
  // The loop backpropagates loss / micro_batches for each micro-batch; the aux losses alike.
  models::set_moe_aux_loss_scale(1.0 / static_cast<double>(std::max<std::int64_t>(micro_batches, 1)));
  if (data_parallel && data_parallel->size() == 1) data_parallel.reset();
  handle.after_optimizer_step = [routers, data_parallel, pair] {
    for (const auto& [layer, router] : routers)
      router->update_expert_bias(data_parallel ? &*data_parallel : nullptr, pair ? &*pair : nullptr);
  };
  handle.log_extras = [routers, data_parallel, pipeline](nlohmann::json& line) {
    std::vector<std::pair<std::int64_t, models::RouterStats>> stats;
    for (const auto& [layer, router] : routers) {
      models::RouterStats s = router->take_stats();
      if (data_parallel) s = reduce_router_stats(std::move(s), *data_parallel);
      stats.emplace_back(layer, std::move(s));
    }
    if (pipeline) stats = gather_router_stats(stats, *pipeline);
    nlohmann::json layers = nlohmann::json::array();
    double aux = 0, z = 0;
    std::int64_t forwards = 0;
    std::string text;
    for (const auto& [layer, s] : stats) {
      aux += s.load_balancing_loss;
      z += s.z_loss;
      forwards += s.forwards;
      layers.push_back({{"layer", layer}, {"tokens_per_expert", s.tokens}, {"dropped_per_expert", s.dropped}});
      text += fmt::format("\n  moe layer {}: tokens per expert [{}]", layer, fmt::join(s.tokens, " "));
      std::int64_t dropped = 0;
      for (auto d : s.dropped) dropped += d;
      if (dropped > 0) text += fmt::format(" dropped [{}]", fmt::join(s.dropped, " "));
    }
    const double per = static_cast<double>(std::max<std::int64_t>(forwards, 1));
    line["moe_layers"] = layers;
    line["load_balancing_loss"] = aux / per;
    line["z_loss"] = z / per;
    return fmt::format(" | load_balancing_loss: {:.6E} | z_loss: {:.6E}{}", aux / per, z / per, text);
  };
}

void append_moe_shape_flags(const models::GptConfig& c, std::vector<std::pair<std::string, std::string>>& f) {
  if (c.num_experts <= 0) return;
  f.emplace_back("--num-experts", std::to_string(c.num_experts));
  f.emplace_back("--moe-ffn-hidden-size", std::to_string(c.moe_ffn_hidden()));
  f.emplace_back("--moe-router-topk", std::to_string(c.moe_router_topk));
  f.emplace_back("--moe-router-score-function", std::string(models::to_string(c.moe_router_score_function)));
  f.emplace_back("--moe-router-pre-softmax", c.moe_router_pre_softmax ? "true" : "false");
  f.emplace_back("--moe-router-topk-scaling-factor", fmt::format("{}", c.moe_router_topk_scaling_factor));
  f.emplace_back("--moe-router-enable-expert-bias", c.moe_router_enable_expert_bias ? "true" : "false");
  f.emplace_back("--moe-router-num-groups", std::to_string(c.moe_router_num_groups));
  f.emplace_back("--moe-router-group-topk", std::to_string(c.moe_router_group_topk));
  f.emplace_back("--moe-shared-expert-intermediate-size", std::to_string(c.moe_shared_expert_intermediate_size));
  std::vector<int> layers;
  for (std::int64_t i = 0; i < c.num_layers; ++i) layers.push_back(c.is_moe_layer(i) ? 1 : 0);
  f.emplace_back("--moe-layer-freq", fmt::format("[{}]", fmt::join(layers, ",")));
}

}  // namespace kiln::train
