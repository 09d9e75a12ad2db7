# Command-line mistakes get messages that name the wrong word, where it is and what was meant, with a
# non-zero exit; library errors show the message alone, the source location only with --verbose.
# (Regexes match whole lines; '.' stands for the ';' in "; did you mean", which CMake lists split on.)

# An unknown command names the word, suggests the closest command and lists them all.
kiln_add_cli_test(NAME cli.unknown_command_suggests EXIT 106 LABELS cli
  LINE [=[kiln: error: unknown command 'trian-cifar10'. did you mean 'train-cifar10'\?]=]
  LINE [=[the commands are: check-device, train-cifar10, .*hpl, hpcg.* \(kiln --help describes them\)]=]
  ABSENT "A subcommand is required"
  COMMAND kiln_cli trian-cifar10 --epochs 1)
kiln_add_cli_test(NAME cli.unknown_command_prefix_suggests EXIT 106 LABELS cli
  LINE [=[kiln: error: unknown command 'train'. did you mean 'train-cifar10'\?]=]
  COMMAND kiln_cli train)
# Under a command that has commands of its own.
kiln_add_cli_test(NAME cli.unknown_nested_command_suggests EXIT 106 LABELS cli
  LINE [=[kiln data: error: unknown command 'cifar'. did you mean 'cifar10'\?]=]
  LINE [=[the commands are: cifar10, tokenizers.* \(kiln data --help describes them\)]=]
  COMMAND kiln_cli data cifar)
# A word nothing is close to: no guess, still the list.
kiln_add_cli_test(NAME cli.unknown_command_without_guess EXIT 106 LABELS cli
  LINE [=[kiln: error: unknown command 'xyzzy']=]
  LINE [=[the commands are: check-device, .*]=]
  COMMAND kiln_cli xyzzy)
kiln_add_cli_test(NAME cli.missing_command_lists_them EXIT 106 LABELS cli
  LINE [=[kiln: error: a command is required, one of: check-device, train-cifar10, .* \(kiln --help describes them\)]=]
  COMMAND kiln_cli)

# A misspelt flag gets the closest flag of that command; nothing runs.
kiln_add_cli_test(NAME cli.misspelt_flag_suggests EXIT 109 LABELS cli
  LINE [=[kiln train-cifar10: error: unknown option '--epoch'. did you mean '--epochs'\? \(kiln train-cifar10 --help lists the options\)]=]
  COMMAND kiln_cli train-cifar10 --epoch 1)
kiln_add_cli_test(NAME cli.misspelt_flag_with_value_suggests EXIT 109 LABELS cli
  LINE [=[kiln hpl: error: unknown option '--dept'. did you mean '--depth'\? \(kiln hpl --help lists the options\)]=]
  COMMAND kiln_cli hpl --n 100 --dept=1)
kiln_add_cli_test(NAME cli.unknown_flag_without_guess EXIT 109 LABELS cli
  LINE [=[kiln hpl: error: unknown option '--frobnicate' \(kiln hpl --help lists the options\)]=]
  COMMAND kiln_cli hpl --frobnicate)
kiln_add_cli_test(NAME cli.unexpected_argument_named EXIT 109 LABELS cli
  LINE [=[kiln check-device: error: unexpected argument 'extra' \(kiln check-device --help lists the options\)]=]
  COMMAND kiln_cli check-device extra)

# `kiln hpl` flags go through the HPL.dat parser: a bad value names the flag, not "HPL.dat line 25",
# and the message comes without the source file and line...
set(_mpi_env "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
kiln_add_cli_test(NAME cli.hpl_flag_error_names_flag EXIT 1 LABELS "cli;hpl" ENVIRONMENT ${_mpi_env}
  LINE [=[kiln: error: kiln hpl --depth: DEPTHs 2 is out of range \[0, 1\]]=]
  ABSENT "HPL.dat" ABSENT [=[\.(cpp|h|cu):[0-9]+]=]
  COMMAND kiln_cli hpl --n 100 --depth 2)
kiln_add_cli_test(NAME cli.hpl_flag_error_names_flag_n EXIT 1 LABELS "cli;hpl" ENVIRONMENT ${_mpi_env}
  LINE [=[kiln: error: kiln hpl --n: Ns 0 is out of range \[1, [0-9]+\]]=]
  COMMAND kiln_cli hpl --n 0)
# ...which --verbose (before or after the command) or KILN_VERBOSE=1 adds, relative to the checkout.
kiln_add_cli_test(NAME cli.verbose_error_has_location EXIT 1 LABELS "cli;hpl" ENVIRONMENT ${_mpi_env}
  LINE [=[kiln: error: kiln hpl --depth: DEPTHs 2 is out of range \[0, 1\] \(kiln/hpc/hpl/hpl_params\.cpp:[0-9]+\)]=]
  COMMAND kiln_cli hpl --n 100 --depth 2 --verbose)
kiln_add_cli_test(NAME cli.verbose_before_command EXIT 1 LABELS "cli;hpl" ENVIRONMENT ${_mpi_env}
  LINE [=[kiln: error: kiln hpl --depth: DEPTHs 2 is out of range \[0, 1\] \(kiln/hpc/hpl/hpl_params\.cpp:[0-9]+\)]=]
  COMMAND kiln_cli --verbose hpl --n 100 --depth 2)
kiln_add_cli_test(NAME cli.verbose_from_environment EXIT 1 LABELS "cli;hpl"
  ENVIRONMENT "${_mpi_env};KILN_VERBOSE=1"
  LINE [=[kiln: error: kiln hpl --depth: DEPTHs 2 is out of range \[0, 1\] \(kiln/hpc/hpl/hpl_params\.cpp:[0-9]+\)]=]
  COMMAND kiln_cli hpl --n 100 --depth 2)
# An HPL.dat's own errors still name the file and the line.
kiln_add_cli_test(NAME cli.hpl_dat_error_names_file_line EXIT 1 LABELS "cli;hpl" ENVIRONMENT ${_mpi_env}
  LINE [=[kiln: error: .*HPL_bad_nb\.dat line 8: NBs '12x' is not an integer]=]
  COMMAND kiln_cli hpl --dat ${PROJECT_SOURCE_DIR}/tests/hpl/HPL_bad_nb.dat)
