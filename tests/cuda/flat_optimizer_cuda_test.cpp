// CUDA paths of the mixed-precision optimizer kernels (bf16/f16 gradients, bf16/f16 model
// copies of fp32 masters), the flat-buffer optimizers, gradient buckets and activation recompute
// with graph-safe dropout on the GPU. Each skips without a GPU.
#include <gtest/gtest.h>

#include <cstring>

#include "kiln/autograd/checkpoint.h"
#include "kiln/autograd/functions.h"
#include "kiln/nn/nn.h"
#include "kiln/optim/flat_optimizer.h"
#include "kiln/tensor/grad_mode.h"
#include "test_util.h"

namespace kiln {
namespace flat_optimizer_cuda_test {

using namespace cudatest;

bool bit_equal(const Tensor& a, const Tensor& b) {
  const Tensor ha = a.to(Device::cpu()).contiguous(), hb = b.to(Device::cpu()).contiguous();
  return ha.dtype() == hb.dtype() && ha.numel() == hb.numel() &&
         std::memcmp(ha.data_ptr(), hb.data_ptr(), ha.nbytes()) == 0;
}

std::vector<Tensor> list(const std::vector<std::int64_t>& sizes, std::uint64_t seed, DType dtype, Device d,
                         double scale = 1.0) {
  std::vector<Tensor> out;
  for (std::size_t i = 0; i < sizes.size(); ++i) out.push_back(on(randn({sizes[i]}, seed + i, dtype, scale), d));
  return out;
}

std::vector<Tensor> copies(const std::vector<Tensor>& v, Device d) {
  std::vector<Tensor> out;
  for (const Tensor& t : v) out.push_back(on(t, d).clone());
  return out;
}

TEST(CudaMixedPrecisionOptim, AdamWithBf16GradsWritesBf16ModelCopies) {
  KILN_REQUIRE_CUDA();
  const std::vector<std::int64_t> sizes = {7, 20001, 64, 3};  // unaligned tails and the float4 path
  for (DType grad_dtype : {DType::F32, DType::BF16, DType::F16}) {
    for (DType model_dtype : {DType::BF16, DType::F16}) {
      auto p = list(sizes, 10, DType::F32, Device::cpu());
      auto g = list(sizes, 20, grad_dtype, Device::cpu(), 0.1);
      auto m = list(sizes, 30, DType::F32, Device::cpu(), 0.01);
      auto v = list(sizes, 40, DType::F32, Device::cpu(), 0.01);
      for (auto& t : v) t = ops::to(t, Device::cpu(), DType::F32) * ops::to(t, Device::cpu(), DType::F32);
      std::vector<Tensor> out_cpu, out_gpu;
      for (auto s : sizes) {
        out_cpu.push_back(poisoned({s}, model_dtype, Device::cpu()));
        out_gpu.push_back(poisoned({s}, model_dtype, gpu()));
      }
      auto pg = copies(p, gpu()), gg = copies(g, gpu()), mg = copies(m, gpu()), vg = copies(v, gpu());
      ops::AdamParams hp;
      hp.lr = 1e-2;
      hp.weight_decay = 0.1;
      hp.decoupled_weight_decay = true;
      for (std::int64_t step = 1; step <= 3; ++step) {
        hp.step = step;
        cpu_kernel(ops::op::adam_step)(p, g, m, v, out_cpu, hp);
        cuda_kernel(ops::op::adam_step)(pg, gg, mg, vg, out_gpu, hp);
      }
      const std::string what = name(grad_dtype) + " grads, " + name(model_dtype) + " model";
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        expect_close(pg[i], p[i], 1e-5, 1e-6, what + " master " + std::to_string(i));
        expect_close(mg[i], m[i], 1e-5, 1e-7, what + " exp_avg " + std::to_string(i));
        // The model copy is the GPU master rounded to nearest even.
        EXPECT_TRUE(bit_equal(out_gpu[i], ops::to(pg[i], gpu(), model_dtype))) << what << " model " << i;
      }
    }
  }
}

// AdamParams::grad_scale_ptr (gradient clipping inside the step): on the GPU, f32 gradients scaled
// as they are read give the very bits of a step on gradients scaled first (ops::binary_ Mul, the
// clip's pass), and 16-bit gradients the CPU kernel's values; the scale is read from device memory.
TEST(CudaMixedPrecisionOptim, AdamGradScaleEqualsScalingTheGradientsFirst) {
  KILN_REQUIRE_CUDA();
  const std::vector<std::int64_t> sizes = {7, 20001, 64, 3};
  const float coef = 0.37f;
  for (DType grad_dtype : {DType::F32, DType::BF16}) {
    auto p = list(sizes, 10, DType::F32, gpu());
    auto g = list(sizes, 20, grad_dtype, gpu(), 0.1);
    auto m = list(sizes, 30, DType::F32, gpu(), 0.01);
    auto v = list(sizes, 40, DType::F32, gpu(), 0.01);
    for (auto& t : v) t = t * t;
    auto p2 = copies(p, gpu()), m2 = copies(m, gpu()), v2 = copies(v, gpu());
    auto pc = copies(p, Device::cpu()), gc = copies(g, Device::cpu()), mc = copies(m, Device::cpu()),
         vc = copies(v, Device::cpu());
    const Tensor scale = Tensor::scalar(coef, DType::F32, gpu());
    std::vector<Tensor> scaled;  // the clip's pass: g * coef in f32
    for (const Tensor& t : g) scaled.push_back(ops::to(t, gpu(), DType::F32) * scale);
    ops::AdamParams hp;
    hp.lr = 1e-2;
    hp.weight_decay = 0.1;
    hp.decoupled_weight_decay = true;
    for (std::int64_t step = 1; step <= 2; ++step) {
      hp.step = step;
      ops::AdamParams fused = hp;
      fused.grad_scale_ptr = static_cast<const float*>(scale.data_ptr());
      cuda_kernel(ops::op::adam_step)(p, g, m, v, {}, fused);
      cuda_kernel(ops::op::adam_step)(p2, scaled, m2, v2, {}, hp);
      ops::AdamParams on_cpu = hp;
      on_cpu.grad_scale_ptr = &coef;
      cpu_kernel(ops::op::adam_step)(pc, gc, mc, vc, {}, on_cpu);
    }
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const std::string what = name(grad_dtype) + " grads, tensor " + std::to_string(i);
      // 16-bit gradients: the pass above widened them to f32 before the product, as the step does.
      EXPECT_TRUE(bit_equal(p[i], p2[i])) << what;
      EXPECT_TRUE(bit_equal(v[i], v2[i])) << what;
      expect_close(p[i], pc[i], 1e-5, 1e-6, what + " against the CPU");
    }
  }
}

