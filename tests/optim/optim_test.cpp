#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <numbers>

#include "kiln/autograd/functions.h"
#include "kiln/io/safetensors.h"
#include "kiln/nn/nn.h"
#include "kiln/optim/clip_grad.h"
#include "kiln/optim/lr_scheduler.h"
#include "kiln/optim/optimizer.h"
#include "kiln/tensor/autocast.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln {
namespace optim_test {

using optim::Adam;
using optim::AdamOptions;
using optim::AdamW;
using optim::SGD;
using optim::SGDOptions;

// ---- float64 references written from PyTorch's documented update rules.
struct RefSgd {
  SGDOptions o;
  std::vector<double> buf;
  bool first = true;
  void step(std::vector<double>& p, const std::vector<double>& g) {
    if (buf.empty()) buf.resize(p.size());
    for (std::size_t i = 0; i < p.size(); ++i) {
      double d = g[i] + o.weight_decay * p[i];
      if (o.momentum != 0) {
        buf[i] = first ? d : o.momentum * buf[i] + (1 - o.dampening) * d;
        d = o.nesterov ? d + o.momentum * buf[i] : buf[i];
      }
      p[i] -= o.lr * d;
    }
    first = false;
  }
};

struct RefAdam {
  AdamOptions o;
  bool decoupled = false;
  std::vector<double> m, v;
  int t = 0;
  void step(std::vector<double>& p, const std::vector<double>& g) {
    if (m.empty()) m.assign(p.size(), 0), v.assign(p.size(), 0);
    ++t;
    for (std::size_t i = 0; i < p.size(); ++i) {
      double gi = g[i];
      if (decoupled)
        p[i] *= 1 - o.lr * o.weight_decay;
      else
        gi += o.weight_decay * p[i];
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * gi;
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * gi * gi;
      double mhat = m[i] / (1 - std::pow(o.beta1, t)), vhat = v[i] / (1 - std::pow(o.beta2, t));
      p[i] -= o.lr * mhat / (std::sqrt(vhat) + o.eps);
    }
  }
};

std::vector<double> grad_at(int step, std::size_t n) {
  std::vector<double> g(n);
  for (std::size_t i = 0; i < n; ++i) g[i] = std::cos(0.9 * static_cast<double>(i) + step) * (step % 2 ? 1.5 : 0.3);
  return g;
}

template <class Opt, class Ref>
void expect_matches_reference(Opt& opt, Tensor p, Ref& ref, int steps) {
  std::vector<double> rp = p.to_vector<double>();
  for (int s = 0; s < steps; ++s) {
    std::vector<double> g = grad_at(s, rp.size());
    p.set_grad(Tensor::from_vector(g));
    opt.step();
    ref.step(rp, g);
    std::vector<double> got = p.to_vector<double>();
    for (std::size_t i = 0; i < rp.size(); ++i) EXPECT_NEAR(got[i], rp[i], 1e-12 * (1 + std::abs(rp[i]))) << s;
  }
}

Tensor param64() { return Tensor::from_vector<double>({1.0, -2.0, 0.5, 3.0, -0.25}).requires_grad_(); }

TEST(Optim, SgdPlainMomentumNesterovWeightDecayFloat64) {
  for (SGDOptions o : {SGDOptions{.lr = 0.1}, SGDOptions{.lr = 0.1, .momentum = 0.9},
                       SGDOptions{.lr = 0.05, .momentum = 0.8, .dampening = 0.3, .weight_decay = 0.01},
                       SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.1, .nesterov = true}}) {
    Tensor p = param64();
    SGD opt({p}, o);
    RefSgd ref;
    ref.o = o;
    expect_matches_reference(opt, p, ref, 4);
  }
}

