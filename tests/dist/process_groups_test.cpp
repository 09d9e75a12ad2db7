// ProcessGroups: Megatron-core's groups in its rank order tp-cp-ep-dp-pp. The layouts are written
// out member by member (as Megatron's parallel_state.py forms them; its docstring's example is
// 16 ranks as tp2 pp4 dp2); the communicators are then checked, on whatever world the test runs
// in, to hold exactly the layout's members in the layout's order.
#include "kiln/dist/process_groups.h"

#include <gtest/gtest.h>

#include <span>
#include <string>
#include <vector>

#include "kiln/runtime/error.h"

namespace kiln::dist {
namespace process_groups_test {

using Groups = std::vector<std::vector<int>>;

TEST(RankLayout, MegatronsExampleSixteenRanksTp2Pp4) {
  const RankLayout l(16, {.tp = 2, .pp = 4});
  EXPECT_EQ(l.dp(), 2);
  EXPECT_EQ(l.groups("tp"), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(l.groups("dp"), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(l.groups("pp"), (Groups{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}));
  EXPECT_EQ(l.groups("tp-pp"), (Groups{{0, 1, 4, 5, 8, 9, 12, 13}, {2, 3, 6, 7, 10, 11, 14, 15}}));
  EXPECT_EQ(l.embedding_groups(), (Groups{{0, 12}, {1, 13}, {2, 14}, {3, 15}}));
  EXPECT_EQ(l.position_embedding_groups(), (Groups{{0}, {1}, {2}, {3}}));
}

TEST(RankLayout, EightRanksTp2Pp2Dp2) {
  const RankLayout l(8, {.tp = 2, .pp = 2});
  EXPECT_EQ(l.dp(), 2);
  EXPECT_EQ(l.groups("tp"), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(l.groups("dp"), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(l.groups("dp-cp"), l.groups("dp"));  // cp 1
  EXPECT_EQ(l.groups("pp"), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(l.groups("tp-pp"), (Groups{{0, 1, 4, 5}, {2, 3, 6, 7}}));
  EXPECT_EQ(l.groups("tp-dp-cp"), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(l.groups("cp"), (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  EXPECT_EQ(l.embedding_groups(), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(l.position_embedding_groups(), (Groups{{0}, {1}, {2}, {3}}));
  EXPECT_EQ(l.group_of("dp", 5), (std::vector<int>{5, 7}));
}

TEST(RankLayout, EightRanksTp2Ep2) {
  // Dense: tp2 dp4. Experts: etp = tp = 2 (etp 0: Megatron's default), ep 2, so expert data parallel 8 / (2 * 2) = 2.
  const RankLayout l(8, {.tp = 2, .ep = 2, .etp = 0});
  EXPECT_EQ(l.dp(), 4);
  EXPECT_EQ(l.edp(), 2);
  EXPECT_EQ(l.groups("dp"), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(l.groups("expert:tp"), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(l.groups("expert:ep"), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(l.groups("expert:dp"), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(l.groups("expert:tp-ep"), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(l.groups("expert:tp-ep-pp"), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
}

TEST(RankLayout, EightRanksTp2Ep4WithExpertTp1) {
  const RankLayout l(8, {.tp = 2, .ep = 4, .etp = 1});
  EXPECT_EQ(l.edp(), 2);
  EXPECT_EQ(l.groups("expert:tp"), (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  EXPECT_EQ(l.groups("expert:ep"), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(l.groups("expert:dp"), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
}

TEST(RankLayout, EightRanksTp2Cp2Dp2) {
  const RankLayout l(8, {.tp = 2, .cp = 2});
  EXPECT_EQ(l.dp(), 2);
  EXPECT_EQ(l.groups("tp"), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(l.groups("cp"), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(l.groups("dp"), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(l.groups("dp-cp"), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));  // cp before dp in the order: cp fastest
  EXPECT_EQ(l.groups("cp-dp"), l.groups("dp-cp"));                     // the kind's own order does not matter
  EXPECT_EQ(l.groups("tp-cp"), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
}

TEST(RankLayout, EverySizeOneIsAGroupOfOne) {
  const RankLayout l(1, {});
  for (const char* kind : {"tp", "pp", "cp", "dp", "dp-cp", "tp-pp", "expert:ep", "expert:dp"})
    EXPECT_EQ(l.groups(kind), (Groups{{0}})) << kind;
  EXPECT_EQ(l.embedding_groups(), (Groups{{0}}));
}

TEST(RankLayout, SizesThatDoNotDivideTheWorldAreRefused) {
  auto refused = [](int world, ParallelSizes sizes, const std::string& part) {
    try {
      RankLayout l(world, sizes);
      FAIL() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  refused(8, {.tp = 3},
          "tensor parallel 3 x context parallel 1 x pipeline parallel 1 = 3 does not divide the world of 8 ranks");
  refused(8, {.tp = 2, .pp = 8}, "= 16 does not divide the world of 8 ranks");
  refused(12, {.tp = 2, .ep = 4, .etp = 0},
          "expert tensor parallel 2 x expert parallel 4 x pipeline parallel 1 = 8 does not divide the world of 12");
  refused(8, {.tp = 0}, "every size must be at least 1");
  EXPECT_THROW((void)RankLayout(8, {}).groups("tp-xp"), Error);
  EXPECT_THROW((void)RankLayout(8, {}).groups("ep"), Error);  // experts are "expert:" kinds
}

// The world ranks of a communicator's members, in its rank order.
std::vector<int> members(const Communicator& group) {
  const int me = Communicator::world().rank();
  std::vector<int> all(static_cast<std::size_t>(group.size()));
  group.all_gather(std::span<const int>(&me, 1), std::span<int>(all));
  return all;
}

// Sizes that fit the world this test runs in (1, 2, 4 or 8 ranks, or any other).
std::vector<ParallelSizes> layouts_for(int world) {
  std::vector<ParallelSizes> out = {{}};
  if (world % 2 == 0) out.push_back({.tp = 2});
  if (world % 4 == 0) {
    out.push_back({.tp = 2, .pp = 2});
    out.push_back({.tp = 2, .ep = 2});
    out.push_back({.tp = 2, .cp = 2});
    out.push_back({.pp = 4});
  }
  if (world % 8 == 0) out.push_back({.tp = 2, .pp = 2, .cp = 2, .ep = 2, .etp = 1});
  return out;
}

TEST(ProcessGroups, CommunicatorsHoldTheLayoutsMembersInOrder) {
  const Communicator world = Communicator::world();
  for (const ParallelSizes& sizes : layouts_for(world.size())) {
    const ProcessGroups groups(world, sizes);
    const RankLayout& l = groups.layout();
    const int me = world.rank();
    const std::string label = "tp" + std::to_string(sizes.tp) + " pp" + std::to_string(sizes.pp) + " cp" +
                              std::to_string(sizes.cp) + " ep" + std::to_string(sizes.ep);
    EXPECT_EQ(members(groups.tp()), l.group_of("tp", me)) << label;
    EXPECT_EQ(members(groups.pp()), l.group_of("pp", me)) << label;
    EXPECT_EQ(members(groups.cp()), l.group_of("cp", me)) << label;
    EXPECT_EQ(members(groups.dp()), l.group_of("dp", me)) << label;
    EXPECT_EQ(members(groups.dp_cp()), l.group_of("dp-cp", me)) << label;
    EXPECT_EQ(members(groups.tp_cp()), l.group_of("tp-cp", me)) << label;
    EXPECT_EQ(members(groups.mp()), l.group_of("tp-pp", me)) << label;
    EXPECT_EQ(members(groups.tp_dp_cp()), l.group_of("tp-dp-cp", me)) << label;
    EXPECT_EQ(members(groups.ep()), l.group_of("expert:ep", me)) << label;
    EXPECT_EQ(members(groups.expert_tp()), l.group_of("expert:tp", me)) << label;
    EXPECT_EQ(members(groups.expert_dp()), l.group_of("expert:dp", me)) << label;
    EXPECT_EQ(members(groups.tp_ep()), l.group_of("expert:tp-ep", me)) << label;
    EXPECT_EQ(groups.tp_rank(), me % sizes.tp) << label;
    // Embedding groups: first and last stage only.
    const bool edge = groups.is_first_stage() || groups.is_last_stage();
    EXPECT_EQ(groups.in_embedding_group(), edge) << label;
    EXPECT_EQ(groups.in_position_embedding_group(), groups.is_first_stage()) << label;
    if (edge) {
      const std::vector<int> stages = l.group_of("pp", me);
      std::vector<int> expected{stages.front()};  // (no ?: here: GCC 13's -Warray-bounds misreads it)
      if (stages.size() > 1) expected.push_back(stages.back());
      EXPECT_EQ(members(groups.embedding()), expected) << label;
    } else {
      EXPECT_THROW((void)groups.embedding(), Error) << label;
    }
  }
}

TEST(ProcessGroups, RefusesSizesThatDoNotDivideTheWorld) {
  const Communicator world = Communicator::world();
  try {
    ProcessGroups groups(world, {.tp = world.size() + 1});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not divide the world of " + std::to_string(world.size()) + " ranks"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace process_groups_test
}  // namespace kiln::dist