TEST(CudaMixedPrecisionOptim, SgdWithBf16GradsAndModelCopies) {
  KILN_REQUIRE_CUDA();
  const std::vector<std::int64_t> sizes = {5, 16385};
  auto p = list(sizes, 50, DType::F32, Device::cpu()), g = list(sizes, 60, DType::BF16, Device::cpu());
  std::vector<Tensor> buf, out_cpu, out_gpu;
  for (auto s : sizes) {
    buf.push_back(Tensor::zeros({s}, DType::F32));
    out_cpu.push_back(poisoned({s}, DType::BF16, Device::cpu()));
    out_gpu.push_back(poisoned({s}, DType::BF16, gpu()));
  }
  auto pg = copies(p, gpu()), gg = copies(g, gpu()), bg = copies(buf, gpu());
  ops::SgdParams sp;
  sp.lr = 0.1;
  sp.momentum = 0.9;
  sp.nesterov = true;
  for (int step = 0; step < 3; ++step) {
    sp.first_step = step == 0;
    cpu_kernel(ops::op::sgd_step)(p, g, buf, out_cpu, sp);
    cuda_kernel(ops::op::sgd_step)(pg, gg, bg, out_gpu, sp);
  }
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    expect_close(pg[i], p[i], 1e-5, 1e-6, "sgd master " + std::to_string(i));
    EXPECT_TRUE(bit_equal(out_gpu[i], ops::to(pg[i], gpu(), DType::BF16))) << i;
  }
  // Mixed gradient dtypes in one call are refused, naming the call.
  std::vector<Tensor> mixed = {gg[0], on(randn({sizes[1]}, 61, DType::F32), gpu())};
  try {
    cuda_kernel(ops::op::sgd_step)(pg, mixed, bg, out_gpu, sp);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sgd_step"), std::string::npos) << e.what();
  }
}

