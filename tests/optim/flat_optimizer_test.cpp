// The flat-buffer optimizers (optim/flat_optimizer.h): bf16 parameters with fp32 masters match
// torch.optim on fp32 masters; f32 parameters match the per-parameter optimizers bit for bit;
// two shards' updates equal the whole; state dicts resume exactly; bad input is refused.
#include "kiln/optim/flat_optimizer.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "kiln/io/safetensors.h"
#include "kiln/optim/clip_grad.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln {
namespace flat_optimizer_test {

using optim::AdamOptions;
using optim::ElementRange;
using optim::FlatAdam;
using optim::FlatAdamW;
using optim::FlatOptimizer;
using optim::FlatSGD;
using optim::GradBufferOptions;
using optim::GradBuffers;
using optim::SGDOptions;

const std::vector<Shape> kShapes = {{3, 40}, {5}, {70}, {9, 9}};

// Parameter j, element i = sin(0.7 i + 1.3 j) in `dtype` (tests/parity/optim_parity.py's values).
std::vector<Tensor> make_params(DType dtype, const std::vector<Shape>& shapes = kShapes) {
  std::vector<Tensor> params;
  for (std::size_t j = 0; j < shapes.size(); ++j) {
    std::vector<float> v(static_cast<std::size_t>(numel_of(shapes[j])));
    for (std::size_t i = 0; i < v.size(); ++i)
      v[i] = static_cast<float>(std::sin(0.7 * static_cast<double>(i) + 1.3 * static_cast<double>(j)));
    params.push_back(Tensor::from_vector(v, shapes[j]).to(dtype).requires_grad_());
  }
  return params;
}

// Gradient of parameter j at step s: 0.5 cos(0.3 i (s + 1) + j).
Tensor grad_at(const Tensor& p, std::size_t j, int s) {
  std::vector<float> g(static_cast<std::size_t>(p.numel()));
  for (std::size_t i = 0; i < g.size(); ++i)
    g[i] = static_cast<float>(0.5 * std::cos(0.3 * static_cast<double>(i) * (s + 1) + static_cast<double>(j)));
  return Tensor::from_vector(g, p.shape());
}

// Writes step s's gradients into the parameters' .grad (views of the buffers, or fresh tensors).
void set_grads(const std::vector<Tensor>& params, int s) {
  NoGradGuard no_grad;
  for (std::size_t j = 0; j < params.size(); ++j) {
    Tensor g = grad_at(params[j], j, s);
    Tensor p = params[j], grad = p.grad();
    if (grad.defined())
      grad.copy_(g);
    else
      p.set_grad(g);
  }
}

bool bit_equal(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.numel() != b.numel()) return false;
  const Tensor ha = a.to(Device::cpu()).contiguous(), hb = b.to(Device::cpu()).contiguous();
  return std::memcmp(ha.data_ptr(), hb.data_ptr(), ha.nbytes()) == 0;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(FlatOptimizer, Fp32ParametersMatchThePerParameterOptimizersBitwise) {
  for (int kind = 0; kind < 3; ++kind) {
    auto flat_params = make_params(DType::F32), plain_params = make_params(DType::F32);
    GradBuffers grads(flat_params, {.bucket_size = 100});
    std::unique_ptr<optim::Optimizer> flat, plain;
    if (kind == 0) {
      flat = std::make_unique<FlatAdamW>(grads, AdamOptions{.lr = 0.01, .weight_decay = 0.1});
      plain = std::make_unique<optim::AdamW>(plain_params, AdamOptions{.lr = 0.01, .weight_decay = 0.1});
    } else if (kind == 1) {
      flat = std::make_unique<FlatAdam>(grads, AdamOptions{.lr = 0.02, .beta1 = 0.8, .weight_decay = 0.05});
      plain = std::make_unique<optim::Adam>(plain_params, AdamOptions{.lr = 0.02, .beta1 = 0.8, .weight_decay = 0.05});
    } else {
      SGDOptions o{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true};
      flat = std::make_unique<FlatSGD>(grads, o);
      plain = std::make_unique<optim::SGD>(plain_params, o);
    }
    for (int s = 0; s < 4; ++s) {
      set_grads(flat_params, s);
      set_grads(plain_params, s);
      flat->step();
      plain->step();
      for (std::size_t j = 0; j < flat_params.size(); ++j)
        EXPECT_TRUE(bit_equal(flat_params[j], plain_params[j])) << "kind " << kind << " step " << s << " param " << j;
    }
  }
}

// Clipping inside the step (FlatAdam::set_grad_scale with clip_coefficient) equals scaling the f32
// buffers first (clip_to_norm_) and stepping, bit for bit, for f32 and bf16 parameters; a norm
// under the limit (coefficient 1) changes nothing; the scale holds for one step only.
TEST(FlatOptimizer, GradScaleInTheStepEqualsClippingTheBuffersFirst) {
  for (DType dtype : {DType::F32, DType::BF16}) {
    auto fused_params = make_params(dtype), pass_params = make_params(dtype);
    GradBuffers fused_grads(fused_params, {.grad_dtype = DType::F32, .bucket_size = 100}),
        pass_grads(pass_params, {.grad_dtype = DType::F32, .bucket_size = 100});
    FlatAdamW fused(fused_grads, AdamOptions{.lr = 0.01, .weight_decay = 0.1});
    FlatAdamW pass(pass_grads, AdamOptions{.lr = 0.01, .weight_decay = 0.1});
    for (int s = 0; s < 4; ++s) {
      set_grads(fused_params, s);
      set_grads(pass_params, s);
      // Limits below and above the norm (about 2.4 here): a real clip, then coefficient 1.
      const double max_norm = s < 2 ? 0.5 : 100.0;
      const Tensor norm = optim::grad_norm(fused_params);
      fused.set_grad_scale(optim::clip_coefficient(norm, max_norm));
      fused.step();
      optim::clip_to_norm_(pass_grads.flat_grads(), optim::grad_norm(pass_params), max_norm);
      pass.step();
      for (std::size_t j = 0; j < fused_params.size(); ++j)
        EXPECT_TRUE(bit_equal(fused_params[j], pass_params[j])) << dtype_name(dtype) << " step " << s << " param " << j;
      EXPECT_TRUE(bit_equal(fused.state_dict().at("state.0.exp_avg"), pass.state_dict().at("state.0.exp_avg")));
    }
    // Without a new scale the next step is unscaled: equal to a step with no clip at all.
    set_grads(fused_params, 4);
    set_grads(pass_params, 4);
    fused.step();
    pass.step();
    for (std::size_t j = 0; j < fused_params.size(); ++j) EXPECT_TRUE(bit_equal(fused_params[j], pass_params[j]));
  }
  // A wrong scale is refused with what it got.
  auto params = make_params(DType::F32);
  GradBuffers grads(params, {});
  FlatAdamW opt(grads, AdamOptions{});
  EXPECT_NE(message_of([&] { opt.set_grad_scale(Tensor::ones({2})); }).find("float32 scalar"), std::string::npos);
}

// ---- parity with torch.optim on fp32 masters (python3-torch), skipped when torch is missing.
std::string run_command(const std::string& cmd, int& status) {
  std::string out;
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) {
    status = -1;
    return out;
  }
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, f)) out.append(buf, n);
  status = pclose(f);
  return out;
}

