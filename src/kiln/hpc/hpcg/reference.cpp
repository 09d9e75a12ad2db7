#include "kiln/hpc/hpcg/reference.h"

#include "kiln/runtime/error.h"

namespace kiln::hpcg {

RefMatrix generate_ref_matrix(const Geometry& g, const Geometry* coarse) {
  RefMatrix A;
  A.layout = make_layout(g, /*colored=*/false);
  A.halo = plan_halo(g, A.layout);
  const auto& L = A.layout;
  std::size_t n = static_cast<std::size_t>(L.nrow);
  A.nonzeros_in_row.assign(n, 0);
  A.columns.assign(n * kStencil, 0);
  A.values.assign(n * kStencil, 0.0);
  A.diagonal.assign(n, 0);
  A.rhs.assign(n, 0.0);
  for (int k = 0; k < L.nz; ++k)
    for (int j = 0; j < L.ny; ++j)
      for (int i = 0; i < L.nx; ++i) {
        int row = local_index(L, i, j, k);
        std::size_t base = static_cast<std::size_t>(row) * kStencil;
        int count = 0;
        for (int dz = -1; dz <= 1; ++dz)
          for (int dy = -1; dy <= 1; ++dy)
            for (int dx = -1; dx <= 1; ++dx) {
              int col = neighbor_column(L, i, j, k, dx, dy, dz);
              if (col < 0) continue;
              bool diagonal = dx == 0 && dy == 0 && dz == 0;
              if (diagonal) A.diagonal[static_cast<std::size_t>(row)] = count;
              A.columns[base + count] = col;
              A.values[base + count] = diagonal ? 26.0 : -1.0;
              ++count;
            }
        A.nonzeros_in_row[static_cast<std::size_t>(row)] = static_cast<std::uint8_t>(count);
        A.rhs[static_cast<std::size_t>(row)] = 26.0 - (count - 1);
        A.local_nonzeros += count;
      }
  if (coarse) {
    LevelLayout C = make_layout(*coarse, false);
    A.fine_of_coarse.resize(static_cast<std::size_t>(C.nrow));
    for (int k = 0; k < C.nz; ++k)
      for (int j = 0; j < C.ny; ++j)
        for (int i = 0; i < C.nx; ++i)
          A.fine_of_coarse[static_cast<std::size_t>(local_index(C, i, j, k))] = local_index(L, 2 * i, 2 * j, 2 * k);
  }
  return A;
}

void exchange_halo_ref(const RefMatrix& A, std::span<double> x) {
  if (A.halo.peers.empty()) return;
  std::vector<double> send(A.halo.send_rows.size());
  for (std::size_t s = 0; s < send.size(); ++s) send[s] = x[static_cast<std::size_t>(A.halo.send_rows[s])];
  std::span<double> halo =
      x.subspan(static_cast<std::size_t>(A.layout.nrow), static_cast<std::size_t>(A.halo.halo_size));
  dist::HaloExchange(dist::Communicator::world(), A.halo.peers).exchange(send, halo);
}

void compute_spmv_ref(const RefMatrix& A, std::span<double> x, std::span<double> y) {
  KILN_CHECK(x.size() >= static_cast<std::size_t>(A.layout.ncol), "compute_spmv_ref: x has {} of {} values", x.size(),
             A.layout.ncol);
  exchange_halo_ref(A, x);
  for (int i = 0; i < A.layout.nrow; ++i) {
    std::size_t base = static_cast<std::size_t>(i) * kStencil;
    double sum = 0.0;
    for (int j = 0; j < A.nonzeros_in_row[static_cast<std::size_t>(i)]; ++j)
      sum += A.values[base + j] * x[static_cast<std::size_t>(A.columns[base + j])];
    y[static_cast<std::size_t>(i)] = sum;
  }
}

namespace {
void symgs_row(const RefMatrix& A, std::span<const double> r, std::span<double> x, int i) {
  std::size_t base = static_cast<std::size_t>(i) * kStencil;
  double diagonal = A.values[base + A.diagonal[static_cast<std::size_t>(i)]];
  double sum = r[static_cast<std::size_t>(i)];
  for (int j = 0; j < A.nonzeros_in_row[static_cast<std::size_t>(i)]; ++j)
    sum -= A.values[base + j] * x[static_cast<std::size_t>(A.columns[base + j])];
  sum += x[static_cast<std::size_t>(i)] * diagonal;  // the loop also took the diagonal term away
  x[static_cast<std::size_t>(i)] = sum / diagonal;
}
}  // namespace

void compute_symgs_ref(const RefMatrix& A, std::span<const double> r, std::span<double> x) {
  exchange_halo_ref(A, x);
  for (int i = 0; i < A.layout.nrow; ++i) symgs_row(A, r, x, i);
  for (int i = A.layout.nrow - 1; i >= 0; --i) symgs_row(A, r, x, i);
}

void compute_restriction_ref(const RefMatrix& A, std::span<const double> r, std::span<const double> ax,
                             std::span<double> rc) {
  for (std::size_t c = 0; c < A.fine_of_coarse.size(); ++c) {
    auto f = static_cast<std::size_t>(A.fine_of_coarse[c]);
    rc[c] = r[f] - ax[f];
  }
}

void compute_prolongation_ref(const RefMatrix& A, std::span<const double> xc, std::span<double> x) {
  for (std::size_t c = 0; c < A.fine_of_coarse.size(); ++c) x[static_cast<std::size_t>(A.fine_of_coarse[c])] += xc[c];
}

double compute_dot_product_ref(int n, std::span<const double> x, std::span<const double> y) {
  double sum = 0.0;
  for (int i = 0; i < n; ++i) sum += x[static_cast<std::size_t>(i)] * y[static_cast<std::size_t>(i)];
  return sum;
}

void compute_waxpby_ref(int n, double alpha, std::span<const double> x, double beta, std::span<const double> y,
                        std::span<double> w) {
  for (int i = 0; i < n; ++i) {
    auto k = static_cast<std::size_t>(i);
    w[k] = alpha * x[k] + beta * y[k];
  }
}

}  // namespace kiln::hpcg
