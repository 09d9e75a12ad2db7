// `kiln`: the command-line entry point. Commands are thin: parse flags, call the library, print.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string_view>

#include "commands.h"
#include "kiln/build_info.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/located_error.h"
#include "usage_errors.h"

namespace {

// Error lines carry the source file and line of the check that failed only when asked for:
// `--verbose` anywhere on the command line, or KILN_VERBOSE set to anything but "" or "0".
bool verbose_errors(const CLI::Option* verbose_flag) {
  if (verbose_flag->count() > 0) return true;
  const char* env = std::getenv("KILN_VERBOSE");
  return env != nullptr && std::string_view(env) != "" && std::string_view(env) != "0";
}

int report(const std::exception& e, bool verbose) {
  std::fprintf(stderr, "kiln: error: %s\n", kiln::error_message(e, verbose).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Kiln: tensors, training and HPC benchmarks on GPUs and CPUs"};
  app.set_version_flag("--version", std::string("kiln ") + kiln::build_info::version);
  auto* verbose =
      app.add_flag("--verbose")
          ->description(
              "error messages also name the source file and line of the check that failed (or set KILN_VERBOSE=1); "
              "accepted before or after the command");
  // Subcommands inherit this (it must precede them): options they do not know go to the main
  // command, so `kiln hpl --verbose ...` works as well as `kiln --verbose hpl ...`.
  app.fallthrough();
  app.require_subcommand(1);
  kiln::cli::add_check_device(app);
  kiln::cli::add_train_cifar10(app);
  kiln::cli::add_inference(app);
  kiln::cli::add_data_cifar10(app);
  kiln::cli::add_data_tokenizers(app);
  kiln::cli::add_data_english_corpus(app);
  kiln::cli::add_preprocess_data(app);
  kiln::cli::add_inspect_data(app);
  kiln::cli::add_pretrain_gpt(app);
  kiln::cli::add_simulate(app);
  kiln::cli::add_compare_runs(app);
  kiln::cli::add_generate(app);
  kiln::cli::add_export_hf(app);
  kiln::cli::add_import_hf(app);
  kiln::cli::add_hpl(app);
  kiln::cli::add_hpcg(app);
  kiln::cli::add_mdrun(app);
  kiln::cli::add_launch(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);  // --help, --version
  } catch (const CLI::RuntimeError& e) {
    return e.get_exit_code();  // a command's own exit status (HPL's failed residual checks)
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "%s\n", kiln::cli::usage_error_message(app, e, argc, argv).c_str());
    return e.get_exit_code();
  } catch (const std::exception& e) {
    return report(e, verbose_errors(verbose));
  }
  return 0;
}
