// A collective on a side stream overlapping GEMMs on the compute stream: the time of each alone
// and of both together, with CUDA events on the compute stream (medians of --reps runs). With full
// overlap `both` is close to max(gemm, collective); with none, to their sum. overlap_fraction is
// (gemm + collective - both) / min(gemm, collective): 1 fully hidden, 0 serialised.
//
// One process per GPU (NCCL needs a GPU of its own for each rank):
//   mpirun --allow-run-as-root -np 2 build/bench/bench_collective_overlap [--n 8192] [--gemms 4]
//       [--mib 1024] [--reps 10]
// A single process also runs. In a world of one NCCL's in-place all-reduce moves nothing (measured
// on the H200: 0.005 ms for 1 GiB), so there the collective is an out-of-place all-gather (NCCL
// copies the whole buffer with its kernels: real traffic on the side stream). --collective
// all_reduce|all_gather picks one explicitly.
// Prints JSON lines (rank 0).
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "bench_util.h"
#include "kiln/dist/communicator.h"
#include "kiln/ops/linalg.h"
#include "kiln/runtime/stream.h"
#include "kiln/tensor/collectives.h"
#include "kiln/tensor/tensor.h"

namespace {

long flag(int argc, char** argv, const char* name, long fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::strtol(argv[i + 1], nullptr, 10);
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kiln;
  dist::initialize(&argc, &argv);
  const dist::Communicator world = dist::Communicator::world();
  if (!bench::have_cuda()) return 0;
  const std::int64_t n = flag(argc, argv, "--n", 8192);
  const long gemms = flag(argc, argv, "--gemms", 4);
  const std::int64_t mib = flag(argc, argv, "--mib", 1024);
  const int reps = static_cast<int>(flag(argc, argv, "--reps", 10));
  std::string collective = world.size() > 1 ? "all_reduce" : "all_gather";
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--collective") == 0) collective = argv[i + 1];
  if (collective != "all_reduce" && collective != "all_gather") {
    std::fprintf(stderr, "bench_collective_overlap: --collective must be all_reduce or all_gather, got %s\n",
                 collective.c_str());
    return 2;
  }

  const Device d = Device::cuda(world.rank() % device_count(DeviceKind::CUDA));
  Backend& cuda = backend_for(d);
  world.use_device(d.index);
  const Stream side = Stream::from_pool(d, StreamPriority::High);

  // ops::gemm_into takes (batch, rows, cols) operands: one batch.
  Tensor a = Tensor::ones({1, n, n}, DType::BF16, d), b = Tensor::ones({1, n, n}, DType::BF16, d);
  Tensor c = Tensor::empty({1, n, n}, DType::BF16, d);
  Tensor grads = Tensor::ones({mib * 1024 * 1024 / 2}, DType::BF16, d);
  // The all-gather's output: world.size() blocks of the input's size.
  Tensor gathered =
      collective == "all_gather" ? Tensor::empty({world.size() * grads.numel()}, DType::BF16, d) : Tensor();
  auto start_collective = [&] {
    return collective == "all_reduce" ? dist::all_reduce(world, grads, dist::ReduceOp::Sum, side)
                                      : dist::all_gather(world, grads, gathered, side);
  };

  auto run_gemms = [&] {
    for (long i = 0; i < gemms; ++i) ops::gemm_into(a, b, c, false, false, 1.0, 0.0);
  };
  auto run_collective = [&] {
    dist::Work work = start_collective();
    work.wait();  // the compute stream waits for it (the host does not)
  };
  auto run_both = [&] {
    dist::Work work = start_collective();
    run_gemms();
    work.wait();
  };
  // Each timed on the compute stream, which waits for the side stream's collective before its stop.
  const double gemm_ms = bench::time_ms(d, run_gemms, 2, reps);
  const double comm_ms = bench::time_ms(d, run_collective, 2, reps);
  const double both_ms = bench::time_ms(d, run_both, 2, reps);
  const double overlap = (gemm_ms + comm_ms - both_ms) / std::min(gemm_ms, comm_ms);

  if (world.rank() == 0) {
    const double flops =
        2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(gemms);
    bench::emit({{"bench", "collective_overlap"},
                 {"ranks", world.size()},
                 {"device", cuda.properties(d.index).name},
                 {"gemm", fmt::format("{} x bf16 {}^3", gemms, n)},
                 {"collective", collective},
                 {"collective_mib", mib},
                 {"gemm_ms", gemm_ms},
                 {"gemm_tflops", flops / (gemm_ms * 1e9)},
                 {"collective_ms", comm_ms},
                 {"both_ms", both_ms},
                 {"sum_alone_ms", gemm_ms + comm_ms},
                 {"overlap_fraction", overlap}});
  }
  return 0;
}