// A small MLP on `device` with bf16 parameters.
struct Mlp {
  nn::Linear l1{32, 64}, l2{64, 16};
  explicit Mlp(Device device) {
    l1.to(device, DType::BF16);
    l2.to(device, DType::BF16);
  }
  std::vector<Tensor> params() { return {l1.weight, l1.bias, l2.weight, l2.bias}; }
  Tensor loss(const Tensor& x) { return sum(square(l2.forward(gelu(l1.forward(x))).to(DType::F32))); }
};

TEST(CudaFlatOptimizer, Bf16TrainingStepsMatchTheCpuAndShardsMatchTheWhole) {
  KILN_REQUIRE_CUDA();
  const optim::GradBufferOptions options{.grad_dtype = DType::F32, .bucket_size = 1000, .shard_count = 2};
  manual_seed(3);
  Mlp cpu_model(Device::cpu());
  manual_seed(3);
  Mlp gpu_model(gpu());
  manual_seed(3);
  Mlp shard_model(gpu());
  optim::GradBuffers cpu_grads(cpu_model.params(), options), gpu_grads(gpu_model.params(), options),
      shard_grads(shard_model.params(), options);
  optim::FlatAdamW cpu_opt(cpu_grads, {.lr = 1e-3, .weight_decay = 0.1});
  optim::FlatAdamW gpu_opt(gpu_grads, {.lr = 1e-3, .weight_decay = 0.1});
  optim::FlatAdamW r0(shard_grads, {.lr = 1e-3, .weight_decay = 0.1}, shard_grads.shard(0, 2));
  optim::FlatAdamW r1(shard_grads, {.lr = 1e-3, .weight_decay = 0.1}, shard_grads.shard(1, 2));
  int buckets = 0;
  gpu_grads.set_bucket_ready_callback([&](optim::ParamAndGradBuffer&, const optim::GradBucket&) { ++buckets; });
  for (int s = 0; s < 3; ++s) {
    Tensor x = Tensor::randn({8, 32}, 100 + s).to(DType::BF16);
    for (auto* g : {&cpu_grads, &gpu_grads, &shard_grads}) g->zero_grad();
    cpu_model.loss(x).backward();
    gpu_model.loss(on(x, gpu())).backward();
    gpu_grads.finish_backward();
    {
      // The shards see the very same gradients (GPU reductions need not be bitwise repeatable).
      NoGradGuard no_grad;
      Tensor dst = shard_grads.buffer(0).grad_data();
      dst.copy_(gpu_grads.buffer(0).grad_data());
    }
    cpu_opt.step();
    gpu_opt.step();
    r0.step();  // both shards of one buffer: together they update everything once
    r1.step();
    expect_close(gpu_grads.buffer(0).param_data().to(DType::F32), cpu_grads.buffer(0).param_data().to(DType::F32), 2e-2,
                 1e-2, "step " + std::to_string(s));  // an Adam step moves by ~lr per element
    EXPECT_TRUE(bit_equal(shard_grads.buffer(0).param_data(), gpu_grads.buffer(0).param_data())) << s;
  }
  EXPECT_EQ(buckets, 3 * static_cast<int>(gpu_grads.buffer(0).buckets().size()));
}

TEST(CudaCheckpoint, GraphSafeDropoutRecomputeIsBitIdentical) {
  KILN_REQUIRE_CUDA();
  manual_seed(7);
  nn::Linear fc(64, 64);
  fc.to(gpu());
  nn::Dropout drop(0.2, 55);
  drop.graph_safe = true;
  auto run = [&](bool recompute) {
    drop.offset = 0;
    Tensor x = on(Tensor::randn({16, 64}, 8), gpu()).requires_grad_();
    fc.weight.set_grad(Tensor());
    fc.bias.set_grad(Tensor());
    auto body = [&](const std::vector<Tensor>& in) { return drop.forward(gelu(fc.forward(in[0]))); };
    Tensor h = x;
    for (int l = 0; l < 3; ++l) h = tanh(recompute ? autograd::checkpoint(body, {h}) : body({h}));
    sum(h * h).backward();
    return std::vector<Tensor>{x.grad(), fc.weight.grad(), fc.bias.grad()};
  };
  auto plain = run(false), recomputed = run(true);
  for (std::size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(bit_equal(recomputed[i], plain[i])) << i;
}

}  // namespace flat_optimizer_cuda_test
}  // namespace kiln
