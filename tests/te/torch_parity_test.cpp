// te/'s fused ops against PyTorch (Debian's python3-torch at /usr/bin/python3) in float64, forward
// and backward: tests/parity/te_fused_torch.py computes each op as PyTorch / Hugging Face do from
// the inputs written here. Skipped when python3 or torch is missing.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kiln/autograd/functions.h"
#include "kiln/te/bias_gelu.h"
#include "kiln/te/fused_norm.h"
#include "kiln/te/gelu_mlp.h"
#include "kiln/te/linear_cross_entropy.h"
#include "kiln/te/rope.h"
#include "kiln/te/swiglu.h"
#include "te_test_util.h"

namespace kiln {
namespace torch_parity_test {

namespace fs = std::filesystem;
using nlohmann::json;
using te_test::randn;

constexpr const char* kPython = "/usr/bin/python3";

class TeTorchParity : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kPython)) GTEST_SKIP() << "python3 not found at " << kPython;
    if (std::system(fmt::format("{} -c 'import torch' >/dev/null 2>&1", kPython).c_str()) != 0)
      GTEST_SKIP() << "python3 cannot import torch";
    dir_ = fs::path(KILN_BINARY_DIR) / "parity" / "te_fused";
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }

  Tensor put(const std::string& name, const Tensor& t) {
    inputs_[name] = {{"shape", t.shape()}, {"values", t.to_vector<double>()}};
    return t;
  }

  void run_torch() {
    std::ofstream(dir_ / "inputs.json") << inputs_.dump();
    const fs::path script = fs::path(KILN_SOURCE_DIR) / "tests" / "parity" / "te_fused_torch.py";
    const std::string cmd =
        fmt::format("{} {} {} > {} 2>&1", kPython, script.string(), dir_.string(), (dir_ / "torch.log").string());
    const int rc = std::system(cmd.c_str());
    std::ifstream log(dir_ / "torch.log");
    const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    ASSERT_EQ(rc, 0) << "te_fused_torch.py failed:\n" << text;
    std::ifstream(dir_ / "outputs.json") >> outputs_;
  }

  void expect_close(const std::string& name, const Tensor& got, double tol) {
    ASSERT_TRUE(outputs_.contains(name)) << "torch did not produce " << name;
    const auto want = outputs_[name].get<std::vector<double>>();
    const auto g = got.to_vector<double>();
    ASSERT_EQ(g.size(), want.size()) << name;
    double err = 0, scale = 1e-300;
    for (std::size_t i = 0; i < g.size(); ++i) {
      err = std::max(err, std::abs(g[i] - want[i]));
      scale = std::max(scale, std::abs(want[i]));
    }
    EXPECT_LE(err / scale, tol) << name;
  }

  fs::path dir_;
  json inputs_ = json::object(), outputs_;
};

