// The CUDA engine: the optimised CPU engine's layout and algorithms as GPU kernels, everything on
// the device during the timed phase (the host only reads back dot products).
//  - matrix: sliced ELL, 32-row slices x 27 slots, 8-byte values and 4-byte columns, generated on
//    the device from the layout (generate_row), rows in coloured order;
//  - SymGS: one kernel per colour, forward 0..7 then backward 7..0; the natural-order twin runs
//    the reference's sweep as wavefronts (one kernel per wave) for the reference CG phase;
//  - the fine residual is computed only at the points restriction injects (an eighth of the rows);
//  - the CG update x += a p, r -= a Ap and r.r are one pass; dot products reduce in a fixed order,
//    so repeated runs give identical residuals.
#include <algorithm>
#include <cmath>
#include <utility>

#include "kiln/hpc/hpcg/cuda/kernels.h"
#include "kiln/hpc/hpcg/engine.h"
#include "kiln/hpc/hpcg/optimized_plan.h"
#include "kiln/runtime/backend.h"
#include "kiln/runtime/cuda/cuda_context.h"
#include "kiln/runtime/cuda/device_array.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/vendor/cuda.h"

namespace kiln::hpcg {

namespace {

// ---- the engine --------------------------------------------------------------------------------

struct GpuLevel {
  OptimizedPlan plan;  // host side: layouts and halo peers
  DeviceArray<double> values;
  DeviceArray<int> columns;
  DeviceArray<int> coarse_of_injected;
  DeviceArray<int> wave_rows;  // the natural-order sweep's schedule, built on first use
  std::vector<int> wave_start;
  DeviceArray<int> send_rows;
  DeviceArray<double> send_buffer;
  std::vector<double> host_send, host_recv;
};

class CudaEngine final : public Engine {
 public:
  CudaEngine(std::vector<Geometry> levels, dist::Communicator comm, int device)
      : Engine(levels, std::move(comm)), device_(device) {
    KILN_CHECK(device >= 0 && device < device_count(DeviceKind::CUDA), "hpcg: no CUDA device {}", device);
    DeviceGuard guard(device_);
    stream_ = cuda_stream(device_);
    std::vector<std::int64_t> nonzeros;
    for (std::size_t l = 0; l < levels.size(); ++l) {
      GpuLevel g;
      g.plan = plan_optimized_level(levels[l], l + 1 < levels.size() ? &levels[l + 1] : nullptr);
      const auto& L = g.plan.layout;
      auto size = static_cast<std::size_t>(ell_size(L.nrow));
      g.values = DeviceArray<double>(device_, size);
      g.columns = DeviceArray<int>(device_, size);
      if (l == 0) rhs_ = Vector(Device::cuda(device_), static_cast<std::size_t>(L.ncol));
      gpu::generate(L, g.values.data(), g.columns.data(), l == 0 ? rhs_.data() : nullptr, stream_);
      KILN_CUDA_CHECK_LAUNCH();
      g.coarse_of_injected = DeviceArray<int>(device_, static_cast<std::size_t>(g.plan.injected_count));
      if (g.plan.injected_count > 0) {
        gpu::fill_coarse_of_injected(g.plan.coarse, g.plan.injected_count, g.coarse_of_injected.data(), stream_);
        KILN_CUDA_CHECK_LAUNCH();
      }
      g.send_rows = upload_ints(g.plan.halo.send_rows);
      g.send_buffer = DeviceArray<double>(device_, g.plan.halo.send_rows.size());
      g.host_send.resize(g.plan.halo.send_rows.size());
      g.host_recv.resize(static_cast<std::size_t>(g.plan.halo.halo_size));
      nonzeros.push_back(count_local_nonzeros(L));
      levels_.push_back(std::move(g));
    }
    partial_ = DeviceArray<double>(device_, gpu::kReduceBlocks);
    scalar_ = DeviceArray<double>(device_, 1);
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));
    set_global_nonzeros(nonzeros);
  }

  std::string name() const override { return "cuda"; }
  Device device() const override { return Device::cuda(device_); }
  int local_columns(int level) const override { return at(level).plan.layout.ncol; }
  double matrix_bytes() const override {
    double bytes = 0;
    for (const auto& g : levels_)
      bytes += static_cast<double>(g.values.size() * 8 + g.columns.size() * 4 + g.coarse_of_injected.size() * 4 +
                                   g.wave_rows.size() * 4);
    return bytes;
  }

