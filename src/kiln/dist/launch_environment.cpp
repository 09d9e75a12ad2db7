#include "kiln/dist/launch_environment.h"

#include <charconv>
#include <cstdlib>
#include <string_view>

namespace kiln::dist {

namespace {

// The whole-number value of `name`, or nullopt when it is unset or not a number >= 0.
std::optional<int> env_int(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr) return std::nullopt;
  const std::string_view s(text);
  int value = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size() || value < 0) return std::nullopt;
  return value;
}

}  // namespace

std::optional<LaunchPosition> launch_position_from_environment() {
  struct Names {
    const char *rank, *size, *local_rank;
  };
  // Open MPI's mpirun; PMIx (srun --mpi=pmix) and PMI-2 / Hydra carry no local rank of their own,
  // where Slurm's SLURM_LOCALID or MPI_LOCALRANKID (MPICH) gives it.
  constexpr Names kLaunchers[] = {
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
      {"PMIX_RANK", "PMIX_SIZE", "SLURM_LOCALID"},
      {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
  };
  for (const Names& n : kLaunchers) {
    const auto rank = env_int(n.rank);
    if (!rank) continue;
    LaunchPosition p;
    p.rank = *rank;
    p.size = env_int(n.size).value_or(env_int("SLURM_NTASKS").value_or(1));
    p.local_rank = env_int(n.local_rank).value_or(env_int("SLURM_LOCALID").value_or(0));
    return p;
  }
  if (std::getenv("SLURM_STEP_ID") != nullptr) {
    if (const auto rank = env_int("SLURM_PROCID")) {
      return LaunchPosition{.rank = *rank,
                            .size = env_int("SLURM_NTASKS").value_or(1),
                            .local_rank = env_int("SLURM_LOCALID").value_or(0)};
    }
  }
  return std::nullopt;
}

}  // namespace kiln::dist