TEST_F(TeTorchParity, FusedKernelsMatchPyTorch) {
  // add + RMSNorm / LayerNorm, both outputs' gradients.
  const Tensor nx = put("norm_x", randn({3, 4, 24}, 1, 1.5, 0.2)), nr = put("norm_r", randn({3, 4, 24}, 2)),
               nw = put("norm_w", randn({24}, 3, 0.2, 1.0)), nb = put("norm_b", randn({24}, 4, 0.2)),
               gy = put("norm_gy", randn({3, 4, 24}, 5)), gs = put("norm_gs", randn({3, 4, 24}, 6));
  // RoPE: Llama-3.1 scaled table, an offset.
  const te::RopeTable table = te::make_rope_table(16, 64, 500000, true, 8, Device::cpu());
  put("rope_cos", table.cos.to(DType::F64));
  put("rope_sin", table.sin.to(DType::F64));
  const Tensor rx = put("rope_x", randn({2, 6, 3, 16}, 7)), rg = put("rope_g", randn({2, 6, 3, 16}, 8));
  put("rope_offset", Tensor::from_vector(std::vector<double>{9}, {1}));
  const Tensor sx = put("glu_x", randn({5, 2, 12}, 9, 2.0)), sg = put("glu_g", randn({5, 2, 6}, 10));
  const Tensor ch = put("ce_h", randn({9, 8}, 11)), cw = put("ce_w", randn({13, 8}, 12, 0.5));
  const Tensor cl = Tensor::from_vector(std::vector<std::int64_t>{0, 12, 5, -100, 7, 7, 3, 1, 11}, {9});
  inputs_["ce_labels"] = {{"shape", {9}}, {"values", cl.to_vector<double>()}};
  const Tensor cm = put("ce_mask", Tensor::from_vector(std::vector<double>{1, 1, 0, 1, 0.5, 1, 1, 0, 1}, {9}));
  const Tensor gx = put("gelu_x", randn({7, 10}, 13)), gw = put("gelu_w", randn({16, 10}, 14, 0.4)),
               gb = put("gelu_b", randn({16}, 15, 0.5)), gg = put("gelu_g", randn({7, 16}, 16));
  const std::vector<Tensor> mlp = {put("mlp_x", randn({6, 10}, 17)), put("mlp_w1", randn({16, 10}, 18, 0.4)),
                                   put("mlp_b1", randn({16}, 19, 0.5)), put("mlp_w2", randn({7, 16}, 20, 0.4)),
                                   put("mlp_b2", randn({7}, 21, 0.5))};
  const Tensor mg = put("mlp_g", randn({6, 7}, 22));
  run_torch();

  for (bool rms : {true, false}) {
    const std::string k = rms ? "rms" : "layer";
    Tensor x = nx.clone().requires_grad_(true), r = nr.clone().requires_grad_(true),
           w = nw.clone().requires_grad_(true), b = nb.clone().requires_grad_(true);
    auto [y, s] = rms ? te::add_rms_norm(x, r, w, 1e-5) : te::add_layer_norm(x, r, w, b, 1e-5);
    add(sum(mul(y, gy)), sum(mul(s, gs))).backward();
    expect_close(k + "_y", y, 1e-13);
    expect_close(k + "_s", s, 1e-15);
    expect_close(k + "_dx", x.grad(), 1e-12);
    expect_close(k + "_dr", r.grad(), 1e-12);
    expect_close(k + "_dw", w.grad(), 1e-12);
    if (!rms) expect_close(k + "_db", b.grad(), 1e-12);
  }
  // Our inverse frequencies are float64; transformers computes them in float32.
  expect_close("hf_inv_freq", Tensor::from_vector(te::rope_inv_freq(128, 500000, true, 8), {64}), 1e-6);
  {
    Tensor x = rx.clone().requires_grad_(true);
    Tensor y = te::apply_rope(x, table, 9);
    sum(mul(y, rg)).backward();
    expect_close("rope_y", y, 1e-14);
    expect_close("rope_dx", x.grad(), 1e-14);
  }
  {
    Tensor x = sx.clone().requires_grad_(true);
    Tensor y = te::swiglu(x);
    sum(mul(y, sg)).backward();
    expect_close("glu_y", y, 1e-14);
    expect_close("glu_dx", x.grad(), 1e-14);
  }
  {
    Tensor h = ch.clone().requires_grad_(true), w = cw.clone().requires_grad_(true);
    te::LinearCrossEntropyOptions o;
    o.max_chunk_bytes = 4 * 13 * 8;  // chunks of four rows
    Tensor loss = te::linear_cross_entropy(h, w, cl, cm, o);
    loss.backward();
    expect_close("ce_loss", loss, 1e-14);
    expect_close("ce_dh", h.grad(), 1e-13);
    expect_close("ce_dw", w.grad(), 1e-13);
  }
  {
    Tensor x = gx.clone().requires_grad_(true), w = gw.clone().requires_grad_(true),
           b = gb.clone().requires_grad_(true);
    Tensor y = te::linear_bias_gelu(x, w, b);
    sum(mul(y, gg)).backward();
    expect_close("gelu_y", y, 1e-14);
    expect_close("gelu_dx", x.grad(), 1e-13);
    expect_close("gelu_dw", w.grad(), 1e-13);
    expect_close("gelu_db", b.grad(), 1e-13);
  }
  {
    std::vector<Tensor> in;
    for (const Tensor& v : mlp) in.push_back(v.clone().requires_grad_(true));
    Tensor y = te::linear_gelu_linear(in[0], in[1], in[2], in[3], in[4]);
    sum(mul(y, mg)).backward();
    expect_close("mlp_y", y, 1e-14);
    const char* names[] = {"mlp_dx", "mlp_dw1", "mlp_db1", "mlp_dw2", "mlp_db2"};
    for (std::size_t i = 0; i < in.size(); ++i) expect_close(names[i], in[i].grad(), 1e-13);
  }
}

}  // namespace torch_parity_test
}  // namespace kiln
