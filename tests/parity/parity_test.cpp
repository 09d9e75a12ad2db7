// Parity with PyTorch (Debian's python3-torch): inputs are written to a scratch directory, the
// script torch_reference.py beside this file computes the same ops with torch (forward and
// backward), and the results are compared here. Skipped when python3 or torch is missing.
//
// The small CNN (conv-relu-pool-linear-cross_entropy) and Kiln's simple_resnet (float64, with Kiln's
// initial weights loaded into the same network in PyTorch) are compared on forward and backward
// only; the optimizer step is covered by the optimizer's own tests.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "kiln/autograd/functions.h"
#include "kiln/models/cifar_models.h"

namespace kiln {
namespace parity_test {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kPython = "/usr/bin/python3";

class TorchParity : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!fs::exists(kPython)) {
      skip_reason_ = "python3 not found at /usr/bin/python3";
      return;
    }
    if (std::system(fmt::format("{} -c 'import torch, numpy' >/dev/null 2>&1", kPython).c_str()) != 0)
      skip_reason_ = "python3 cannot import torch and numpy";
  }

  void SetUp() override {
    if (!skip_reason_.empty()) GTEST_SKIP() << skip_reason_;
    dir_ = fs::path(KILN_BINARY_DIR) / "parity" / ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }

  // Records an input (float64 or int64 on disk) for the torch script.
  void put(const std::string& name, const Tensor& t) {
    const bool integral = t.dtype() == DType::I64;
    std::ofstream f(dir_ / (name + ".bin"), std::ios::binary);
    if (integral) {
      auto v = t.to_vector<std::int64_t>();
      f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * 8));
    } else {
      auto v = t.to_vector<double>();
      f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * 8));
    }
    manifest_[name] = {{"shape", t.shape()}, {"dtype", integral ? "i64" : "f64"}};
  }

  // A random input, recorded; rounded to `dtype` first so both sides see identical values.
  Tensor input(const std::string& name, Shape shape, std::uint64_t seed, DType dtype = DType::F64) {
    Tensor t = Tensor::randn(std::move(shape), seed, DType::F64).to(dtype);
    put(name, t);
    return t;
  }

  void run_torch() {
    std::ofstream(dir_ / "inputs.json") << manifest_.dump();
    const fs::path script = fs::path(KILN_SOURCE_DIR) / "tests" / "parity" / "torch_reference.py";
    const std::string cmd =
        fmt::format("{} {} {} > {} 2>&1", kPython, script.string(), dir_.string(), (dir_ / "torch.log").string());
    const int rc = std::system(cmd.c_str());
    std::ifstream log(dir_ / "torch.log");
    std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    ASSERT_EQ(rc, 0) << "torch_reference.py failed:\n" << text;
    std::ifstream(dir_ / "outputs.json") >> outputs_;
  }

  std::vector<double> torch_result(const std::string& name) {
    EXPECT_TRUE(outputs_.contains(name)) << "torch did not produce " << name;
    if (!outputs_.contains(name)) return {};
    std::int64_t n = 1;
    for (auto s : outputs_[name]["shape"]) n *= s.get<std::int64_t>();
    std::vector<double> v(static_cast<std::size_t>(n));
    std::ifstream f(dir_ / ("out_" + name + ".bin"), std::ios::binary);
    f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 8));
    return v;
  }

  void compare(const std::string& name, const Tensor& ours, double tol) {
    ASSERT_TRUE(ours.defined()) << name << ": kiln produced no tensor";
    auto want = torch_result(name);
    auto got = ours.to_vector<double>();
    ASSERT_EQ(got.size(), want.size()) << name << ": kiln " << ours.describe();
    double worst = 0;
    std::size_t at = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const double err = std::abs(got[i] - want[i]) / (1.0 + std::abs(want[i]));
      if (!(err <= worst)) {
        worst = err;
        at = i;
      }
    }
    EXPECT_LE(worst, tol) << name << ": element " << at << " kiln " << got[at] << " torch " << want[at];
  }

  // The gradient of sum(y * gy) with respect to every tensor in `wrt`.
  static void backward_with(const Tensor& y, const Tensor& gy) { sum(mul(y, gy)).backward(); }

  static inline std::string skip_reason_;
  fs::path dir_;
  json manifest_ = json::object();
  json outputs_;
};

