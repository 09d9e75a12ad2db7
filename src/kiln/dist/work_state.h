#pragma once
// Work's state, for the files that start collectives (collectives_*.cpp). Not for use outside dist/.
#include <mpi.h>

#include <cstddef>
#include <functional>
#include <optional>
#include <vector>

#include "kiln/dist/work.h"

namespace kiln::dist {

struct Work::State {
  Device device = Device::cpu();
  std::optional<Event> event;  // device work: recorded at the start; host work: on completion
  // Host work: MPI's requests, then the steps that finish the call once they are done.
  std::vector<MPI_Request> requests;
  std::vector<std::function<void()>> finish;
  // Memory the transfer uses until it completes (f32 copies of reduced-precision data, gathered
  // blocks, MPI's count and displacement arrays).
  std::vector<std::vector<std::byte>> scratch;
  std::vector<std::vector<int>> int_arrays;
  bool completed = false;

  std::byte* scratch_bytes(std::size_t bytes) {
    scratch.emplace_back(bytes);
    return scratch.back().data();
  }
  int* ints(std::vector<int> values) {
    int_arrays.push_back(std::move(values));
    return int_arrays.back().data();
  }
};

}  // namespace kiln::dist