struct ParityCase {
  std::string optimizer;
  nlohmann::json kwargs;
  DType grad_dtype;
  std::function<std::unique_ptr<FlatOptimizer>(GradBuffers&)> make;
};

TEST(FlatOptimizerParity, Bf16ParametersMatchTorchOnFp32Masters) {
  const int steps = 5;
  std::vector<ParityCase> cases = {
      {"adamw",
       {{"lr", 0.01}, {"weight_decay", 0.1}},
       DType::F32,
       [](GradBuffers& g) { return std::make_unique<FlatAdamW>(g, AdamOptions{.lr = 0.01, .weight_decay = 0.1}); }},
      {"adamw",
       {{"lr", 0.003}, {"betas", {0.9, 0.95}}, {"eps", 1e-6}, {"weight_decay", 0.02}},
       DType::BF16,
       [](GradBuffers& g) {
         return std::make_unique<FlatAdamW>(
             g, AdamOptions{.lr = 0.003, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.02});
       }},
      {"adam",
       {{"lr", 0.01}, {"weight_decay", 0.05}},
       DType::F32,
       [](GradBuffers& g) { return std::make_unique<FlatAdam>(g, AdamOptions{.lr = 0.01, .weight_decay = 0.05}); }},
      {"sgd",
       {{"lr", 0.05}, {"momentum", 0.9}, {"nesterov", true}},
       DType::BF16,
       [](GradBuffers& g) {
         return std::make_unique<FlatSGD>(g, SGDOptions{.lr = 0.05, .momentum = 0.9, .nesterov = true});
       }},
  };
  nlohmann::json cfgs = nlohmann::json::array();
  for (const auto& c : cases) {
    nlohmann::json cfg = {{"optimizer", c.optimizer},
                          {"steps", steps},
                          {"kwargs", c.kwargs},
                          {"round_init", true},
                          {"round_grads", c.grad_dtype == DType::BF16}};
    cfg["shapes"] = kShapes;
    cfgs.push_back(cfg);
  }
  int status = -1;
  const std::string out = run_command(
      "/usr/bin/python3 " KILN_SOURCE_DIR "/tests/parity/optim_parity.py '" + cfgs.dump() + "' 2>/dev/null", status);
  if (status != 0 && WIFEXITED(status) && (WEXITSTATUS(status) == 77 || WEXITSTATUS(status) == 127))
    GTEST_SKIP() << "/usr/bin/python3 with torch not found";
  ASSERT_EQ(status, 0) << out;
  const nlohmann::json results = nlohmann::json::parse(out);
  ASSERT_EQ(results.size(), cases.size());
  for (std::size_t k = 0; k < cases.size(); ++k) {
    auto params = make_params(DType::BF16);
    GradBuffers grads(params, {.grad_dtype = cases[k].grad_dtype, .bucket_size = 128});
    auto opt = cases[k].make(grads);
    for (int s = 0; s < steps; ++s) {
      set_grads(params, s);  // rounded to bf16 on the way in when the buffer is bf16
      opt->step();
      const TensorDict state = opt->state_dict();
      for (std::size_t j = 0; j < params.size(); ++j) {
        const Tensor* master = state.find(fmt::format("state.{}.master", j));
        ASSERT_NE(master, nullptr);
        const auto got = master->to_vector<float>();
        const auto want = results[k][s][j].get<std::vector<double>>();
        ASSERT_EQ(got.size(), want.size());
        for (std::size_t i = 0; i < got.size(); ++i)
          ASSERT_NEAR(got[i], want[i], 2e-6 * (1 + std::abs(want[i])))
              << cases[k].optimizer << " " << cases[k].kwargs.dump() << " step " << s << " param " << j << " elem "
              << i;
        // The bf16 parameter is its master rounded to nearest even.
        EXPECT_TRUE(bit_equal(params[j].reshape({-1}), master->reshape({-1}).to(DType::BF16)))
            << "step " << s << " param " << j;
      }
    }
  }
}

