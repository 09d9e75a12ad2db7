// MoeLayer on a CUDA device against the same layer on the CPU: output, gradients, router counts and
// the expert-bias update, through the fused kernels (te/cuda/moe.cu) with capacity dropping and
// padding, in f32 (bf16 changes the routing of close scores, so it is compared at the kernel level
// only, in test_backend_ops). Skipped without a CUDA device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "kiln/autograd/functions.h"
#include "kiln/models/moe_aux_loss.h"
#include "kiln/models/moe_layer.h"
#include "kiln/nn/init.h"
#include "kiln/runtime/backend.h"
#include "kiln/te/grouped_gemm_path.h"
#include "kiln/te/moe.h"
#if KILN_WITH_CUDA
#include "kiln/te/cuda/grouped_gemm_cublas.h"
#endif
#include "kiln/tensor/grad_mode.h"

namespace kiln::models {
namespace moe_layer_cuda_test {

double normwise_error(const Tensor& a, const Tensor& b) {
  const auto x = a.to(DType::F32).to_vector<double>(), y = b.to(DType::F32).to_vector<double>();
  double d2 = 0, r2 = 0;
  for (std::size_t i = 0; i < x.size(); ++i) d2 += (x[i] - y[i]) * (x[i] - y[i]), r2 += y[i] * y[i];
  return std::sqrt(d2 / std::max(r2, 1e-300));
}

struct Result {
  Tensor y, dx;
  std::vector<Tensor> grads;
  RouterStats stats;
  Tensor bias;
};

Result run(const MoeSpec& spec, Device device, DType dtype) {
  auto layer = std::make_shared<MoeLayer>(spec, LayerContext{});
  Generator gen(11);
  {
    NoGradGuard no_grad;
    for (const auto& [name, p] : layer->named_parameters()) nn::init::normal_(p, 0.0, 0.2, &gen);
    if (layer->router->expert_bias.defined()) nn::init::normal_(layer->router->expert_bias, 0.0, 0.05, &gen);
  }
  layer->to(device, dtype);
  layer->train();
  Tensor x = nn::init::normal_(Tensor::zeros({4, 64, spec.hidden_size}), 0.0, 1.0, &gen).detach();
  const Tensor r = nn::init::normal_(Tensor::zeros({4, 64, spec.hidden_size}), 0.0, 1.0, &gen).detach();
  x = x.to(device, dtype);
  x.requires_grad_(true);
  Result out;
  out.y = layer->forward(x);
  sum(mul(out.y.to(DType::F32), r.to(device))).backward();
  out.dx = x.grad();
  for (const auto& [name, p] : layer->named_parameters()) out.grads.push_back(p.grad());
  out.stats = layer->router->take_stats();
  layer->router->update_expert_bias();
  if (layer->router->expert_bias.defined()) out.bias = layer->router->expert_bias.to(Device::cpu(), DType::F32);
  return out;
}

MoeSpec cuda_spec() {
  MoeSpec s;
  s.hidden_size = 128;
  s.num_experts = 8;
  s.ffn_hidden_size = 96;
  s.activation = MlpActivation::SwiGLU;
  s.router.score = te::RouterScore::Sigmoid;
  s.router.topk = 2;
  s.router.num_groups = 4;
  s.router.group_topk = 2;
  s.expert_bias = true;
  s.bias_update_rate = 0.01;
  s.aux_loss_coeff = 0.01;
  s.z_loss_coeff = 0.001;
  s.capacity_factor = 1.0;
  s.pad_to_capacity = true;
  s.shared_expert_ffn = 64;
  s.grouped_gemm = true;
  s.permute_fusion = true;
  s.seq_length = 64;
  return s;
}

class MoeLayerCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (device_count(DeviceKind::CUDA) == 0) GTEST_SKIP() << "no CUDA device";
    set_moe_aux_loss_scale(1.0);
  }
};