TEST(Optim, SgdHandComputedValues) {
  // p = 1, g = 1, 0.5; lr 0.1, momentum 0.9: buf 1 -> p 0.9; buf 0.9 + 0.5 = 1.4 -> p 0.76.
  Tensor p = Tensor::from_vector<double>({1.0}).requires_grad_();
  SGD opt({p}, {.lr = 0.1, .momentum = 0.9});
  p.set_grad(Tensor::from_vector<double>({1.0}));
  opt.step();
  EXPECT_NEAR(p.item(), 0.9, 1e-15);
  p.set_grad(Tensor::from_vector<double>({0.5}));
  opt.step();
  EXPECT_NEAR(p.item(), 0.76, 1e-15);
}

TEST(Optim, AdamHandComputedFirstStep) {
  // The first bias-corrected Adam step moves each weight by lr * g / (|g| + eps') ~ lr * sign(g).
  Tensor p = Tensor::from_vector<double>({1.0, 2.0}).requires_grad_();
  Adam opt({p}, {.lr = 0.1, .eps = 0});
  p.set_grad(Tensor::from_vector<double>({0.3, -4.0}));
  opt.step();
  EXPECT_NEAR(p.to_vector<double>()[0], 0.9, 1e-12);
  EXPECT_NEAR(p.to_vector<double>()[1], 2.1, 1e-12);
}

TEST(Optim, AdamAndAdamWFloat64) {
  for (AdamOptions o : {AdamOptions{.lr = 0.01}, AdamOptions{.lr = 0.05, .beta1 = 0.8, .weight_decay = 0.1},
                        AdamOptions{.lr = 0.02, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.05}}) {
    Tensor p = param64();
    Adam adam({p}, o);
    RefAdam ref;
    ref.o = o;
    ref.decoupled = false;
    expect_matches_reference(adam, p, ref, 5);
    Tensor q = param64();
    AdamW adamw({q}, o);
    RefAdam refw;
    refw.o = o;
    refw.decoupled = true;
    expect_matches_reference(adamw, q, refw, 5);
  }
}

TEST(Optim, AdamWDefaultsAndParamGroups) {
  Tensor a = param64(), b = param64();
  std::vector<optim::ParamGroup> groups(2);
  groups[0].params = {a};
  groups[1].params = {b};
  groups[1].weight_decay = 0.0;
  groups[1].lr_mult = 0.5;
  AdamW opt(groups, AdamW::defaults());
  EXPECT_EQ(*opt.param_groups()[0].weight_decay, 0.01);
  EXPECT_EQ(*opt.param_groups()[1].weight_decay, 0.0);
  EXPECT_EQ(*opt.param_groups()[1].lr, 0.5e-3);
  opt.set_lr(0.1);
  EXPECT_EQ(*opt.param_groups()[0].lr, 0.1);
  EXPECT_EQ(*opt.param_groups()[1].lr, 0.05);
  EXPECT_THROW(SGD({a, a}, {}), Error);  // duplicate parameter
  EXPECT_THROW(SGD({a}, {.lr = 0.1, .nesterov = true}), Error);
}

TEST(Optim, ParametersWithoutGradientsAreSkipped) {
  Tensor a = param64(), b = param64();
  Adam opt({a, b}, {.lr = 0.1});
  a.set_grad(Tensor::from_vector<double>({1, 1, 1, 1, 1}));
  opt.step();
  EXPECT_EQ(b.to_vector<double>(), param64().to_vector<double>());
  EXPECT_NE(a.to_vector<double>(), param64().to_vector<double>());
  opt.zero_grad();
  EXPECT_FALSE(a.grad().defined());
}

