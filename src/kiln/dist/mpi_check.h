#pragma once
// dist's check of an MPI call's return code: anything but MPI_SUCCESS throws kiln::Error naming
// the call and MPI's own text for the code. For dist's sources (the ones that call MPI).
#include <mpi.h>

#include <string>

#include "kiln/runtime/error.h"

namespace kiln::dist::detail {

inline void check_mpi(int rc, const char* call, const char* file, int line) {
  if (rc == MPI_SUCCESS) [[likely]]
    return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  ::kiln::detail::throw_error(fmt::format("MPI error in {}: {}", call, std::string(text, len)), file, line);
}

}  // namespace kiln::dist::detail

#define KILN_MPI_CHECK(call) ::kiln::dist::detail::check_mpi((call), #call, __FILE__, __LINE__)