TEST_F(MoeLayerCuda, MatchesTheCpu) {
  for (MoeTokenDropPolicy policy : {MoeTokenDropPolicy::Probs, MoeTokenDropPolicy::Position}) {
    MoeSpec spec = cuda_spec();
    spec.drop_policy = policy;
    const Result cpu = run(spec, Device::cpu(), DType::F32);
    const Result gpu = run(spec, Device::cuda(), DType::F32);
    EXPECT_EQ(gpu.stats.tokens, cpu.stats.tokens);
    EXPECT_EQ(gpu.stats.dropped, cpu.stats.dropped);
    EXPECT_NEAR(gpu.stats.load_balancing_loss, cpu.stats.load_balancing_loss, 1e-6);
    EXPECT_NEAR(gpu.stats.z_loss, cpu.stats.z_loss, 1e-5);
    EXPECT_LE(normwise_error(gpu.y.to(Device::cpu()), cpu.y), 1e-5);
    EXPECT_LE(normwise_error(gpu.dx.to(Device::cpu()), cpu.dx), 1e-5);
    for (std::size_t i = 0; i < cpu.grads.size(); ++i)
      EXPECT_LE(normwise_error(gpu.grads[i].to(Device::cpu()), cpu.grads[i]), 1e-5) << "parameter " << i;
    EXPECT_LE(normwise_error(gpu.bias, cpu.bias), 1e-6);
  }
}

// The experts' grouped GEMM on every CUDA path (te/cuda/grouped_gemm_cublas.h), chosen with
// KILN_GROUPED_GEMM: "auto" (the default: chunked or loop by rows per expert), "grouped" (one
// cublasGemmGroupedBatchedEx call per product after reading the offsets back), "loop" (one cuBLASLt
// GEMM per expert), "chunked" (pointer-array batched GEMMs over blocks of rows) and "tc" (the tensor-core
// kernel that reads the offsets on the device, what graph captures run; f32 there takes the SIMT kernel), each against
// the CPU in bf16 and f32: output, input and weight gradients through te::grouped_linear, with an expert without rows
// (its weight gradient is zeros) and unused tail rows (zeros). The grouped path must really make its cuBLAS call (no
// silent fallback to the loop).
class ScopedGroupedGemmPath {  // sets KILN_GROUPED_GEMM, restoring what was there at scope end
 public:
  explicit ScopedGroupedGemmPath(const char* path) {
    if (const char* v = std::getenv("KILN_GROUPED_GEMM")) saved_ = v, had_ = true;
    setenv("KILN_GROUPED_GEMM", path, 1);
  }
  ~ScopedGroupedGemmPath() {
    if (had_) {
      setenv("KILN_GROUPED_GEMM", saved_.c_str(), 1);
    } else {
      unsetenv("KILN_GROUPED_GEMM");
    }
  }

 private:
  std::string saved_;
  bool had_ = false;
};

std::int64_t grouped_cublas_calls() {
#if KILN_WITH_CUDA
  return te::cuda::grouped_gemm_grouped_calls();
#else
  return 0;
#endif
}

// y = grouped_linear(x, w) and the gradients of sum(y * r), as f32 on the CPU.
std::vector<Tensor> grouped_linear_products(const Tensor& x0, const Tensor& w0, const Tensor& r,
                                            const std::vector<std::int64_t>& off, Device d, DType dt) {
  // detach: the first (CPU f32) run makes x0 and w0 themselves the leaves, and a later .to() of a
  // tensor that requires grad would be a non-leaf whose .grad() stays undefined.
  Tensor x = x0.detach().to(d, dt), w = w0.detach().to(d, dt);
  x.requires_grad_(true);
  w.requires_grad_(true);
  const Tensor y = te::grouped_linear(x, w, Tensor::from_vector(off, {static_cast<std::int64_t>(off.size())}).to(d));
  sum(mul(y.to(DType::F32), r.to(d))).backward();
  return {y.detach().to(Device::cpu(), DType::F32), x.grad().to(Device::cpu(), DType::F32),
          w.grad().to(Device::cpu(), DType::F32)};
}