TEST(Optim, StateDictResumesExactly) {
  std::string path = (std::filesystem::temp_directory_path() / "kiln_optim_state.safetensors").string();
  for (int kind = 0; kind < 2; ++kind) {
    Tensor p = param64(), q = param64();
    std::unique_ptr<optim::Optimizer> a, b;
    if (kind == 0) {
      a = std::make_unique<AdamW>(std::vector<Tensor>{p}, AdamOptions{.lr = 0.05, .weight_decay = 0.1});
      b = std::make_unique<AdamW>(std::vector<Tensor>{q}, AdamOptions{.lr = 0.05, .weight_decay = 0.1});
    } else {
      a = std::make_unique<SGD>(std::vector<Tensor>{p}, SGDOptions{.lr = 0.05, .momentum = 0.9});
      b = std::make_unique<SGD>(std::vector<Tensor>{q}, SGDOptions{.lr = 0.05, .momentum = 0.9});
    }
    for (int s = 0; s < 3; ++s) {
      p.set_grad(Tensor::from_vector(grad_at(s, 5)));
      a->step();
    }
    io::save_safetensors(path, a->state_dict());
    b->load_state_dict(io::load_safetensors(path).tensors);
    {
      NoGradGuard g;
      q.copy_(p);
    }
    for (int s = 3; s < 6; ++s) {
      p.set_grad(Tensor::from_vector(grad_at(s, 5)));
      q.set_grad(Tensor::from_vector(grad_at(s, 5)));
      a->step();
      b->step();
    }
    EXPECT_EQ(p.to_vector<double>(), q.to_vector<double>()) << kind;
  }
  // A state for a different layout is rejected.
  Tensor r = Tensor::zeros({2}, DType::F64).requires_grad_();
  Adam c({r}, {});
  Tensor p = param64();
  Adam d({p}, {});
  p.set_grad(Tensor::from_vector(grad_at(0, 5)));
  d.step();
  EXPECT_THROW(c.load_state_dict(d.state_dict()), Error);
  std::filesystem::remove(path);
}

TEST(Optim, ClipGradNorm) {
  Tensor a = Tensor::zeros({2}).requires_grad_(), b = Tensor::zeros({1}).requires_grad_();
  Tensor none = Tensor::zeros({1}).requires_grad_();
  a.set_grad(Tensor::from_vector<float>({3, 0}));
  b.set_grad(Tensor::from_vector<float>({4}));
  Tensor n = optim::clip_grad_norm_({a, b, none}, 10.0);
  EXPECT_NEAR(n.item(), 5.0, 1e-6);
  EXPECT_EQ(a.grad().to_vector<float>(), (std::vector<float>{3, 0}));  // under the limit: unchanged
  n = optim::clip_grad_norm_({a, b}, 1.0);
  EXPECT_NEAR(n.item(), 5.0, 1e-6);
  EXPECT_NEAR(a.grad().to_vector<float>()[0], 0.6, 1e-6);
  EXPECT_NEAR(b.grad().to_vector<float>()[0], 0.8, 1e-6);
  EXPECT_NEAR(optim::grad_norm({a, b}).item(), 1.0, 1e-5);
  EXPECT_EQ(optim::clip_grad_norm_({none}, 1.0).item(), 0.0);
}

