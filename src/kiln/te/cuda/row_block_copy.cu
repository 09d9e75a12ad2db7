#include "kiln/runtime/error.h"
#include "kiln/te/cuda/row_block_copy.h"

namespace kiln::te::cuda {

namespace {

// Kernel parameters are limited to 4 KiB: 160 jobs of 24 bytes and the count fit.
constexpr int kJobsPerLaunch = 160;
struct Jobs {
  RowBlockCopy job[kJobsPerLaunch];
  int count;
};
static_assert(sizeof(Jobs) + 2 * sizeof(std::int64_t) <= 4096);

// One block per (job, row); its threads copy the row in 4-byte words (rows are whole words).
__global__ void copy_row_blocks_kernel(Jobs jobs, std::int64_t row_words, std::int64_t max_rows) {
  const std::int64_t flat = blockIdx.x;
  const int j = static_cast<int>(flat / max_rows);
  const std::int64_t r = flat % max_rows;
  if (j >= jobs.count || r >= jobs.job[j].rows) return;
  const auto* src = static_cast<const std::uint32_t*>(jobs.job[j].src) + r * row_words;
  auto* dst = static_cast<std::uint32_t*>(jobs.job[j].dst) + r * row_words;
  for (std::int64_t i = threadIdx.x; i < row_words; i += blockDim.x) dst[i] = src[i];
}

}  // namespace

void copy_row_blocks(const std::vector<RowBlockCopy>& jobs, std::int64_t cols, std::size_t element_size,
                     cudaStream_t stream) {
  const std::int64_t bytes = cols * static_cast<std::int64_t>(element_size);
  KILN_CHECK(bytes % 4 == 0, "copy_row_blocks: a row of {} bytes is not whole 4-byte words", bytes);
  for (std::size_t done = 0; done < jobs.size(); done += kJobsPerLaunch) {
    Jobs chunk{};
    const std::size_t n = jobs.size() - done < kJobsPerLaunch ? jobs.size() - done : kJobsPerLaunch;
    std::int64_t max_rows = 0;
    for (std::size_t i = 0; i < n; ++i) {
      chunk.job[i] = jobs[done + i];
      max_rows = chunk.job[i].rows > max_rows ? chunk.job[i].rows : max_rows;
    }
    chunk.count = static_cast<int>(n);
    if (max_rows == 0) continue;
    const std::int64_t blocks = static_cast<std::int64_t>(n) * max_rows;
    copy_row_blocks_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(chunk, bytes / 4, max_rows);
    KILN_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace kiln::te::cuda
