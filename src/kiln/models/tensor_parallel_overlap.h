#pragma once
// --tp-comm-overlap: the sequence-parallel linears with their collectives cut into per-rank chunks
// that travel around the tensor-parallel ring while the GEMMs run on the chunks already there
// (TransformerEngine's userbuffers "ring exchange" overlap, which Megatron turns on with the same flag).
//
// Under sequence parallelism the blocking layers are (tensor_parallel_mappings.h)
//   column: all-gather the sequence, then one GEMM       backward: one GEMM, then reduce-scatter
//   row:    one GEMM, then reduce-scatter the sequence   backward: all-gather, then one GEMM
// so the GEMM waits for the whole collective or the collective for the whole GEMM. Here both are
// split along the sequence into tp chunks (chunk c: the positions rank c holds):
//   all-gather + GEMM: at step s rank r holds chunk (r - s) mod tp; it sends that chunk to rank
//     r + 1 and receives the next from rank r - 1 on a communication stream while the GEMM of the
//     chunk it holds runs; tp GEMMs, tp - 1 exchanges, each hidden behind a GEMM.
//   GEMM + reduce-scatter: the partial sum of chunk c starts on rank c + 1 and travels r -> r + 1,
//     each rank adding its own GEMM of that chunk, until it reaches rank c; the GEMM of step s runs
//     while the partial sum of step s - 1 is in flight.
// The weight gradient is one GEMM over the gathered tensor (saved in forward for the column layer,
// gathered chunk by chunk in backward for the row layer), deferred into the zero-bubble schedules'
// weight-gradient store like `linear`'s. The results equal the blocking layers' up to the order of
// the reduce-scatter's sums (a ring instead of the library's algorithm).
//
// x is batch-first [B, T, ...] (T / tp positions per rank where split, as Kiln's sequence-parallel
// activations are); weight [out, in] as `linear`'s. On CPUs the exchanges are MPI's non-blocking
// point-to-point calls; on GPUs NCCL's, on a side stream.
#include "kiln/dist/communicator.h"
#include "kiln/tensor/tensor.h"

namespace kiln::models {

// Column-parallel linear under sequence parallelism: x [B, T/tp, in] (this rank's positions) ->
// [B, T, out_r] = gather_from_sequence_parallel_region(x) W_r^T + b_r.
Tensor sequence_parallel_column_linear_overlapped(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                                  const dist::Communicator& tp);

// Row-parallel linear under sequence parallelism: x [B, T, in_r] -> [B, T/tp, out] =
// reduce_scatter_to_sequence_parallel_region(x W_r^T) (the bias is added by the caller).
Tensor sequence_parallel_row_linear_overlapped(const Tensor& x, const Tensor& weight, const dist::Communicator& tp);

}  // namespace kiln::models
