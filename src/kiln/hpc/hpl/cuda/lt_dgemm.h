#pragma once
// The trailing update's DGEMM through cuBLASLt with one chosen kernel configuration (algorithm,
// tile, stages), for comparing configurations inside a real HPL run: under the H200's power cap
// the DGEMM's rate depends on how much energy a configuration spends per flop, which
// cublasDgemm's heuristic does not model. `kiln hpl --peer update-algos` lists the candidates.
//
// Host code only: include kiln/runtime/vendor/cuda.h first.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace kiln::hpl::cuda {

struct LtConfig {
  int algo = 0;
  std::uint32_t tile = 0, stages = 0;
  // "ALGO:TILE:STAGES", as `--peer update-algos` prints them; nullopt for anything else.
  static std::optional<LtConfig> parse(const std::string& text);
};

class LtDgemm {
 public:
  LtDgemm(LtConfig config, cudaStream_t stream, void* workspace, std::size_t workspace_bytes);
  ~LtDgemm();
  LtDgemm(const LtDgemm&) = delete;
  LtDgemm& operator=(const LtDgemm&) = delete;
  // C = alpha A B + beta C, all column-major, no transposes (A: m x k, B: k x n). Returns false,
  // doing nothing, when the configuration does not support this shape (the caller falls back).
  bool run(long m, long n, long k, double alpha, const double* a, long lda, const double* b, long ldb, double beta,
           double* c, long ldc);

 private:
  LtConfig config_;
  cudaStream_t stream_;
  void* workspace_;
  std::size_t workspace_bytes_;
  cublasLtHandle_t handle_ = nullptr;
  cublasLtMatmulDesc_t desc_ = nullptr;
};

}  // namespace kiln::hpl::cuda