double f32_tolerance() {
  const char* v = std::getenv("KILN_ALLOW_TF32");  // TF32 GEMMs (10-bit mantissa) when set
  return v && v[0] != '\0' && std::string(v) != "0" ? 5e-3 : 1e-5;
}

// Every path and dtype against the CPU's f32 products; checks the tail rows and the empty experts.
void check_all_paths(const Tensor& x0, const Tensor& w0, const Tensor& r, const std::vector<std::int64_t>& off) {
  const std::vector<Tensor> ref = grouped_linear_products(x0, w0, r, off, Device::cpu(), DType::F32);
  const std::int64_t experts = w0.size(0), odim = w0.size(1);
  for (DType dt : {DType::BF16, DType::F32}) {
    for (const char* path : {"auto", "grouped", "loop", "chunked", "tc"}) {
      const std::string what = std::string(path) + " path, " + std::string(dtype_name(dt));
      const std::int64_t calls_before = grouped_cublas_calls();
      std::vector<Tensor> got;
      {
        ScopedGroupedGemmPath scoped(path);
        got = grouped_linear_products(x0, w0, r, off, Device::cuda(), dt);
      }
      // The forward, data-gradient and weight-gradient products: three grouped calls; auto makes
      // the weight gradient's where its forward takes the chunked launches.
      if (std::string(path) == "grouped") {
        EXPECT_EQ(grouped_cublas_calls() - calls_before, 3) << what;
      } else if (std::string(path) == "auto") {
        const bool chunked =
            te::resolve_grouped_gemm_path(te::GroupedGemmPath::Auto, off) == te::GroupedGemmPath::Chunked;
        EXPECT_EQ(grouped_cublas_calls() - calls_before, chunked ? 1 : 0) << what;
      } else {
        EXPECT_EQ(grouped_cublas_calls(), calls_before) << what;
      }
      const double tol = dt == DType::F32 ? f32_tolerance() : 1e-2;
      for (std::size_t i = 0; i < ref.size(); ++i)
        EXPECT_LE(normwise_error(got[i], ref[i]), tol) << what << ", output " << i;
      const auto y = got[0].to_vector<float>();
      for (std::size_t k = static_cast<std::size_t>(off.back() * odim); k < y.size(); ++k)
        ASSERT_EQ(y[k], 0.0f) << what << ": tail row element " << k;
      for (std::int64_t e = 0; e < experts; ++e) {
        if (off[static_cast<std::size_t>(e)] != off[static_cast<std::size_t>(e) + 1]) continue;
        for (float v : got[2].select(0, e).contiguous().to_vector<float>())
          ASSERT_EQ(v, 0.0f) << what << ": the empty expert " << e << "'s weight gradient";
      }
    }
  }
}

TEST(GroupedGemmCuda, EveryPathMatchesTheCpu) {
  if (device_count(DeviceKind::CUDA) == 0) GTEST_SKIP() << "no CUDA device";
  Generator gen(5);
  const Tensor x0 = nn::init::normal_(Tensor::zeros({300, 72}), 0.0, 0.5, &gen);
  const Tensor w0 = nn::init::normal_(Tensor::zeros({4, 136, 72}), 0.0, 0.2, &gen);
  const Tensor r = nn::init::normal_(Tensor::zeros({300, 136}), 0.0, 1.0, &gen);
  // Experts 0 and 2 have 130 rows each (one cuBLAS group of two), expert 1 none, expert 3 30 rows
  // (a group of its own), rows 290 .. 300 unused.
  check_all_paths(x0, w0, r, {0, 130, 130, 260, 290});
}