// Assembles parameter j's state entry `what` from several optimizers' state dicts (whole or
// sharded with "state.<j>.shard").
std::vector<float> assemble(const std::vector<TensorDict>& states, std::size_t j, const std::string& what,
                            std::int64_t numel) {
  std::vector<float> out(static_cast<std::size_t>(numel), std::nanf(""));
  for (const TensorDict& st : states) {
    const Tensor* t = st.find(fmt::format("state.{}.{}", j, what));
    if (!t) continue;
    std::int64_t begin = 0;
    if (const Tensor* sh = st.find(fmt::format("state.{}.shard", j))) begin = sh->to_vector<std::int64_t>()[0];
    const auto v = t->to_vector<float>();
    std::copy(v.begin(), v.end(), out.begin() + begin);
  }
  return out;
}

TEST(FlatOptimizer, TwoShardsUpdatesEqualTheWhole) {
  const GradBufferOptions options{.grad_dtype = DType::F32, .bucket_size = 150, .shard_count = 2};
  for (int kind = 0; kind < 2; ++kind) {
    auto whole_params = make_params(DType::BF16);
    std::vector<std::vector<Tensor>> shard_params = {make_params(DType::BF16), make_params(DType::BF16)};
    GradBuffers whole_grads(whole_params, options);
    GradBuffers g0(shard_params[0], options), g1(shard_params[1], options);
    auto make = [&](GradBuffers& g, FlatOptimizer::Shard shard) -> std::unique_ptr<FlatOptimizer> {
      if (kind == 0) return std::make_unique<FlatAdamW>(g, AdamOptions{.lr = 0.01, .weight_decay = 0.1}, shard);
      return std::make_unique<FlatSGD>(g, SGDOptions{.lr = 0.05, .momentum = 0.9}, shard);
    };
    auto whole = make(whole_grads, {});
    std::vector<std::unique_ptr<FlatOptimizer>> shards;
    shards.push_back(make(g0, g0.shard(0, 2)));
    shards.push_back(make(g1, g1.shard(1, 2)));
    // The shards cut some parameter (so partial state entries are exercised).
    bool cut = false;
    for (const auto& [key, t] : shards[0]->state_dict()) cut = cut || key.ends_with(".shard");
    EXPECT_TRUE(cut);
    for (int s = 0; s < 4; ++s) {
      set_grads(whole_params, s);
      set_grads(shard_params[0], s);
      set_grads(shard_params[1], s);
      whole->step();
      shards[0]->step();
      shards[1]->step();
      // The all-gather a distributed optimizer does: each rank's shard of the parameter buffer
      // goes to the other rank.
      GradBuffers* gb[2] = {&g0, &g1};
      for (int r = 0; r < 2; ++r)
        for (const ElementRange& range : gb[r]->buffer(0).shard_ranges(r, 2)) {
          NoGradGuard no_grad;
          Tensor dst = optim::ParamAndGradBuffer::narrow(gb[1 - r]->buffer(0).param_data(), range);
          dst.copy_(optim::ParamAndGradBuffer::narrow(gb[r]->buffer(0).param_data(), range));
        }
      for (int r = 0; r < 2; ++r)
        EXPECT_TRUE(bit_equal(gb[r]->buffer(0).param_data(), whole_grads.buffer(0).param_data()))
            << "kind " << kind << " step " << s << " rank " << r;
    }
    const TensorDict w = whole->state_dict();
    const std::vector<TensorDict> parts = {shards[0]->state_dict(), shards[1]->state_dict()};
    for (std::size_t j = 0; j < whole_params.size(); ++j)
      for (std::string what : {"master", kind == 0 ? "exp_avg_sq" : "momentum_buffer"}) {
        const auto got = assemble(parts, j, what, whole_params[j].numel());
        const auto want = w.find(fmt::format("state.{}.{}", j, what))->to_vector<float>();
        EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << what << " " << j;
      }
  }
}

