// Capturable optimizers (lr and step in device memory, for CUDA graphs) against the host-scalar
// path: on the CPU the "device" scalars are CPU tensors, so the same kernels run both ways and the
// parameters must be bit-identical, through LR schedule changes and a state_dict round trip.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>

#include "kiln/optim/lr_scheduler.h"
#include "kiln/optim/optimizer.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/graph_capture_state.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln {
namespace capturable_optim_test {

using optim::Adam;
using optim::AdamOptions;
using optim::AdamW;
using optim::SGD;
using optim::SGDOptions;

std::vector<double> grad_values(int step, std::size_t n, int salt) {
  std::vector<double> g(n);
  for (std::size_t i = 0; i < n; ++i)
    g[i] = std::cos(0.7 * static_cast<double>(i) + step + salt) * (step % 3 == 0 ? 2.0 : 0.4);
  return g;
}

// Two parameters (two sizes) in `dtype`; a factory builds the optimizer with capturable on or off.
using Factory = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>, bool capturable)>;

struct Run {
  std::vector<Tensor> params;
  std::unique_ptr<optim::Optimizer> opt;
};

Run make_run(const Factory& make, DType dtype, bool capturable) {
  Run r;
  r.params.push_back(Tensor::from_vector<double>({1.0, -2.0, 0.5, 3.0, -0.25}).to(dtype).requires_grad_());
  r.params.push_back(Tensor::from_vector<double>({0.3, 0.1, -0.7}).to(dtype).requires_grad_());
  r.opt = make(r.params, capturable);
  return r;
}

void step_run(Run& r, int step, DType dtype) {
  for (std::size_t i = 0; i < r.params.size(); ++i)
    r.params[i].set_grad(
        Tensor::from_vector(grad_values(step, static_cast<std::size_t>(r.params[i].numel()), static_cast<int>(i)))
            .to(dtype));
  r.opt->step();
}

void expect_same(const Run& a, const Run& b, const std::string& what) {
  for (std::size_t i = 0; i < a.params.size(); ++i)
    EXPECT_EQ(a.params[i].to_vector<double>(), b.params[i].to_vector<double>()) << what << " param " << i;
}

void check_factory(const Factory& make, const std::string& name) {
  for (DType dtype : {DType::F32, DType::F64}) {
    const std::string what = name + (dtype == DType::F32 ? " f32" : " f64");
    Run host = make_run(make, dtype, false), dev = make_run(make, dtype, true);
    EXPECT_FALSE(host.opt->capturable());
    EXPECT_TRUE(dev.opt->capturable());
    optim::CosineAnnealingLR schedule(0.05, 12);
    for (int s = 0; s < 12; ++s) {
      schedule.apply(*host.opt, s);  // the lr changes every step
      schedule.apply(*dev.opt, s);
      if (s == 7) {  // assigned directly, then pushed with sync_lr_to_device()
        host.opt->param_groups()[0].lr = 0.2;
        dev.opt->param_groups()[0].lr = 0.2;
        dev.opt->sync_lr_to_device();
      }
      step_run(host, s, dtype);
      step_run(dev, s, dtype);
      expect_same(host, dev, what + " step " + std::to_string(s));
    }
    // The state_dict reports the device step count; loading it into either kind resumes exactly.
    TensorDict hs = host.opt->state_dict(), ds = dev.opt->state_dict();
    EXPECT_EQ(hs.at("state.0.step").item(), 12);
    EXPECT_EQ(ds.at("state.0.step").item(), 12);
    Run resumed = make_run(make, dtype, true);
    {
      NoGradGuard no_grad;
      for (std::size_t i = 0; i < resumed.params.size(); ++i) resumed.params[i].copy_(dev.params[i]);
    }
    resumed.opt->load_state_dict(ds);
    for (int s = 12; s < 15; ++s) {
      step_run(host, s, dtype);
      step_run(resumed, s, dtype);
      expect_same(host, resumed, what + " resumed step " + std::to_string(s));
    }
  }
}

TEST(CapturableOptim, AdamMatchesHostScalars) {
  check_factory(
      [](std::vector<Tensor> p, bool c) {
        return std::make_unique<Adam>(std::move(p), AdamOptions{.lr = 0.05, .weight_decay = 0.01, .capturable = c});
      },
      "Adam");
}

TEST(CapturableOptim, AdamWMatchesHostScalars) {
  check_factory(
      [](std::vector<Tensor> p, bool c) {
        return std::make_unique<AdamW>(std::move(p), AdamOptions{.lr = 0.05, .weight_decay = 0.1, .capturable = c});
      },
      "AdamW");
}

TEST(CapturableOptim, SgdMatchesHostScalars) {
  check_factory(
      [](std::vector<Tensor> p, bool c) {
        return std::make_unique<SGD>(std::move(p),
                                     SGDOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3, .capturable = c});
      },
      "SGD momentum");
  check_factory(
      [](std::vector<Tensor> p, bool c) {
        return std::make_unique<SGD>(std::move(p),
                                     SGDOptions{.lr = 0.05, .momentum = 0.9, .nesterov = true, .capturable = c});
      },
      "SGD nesterov");
  check_factory([](std::vector<Tensor> p,
                   bool c) { return std::make_unique<SGD>(std::move(p), SGDOptions{.lr = 0.05, .capturable = c}); },
                "SGD plain");
}

// What would be frozen wrongly into a graph is refused while a capture is marked active.
TEST(CapturableOptim, RefusesHostWritesDuringCapture) {
  Tensor p = Tensor::from_vector<double>({1.0, 2.0}).requires_grad_();
  Adam opt({p}, {.lr = 0.1, .capturable = true});
  p.set_grad(Tensor::from_vector<double>({0.5, -0.5}));
  // No eager step yet: the state and device scalars would have to be created during capture.
  set_graph_capture_active(true);
  EXPECT_THROW(opt.step(), Error);
  set_graph_capture_active(false);
  opt.step();
  set_graph_capture_active(true);
  opt.set_lr(0.1);  // unchanged: nothing to write, allowed
  EXPECT_NO_THROW(opt.step());
  EXPECT_THROW(opt.set_lr(0.2), Error);  // a changed lr must be written outside the capture
  set_graph_capture_active(false);
}

}  // namespace capturable_optim_test
}  // namespace kiln
