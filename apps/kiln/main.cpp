// `kiln`: the command-line entry point. Commands are thin: parse flags, call the library, print.
#include <cstdio>
#include <exception>

#include "commands.h"
#include "kiln/build_info.h"
#include "kiln/runtime/error.h"

int main(int argc, char** argv) {
  CLI::App app{"Kiln: tensors, training and HPC benchmarks on GPUs and CPUs"};
  app.set_version_flag("--version", std::string("kiln ") + kiln::build_info::version);
  app.require_subcommand(1);
  kiln::cli::add_check_device(app);
  kiln::cli::add_train_cifar10(app);
  kiln::cli::add_inference(app);
  kiln::cli::add_data_cifar10(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "kiln: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