TEST(FlatOptimizer, StateDictRoundTripResumesExactly) {
  const std::string path = (std::filesystem::temp_directory_path() / "kiln_flat_optim_state.safetensors").string();
  const GradBufferOptions options{.grad_dtype = DType::BF16, .bucket_size = 150, .shard_count = 2};
  for (int rank : {-1, 1}) {  // -1: the whole buffers
    auto pa = make_params(DType::BF16), pb = make_params(DType::BF16);
    GradBuffers ga(pa, options), gb(pb, options);
    FlatOptimizer::Shard sa = rank < 0 ? FlatOptimizer::Shard{} : ga.shard(rank, 2);
    FlatOptimizer::Shard sb = rank < 0 ? FlatOptimizer::Shard{} : gb.shard(rank, 2);
    FlatAdamW a(ga, AdamOptions{.lr = 0.01, .weight_decay = 0.1}, sa);
    FlatAdamW b(gb, AdamOptions{.lr = 0.5, .weight_decay = 0.0}, sb);  // lr/wd come from the state
    for (int s = 0; s < 3; ++s) {
      set_grads(pa, s);
      a.step();
    }
    io::save_safetensors(path, a.state_dict());
    b.load_state_dict(io::load_safetensors(path).tensors);
    EXPECT_EQ(b.steps(), 3);
    EXPECT_DOUBLE_EQ(b.lr(), 0.01);
    {
      NoGradGuard no_grad;  // the parts of the parameters outside the shard come from the model
      Tensor dst = gb.buffer(0).param_data();
      dst.copy_(ga.buffer(0).param_data());
    }
    for (int s = 3; s < 6; ++s) {
      set_grads(pa, s);
      set_grads(pb, s);
      a.step();
      b.step();
    }
    for (std::size_t j = 0; j < pa.size(); ++j)
      EXPECT_TRUE(bit_equal(pa[j], pb[j])) << "rank " << rank << " param " << j;
    const TensorDict da = a.state_dict(), db = b.state_dict();
    ASSERT_EQ(da.size(), db.size());
    for (const auto& [key, t] : da) EXPECT_TRUE(bit_equal(t, *db.find(key))) << key;
  }
  std::filesystem::remove(path);
}

