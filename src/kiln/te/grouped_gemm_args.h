#pragma once
// The experts' grouped GEMM (te/moe_ops.h's GroupedGemmKernel / GroupedGemmWgradKernel) as the
// arguments of one cuBLAS grouped call (cublasGemmGroupedBatchedEx), built on the host from the
// per-expert row offsets once they have been read back. Apart from the CUDA code so that the CPU
// tests can run what it builds (tests/te/grouped_gemm_args_test.cpp executes the arguments with a
// reference column-major GEMM and compares with the CPU kernels).
//
// cuBLAS is column-major: a row-major [a, b] matrix is its column-major b x a transpose, so each
// row-major product is computed as its transpose, and no operand is copied. Per expert e with
// rows lo .. lo + n (n > 0):
//   Forward  y_e [n, O] = x_e [n, K] W_e^T (w [E, O, K]):  C = y_e^T  (O x n)  = op_T(w_e) x_e^T,
//            m = O, n = n, k = K;  A = w_e (trans, lda K), B = x_e (lda K), C ldc O
//   TransW   y_e [n, O] = x_e [n, K] W_e   (w [E, K, O]):  C = y_e^T  (O x n)  = w_e^T x_e^T,
//            m = O, n = n, k = K;  A = w_e (lda O),        B = x_e (ldb K),   C ldc O
//   Wgrad    dw_e [O, K] = dy_e^T [O, n] x_e [n, K]:        C = dw_e^T (K x O) = x_e^T op_T(dy_e^T),
//            m = K, n = O, k = n;  A = x_e (lda K),        B = dy_e (trans, ldb O), C ldc K
// Problems of equal shape (m, n, k, transposes, leading dimensions) form one cuBLAS group: with
// capacity padding every expert has the same rows and the call has one group.
#include <cstdint>
#include <span>
#include <vector>

namespace kiln::te {

enum class GroupedProduct {
  Forward,  // operands (x [R, K], w [E, O, K]) -> y [R, O]
  TransW,   // operands (x [R, K], w [E, K, O]) -> y [R, O] (the data gradient)
  Wgrad,    // operands (dy [R, O], x [R, K])   -> dw [E, O, K]
};

// One cuBLAS group: group_size problems C (m x n, ldc) = op(A) (m x k) op(B) (k x n), column-major.
struct GemmGroup {
  bool trans_a = false, trans_b = false;
  std::int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  std::int64_t size = 0;
};

struct GroupedGemmArgs {
  std::vector<GemmGroup> groups;
  // Per problem, group-major (all of group 0's problems, then group 1's, ...): the element offsets of
  // A, B and C from their tensors' first elements. A and B are, per product: Forward / TransW: A in
  // w, B in x, C in y; Wgrad: A in x, B in dy, C in dw.
  std::vector<std::int64_t> a, b, c;
  // The expert of each problem (same order), for messages and tests.
  std::vector<std::int64_t> expert;
  // Wgrad: the experts without rows, whose dw the caller zeroes (cuBLAS gets no k = 0 problems).
  std::vector<std::int64_t> empty_experts;
  // Forward / TransW: offsets[E]; the caller zeroes the output rows from here on.
  std::int64_t used_rows = 0;

  std::size_t problems() const { return a.size(); }
  // Whether every dimension and leading dimension fits cuBLAS's 32-bit interface.
  bool fits_int32() const;
};

// offsets [E + 1] (0 <= offsets[0] <= ... <= offsets[E] <= rows, else a kiln::Error naming the
// offsets); kdim / odim as in the kernels' contracts: the K and O of x [R, K] and y [R, O] (Forward,
// TransW) or of dw [E, O, K] (Wgrad). K = 0 or O = 0 gives no problems: the outputs are then empty
// or (Forward / TransW with K = 0: an empty sum) zeros the caller writes.
GroupedGemmArgs grouped_gemm_args(GroupedProduct product, std::span<const std::int64_t> offsets, std::int64_t rows,
                                  std::int64_t kdim, std::int64_t odim);

}  // namespace kiln::te
