#include "kiln/dist/process_groups.h"

#include <algorithm>
#include <array>
#include <string>

#include "kiln/runtime/error.h"

namespace kiln::dist {

namespace {

// Megatron's order; a generator's sizes are given in it.
constexpr std::array<std::string_view, 5> kOrder = {"tp", "cp", "ep", "dp", "pp"};
using Sizes = std::array<int, 5>;
using Mask = std::array<bool, 5>;

// Coordinates of `index` in a row-major-from-the-front shape (first dimension fastest).
std::vector<int> decompose(int index, const std::vector<int>& shape) {
  std::vector<int> idx(shape.size());
  int stride = 1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    idx[i] = (index / stride) % shape[i];
    stride *= shape[i];
  }
  return idx;
}

// RankGenerator's generate_masked_orthogonal_rank_groups: the groups that vary the masked
// dimensions, one per combination of the others.
std::vector<std::vector<int>> masked_groups(int world, const Sizes& sizes, const Mask& mask) {
  std::vector<int> masked_shape, unmasked_shape, masked_stride, unmasked_stride;
  int stride = 1;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    (mask[i] ? masked_shape : unmasked_shape).push_back(sizes[i]);
    (mask[i] ? masked_stride : unmasked_stride).push_back(stride);
    stride *= sizes[i];
  }
  int group_size = 1;
  for (int s : masked_shape) group_size *= s;
  std::vector<std::vector<int>> groups(static_cast<std::size_t>(world / group_size));
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const std::vector<int> fixed = decompose(static_cast<int>(g), unmasked_shape);
    int base = 0;
    for (std::size_t i = 0; i < fixed.size(); ++i) base += fixed[i] * unmasked_stride[i];
    for (int r = 0; r < group_size; ++r) {
      const std::vector<int> varied = decompose(r, masked_shape);
      int rank = base;
      for (std::size_t i = 0; i < varied.size(); ++i) rank += varied[i] * masked_stride[i];
      groups[g].push_back(rank);
    }
  }
  return groups;
}

Mask mask_of(std::string_view kind, std::string_view whole) {
  Mask mask{};
  std::size_t start = 0;
  while (start <= kind.size()) {
    const std::size_t end = std::min(kind.find('-', start), kind.size());
    const std::string_view token = kind.substr(start, end - start);
    const auto it = std::find(kOrder.begin(), kOrder.end(), token);
    KILN_CHECK(it != kOrder.end(), "RankLayout::groups: unknown dimension '{}' in '{}' (tp, cp, ep, dp, pp)", token,
               whole);
    mask[static_cast<std::size_t>(it - kOrder.begin())] = true;
    start = end + 1;
  }
  return mask;
}

}  // namespace

RankLayout::RankLayout(int world_size, ParallelSizes sizes)
    : world_(world_size),
      tp_(sizes.tp),
      pp_(sizes.pp),
      cp_(sizes.cp),
      dp_(0),
      ep_(sizes.ep),
      etp_(sizes.etp == 0 ? sizes.tp : sizes.etp),
      edp_(0) {
  KILN_CHECK(world_ >= 1, "ProcessGroups: the world has {} ranks", world_);
  KILN_CHECK(tp_ >= 1 && pp_ >= 1 && cp_ >= 1 && ep_ >= 1 && etp_ >= 1,
             "ProcessGroups: every size must be at least 1 (tp {}, pp {}, cp {}, ep {}, expert tp {})", tp_, pp_, cp_,
             ep_, etp_);
  const int model = tp_ * cp_ * pp_;
  KILN_CHECK(world_ % model == 0,
             "ProcessGroups: tensor parallel {} x context parallel {} x pipeline parallel {} = {} does not divide the "
             "world of {} ranks",
             tp_, cp_, pp_, model, world_);
  dp_ = world_ / model;
  const int expert = etp_ * ep_ * pp_;
  KILN_CHECK(
      world_ % expert == 0,
      "ProcessGroups: expert tensor parallel {} x expert parallel {} x pipeline parallel {} = {} does not divide "
      "the world of {} ranks",
      etp_, ep_, pp_, expert, world_);
  edp_ = world_ / expert;
}