TEST(Optim, LrSchedules) {
  optim::StepLR step(1.0, 10, 0.5);
  EXPECT_DOUBLE_EQ(step.get_lr(0), 1.0);
  EXPECT_DOUBLE_EQ(step.get_lr(9), 1.0);
  EXPECT_DOUBLE_EQ(step.get_lr(10), 0.5);
  EXPECT_DOUBLE_EQ(step.get_lr(25), 0.25);
  optim::LinearLR lin(2.0, 0.5, 1.0, 4);
  EXPECT_DOUBLE_EQ(lin.get_lr(0), 1.0);
  EXPECT_DOUBLE_EQ(lin.get_lr(2), 1.5);
  EXPECT_DOUBLE_EQ(lin.get_lr(4), 2.0);
  EXPECT_DOUBLE_EQ(lin.get_lr(100), 2.0);
  optim::CosineAnnealingLR cos(1.0, 10, 0.1);
  EXPECT_DOUBLE_EQ(cos.get_lr(0), 1.0);
  EXPECT_NEAR(cos.get_lr(5), 0.55, 1e-12);
  EXPECT_NEAR(cos.get_lr(10), 0.1, 1e-12);

  optim::WarmupDecayOptions o{.max_lr = 1.0, .min_lr = 0.1, .warmup_iters = 10, .decay_iters = 110};
  optim::WarmupDecayLR cosine(o);
  EXPECT_DOUBLE_EQ(cosine.get_lr(0), 0.0);
  EXPECT_DOUBLE_EQ(cosine.get_lr(5), 0.5);
  EXPECT_DOUBLE_EQ(cosine.get_lr(10), 1.0);
  EXPECT_NEAR(cosine.get_lr(35), 0.1 + 0.45 * (1 + std::cos(std::numbers::pi / 4)), 1e-12);
  EXPECT_NEAR(cosine.get_lr(60), 0.55, 1e-12);
  EXPECT_NEAR(cosine.get_lr(110), 0.1, 1e-12);
  EXPECT_DOUBLE_EQ(cosine.get_lr(500), 0.1);
  o.style = optim::DecayStyle::Linear;
  optim::WarmupDecayLR linear(o);
  EXPECT_NEAR(linear.get_lr(35), 0.775, 1e-12);
  o.style = optim::DecayStyle::Constant;
  EXPECT_DOUBLE_EQ(optim::WarmupDecayLR(o).get_lr(1000), 1.0);
  o.style = optim::DecayStyle::InverseSquareRoot;
  EXPECT_NEAR(optim::WarmupDecayLR(o).get_lr(40), 0.5, 1e-12);

  Tensor p = param64();
  SGD opt({p}, {.lr = 1.0});
  EXPECT_DOUBLE_EQ(cosine.apply(opt, 5), 0.5);
  EXPECT_DOUBLE_EQ(opt.lr(), 0.5);
}

TEST(Autocast, LinearAndMatmulComputeInBf16WithFp32MasterWeights) {
  manual_seed(0);
  nn::Linear lin(8, 4);
  Tensor x = Tensor::randn({3, 8}, 4);
  Tensor ref = lin.forward(x);
  Tensor y;
  {
    AutocastGuard autocast(DType::BF16);
    ASSERT_TRUE(autocast_dtype() == DType::BF16);
    y = lin.forward(x);
    EXPECT_EQ(matmul(x, lin.weight.t()).dtype(), DType::BF16);
    {
      AutocastGuard off(DType::BF16, false);
      EXPECT_EQ(matmul(x, lin.weight.t()).dtype(), DType::F32);
    }
  }
  EXPECT_FALSE(autocast_dtype().has_value());
  EXPECT_EQ(y.dtype(), DType::BF16);
  std::vector<float> a = y.to_vector<float>(), b = ref.to_vector<float>();
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 0.05 * (1 + std::abs(b[i])));
  sum(y.to(DType::F32)).backward();
  EXPECT_EQ(lin.weight.grad().dtype(), DType::F32);
  EXPECT_EQ(lin.bias.grad().dtype(), DType::F32);
  // The optimizer updates the fp32 master weights as usual.
  optim::SGD opt(lin.parameters(), {.lr = 0.1});
  opt.step();
  EXPECT_EQ(lin.weight.dtype(), DType::F32);
}

// ---- parity with torch.optim (python3-torch), skipped when torch is missing.
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

std::vector<Tensor> parity_params() {
  std::vector<Tensor> params;
  std::vector<Shape> shapes = {{3, 4}, {5}};
  for (std::size_t j = 0; j < shapes.size(); ++j) {
    std::vector<float> v(static_cast<std::size_t>(numel_of(shapes[j])));
    for (std::size_t i = 0; i < v.size(); ++i)
      v[i] = static_cast<float>(std::sin(0.7 * static_cast<double>(i) + 1.3 * static_cast<double>(j)));
    params.push_back(Tensor::from_vector(v, shapes[j]).requires_grad_());
  }
  return params;
}

struct ParityCase {
  std::string name;
  nlohmann::json kwargs;
  std::vector<Tensor> params;
  std::unique_ptr<optim::Optimizer> opt;
};

