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
#include "kiln/te/moe.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln::models {
namespace {

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

// The experts' grouped GEMM on both CUDA paths (te/cuda/grouped_gemm_cublas.h: cuBLAS per expert
// after reading the offsets back, the default; KILN_GROUPED_GEMM=tc: the tensor-core kernel that reads
// them on the device, what graph captures run) against the CPU, bf16: output, input and weight
// gradients, with an expert without rows (its weight gradient is zeros) and unused tail rows (zeros).
TEST(GroupedGemmCuda, BothPathsMatchTheCpu) {
  if (device_count(DeviceKind::CUDA) == 0) GTEST_SKIP() << "no CUDA device";
  Generator gen(5);
  const Tensor x0 = nn::init::normal_(Tensor::zeros({300, 72}), 0.0, 0.5, &gen);
  const Tensor w0 = nn::init::normal_(Tensor::zeros({4, 136, 72}), 0.0, 0.2, &gen);
  const Tensor r = nn::init::normal_(Tensor::zeros({300, 136}), 0.0, 1.0, &gen);
  const std::vector<std::int64_t> off = {0, 130, 130, 260, 290};
  auto run_on = [&](Device d, DType dt) {
    // detach: the first (CPU f32) run makes x0 and w0 themselves the leaves, and a later .to() of a
    // tensor that requires grad would be a non-leaf whose .grad() stays undefined.
    Tensor x = x0.detach().to(d, dt), w = w0.detach().to(d, dt);
    x.requires_grad_(true);
    w.requires_grad_(true);
    const Tensor y = te::grouped_linear(x, w, Tensor::from_vector(off, {5}).to(d));
    sum(mul(y.to(DType::F32), r.to(d))).backward();
    return std::vector<Tensor>{y.detach().to(Device::cpu(), DType::F32), x.grad().to(Device::cpu(), DType::F32),
                               w.grad().to(Device::cpu(), DType::F32)};
  };
  const std::vector<Tensor> ref = run_on(Device::cpu(), DType::F32);
  for (const char* path : {"cublas", "tc"}) {
    if (std::string(path) == "tc") setenv("KILN_GROUPED_GEMM", "tc", 1);
    const std::vector<Tensor> got = run_on(Device::cuda(), DType::BF16);
    unsetenv("KILN_GROUPED_GEMM");
    for (std::size_t i = 0; i < ref.size(); ++i)
      EXPECT_LE(normwise_error(got[i], ref[i]), 1e-2) << path << " path, output " << i;
    const auto y = got[0].to_vector<float>();
    for (std::size_t k = 290 * 136; k < y.size(); ++k) ASSERT_EQ(y[k], 0.0f) << path << ": tail row element " << k;
    const auto dw1 = got[2].select(0, 1).contiguous().to_vector<float>();
    for (float v : dw1) ASSERT_EQ(v, 0.0f) << path << ": the empty expert's weight gradient";
  }
}

}  // namespace
}  // namespace kiln::models