std::vector<std::vector<int>> RankLayout::groups(std::string_view kind) const {
  constexpr std::string_view kExpert = "expert:";
  if (kind.substr(0, kExpert.size()) == kExpert) {
    const Sizes sizes = {etp_, 1, ep_, edp_, pp_};
    return masked_groups(world_, sizes, mask_of(kind.substr(kExpert.size()), kind));
  }
  const Mask mask = mask_of(kind, kind);
  KILN_CHECK(!mask[2], "RankLayout::groups: '{}': expert parallel groups are 'expert:' kinds", kind);
  const Sizes sizes = {tp_, cp_, 1, dp_, pp_};
  return masked_groups(world_, sizes, mask);
}

std::vector<int> RankLayout::group_of(std::string_view kind, int rank) const {
  for (auto& group : groups(kind))
    if (std::find(group.begin(), group.end(), rank) != group.end()) return group;
  KILN_FAIL("RankLayout::group_of: rank {} is not in the world of {}", rank, world_);
}

std::vector<std::vector<int>> RankLayout::embedding_groups() const {
  std::vector<std::vector<int>> out;
  // First and last stage (one rank when there is one stage). Built element by element: GCC 13's
  // -Warray-bounds misreads a conditional between a two-element list and a copy of `stages`.
  for (auto& stages : groups("pp")) {
    std::vector<int> ends{stages.front()};
    if (stages.size() > 1) ends.push_back(stages.back());
    out.push_back(std::move(ends));
  }
  return out;
}

std::vector<std::vector<int>> RankLayout::position_embedding_groups() const {
  std::vector<std::vector<int>> out;
  for (auto& stages : groups("pp")) out.push_back({stages.front()});
  return out;
}

namespace {

// This rank's group among `groups` (color: its index; key: the rank's place in it), or color -1.
std::pair<int, int> place(const std::vector<std::vector<int>>& groups, int rank) {
  for (std::size_t g = 0; g < groups.size(); ++g) {
    auto it = std::find(groups[g].begin(), groups[g].end(), rank);
    if (it != groups[g].end()) return {static_cast<int>(g), static_cast<int>(it - groups[g].begin())};
  }
  return {-1, 0};
}

Communicator split_into(const Communicator& world, const std::vector<std::vector<int>>& groups) {
  const auto [color, key] = place(groups, world.rank());
  return world.split(color, key);
}

}  // namespace

ProcessGroups::ProcessGroups(const Communicator& world, ParallelSizes sizes)
    : world_(world), layout_(world.size(), sizes) {
  tp_.emplace(split_into(world, layout_.groups("tp")));
  pp_.emplace(split_into(world, layout_.groups("pp")));
  cp_.emplace(split_into(world, layout_.groups("cp")));
  dp_.emplace(split_into(world, layout_.groups("dp")));
  dp_cp_.emplace(split_into(world, layout_.groups("dp-cp")));
  tp_cp_.emplace(split_into(world, layout_.groups("tp-cp")));
  mp_.emplace(split_into(world, layout_.groups("tp-pp")));
  tp_dp_cp_.emplace(split_into(world, layout_.groups("tp-dp-cp")));
  ep_.emplace(split_into(world, layout_.groups("expert:ep")));
  expert_tp_.emplace(split_into(world, layout_.groups("expert:tp")));
  expert_dp_.emplace(split_into(world, layout_.groups("expert:dp")));
  tp_ep_.emplace(split_into(world, layout_.groups("expert:tp-ep")));
  const auto [e_color, e_key] = place(layout_.embedding_groups(), world.rank());
  embedding_ = world.split_optional(e_color, e_key);
  const auto [p_color, p_key] = place(layout_.position_embedding_groups(), world.rank());
  position_embedding_ = world.split_optional(p_color, p_key);
}

const Communicator& ProcessGroups::embedding() const {
  KILN_CHECK(embedding_.has_value(),
             "ProcessGroups::embedding: world rank {} (pipeline stage {} of {}) is in no embedding group (only the "
             "first and last stages are)",
             world_.rank(), pp_rank(), pp_->size());
  return *embedding_;
}

const Communicator& ProcessGroups::position_embedding() const {
  KILN_CHECK(position_embedding_.has_value(),
             "ProcessGroups::position_embedding: world rank {} (pipeline stage {}) is in no position-embedding group "
             "(only the first stage is)",
             world_.rank(), pp_rank());
  return *position_embedding_;
}

}  // namespace kiln::dist