// 200 small experts (0 to 6 rows each, 28 empty): 3 x 172 = 516 operand pointers, more than one launch
// of te/cuda/device_pointer_table.cu carries (496), and groups of many equal shapes.
TEST(GroupedGemmCuda, ManySmallExpertsMatchTheCpu) {
  if (device_count(DeviceKind::CUDA) == 0) GTEST_SKIP() << "no CUDA device";
  std::vector<std::int64_t> off = {0};
  for (std::int64_t e = 0; e < 200; ++e) off.push_back(off.back() + (e * 5 + 3) % 7);
  const std::int64_t rows = off.back() + 5;
  Generator gen(6);
  const Tensor x0 = nn::init::normal_(Tensor::zeros({rows, 32}), 0.0, 0.5, &gen);
  const Tensor w0 = nn::init::normal_(Tensor::zeros({200, 24, 32}), 0.0, 0.2, &gen);
  const Tensor r = nn::init::normal_(Tensor::zeros({rows, 24}), 0.0, 1.0, &gen);
  check_all_paths(x0, w0, r, off);
}

// The chunked path's cases together (te/cuda/grouped_gemm_chunked.h): an expert with a large block
// of 1024 rows, experts with several full blocks of 128 rows, exactly one, none, and partial blocks of
// every padded size (32, 64, 96, 128), the last expert's partial block too close to x's end to be
// padded (it runs on its exact rows).
TEST(GroupedGemmCuda, ChunkedBlocksMatchTheCpu) {
  if (device_count(DeviceKind::CUDA) == 0) GTEST_SKIP() << "no CUDA device";
  std::vector<std::int64_t> off = {0};
  for (std::int64_t rows : {1100, 260, 128, 0, 45, 200, 127, 3}) off.push_back(off.back() + rows);
  const std::int64_t rows = off.back() + 10;
  Generator gen(7);
  const Tensor x0 = nn::init::normal_(Tensor::zeros({rows, 40}), 0.0, 0.5, &gen);
  const Tensor w0 = nn::init::normal_(Tensor::zeros({8, 48, 40}), 0.0, 0.2, &gen);
  const Tensor r = nn::init::normal_(Tensor::zeros({rows, 48}), 0.0, 1.0, &gen);
  check_all_paths(x0, w0, r, off);
}

// chunked's plans serve every batch count up to a power of two: routings of the same shapes whose
// blocks make 8, then 5, then 3 problems of one kind (bounds 8, 8 and 4) reuse the plans at counts
// below the one they were made for, and must still match the CPU.
TEST(GroupedGemmCuda, ChunkedPlansServeChangingCounts) {
  if (device_count(DeviceKind::CUDA) == 0) GTEST_SKIP() << "no CUDA device";
  Generator gen(11);
  const Tensor w0 = nn::init::normal_(Tensor::zeros({8, 48, 40}), 0.0, 0.2, &gen);
  for (const std::vector<std::int64_t>& counts : {std::vector<std::int64_t>{128, 128, 128, 128, 128, 128, 128, 128},
                                                  {128, 0, 256, 0, 128, 20, 128, 0},
                                                  {0, 0, 128, 40, 0, 128, 0, 128}}) {
    std::vector<std::int64_t> off = {0};
    for (std::int64_t c : counts) off.push_back(off.back() + c);
    const std::int64_t rows = off.back() + 32;
    const Tensor x0 = nn::init::normal_(Tensor::zeros({rows, 40}), 0.0, 0.5, &gen);
    const Tensor r = nn::init::normal_(Tensor::zeros({rows, 48}), 0.0, 1.0, &gen);
    const std::vector<Tensor> ref = grouped_linear_products(x0, w0, r, off, Device::cpu(), DType::F32);
    std::vector<Tensor> got;
    {
      ScopedGroupedGemmPath scoped("chunked");
      got = grouped_linear_products(x0, w0, r, off, Device::cuda(), DType::F32);
    }
    for (std::size_t i = 0; i < ref.size(); ++i)
      EXPECT_LE(normwise_error(got[i], ref[i]), f32_tolerance())
          << "output " << i << ", routing with expert 0 at " << counts[0] << " rows";
  }
}

}  // namespace moe_layer_cuda_test
}  // namespace kiln::models