// All cases in one python run (importing torch takes seconds).
TEST(OptimParity, SgdAdamAdamWMatchTorch) {
  const int steps = 6;
  std::vector<ParityCase> cases;
  auto add = [&](std::string name, nlohmann::json kwargs, auto make) {
    ParityCase c{std::move(name), std::move(kwargs), parity_params(), nullptr};
    c.opt = make(c.params);
    cases.push_back(std::move(c));
  };
  add("sgd", {{"lr", 0.1}, {"momentum", 0.9}, {"weight_decay", 0.01}, {"nesterov", true}}, [](auto& p) {
    return std::make_unique<SGD>(p, SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true});
  });
  add("sgd", {{"lr", 0.05}, {"momentum", 0.8}, {"dampening", 0.2}},
      [](auto& p) { return std::make_unique<SGD>(p, SGDOptions{.lr = 0.05, .momentum = 0.8, .dampening = 0.2}); });
  add("sgd", {{"lr", 0.05}, {"weight_decay", 0.1}},
      [](auto& p) { return std::make_unique<SGD>(p, SGDOptions{.lr = 0.05, .weight_decay = 0.1}); });
  add("adam", {{"lr", 0.01}, {"betas", {0.85, 0.99}}, {"eps", 1e-7}, {"weight_decay", 0.02}}, [](auto& p) {
    return std::make_unique<Adam>(
        p, AdamOptions{.lr = 0.01, .beta1 = 0.85, .beta2 = 0.99, .eps = 1e-7, .weight_decay = 0.02});
  });
  add("adamw", {{"lr", 0.01}, {"weight_decay", 0.1}},
      [](auto& p) { return std::make_unique<AdamW>(p, AdamOptions{.lr = 0.01, .weight_decay = 0.1}); });

  nlohmann::json cfgs = nlohmann::json::array();
  for (const auto& c : cases) {
    nlohmann::json cfg = {{"optimizer", c.name}, {"steps", steps}, {"kwargs", c.kwargs}};
    cfg["shapes"] = nlohmann::json::array();
    for (const Tensor& p : c.params) cfg["shapes"].push_back(p.shape());
    cfgs.push_back(cfg);
  }
  // The script exits with 77 when torch is missing; Debian's python3-torch is under /usr/bin.
  int status = -1;
  std::string out;
  for (const char* py : {"/usr/bin/python3", "python3"}) {
    out = run_command(std::string(py) + " " KILN_SOURCE_DIR "/tests/parity/optim_parity.py '" + cfgs.dump() + "'",
                      status);
    if (status == 0) break;
  }
  if (status != 0 && WIFEXITED(status) && (WEXITSTATUS(status) == 77 || WEXITSTATUS(status) == 127))
    GTEST_SKIP() << "python3 with torch not found";
  ASSERT_EQ(status, 0) << out;
  nlohmann::json results = nlohmann::json::parse(out);
  ASSERT_EQ(results.size(), cases.size());
  for (std::size_t k = 0; k < cases.size(); ++k) {
    auto& c = cases[k];
    for (int s = 0; s < steps; ++s) {
      for (std::size_t j = 0; j < c.params.size(); ++j) {
        std::size_t n = static_cast<std::size_t>(c.params[j].numel());
        std::vector<float> g(n);
        for (std::size_t i = 0; i < n; ++i)
          g[i] = static_cast<float>(0.5 * std::cos(0.3 * static_cast<double>(i) * (s + 1) + static_cast<double>(j)));
        c.params[j].set_grad(Tensor::from_vector(g, c.params[j].shape()));
      }
      c.opt->step();
      for (std::size_t j = 0; j < c.params.size(); ++j) {
        std::vector<float> got = c.params[j].to_vector<float>();
        std::vector<double> want = results[k][s][j].get<std::vector<double>>();
        ASSERT_EQ(got.size(), want.size());
        for (std::size_t i = 0; i < got.size(); ++i)
          EXPECT_NEAR(got[i], want[i], 2e-6 * (1 + std::abs(want[i])))
              << c.name << " " << c.kwargs.dump() << " step " << s << " param " << j;
      }
    }
  }
}

}  // namespace optim_test
}  // namespace kiln
