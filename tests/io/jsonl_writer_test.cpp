#include "kiln/io/jsonl_writer.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "io_test_util.h"

namespace kiln::io {
namespace jsonl_writer_test {

std::vector<nlohmann::json> read_lines(const std::filesystem::path& file) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(testing::read_all(file));
  std::string line;
  while (std::getline(in, line)) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

TEST(JsonlWriter, WritesOneFlushedObjectPerLineAndAppends) {
  auto file = testing::scratch_dir() / "logs" / "metrics.jsonl";
  {
    JsonlWriter log(file);
    log.write({{"epoch", 1}, {"loss", 1.5}, {"note", "two\nlines"}});
    // Flushed per line: readable before the writer closes.
    auto lines = read_lines(file);
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_EQ(lines[0]["note"], "two\nlines");
    log.write({{"epoch", 2}, {"loss", 1.25}});
  }
  {
    JsonlWriter log(file);  // a resumed run keeps the earlier lines
    log.write({{"epoch", 3}});
  }
  auto lines = read_lines(file);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[1]["loss"], 1.25);
  EXPECT_EQ(lines[2]["epoch"], 3);

  JsonlWriter fresh(file, JsonlWriter::Mode::Truncate);
  fresh.write({{"epoch", 1}});
  EXPECT_EQ(read_lines(file).size(), 1u);
}

TEST(JsonlWriter, RejectsAnythingButAnObject) {
  auto file = testing::scratch_dir() / "m.jsonl";
  JsonlWriter log(file);
  auto message = testing::error_of([&] { log.write(nlohmann::json::array({1, 2})); });
  EXPECT_CONTAINS(message, "m.jsonl");
  EXPECT_CONTAINS(message, "must be a JSON object, got array");
}

}  // namespace jsonl_writer_test
}  // namespace kiln::io
