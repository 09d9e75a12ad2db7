// Module::load wraps the state-dict error with the file's name: the message a user sees names the
// file and the mismatch once, with no source location inside it (the `kiln` CLI shows message()).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "kiln/nn/nn.h"
#include "kiln/runtime/located_error.h"

namespace kiln {
namespace module_load_error_test {

TEST(ModuleLoadError, NamesTheFileAndHasOneLocation) {
  std::string path = (std::filesystem::temp_directory_path() / "kiln_module_load_error_test.safetensors").string();
  nn::Linear(4, 2).save(path);
  nn::Linear wrong(3, 2);
  try {
    wrong.load(path);
    ADD_FAILURE() << "loading a 4-input Linear's weights into a 3-input one did not fail";
  } catch (const Error& e) {
    const std::string message = error_message(e);
    EXPECT_EQ(message.rfind("loading " + path + ": ", 0), 0u) << message;
    EXPECT_NE(message.find("size mismatch for weight"), std::string::npos) << message;
    EXPECT_EQ(message.find(".cpp:"), std::string::npos) << message;  // the inner location is dropped
    const std::string full = e.what();
    EXPECT_NE(full.find("(kiln/nn/module.cpp:"), std::string::npos) << full;
  }
  std::filesystem::remove(path);
}

}  // namespace module_load_error_test
}  // namespace kiln
