#include "kiln/hpc/hpcg/geometry.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "kiln/hpc/hpcg/benchmark.h"
#include "kiln/runtime/error.h"

namespace kiln::hpcg {
namespace geometry_test {

std::string error_of(auto&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(HpcgGeometry, RefusesDimensionsThatAreNotMultiplesOf8) {
  auto msg = error_of([] { check_local_dimensions(20, 16, 16); });
  EXPECT_NE(msg.find("nx = 20 is not a multiple of 8"), std::string::npos) << msg;
  msg = error_of([] { check_local_dimensions(16, 16, 36); });
  EXPECT_NE(msg.find("nz = 36 is not a multiple of 8"), std::string::npos) << msg;
  msg = error_of([] { check_local_dimensions(8, 16, 16); });
  EXPECT_NE(msg.find("minimum of 16"), std::string::npos) << msg;
  EXPECT_NO_THROW(check_local_dimensions(16, 24, 32));
}

TEST(HpcgGeometry, RefusesAProcessGridThatDoesNotFit) {
  auto msg = error_of([] { choose_process_grid(3, std::array{2, 2, 1}); });
  EXPECT_NE(msg.find("has 4 places but 3 processes"), std::string::npos) << msg;
  // 11 is prime: 1x1x11 has aspect ratio 1/11, below the reference's 0.125.
  msg = error_of([] { choose_process_grid(11, std::nullopt); });
  EXPECT_NE(msg.find("aspect ratio"), std::string::npos) << msg;
}

TEST(HpcgGeometry, ChoosesTheMostCubicGrid) {
  auto g = choose_process_grid(8, std::nullopt);
  EXPECT_EQ(g.npx * g.npy * g.npz, 8);
  EXPECT_EQ(std::max({g.npx, g.npy, g.npz}), 2);
  g = choose_process_grid(12, std::nullopt);
  EXPECT_EQ(std::max({g.npx, g.npy, g.npz}), 3);
  g = choose_process_grid(1, std::nullopt);
  EXPECT_EQ(g.size(), 1);
}

TEST(HpcgGeometry, RanksAndNeighboursFollowTheReferenceNumbering) {
  ProcessGrid grid{2, 3, 2};
  Geometry g = make_geometry(16, 16, 16, grid, 7);  // 7 = 1 + 2*(0 + 3*1)
  EXPECT_EQ(g.ipx, 1);
  EXPECT_EQ(g.ipy, 0);
  EXPECT_EQ(g.ipz, 1);
  EXPECT_EQ(g.neighbor_rank(-1, 0, 0), 6);
  EXPECT_EQ(g.neighbor_rank(1, 0, 0), -1);
  EXPECT_EQ(g.neighbor_rank(0, 1, -1), 3);
  auto levels = make_hierarchy(g);
  ASSERT_EQ(levels.size(), 4u);
  EXPECT_EQ(levels[3].nx, 2);
}

TEST(HpcgDat, ReadsTheReferenceFormat) {
  std::string path = ::testing::TempDir() + "/hpcg.dat";
  {
    std::ofstream f(path);
    f << "HPCG benchmark input file\nSandia National Laboratories; University of Tennessee, Knoxville\n32 24 16\n7\n";
  }
  auto p = read_hpcg_dat(path);
  EXPECT_EQ(p.nx, 32);
  EXPECT_EQ(p.ny, 24);
  EXPECT_EQ(p.nz, 16);
  EXPECT_DOUBLE_EQ(p.run_seconds, 7.0);
  {
    std::ofstream f(path);
    f << "a\nb\n32 x 16\n";
  }
  EXPECT_NE(error_of([&] { read_hpcg_dat(path); }).find("not 'nx ny nz'"), std::string::npos);
  std::remove(path.c_str());
}

}  // namespace geometry_test
}  // namespace kiln::hpcg
