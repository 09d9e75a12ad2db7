// The reference engine: the ComputeX_ref twins on the reference's data structure, behind the
// Engine interface, so `--kernels ref` runs the whole benchmark with the reference's kernels.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kiln/hpc/hpcg/engine.h"
#include "kiln/hpc/hpcg/reference.h"
#include "kiln/runtime/error.h"

namespace kiln::hpcg {

namespace {

std::span<double> whole(Vector& v) { return {v.data(), v.size()}; }
std::span<const double> whole(const Vector& v) { return {v.data(), v.size()}; }

class ReferenceEngine final : public Engine {
 public:
  ReferenceEngine(std::vector<Geometry> levels, dist::Communicator comm) : Engine(levels, std::move(comm)) {
    std::vector<std::int64_t> nonzeros;
    for (std::size_t l = 0; l < levels.size(); ++l) {
      const Geometry* coarse = l + 1 < levels.size() ? &levels[l + 1] : nullptr;
      matrices_.push_back(generate_ref_matrix(levels[l], coarse));
      nonzeros.push_back(matrices_.back().local_nonzeros);
      ax_.push_back(Vector(Device::cpu(), static_cast<std::size_t>(matrices_.back().layout.ncol)));
    }
    set_global_nonzeros(nonzeros);
  }

  std::string name() const override { return "reference"; }
  Device device() const override { return Device::cpu(); }
  bool natural_order_only() const override { return true; }
  int local_columns(int level) const override { return A(level).layout.ncol; }
  double matrix_bytes() const override {
    double bytes = 0;
    for (const auto& m : matrices_)
      bytes += static_cast<double>(m.values.size() * 8 + m.columns.size() * 4 + m.nonzeros_in_row.size() +
                                   m.diagonal.size() * 4 + m.fine_of_coarse.size() * 4);
    return bytes;
  }

  void upload(std::span<const double> natural, Vector& v, int level) override {
    KILN_CHECK(natural.size() == static_cast<std::size_t>(local_rows(level)), "hpcg upload: {} values for {} rows",
               natural.size(), local_rows(level));
    std::copy(natural.begin(), natural.end(), v.data());
  }
  std::vector<double> download(const Vector& v, int level) override { return {v.data(), v.data() + local_rows(level)}; }
  void rhs(Vector& b) override { std::copy(A(0).rhs.begin(), A(0).rhs.end(), b.data()); }
  void fill(Vector& v, int, double value) override { std::fill(v.data(), v.data() + v.size(), value); }
  void copy(const Vector& from, Vector& to, int level) override {
    std::copy(from.data(), from.data() + local_rows(level), to.data());
  }

  void exaggerate_diagonal(Vector& b) override {
    auto& M = matrices_[0];
    saved_diagonal_.resize(static_cast<std::size_t>(M.layout.nrow));
    for (int k = 0; k < M.layout.nz; ++k)
      for (int j = 0; j < M.layout.ny; ++j)
        for (int i = 0; i < M.layout.nx; ++i) {
          auto row = static_cast<std::size_t>(local_index(M.layout, i, j, k));
          double scale = diagonal_exaggeration(global_row(M.layout, i, j, k));
          double& d = M.values[row * kStencil + static_cast<std::size_t>(M.diagonal[row])];
          saved_diagonal_[row] = d;
          d *= scale;
          b.data()[row] *= scale;
        }
  }
  void restore_diagonal() override {
    auto& M = matrices_[0];
    for (std::size_t row = 0; row < saved_diagonal_.size(); ++row)
      M.values[row * kStencil + static_cast<std::size_t>(M.diagonal[row])] = saved_diagonal_[row];
  }

 protected:
  void spmv(int level, Vector& x, Vector& y) override { compute_spmv_ref(A(level), whole(x), whole(y)); }
  void symgs(int level, const Vector& r, Vector& x, Ordering, bool) override {
    compute_symgs_ref(A(level), whole(r), whole(x));
  }
  void residual_restriction(int level, const Vector& r, Vector& x, Vector& rc) override {
    auto& ax = ax_[static_cast<std::size_t>(level)];
    compute_spmv_ref(A(level), whole(x), whole(ax));
    compute_restriction_ref(A(level), whole(r), whole(ax), whole(rc));
  }
  void prolongation(int level, const Vector& xc, Vector& x) override {
    compute_prolongation_ref(A(level), whole(xc), whole(x));
  }
  double local_dot(int level, const Vector& x, const Vector& y) override {
    return compute_dot_product_ref(local_rows(level), whole(x), whole(y));
  }
  void waxpby(int level, double alpha, const Vector& x, double beta, const Vector& y, Vector& w) override {
    compute_waxpby_ref(local_rows(level), alpha, whole(x), beta, whole(y), whole(w));
  }
  double local_max_abs_difference(const Vector& a, const Vector& b, int level) override {
    double m = 0.0;
    for (int i = 0; i < local_rows(level); ++i) m = std::max(m, std::fabs(a.data()[i] - b.data()[i]));
    return m;
  }

 private:
  const RefMatrix& A(int level) const { return matrices_[static_cast<std::size_t>(level)]; }
  std::vector<RefMatrix> matrices_;
  std::vector<Vector> ax_;
  std::vector<double> saved_diagonal_;
};

}  // namespace

std::unique_ptr<Engine> make_reference_engine(std::vector<Geometry> levels, dist::Communicator comm) {
  return std::make_unique<ReferenceEngine>(std::move(levels), std::move(comm));
}

}  // namespace kiln::hpcg