  void upload(std::span<const double> natural, Vector& v, int level) override {
    const auto& L = at(level).plan.layout;
    KILN_CHECK(natural.size() == static_cast<std::size_t>(L.nrow), "hpcg upload: {} values for {} rows", natural.size(),
               L.nrow);
    std::vector<double> ordered(static_cast<std::size_t>(L.nrow));
    for (int k = 0, n = 0; k < L.nz; ++k)
      for (int j = 0; j < L.ny; ++j)
        for (int i = 0; i < L.nx; ++i, ++n)
          ordered[static_cast<std::size_t>(local_index(L, i, j, k))] = natural[static_cast<std::size_t>(n)];
    backend_for(device()).copy_from_host(v.data(), ordered.data(), ordered.size() * sizeof(double), device_);
  }
  std::vector<double> download(const Vector& v, int level) override {
    const auto& L = at(level).plan.layout;
    std::vector<double> ordered(static_cast<std::size_t>(L.nrow)), out(ordered.size());
    backend_for(device()).copy_to_host(ordered.data(), v.data(), ordered.size() * sizeof(double), device_);
    for (int k = 0, n = 0; k < L.nz; ++k)
      for (int j = 0; j < L.ny; ++j)
        for (int i = 0; i < L.nx; ++i, ++n)
          out[static_cast<std::size_t>(n)] = ordered[static_cast<std::size_t>(local_index(L, i, j, k))];
    return out;
  }
  void rhs(Vector& b) override { copy(rhs_, b, 0); }
  void fill(Vector& v, int, double value) override {
    DeviceGuard guard(device_);
    if (value == 0.0) {
      KILN_CUDA_CHECK(cudaMemsetAsync(v.data(), 0, v.size() * sizeof(double), stream_));
      return;
    }
    gpu::fill(static_cast<std::int64_t>(v.size()), value, v.data(), stream_);
    KILN_CUDA_CHECK_LAUNCH();
  }
  void copy(const Vector& from, Vector& to, int level) override {
    DeviceGuard guard(device_);
    KILN_CUDA_CHECK(cudaMemcpyAsync(to.data(), from.data(),
                                    static_cast<std::size_t>(local_rows(level)) * sizeof(double),
                                    cudaMemcpyDeviceToDevice, stream_));
  }

