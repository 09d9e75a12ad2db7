#pragma once
// ProcessGroups: the communicators of Megatron-core's parallel layout, built from the world and
// the parallel sizes in Megatron's rank order "tp-cp-ep-dp-pp" (tensor parallel ranks adjacent,
// pipeline stages farthest apart), as megatron/core/parallel_state.py's RankGenerator builds them.
// It is the one object layers, the data-parallel wrapper and the optimizer receive. With every size
// 1 each group is this process alone and the code path is the single-GPU one.
//
// Two generators share the world (Megatron-core >= 0.9):
//   dense layers:  tp x cp x dp x pp        (dp = world / (tp * cp * pp))
//   expert layers: etp x ep x edp x pp      (etp 1 by default, 0 for tp; edp = world / (etp * ep * pp))
// A rank's coordinates follow the order: rank = tp_i + tp * (cp_i + cp * (ep_i + ep * (dp_i + dp * pp_i)))
// (ep is 1 in the dense generator, cp in the expert one). A group of kind "a-b" varies the named
// dimensions and fixes the others; its members are ordered with the dimension earliest in the order
// fastest, whatever order the kind names them in (RankGenerator's masked orthogonal groups).
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/dist/communicator.h"

namespace kiln::dist {

struct ParallelSizes {
  int tp = 1;  // tensor parallel
  int pp = 1;  // pipeline parallel
  int cp = 1;  // context parallel
  int ep = 1;  // expert parallel
  // Expert tensor parallel: 1 (whole experts) as kiln's --expert-tensor-parallel-size; 0: the same
  // as tp (Megatron-core's default when the flag is not given).
  int etp = 1;
};

// The rank layout alone (no MPI): which world ranks form each group. Checks that the sizes divide
// the world and throws naming the sizes and the world otherwise.
class RankLayout {
 public:
  RankLayout(int world_size, ParallelSizes sizes);

  int world_size() const { return world_; }
  int tp() const { return tp_; }
  int pp() const { return pp_; }
  int cp() const { return cp_; }
  int dp() const { return dp_; }
  int ep() const { return ep_; }
  int etp() const { return etp_; }
  int edp() const { return edp_; }

  // Every group of a kind, each as its world ranks in group order. Dense kinds: "tp", "cp", "dp",
  // "pp", "dp-cp", "tp-cp", "tp-pp" (model parallel), "tp-dp-cp", "tp-dp". Expert kinds
  // (prefixed "expert:"): "expert:tp", "expert:ep", "expert:dp", "expert:tp-ep", "expert:tp-ep-pp".
  std::vector<std::vector<int>> groups(std::string_view kind) const;
  // The group of `kind` that holds `rank`.
  std::vector<int> group_of(std::string_view kind, int rank) const;
  // Megatron's embedding groups: per pipeline group, its first and last stage (one rank when pp is
  // 1); the position-embedding group: its first stage.
  std::vector<std::vector<int>> embedding_groups() const;
  std::vector<std::vector<int>> position_embedding_groups() const;

 private:
  int world_, tp_, pp_, cp_, dp_, ep_, etp_, edp_;
};

class ProcessGroups {
 public:
  // Collective over `world`: every rank calls it with the same sizes.
  ProcessGroups(const Communicator& world, ParallelSizes sizes);

  const RankLayout& layout() const { return layout_; }
  const Communicator& world() const { return world_; }
  const Communicator& tp() const { return *tp_; }
  const Communicator& pp() const { return *pp_; }
  const Communicator& cp() const { return *cp_; }
  const Communicator& dp() const { return *dp_; }        // data parallel (without cp)
  const Communicator& dp_cp() const { return *dp_cp_; }  // data parallel with cp: the gradient reduction's
  const Communicator& tp_cp() const { return *tp_cp_; }
  const Communicator& mp() const { return *mp_; }  // model parallel: tp x pp
  const Communicator& tp_dp_cp() const { return *tp_dp_cp_; }
  const Communicator& ep() const { return *ep_; }
  const Communicator& expert_tp() const { return *expert_tp_; }
  const Communicator& expert_dp() const { return *expert_dp_; }
  const Communicator& tp_ep() const { return *tp_ep_; }
  // Only on the ranks that hold them (first/last pipeline stage); throws elsewhere.
  bool in_embedding_group() const { return embedding_.has_value(); }
  bool in_position_embedding_group() const { return position_embedding_.has_value(); }
  const Communicator& embedding() const;
  const Communicator& position_embedding() const;

  // This rank's place in each dimension (its rank in the group of that kind).
  int tp_rank() const { return tp_->rank(); }
  int pp_rank() const { return pp_->rank(); }
  int cp_rank() const { return cp_->rank(); }
  int dp_rank() const { return dp_->rank(); }
  int ep_rank() const { return ep_->rank(); }
  bool is_first_stage() const { return pp_rank() == 0; }
  bool is_last_stage() const { return pp_rank() == pp_->size() - 1; }

 private:
  Communicator world_;
  RankLayout layout_;
  std::optional<Communicator> tp_, pp_, cp_, dp_, dp_cp_, tp_cp_, mp_, tp_dp_cp_, ep_, expert_tp_, expert_dp_, tp_ep_;
  std::optional<Communicator> embedding_, position_embedding_;
};

}  // namespace kiln::dist