TEST(FlatOptimizer, RefusesBadInput) {
  auto params = make_params(DType::BF16);
  GradBuffers grads(params, {.bucket_size = 150, .shard_count = 2});
  const std::int64_t n = grads.buffer(0).numel();
  std::string m = message_of([&] { FlatAdamW opt(grads, optim::AdamW::defaults(), {{{0, n + 1}}}); });
  EXPECT_NE(m.find("FlatAdamW"), std::string::npos) << m;
  EXPECT_NE(m.find(fmt::format("shard range [0, {}) of buffer 0 is out of bounds", n + 1)), std::string::npos) << m;
  m = message_of([&] { FlatAdamW opt(grads, optim::AdamW::defaults(), {{{-4, 10}}}); });
  EXPECT_NE(m.find("out of bounds"), std::string::npos) << m;
  m = message_of([&] { FlatSGD opt(grads, SGDOptions{}, {{{0, 100}, {50, 200}}}); });
  EXPECT_NE(m.find("FlatSGD: shard ranges [0, 100) and [50, 200) of buffer 0 overlap"), std::string::npos) << m;
  m = message_of([&] { FlatSGD opt(grads, SGDOptions{}, {{{0, 10}}, {{0, 10}}}); });
  EXPECT_NE(m.find("ranges for 2 buffers, but the gradient buffers are 1"), std::string::npos) << m;
  // Parameter 0 ([3, 40], the last laid out) cut into two pieces.
  const ElementRange p0 = grads.buffer(0).range_of(grads.locate(params[0])->index);
  m = message_of([&] { FlatSGD opt(grads, SGDOptions{}, {{{p0.begin, p0.begin + 10}, {p0.begin + 20, p0.end}}}); });
  EXPECT_NE(m.find("cuts parameter 0"), std::string::npos) << m;
  Tensor stranger = make_params(DType::BF16, {{4}})[0];
  m = message_of([&] {
    std::vector<optim::ParamGroup> groups(1);
    groups[0].params = {params[1], stranger};
    FlatAdamW opt(grads, groups, optim::AdamW::defaults());
  });
  EXPECT_NE(m.find("FlatAdamW: parameter 1 of group 0"), std::string::npos) << m;
  EXPECT_NE(m.find("not in the gradient buffers"), std::string::npos) << m;
  m = message_of([&] { FlatAdamW opt(grads, AdamOptions{.capturable = true}); });
  EXPECT_NE(m.find("capturable"), std::string::npos) << m;

  // A state saved for one shard does not load into another, nor whole into a shard.
  FlatAdamW r0(grads, optim::AdamW::defaults(), grads.shard(0, 2)),
      r1(grads, optim::AdamW::defaults(), grads.shard(1, 2));
  FlatAdamW all(grads, optim::AdamW::defaults());
  set_grads(params, 0);
  r0.step();
  all.step();
  m = message_of([&] { r1.load_state_dict(r0.state_dict()); });
  EXPECT_NE(m.find("FlatAdamW.load_state_dict"), std::string::npos) << m;
  EXPECT_NE(m.find("shard"), std::string::npos) << m;
  m = message_of([&] { r1.load_state_dict(all.state_dict()); });
  EXPECT_NE(m.find("FlatAdamW.load_state_dict"), std::string::npos) << m;
  EXPECT_EQ(r1.steps(), 0);  // nothing installed

  // Dropping the gradient views is caught at the next step.
  params[2].set_grad(Tensor());
  m = message_of([&] { all.step(); });
  EXPECT_NE(m.find("FlatAdamW"), std::string::npos) << m;
  EXPECT_NE(m.find("no longer a view"), std::string::npos) << m;
}

}  // namespace flat_optimizer_test
}  // namespace kiln