  void exaggerate_diagonal(Vector& b) override {
    DeviceGuard guard(device_);
    auto& g = levels_[0];
    saved_diagonal_ = DeviceArray<double>(device_, static_cast<std::size_t>(g.plan.layout.nrow));
    gpu::exaggerate_diagonal(g.plan.layout, g.values.data(), saved_diagonal_.data(), b.data(), stream_);
    KILN_CUDA_CHECK_LAUNCH();
  }
  void restore_diagonal() override {
    DeviceGuard guard(device_);
    auto& g = levels_[0];
    gpu::restore_diagonal(g.plan.layout.nrow, g.values.data(), saved_diagonal_.data(), stream_);
    KILN_CUDA_CHECK_LAUNCH();
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));
    saved_diagonal_ = DeviceArray<double>();
  }
  void synchronize() override { KILN_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

 protected:
  void spmv(int level, Vector& x, Vector& y) override {
    DeviceGuard guard(device_);
    exchange_halo(level, x);
    const auto& g = at(level);
    gpu::spmv(g.plan.layout.nrow, g.values.data(), g.columns.data(), x.data(), y.data(), stream_);
    KILN_CUDA_CHECK_LAUNCH();
  }

  void symgs(int level, const Vector& r, Vector& x, Ordering ordering, bool x_is_zero) override {
    DeviceGuard guard(device_);
    exchange_halo(level, x);
    const auto& g = at(level);
    const auto& L = g.plan.layout;
    constexpr unsigned all_slots = (1u << kStencil) - 1;
    auto relax = [&](int first, int count, const int* rows, unsigned slots) {
      if (count <= 0) return;
      gpu::relax(first, count, rows, slots, g.values.data(), g.columns.data(), r.data(), x.data(), stream_);
      KILN_CUDA_CHECK_LAUNCH();
    };
    if (ordering == Ordering::Optimized) {
      for (int c = 0; c < 8; ++c)
        relax(L.color_start[c], L.color_start[c + 1] - L.color_start[c], nullptr,
              x_is_zero ? lower_colour_slots(c) : all_slots);
      for (int c = 7; c >= 0; --c) relax(L.color_start[c], L.color_start[c + 1] - L.color_start[c], nullptr, all_slots);
      return;
    }
    if (g.wave_start.empty()) build_waves(level);
    const auto& waves = g.wave_start;
    for (std::size_t w = 0; w + 1 < waves.size(); ++w)
      relax(waves[w], waves[w + 1] - waves[w], g.wave_rows.data(), all_slots);
    for (std::size_t w = waves.size() - 1; w-- > 0;)
      relax(waves[w], waves[w + 1] - waves[w], g.wave_rows.data(), all_slots);
  }

  void residual_restriction(int level, const Vector& r, Vector& x, Vector& rc) override {
    DeviceGuard guard(device_);
    exchange_halo(level, x);
    const auto& g = at(level);
    int ncoarse = static_cast<int>(g.coarse_of_injected.size());
    gpu::residual_restriction(g.plan.injected_first, ncoarse, g.coarse_of_injected.data(), g.values.data(),
                              g.columns.data(), r.data(), x.data(), rc.data(), stream_);
    KILN_CUDA_CHECK_LAUNCH();
  }

  void prolongation(int level, const Vector& xc, Vector& x) override {
    DeviceGuard guard(device_);
    const auto& g = at(level);
    int ncoarse = static_cast<int>(g.coarse_of_injected.size());
    gpu::prolongation(g.plan.injected_first, ncoarse, g.coarse_of_injected.data(), xc.data(), x.data(), stream_);
    KILN_CUDA_CHECK_LAUNCH();
  }

  double local_dot(int level, const Vector& x, const Vector& y) override {
    DeviceGuard guard(device_);
    gpu::dot_partials(local_rows(level), x.data(), y.data(), partial_.data(), stream_);
    KILN_CUDA_CHECK_LAUNCH();
    return finish(false);
  }
  void waxpby(int level, double alpha, const Vector& x, double beta, const Vector& y, Vector& w) override {
    DeviceGuard guard(device_);
    int n = local_rows(level);
    gpu::waxpby(n, alpha, x.data(), beta, y.data(), w.data(), stream_);
    KILN_CUDA_CHECK_LAUNCH();
  }
  double local_cg_update(double alpha, const Vector& p, const Vector& ap, Vector& x, Vector& r) override {
    DeviceGuard guard(device_);
    gpu::cg_update_partials(local_rows(0), alpha, p.data(), ap.data(), x.data(), r.data(), partial_.data(), stream_);
    KILN_CUDA_CHECK_LAUNCH();
    return finish(false);
  }
  double local_max_abs_difference(const Vector& a, const Vector& b, int level) override {
    DeviceGuard guard(device_);
    gpu::max_abs_difference_partials(local_rows(level), a.data(), b.data(), partial_.data(), stream_);
    KILN_CUDA_CHECK_LAUNCH();
    return finish(true);
  }

 private:
  const GpuLevel& at(int level) const { return levels_[static_cast<std::size_t>(level)]; }

  void build_waves(int level) {
    auto& g = levels_[static_cast<std::size_t>(level)];
    WaveSchedule w = plan_waves(g.plan.layout);
    g.wave_rows = upload_ints(w.rows);
    g.wave_start = std::move(w.start);
  }

  DeviceArray<int> upload_ints(const std::vector<int>& host) {
    DeviceArray<int> d(device_, host.size());
    if (!host.empty())
      KILN_CUDA_CHECK(
          cudaMemcpyAsync(d.data(), host.data(), host.size() * sizeof(int), cudaMemcpyHostToDevice, stream_));
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the host vector may go away
    return d;
  }

  double finish(bool take_max) {
    gpu::finish(partial_.data(), scalar_.data(), take_max, stream_);
    KILN_CUDA_CHECK_LAUNCH();
    double value = 0.0;
    KILN_CUDA_CHECK(cudaMemcpyAsync(&value, scalar_.data(), sizeof(double), cudaMemcpyDeviceToHost, stream_));
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return value;
  }

  // Halo exchange staged through the host: pack on the device, MPI on the host, unpack by copy
  // (halo points are contiguous after the rows). Nothing to do on one process.
  void exchange_halo(int level, Vector& x) {
    auto& g = levels_[static_cast<std::size_t>(level)];
    if (g.plan.halo.peers.empty()) return;
    int n = static_cast<int>(g.host_send.size());
    gpu::gather(n, g.send_rows.data(), x.data(), g.send_buffer.data(), stream_);
    KILN_CUDA_CHECK_LAUNCH();
    KILN_CUDA_CHECK(cudaMemcpyAsync(g.host_send.data(), g.send_buffer.data(), g.host_send.size() * sizeof(double),
                                    cudaMemcpyDeviceToHost, stream_));
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));
    exchange_halo_values(g.plan.halo, comm(), std::span<const double>(g.host_send.data(), g.host_send.size()),
                         std::span<double>(g.host_recv.data(), g.host_recv.size()));
    KILN_CUDA_CHECK(cudaMemcpyAsync(x.data() + g.plan.layout.nrow, g.host_recv.data(),
                                    g.host_recv.size() * sizeof(double), cudaMemcpyHostToDevice, stream_));
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));  // host_recv is reused by the next exchange
  }

  int device_;
  cudaStream_t stream_ = nullptr;
  std::vector<GpuLevel> levels_;
  Vector rhs_;
  DeviceArray<double> partial_, scalar_, saved_diagonal_;
};

}  // namespace

std::unique_ptr<Engine> make_cuda_engine(std::vector<Geometry> levels, dist::Communicator comm, int device_index) {
  return std::make_unique<CudaEngine>(std::move(levels), std::move(comm), device_index);
}

}  // namespace kiln::hpcg