TEST_F(TorchParity, OpsAndSmallCnn) {
  constexpr double kTol = 1e-9;  // float64 on both sides

  // conv2d: stride (2, 1), padding (1, 2), dilation (1, 2), groups 2.
  Tensor cx = input("conv.x", {2, 4, 7, 6}, 1).requires_grad_(), cw = input("conv.w", {6, 2, 3, 3}, 2).requires_grad_(),
         cb = input("conv.b", {6}, 3).requires_grad_();
  ops::Conv2dParams cp;
  cp.stride_h = 2;
  cp.pad_h = 1;
  cp.pad_w = 2;
  cp.dilation_w = 2;
  cp.groups = 2;
  Tensor cy = conv2d(cx, cw, cb, cp);
  backward_with(cy, input("conv.gy", cy.shape(), 4));

  Tensor px = input("pool.x", {2, 3, 7, 7}, 5).requires_grad_();
  Tensor py = max_pool2d(px, 3, 2, 1);
  backward_with(py, input("pool.gy", py.shape(), 6));

  Tensor bx = input("bn.x", {4, 3, 5, 5}, 7).requires_grad_(), bw = input("bn.w", {3}, 8).requires_grad_(),
         bb = input("bn.b", {3}, 9).requires_grad_();
  Tensor rm = input("bn.rm", {3}, 10), rv = abs(input("bn.rv", {3}, 11));
  put("bn.rv", rv);
  Tensor by = batch_norm(bx, bw, bb, rm, rv, true, 0.1, 1e-5);
  backward_with(by, input("bn.gy", by.shape(), 12));

  Tensor ax = input("bna.x", {4, 3, 5, 5}, 40).requires_grad_(), aw = input("bna.w", {3}, 41).requires_grad_(),
         ab = input("bna.b", {3}, 42).requires_grad_(), ar = input("bna.r", {4, 3, 5, 5}, 43).requires_grad_();
  Tensor ay = batch_norm_act(ax, aw, ab, Tensor(), Tensor(), true, 0.1, 1e-5, ar, true);
  backward_with(ay, input("bna.gy", ay.shape(), 44));

  Tensor lx = input("ln.x", {3, 4, 8}, 13).requires_grad_(), lw = input("ln.w", {8}, 14).requires_grad_(),
         lb = input("ln.b", {8}, 15).requires_grad_();
  Tensor ly = layer_norm(lx, lw, lb, 1e-5);
  backward_with(ly, input("ln.gy", ly.shape(), 16));

  Tensor ex = input("ce.x", {6, 5}, 17).requires_grad_();
  Tensor et = Tensor::from_vector<std::int64_t>({0, 3, 4, 1, 3, 2});
  put("ce.t", et);
  Tensor eloss = cross_entropy(ex, et, 3, 0.1);
  eloss.backward();

  Tensor sx = input("sm.x", {3, 5, 4}, 18).requires_grad_();
  Tensor sgy = input("sm.gy", {3, 5, 4}, 19);
  Tensor sy = softmax(sx, 1);
  backward_with(sy, sgy);
  Tensor sgx = sx.grad();
  Tensor sx2 = sx.detach().clone().requires_grad_();
  Tensor sy2 = log_softmax(sx2, -1);
  backward_with(sy2, sgy);

  Tensor gx = input("gelu.x", {4, 6}, 20);
  Tensor ggy = input("gelu.gy", {4, 6}, 21);
  Tensor gx_exact = gx.clone().requires_grad_(), gx_tanh = gx.clone().requires_grad_();
  Tensor gy_exact = gelu(gx_exact), gy_tanh = gelu(gx_tanh, true);
  backward_with(gy_exact, ggy);
  backward_with(gy_tanh, ggy);

  Tensor nx = input("lin.x", {3, 4, 5}, 22).requires_grad_(), nw = input("lin.w", {6, 5}, 23).requires_grad_(),
         nb = input("lin.b", {6}, 24).requires_grad_();
  Tensor ny = linear(nx, nw, nb);
  backward_with(ny, input("lin.gy", ny.shape(), 25));

  Tensor mw = input("emb.w", {10, 4}, 26).requires_grad_();
  Tensor midx = Tensor::from_vector<std::int64_t>({1, 7, 1, 0, 9, 7}, {2, 3});
  put("emb.idx", midx);
  Tensor my = embedding(mw, midx);
  backward_with(my, input("emb.gy", my.shape(), 27));

  // Small CNN in float32: forward and backward.
  Tensor x = input("cnn.x", {4, 3, 8, 8}, 30, DType::F32);
  Tensor w1 = (input("cnn.w1", {8, 3, 3, 3}, 31, DType::F32)).requires_grad_();
  Tensor b1 = input("cnn.b1", {8}, 32, DType::F32).requires_grad_();
  Tensor w2 = input("cnn.w2", {10, 128}, 33, DType::F32).requires_grad_();
  Tensor b2 = input("cnn.b2", {10}, 34, DType::F32).requires_grad_();
  Tensor t = Tensor::from_vector<std::int64_t>({3, 9, 0, 3});
  put("cnn.t", t);
  ops::Conv2dParams pad1;
  pad1.pad_h = pad1.pad_w = 1;
  Tensor h = max_pool2d(relu(conv2d(x, w1, b1, pad1)), 2);
  Tensor logits = linear(h.flatten(1), w2, b2);
  Tensor loss = cross_entropy(logits, t);
  loss.backward();

  // Kiln's simple_resnet (its blocks end in the fused batch norm + shortcut add + ReLU) against the
  // same network in PyTorch with Kiln's initial weights and buffers, float64, training mode.
  auto net = models::make_cifar_model("simple_resnet");
  net->to(DType::F64);
  net->train();
  for (const auto& [name, t] : net->state_dict()) put("rn.p." + name, t);  // written before the forward
  Tensor rx = input("rn.x", {2, 3, 8, 8}, 50);
  Tensor rt = Tensor::from_vector<std::int64_t>({3, 7});
  put("rn.t", rt);
  Tensor rlogits = net->forward(rx);
  Tensor rloss = cross_entropy(rlogits, rt);
  rloss.backward();

  run_torch();

  compare("conv.y", cy, kTol);
  compare("conv.gx", cx.grad(), kTol);
  compare("conv.gw", cw.grad(), kTol);
  compare("conv.gb", cb.grad(), kTol);
  compare("pool.y", py, kTol);
  compare("pool.gx", px.grad(), kTol);
  compare("bn.y", by, kTol);
  // Saved batch statistics are f32 (as on the GPU), so gradients agree to f32 precision.
  compare("bn.gx", bx.grad(), 1e-6);
  compare("bn.gw", bw.grad(), 1e-6);
  compare("bn.gb", bb.grad(), kTol);
  compare("bn.rm_after", rm, kTol);
  compare("bn.rv_after", rv, kTol);
  compare("bna.y", ay, kTol);
  compare("bna.gx", ax.grad(), 1e-6);
  compare("bna.gw", aw.grad(), 1e-6);
  compare("bna.gb", ab.grad(), kTol);
  compare("bna.gr", ar.grad(), kTol);
  compare("ln.y", ly, kTol);
  compare("ln.gx", lx.grad(), 1e-6);
  compare("ln.gw", lw.grad(), 1e-6);
  compare("ln.gb", lb.grad(), kTol);
  compare("ce.loss", eloss, kTol);
  compare("ce.gx", ex.grad(), 1e-6);  // the saved log-sum-exp is f32
  compare("sm.y", sy, kTol);
  compare("sm.gx", sgx, kTol);
  compare("lsm.y", sy2, kTol);
  compare("lsm.gx", sx2.grad(), kTol);
  compare("gelu_none.y", gy_exact, kTol);
  compare("gelu_none.gx", gx_exact.grad(), kTol);
  compare("gelu_tanh.y", gy_tanh, kTol);
  compare("gelu_tanh.gx", gx_tanh.grad(), kTol);
  compare("lin.y", ny, kTol);
  compare("lin.gx", nx.grad(), kTol);
  compare("lin.gw", nw.grad(), kTol);
  compare("lin.gb", nb.grad(), kTol);
  compare("emb.y", my, kTol);
  compare("emb.gw", mw.grad(), kTol);

  constexpr double kF32 = 2e-5;
  compare("cnn.logits", logits, kF32);
  compare("cnn.loss", loss, kF32);
  compare("cnn.gw1", w1.grad(), kF32);
  compare("cnn.gb1", b1.grad(), kF32);
  compare("cnn.gw2", w2.grad(), kF32);
  compare("cnn.gb2", b2.grad(), kF32);

  compare("rn.logits", rlogits, kTol);
  compare("rn.loss", rloss, kTol);
  int resnet_tensors = 0;
  for (const auto& [name, p] : net->named_parameters()) {
    compare("rn.g." + name, p.grad(), 1e-7);
    ++resnet_tensors;
  }
  for (const auto& [name, b] : net->named_buffers()) {
    if (name.ends_with("num_batches_tracked")) continue;
    compare("rn.b." + name, b, kTol);  // the running statistics after the training-mode forward
    ++resnet_tensors;
  }
  EXPECT_GT(resnet_tensors, 50);
}

}  // namespace parity_test
}  // namespace kiln
