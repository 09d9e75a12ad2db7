// train/run_comparison.h: log.jsonl files read into losses by iteration (other records skipped,
// bad lines refused naming the file and line), summaries against a reference run (windowed final
// training loss, last validation loss, relative differences, the largest gap between the curves),
// the table, and the figure written as a PNG.
#include "kiln/train/run_comparison.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "kiln/runtime/error.h"

namespace kiln::train {
namespace run_comparison_test {

namespace fs = std::filesystem;

fs::path scratch(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("kiln_run_comparison_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// A log.jsonl as the trainer writes it: a training loss every 10 iterations (loss = start - slope *
// iteration / 100), a validation loss every 50, and a record without losses.
fs::path write_log(const fs::path& dir, double start, double slope) {
  std::ofstream out(dir / "log.jsonl");
  out << "{\"event\":\"start\",\"world_size\":1}\n";
  for (int it = 10; it <= 100; it += 10) {
    out << "{\"iteration\":" << it << ",\"lm_loss\":" << start - slope * it / 100.0 << ",\"lr\":0.001}\n";
    if (it % 50 == 0)
      out << "{\"iteration\":" << it << ",\"validation_loss\":" << start - slope * it / 100.0 + 0.1 << "}\n";
  }
  return dir;
}

TEST(RunComparison, ReadsTheLossesAndSkipsOtherRecords) {
  const fs::path d = write_log(scratch("read"), 5.0, 1.0);
  const RunLog log = read_run_log(d, "a");
  ASSERT_EQ(log.iterations.size(), 10u);
  EXPECT_EQ(log.iterations.front(), 10);
  EXPECT_DOUBLE_EQ(log.train_loss.back(), 4.0);
  ASSERT_EQ(log.val_iterations, (std::vector<double>{50, 100}));
  EXPECT_DOUBLE_EQ(log.val_loss.back(), 4.1);
  EXPECT_EQ(log.path, d / "log.jsonl");
  // The file itself works too.
  EXPECT_EQ(read_run_log(d / "log.jsonl", "a").train_loss, log.train_loss);
}

TEST(RunComparison, SummariesAgainstTheReference) {
  const RunLog ref = read_run_log(write_log(scratch("ref"), 5.0, 1.0), "bf16");
  const RunLog other = read_run_log(write_log(scratch("other"), 5.0, 0.8), "fp8");
  const auto s = summarize_runs({ref, other}, 0, 2);
  ASSERT_EQ(s.size(), 2u);
  // Windowed over the last two logged values: iterations 90 and 100.
  EXPECT_NEAR(s[0].final_train_loss, 4.05, 1e-12);
  EXPECT_NEAR(s[1].final_train_loss, 5.0 - 0.8 * 0.95, 1e-12);
  EXPECT_EQ(s[0].train_vs_reference, 0);
  EXPECT_NEAR(s[1].train_vs_reference, (4.24 - 4.05) / 4.05, 1e-12);
  ASSERT_TRUE(s[1].val_vs_reference.has_value());
  EXPECT_NEAR(*s[1].val_vs_reference, (4.3 - 4.1) / 4.1, 1e-12);
  // The curves part the most at the end here.
  EXPECT_NEAR(s[1].max_train_gap, (4.24 - 4.05) / 4.05, 1e-12);
  EXPECT_EQ(s[0].max_train_gap, 0);
  const std::string table = format_run_summaries(s, 0);
  EXPECT_NE(table.find("(ref)"), std::string::npos) << table;
  EXPECT_NE(table.find("+4.69%"), std::string::npos) << table;  // 0.19 / 4.05
  EXPECT_NE(table.find("+4.88%"), std::string::npos) << table;  // 0.2 / 4.1
}

TEST(RunComparison, WritesTheFigure) {
  const fs::path d = scratch("figure");
  const RunLog a = read_run_log(write_log(scratch("fa"), 5.0, 1.0), "a");
  const RunLog b = read_run_log(write_log(scratch("fb"), 5.2, 1.1), "b");
  write_runs_figure(d / "curves.png", {a, b}, "two runs", 3);
  std::ifstream png(d / "curves.png", std::ios::binary);
  char magic[4] = {};
  png.read(magic, 4);
  EXPECT_EQ(std::string(magic + 1, 3), "PNG");
}

TEST(RunComparison, BadInputIsRefusedNamingTheFileAndLine) {
  auto refused = [](const fs::path& p, const std::string& expected) {
    try {
      (void)read_run_log(p, "x");
      ADD_FAILURE() << "accepted " << p;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  };
  const fs::path d = scratch("bad");
  refused(d, "the run directory holds no log.jsonl");
  std::ofstream(d / "log.jsonl") << "{\"iteration\":10,\"lm_loss\":5}\n{\"iteration\":20,\"lm_lo\n";
  refused(d, "log.jsonl line 2 is not a JSON object");
  std::ofstream(d / "log.jsonl") << "{\"iteration\":10,\"lm_loss\":\"five\"}\n";
  refused(d, "line 1: \"lm_loss\" is not a number");
  std::ofstream(d / "log.jsonl") << "{\"event\":\"start\"}\n";
  refused(d, "holds no training loss");
  const RunLog ok = read_run_log(write_log(scratch("ok"), 5.0, 1.0), "ok");
  try {
    (void)summarize_runs({ok}, 1, 1);
    ADD_FAILURE() << "a reference beyond the runs was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("reference run 2 is not among the 1 runs"), std::string::npos) << e.what();
  }
}

}  // namespace run_comparison_test
}  // namespace kiln::train
